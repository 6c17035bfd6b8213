#!/usr/bin/env python3
"""A model update: v2 of a ~2 GiB checkpoint with 5% of its tensors changed, on a node holding v1.

    .venv/bin/python bench/delta.py [--size 2GiB] [--changed 0.05] [--cold-bps 400MB] [--cap 100MB] [--rounds 5]

Cold path (the real CLI, `--no-daemon`): `weightd preload v2 --tier warm` on a node without v1 (full
fetch, the baseline) and on a node whose warm tier holds v1 (delta); cold storage is made uncached
before every run and, as root, read through a cgroup-v1 blkio throttle (--cold-bps: shared storage,
not the local NVMe). P2P path (real daemons on 127.0.0.x, every node capped at --cap): the same
preload from an origin, without and with v1 on the worker. Reported: bytes moved by source, the
changed tensor bytes, wall time (median of --rounds; --reps is the old name), and the ratios the
issue sets targets for. The four cold-path cases (full and delta, into warm and into hot) run once
per round in a rotating order, and so do the two P2P ones (bench/_rounds.py: up to twice the rounds
while a spread is wide, no ratio past --max-spread); each case's node set-up is untimed. The JSON is
in the common shape (delta over full per tier, target >= 5x; the machine's state).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from p2p.torrent import TORRENT_RELPATH, load_torrent  # noqa: E402
from _blkio import Throttle  # noqa: E402
from _rounds import machine_state, report, rounds, speedup  # noqa: E402
from swarm import Daemon  # noqa: E402
from tiering import build_manifest  # noqa: E402
from tiering.content.manifest_parse import load_manifest  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from tiering.pagecache import drop_from_cache  # noqa: E402
from tiering.sample import make_checkpoint, mutate_tensor  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
NAME = "bench/delta"


def weightd(config: Path, *args: str, wrap=lambda c: c) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(wrap([sys.executable, "-m", "weightd", "--config", str(config), *args]),
                          capture_output=True, text=True, env=ENV)
    if proc.returncode:
        raise SystemExit(f"weightd {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def node_config(base: Path, cold: Path, tag: str) -> Path:
    d = base / f"node-{tag}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    cfg = d / "weightd.toml"
    cfg.write_text(f'state_dir = "{d}/state"\n[tiers.hot]\npath = "/dev/shm/weightd-bench-delta-{os.getpid()}-{tag}"\n'
                   f'capacity = "6GiB"\n[tiers.warm]\npath = "{d}/warm"\ncapacity = "16GiB"\n'
                   f'[tiers.cold]\npath = "{cold}"\n[p2p]\nthreshold = "64GiB"\n')
    return cfg


def cleanup_shm(tag: str) -> None:
    shutil.rmtree(f"/dev/shm/weightd-bench-delta-{os.getpid()}-{tag}", ignore_errors=True)


def cool(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            drop_from_cache(str(p))


def preload_json(config: Path, wrap=lambda c: c, *extra: str, tier: str = "warm") -> tuple[dict, float]:
    t0 = time.perf_counter()
    proc = weightd(config, *extra, "preload", f"{NAME}@v2", "--tier", tier, "--strict", "--json", wrap=wrap)
    return json.loads(proc.stdout.splitlines()[0]), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--changed", type=float, default=0.05, help="fraction of tensors changed in v2")
    ap.add_argument("--cold-bps", default="400MB", help="read bandwidth of cold storage (blkio throttle)")
    ap.add_argument("--cap", default="100MB", help="P2P: every node's upload and download cap")
    ap.add_argument("--rounds", "--reps", "--runs", dest="reps", type=int, default=5,
                    help="rounds (full and delta into each tier in each, rotating; up to twice as many while a "
                         "spread is wide)")
    ap.add_argument("--max-spread", type=float, default=0.5,
                    help="no ratio when a contender's interquartile range over its median exceeds it")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--skip-p2p", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-delta-", dir=args.dir))
    throttle = None
    try:
        v1 = make_checkpoint(base / "v1", total_bytes=parse_size(args.size), shards=4, layers=24, seed="delta")
        v2 = base / "v2"
        shutil.copytree(v1, v2)
        m1 = build_manifest(v1)
        tensors = [(f, t) for f, t in m1.tensors()]
        step = max(1, round(1 / args.changed))
        changed = tensors[step // 2::step]  # every 20th tensor in file order: spread over all shards
        changed_bytes = sum(mutate_tensor(v2 / f.path, t.name, seed="v2") for f, t in changed)
        shards = sorted({f.path for f, _ in changed})
        cold = base / "cold"
        pub = base / "publish.toml"
        pub.write_text(f'state_dir = "{base}/pubstate"\n[tiers.cold]\npath = "{cold}"\n'
                       f'[tiers.hot]\npath = "/dev/shm/weightd-bench-delta-pub-{os.getpid()}"\n'
                       f'[tiers.warm]\npath = "{base}/pubwarm"\n[p2p]\nthreshold = "1MiB"\npiece_size = "auto"\n')
        for d, v in ((v1, "v1"), (v2, "v2")):
            weightd(pub, "--no-daemon", "publish", str(d), "--name", NAME, "--version", v)
        shutil.rmtree(v1)
        shutil.rmtree(v2)
        size = m1.total_bytes
        m2 = load_manifest(cold / NAME / "v2/.weightd/manifest.json")
        m2_piece = load_torrent((cold / NAME / "v2" / TORRENT_RELPATH).read_bytes(), m2, "v2").piece_length()
        st = os.stat(cold)
        throttle = Throttle((os.major(st.st_dev), os.minor(st.st_dev)), parse_size(args.cold_bps))

        # -- cold path: into the warm tier (NVMe: the copy is written back and fsync'd) and the hot tier --
        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        last: dict[str, dict] = {}

        def cold_path(mode: str, tier: str) -> float:
            """One preload of v2 into ``tier`` on a fresh node, with v1 there first for ``delta`` (set-up
            and the cold copy's eviction from the page cache untimed)."""
            cfg = node_config(base, cold, mode)
            try:
                if mode == "delta":
                    weightd(cfg, "--no-daemon", "preload", f"{NAME}@v1", "--tier", tier, "--strict")  # v1 on the node
                cool(cold)
                last[f"{mode}_{tier}"], t = preload_json(cfg, throttle.wrap, "--no-daemon", tier=tier)
                return t
            finally:
                shutil.rmtree(base / f"node-{mode}", ignore_errors=True)
                cleanup_shm(mode)

        # -- cold path: into the warm tier (NVMe: the copy is written back and fsync'd) and the hot tier --
        m0 = machine_state()
        times = rounds({f"{mode}_{tier}": (lambda mode=mode, tier=tier: cold_path(mode, tier))
                        for tier in ("warm", "hot") for mode in ("full", "delta")}, args.reps,
                       widen=args.max_spread, log=log)
        ratios = []
        extra = {"tensors": len(tensors), "tensors_changed": len(changed),
                 "changed_tensor_bytes": changed_bytes, "shards_touched": len(shards),
                 "cold_read_bps": parse_size(args.cold_bps) if throttle.active else None,
                 "throttle": "cgroup v1 blkio" if throttle.active else f"none ({throttle.why})"}
        for tier in ("warm", "hot"):
            full_t, delta_t = times[f"full_{tier}"], times[f"delta_{tier}"]
            full_r, delta_r = last[f"full_{tier}"], last[f"delta_{tier}"]
            extra[f"cold_path_{tier}"] = {
                "full": {"seconds": round(statistics.median(full_t), 2), "bytes_by_source": full_r["bytes_by_source"]},
                "delta": {"seconds": round(statistics.median(delta_t), 2), "bytes_by_source": delta_r["bytes_by_source"],
                          "donors": delta_r["delta"]["donors"] if delta_r["delta"] else []},
                "moved_over_changed": round(delta_r["bytes_by_source"]["cold"] / changed_bytes, 4),
                "speedup_vs_full": round(statistics.median(full_t) / statistics.median(delta_t), 2),
            }
            ratios.append(speedup(times, f"delta_{tier}", f"full_{tier}", max_spread=args.max_spread, target=5.0))

        # -- P2P path -------------------------------------------------------------------------------
        if not args.skip_p2p:
            def p2p_run(mode: str) -> float:
                origin = Daemon(base / "p2p", "127.0.0.2", cold, args.cap, "origin", None, '"127.0.0.0/8"')
                w = None
                try:
                    w = Daemon(base / "p2p", "127.0.0.3", cold, args.cap, "worker", f"127.0.0.2:{origin.port}",
                               '"127.0.0.0/8"', f"http://127.0.0.2:{origin.tport}/announce")
                    if mode == "delta":
                        weightd(w.config, "preload", f"{NAME}@v1", "--tier", "warm")
                    last[f"p2p_{mode}"], t = preload_json(w.config)
                    return t
                finally:
                    for d in (w, origin):
                        if d is not None:
                            d.stop()

            p2p_t = rounds({"p2p_full": lambda: p2p_run("full"), "p2p_delta": lambda: p2p_run("delta")}, args.reps,
                           widen=args.max_spread, log=log)
            times.update(p2p_t)
            p2p = {}
            for mode in ("full", "delta"):
                by = last[f"p2p_{mode}"]["bytes_by_source"]
                p2p[mode] = {"seconds": round(statistics.median(times[f"p2p_{mode}"]), 2), "bytes_by_source": by,
                             "moved": by["origin"] + by["peer"]}
            # what the issue allows: changed bytes plus one piece per changed region (each changed tensor
            # is its own region here: they are never adjacent)
            allowed = changed_bytes + len(changed) * (m2_piece or 0)
            extra["p2p_path"] = {
                "cap_bytes_per_s": parse_size(args.cap), "piece_size": m2_piece, **p2p,
                "moved_over_changed": round(p2p["delta"]["moved"] / changed_bytes, 3),
                "allowed_bytes": allowed, "within_allowed": p2p["delta"]["moved"] <= allowed,
                "speedup_vs_full": round(p2p["full"]["seconds"] / p2p["delta"]["seconds"], 2),
            }
            ratios.append(speedup(times, "p2p_delta", "p2p_full", max_spread=args.max_spread))
        extra["targets"] = {"cold_moved_over_changed": 1.05, "cold_speedup_vs_full": 5.0,
                            "p2p_moved": "changed bytes + one piece per changed region"}
        m1 = machine_state()
        print(json.dumps(report("delta", times, ratios, rounds=args.reps, max_spread=args.max_spread,
                                machine=(m0, m1), bytes=size, **extra), indent=2))
        return 0
    finally:
        if throttle is not None:
            throttle.close()
        shutil.rmtree(base, ignore_errors=True)
        for p in Path("/dev/shm").glob(f"weightd-bench-delta-*{os.getpid()}*"):
            shutil.rmtree(p, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
