#!/usr/bin/env python3
"""Preload from an object-store cold tier against what a user would otherwise script, and against the
server's own ceiling; all three on the same checkpoint, the same local S3 server (moto), interleaved.

    .venv/bin/python bench/objstore.py [--size 1GiB] [--rounds 5] [--range best] [--concurrency best]

(a) weightd: `weightd preload NAME --tier warm` end to end (the real CLI: ranged GETs along the
    manifest's parts, hashed as they arrive, fsync, rename), the copy evicted between rounds; the
    same through a running daemon (`--daemon-only`: the daemon downloads, as on a node where weightd
    is a service); the same into hot (tmpfs: no disk write or fsync), to show what the local disk costs; and the
    download alone in this process (`fetch_only`: ObjectCold.fetch into tmpfs), to show what the
    interpreter start, catalog and commit cost;
(b) s3transfer with its defaults (boto3's download_file per file), then `weightd verify` of the
    result (what a user would script);
(c) the ceiling: ranged GETs over the same objects with the best range size and concurrency found
    (a sweep from 8 MiB to 256 MiB ranges, 2 to 8 at a time), each range read whole into memory
    (obstore.get_range), writing nothing.

weightd's [tiers.cold] range_size and concurrency are set to the ceiling's best setting (--range and
--concurrency "best", the default; a deployment tunes these two for its store the same way): on moto
every ranged GET reads the whole object on the server (FakeKey.value) before slicing it, so fewer,
larger ranges win (one GET per object, when the checkpoint has a few files per worker), where S3
itself serves many mid-sized ranges in parallel best.

moto is pure Python and is the bottleneck here, so (c) is the figure to compare (a) against; the
server runs in this process and shares the machine's cores with the client, so a client that does
work (hashing, writing) takes CPU from the server: the CPU seconds of weightd's process are printed.
Then a delta update: v2 with about 5% of its tensors changed, preloaded next to v1, with the
requests and bytes the store served for it (the report's ``store``). The contenders run once per round
in a rotating order (bench/_rounds.py: up to twice the rounds while a spread is wide, no ratio past
--max-spread). Prints JSON in the common shape (medians and min-max, the ratios (a)/(c) and (a)/(b)
with their per-round spread, the machine's state), plus requests issued and bytes served by
weightd, and its peak RSS.
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
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_state, process_cpu_s, report, rounds, speedup  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from tiering.sample import local_s3, make_checkpoint  # noqa: E402


def ceiling(store, keys: list[tuple[str, int]], range_bytes: int, concurrency: int) -> float:
    import obstore
    work = [(k, s, min(n, s + range_bytes)) for k, n in keys for s in range(0, n, range_bytes)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        for _ in pool.map(lambda w: len(obstore.get_range(store, w[0], start=w[1], end=w[2])), work):
            pass
    return time.perf_counter() - t0


def fetch_only(fetcher, m) -> float:
    """weightd's download alone, in this process: ObjectCold.fetch (ranged GETs, hashed as they
    arrive, written at their offsets, fsync) into a tmpfs directory; no interpreter start, no
    catalog, no commit."""
    from tiering import Dir
    dst = Path(tempfile.mkdtemp(prefix="weightd-bench-fetch-", dir="/dev/shm"))
    try:
        with Dir(os.open(dst, os.O_RDONLY | os.O_DIRECTORY), dst) as d:
            t0 = time.perf_counter()
            got = fetcher.fetch(m, d)
            seconds = time.perf_counter() - t0
        assert got == m.total_bytes, got
        return seconds
    finally:
        shutil.rmtree(dst, ignore_errors=True)


def delta_update(wd: list[str], env: dict[str, str], base: Path, src: Path, total: int) -> dict:
    """v2 = v1 with about 5% of its bytes changed (whole tensors), preloaded into warm next to v1: the
    bytes and requests the store served, against the changed bytes and the changed regions."""
    from tiering import build_manifest
    from tiering.sample import mutate_tensor
    v2 = base / "src-v2"
    shutil.copytree(src, v2)
    m = build_manifest(src)
    by_file = {t.name: f.path for f, t in m.tensors()}
    tensors = [t for _, t in m.tensors() if t.nbytes > 4096]
    changed, names = 0, []
    for t in tensors[::max(1, len(tensors) // 12)]:
        if changed > total * 0.05:
            break
        changed += mutate_tensor(v2 / by_file[t.name], t.name, seed="bench-delta")
        names.append(t.name)
    subprocess.run([*wd, "-q", "publish", str(v2), "--name", "bench/s3", "--version", "v2"], check=True, env=env,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    subprocess.run([*wd, "-q", "preload", "bench/s3@v1", "--tier", "warm"], check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    p = subprocess.run([*wd, "-q", "preload", "bench/s3@v2", "--tier", "warm", "--json"], check=True, env=env,
                       cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    rep = json.loads(p.stdout)
    served = rep["store"]["bytes_read"]
    return {"changed_bytes": changed, "changed_regions": len(names), "bytes_served": served,
            "served_over_changed": round(served / changed, 4), "requests": rep["store"]["requests"],
            "local_reuse_bytes": rep["bytes_by_source"]["local_reuse"], "seconds": round(seconds, 3),
            "target": "served <= 1.05x changed, about one GET per changed region"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--rounds", "--runs", dest="rounds", type=int, default=5,
                    help="rounds (every contender in each, rotating; up to twice as many while a spread is wide)")
    ap.add_argument("--max-spread", type=float, default=0.5,
                    help="no ratio when a contender's interquartile range over its median exceeds it")
    ap.add_argument("--range", dest="range_size", default="best",
                    help="weightd's range_size (default: the ceiling sweep's best)")
    ap.add_argument("--concurrency", default="best", help="weightd's concurrency (default: the ceiling sweep's best)")
    a = ap.parse_args()
    size = parse_size(a.size)
    try:
        if a.range_size != "best" and parse_size(a.range_size) <= 0 or a.concurrency != "best" and int(a.concurrency) < 1:
            raise ValueError
    except ValueError:
        ap.error("--range takes a positive size and --concurrency a positive count (or best)")
    if size <= 0 or a.rounds < 1:
        ap.error("--size and --rounds take positive values")
    bucket = f"weightd-bench-{uuid.uuid4().hex[:8]}"
    with local_s3(bucket, key="bench") as ep:
        return run(a, size, ep, bucket)


def run(a: argparse.Namespace, size: int, ep: str, bucket: str) -> int:
    import boto3
    from boto3.s3.transfer import TransferConfig  # noqa: F401 (its defaults are the point)
    from obstore.store import S3Store
    env = dict(os.environ)  # (local_s3 set the keys)
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-s3-"))
    hot = Path(f"/dev/shm/weightd-bench-s3-{uuid.uuid4().hex[:8]}")   # (hot on tmpfs, as on a node)
    daemon = None
    try:
        s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1")
        cfg = base / "weightd.toml"

        def configure(range_bytes: int, concurrency: int) -> None:
            cfg.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "{2 * size}"\n'
                           f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "{2 * size}"\n[tiers.cold]\n'
                           f'url = "s3://{bucket}/models"\nendpoint = "{ep}"\nregion = "us-east-1"\n'
                           f'range_size = "{range_bytes}"\nconcurrency = {concurrency}\n'
                           f'[api]\nsocket = "{base}/api.sock"\n')
        configure(64 << 20, 4)
        wd = [sys.executable, "-m", "weightd", "--config", str(cfg), "--no-daemon"]
        src = make_checkpoint(base / "src", total_bytes=size, shards=8, layers=32, seed="s3bench")
        subprocess.run([*wd, "-q", "publish", str(src), "--name", "bench/s3", "--version", "v1"], check=True,
                       env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        objs = [(o["Key"], o["Size"]) for o in s3.list_objects_v2(Bucket=bucket, Prefix="models/bench/s3/v1/")["Contents"]
                if "/.weightd/" not in o["Key"]]
        total = sum(n for _, n in objs)
        store = S3Store(bucket, endpoint=ep, region="us-east-1", client_options={"allow_http": True})
        # (c): a sweep for the server's best, then that setting in every round
        sweep = {}
        for rb in (8 << 20, 16 << 20, 64 << 20, 128 << 20, 256 << 20):
            for cc in (2, 4, 8):
                sweep[(rb, cc)] = ceiling(store, objs, rb, cc)
        best = min(sweep, key=sweep.get)
        range_bytes = best[0] if a.range_size == "best" else parse_size(a.range_size)
        concurrency = best[1] if a.concurrency == "best" else int(a.concurrency)
        configure(range_bytes, concurrency)
        from tiering import build_manifest
        from tiering import ObjectCold
        m = build_manifest(src).with_labels(name="bench/s3", version="v1")
        fetcher = ObjectCold(f"s3://{bucket}/models", endpoint=ep, region="us-east-1",
                             range_bytes=range_bytes, concurrency=concurrency)
        stats: dict[str, list] = {}

        daemon = subprocess.Popen([*wd[:-1], "serve"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_for(base / "api.sock", daemon)
        by_daemon = [*wd[:-1], "--daemon-only"]

        def weightd(kind: str) -> float:
            subprocess.run([*by_daemon, "-q", "evict", "bench/s3@v1", "--force"], env=env, cwd=ROOT,
                           capture_output=True)
            tier = "hot" if kind == "weightd_hot" else "warm"
            cli = by_daemon if kind == "weightd_daemon" else wd
            d0 = process_cpu_s(daemon.pid)
            t0 = time.perf_counter()
            p = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *cli, "-q", "preload", "bench/s3@v1",
                                "--tier", tier, "--strict", "--json"], env=env, cwd=ROOT, capture_output=True,
                               text=True, check=True)
            seconds = time.perf_counter() - t0
            rss, user, system = p.stderr.strip().splitlines()[-1].split()
            if kind != "weightd_daemon":   # (the command's own: the daemon's are its process's)
                stats.setdefault("peak_rss_kib", []).append(int(rss))
                stats.setdefault(f"cpu_s_{kind}", []).append(float(user) + float(system))
            else:   # (the daemon's CPU seconds over the preload, and the client's)
                stats.setdefault("cpu_s_weightd_daemon", []).append(
                    round(process_cpu_s(daemon.pid) - d0 + float(user) + float(system), 3))
            rep = json.loads(p.stdout)
            assert rep["bytes_by_source"]["cold"] == rep["bytes"] == total, rep
            stats.setdefault("requests", []).append(rep["store"]["requests"])
            return seconds

        def s3transfer_verify() -> float:
            dst = base / "s3t"
            shutil.rmtree(dst, ignore_errors=True)
            t0 = time.perf_counter()
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="models/bench/s3/v1/")["Contents"]]
            for key in keys:
                out = dst / key.removeprefix("models/bench/s3/v1/")
                out.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, key, str(out))
            subprocess.run([*wd, "-q", "verify", str(dst)], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - t0

        contenders = {"weightd": lambda: weightd("weightd"), "weightd_hot": lambda: weightd("weightd_hot"),
                      "weightd_daemon": lambda: weightd("weightd_daemon"),
                      "fetch_only": lambda: fetch_only(fetcher, m), "s3transfer_verify": s3transfer_verify,
                      "ceiling": lambda: ceiling(store, objs, *best)}
        m0 = machine_state()
        times = rounds(contenders, a.rounds, widen=a.max_spread, log=lambda x: print(x, file=sys.stderr, flush=True))
        m1 = machine_state()
        delta = delta_update(wd, env, base, src, total)
        med = {k: statistics.median(v) for k, v in times.items()}
        sp = a.max_spread
        print(json.dumps(report(
            "objstore", times, [speedup(times, "weightd", "ceiling", max_spread=sp, target=0.9),
                                speedup(times, "weightd", "s3transfer_verify", max_spread=sp, target=1.3),
                                speedup(times, "weightd_daemon", "ceiling", max_spread=sp, target=0.9),
                                speedup(times, "weightd_hot", "ceiling", max_spread=sp),
                                speedup(times, "fetch_only", "ceiling", max_spread=sp)],
            rounds=a.rounds, max_spread=sp, machine=(m0, m1), **{
            "bytes": total, "files": len(objs),
            "server": "moto (ThreadedMotoServer, 127.0.0.1)",
            "weightd": {"range_bytes": range_bytes, "concurrency": concurrency,
                        "chosen": "the ceiling's best" if (a.range_size, a.concurrency) == ("best", "best")
                        else "--range/--concurrency"},
            "ceiling_setting": {"range_bytes": best[0], "concurrency": best[1]},
            "ceiling_sweep_s": {f"{rb >> 20}MiB x{cc}": round(t, 3) for (rb, cc), t in sorted(sweep.items())},
            "median_s": {k: round(v, 3) for k, v in med.items()},
            "range_s": {k: [round(min(v), 3), round(max(v), 3)] for k, v in times.items()},
            "mb_per_s": {k: round(total / v / 1e6, 1) for k, v in med.items()},
            "ratio_weightd_over_ceiling": round(med["ceiling"] / med["weightd"], 3),
            "ratio_weightd_over_s3transfer_verify": round(med["s3transfer_verify"] / med["weightd"], 3),
            "ratio_weightd_daemon_over_ceiling": round(med["ceiling"] / med["weightd_daemon"], 3),
            "ratio_weightd_hot_over_ceiling": round(med["ceiling"] / med["weightd_hot"], 3),
            "ratio_fetch_only_over_ceiling": round(med["ceiling"] / med["fetch_only"], 3),
            "weightd_peak_rss_mib": round(max(stats["peak_rss_kib"]) / 1024, 1),
            "weightd_cpu_s_median": {k: round(statistics.median(stats[f"cpu_s_{k}"]), 2)
                                     for k in ("weightd", "weightd_hot", "weightd_daemon")},
            "weightd_requests_per_preload": stats["requests"][-1],
            "delta_update": delta,
            "targets": {"vs_ceiling": 0.9, "vs_s3transfer_verify": 1.3, "peak_rss_mib": 200},
        }), indent=2))
        return 0
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(hot, ignore_errors=True)


def wait_for(sock: Path, daemon: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not sock.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("bench/objstore.py: the daemon did not start")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
