#!/usr/bin/env python3
"""Cold -> warm preload where the page cache cannot hold the checkpoint, vs `cp -r && sync`, with the
device's own counters.

    .venv/bin/python bench/preload_cgroup.py [--size 2GiB] [--memory 384MiB] [--rounds 5] [--dir /var/tmp]
                                              [--rss-sizes 1GiB,8GiB]

Each run is one command in a fresh cgroup-v1 memory child limited to --memory (page-cache pages, read
and written, are charged to it: a node whose free memory is smaller than the checkpoint), and the same
commands without the limit:

  cp_sync[_cg]         `cp -r COLD DST && sync`
  weightd[_cg]         `weightd --no-daemon preload NAME@V --tier warm --lease 0 --json` (the real CLI,
                       interpreter start included: copy, verify, durable commit, warming)
  weightd_signed_cg    the same with `[trust] require_signature = true` (the signed SHA-256 of every file
                       checked too)

Before each run (untimed): the destination removed, the cold copy dropped from the page cache
(POSIX_FADV_DONTNEED on each of its files, checked with cachestat: only the source's pages, so other
work on this shared machine keeps its cache). The device's sectors read and written (/proc/diskstats, the
line of the tiers' device) are counted from the start of the command until everything it wrote is on the
device (a `sync` after it, untimed; cp's own `sync` is timed, as weightd's fsyncs are); other work on the
machine adds to them, so the medians are what to read. Every contender runs once per round in a rotating
order (bench/_rounds.py). Targets (issue #35): in the cgroup, weightd >= 1.0x the speed of `cp -r && sync`
and reads <= 1.1x the bytes it reads from the device; the signed preload <= 1.15x the unsigned one.

--rss-sizes: afterwards, one cold -> warm preload of a checkpoint of each size (no cgroup), with its peak
RSS (GNU time's %M): the copy's memory is its buffers, whatever the checkpoint's size.
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
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _memcg import MemoryLimit, Run, device_of, run_counted  # noqa: E402
from _rounds import list_arg, machine_state, positive_size_arg, report, rounds, speedup, summary  # noqa: E402

from tiering.content.signature import generate_keypair  # noqa: E402
from tiering.content.units import format_bytes  # noqa: E402
from tiering.pagecache import drop_from_cache, residency  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402

NAME = "bench/model"
CASES = ("cp_sync", "weightd", "cp_sync_cg", "weightd_cg", "weightd_signed_cg")


def over(samples: dict[str, list[int]], of: str, vs: str, *, target_at_most: float | None = None) -> dict[str, Any]:
    """``of`` over ``vs`` (bytes counted in the same rounds): the ratio of medians with the range of the
    per-round ratios, in the common shape of speedup()."""
    a, b = samples[of], samples[vs]
    per = [x / y for x, y in zip(a, b) if y > 0]
    out: dict[str, Any] = {"of": of, "vs": vs, "rounds": len(per),
                           "per_round_min": round(min(per), 3) if per else None,
                           "per_round_max": round(max(per), 3) if per else None,
                           "ratio": round(statistics.median(a) / statistics.median(b), 3)
                           if b and statistics.median(b) > 0 else None}
    if target_at_most is not None:
        out["target_at_most"] = target_at_most
        out["met"] = None if out["ratio"] is None else out["ratio"] <= target_at_most
    return out


def peak_rss(py: str, cfg: Path, env: dict[str, str], base: Path, size: int, dev: tuple[int, int]) -> dict[str, Any]:
    """One cold -> warm preload of a fresh ``size`` checkpoint (the cold copy out of the page cache):
    its peak RSS and time; the checkpoint is removed afterwards."""
    name = f"bench/rss-{size}"
    src = make_checkpoint(base / "rss-src", total_bytes=size, shards=max(4, size >> 30), layers=16, seed="rss")
    try:
        subprocess.run([py, "-m", "weightd", "--config", str(cfg), "publish", str(src), "--name", name,
                        "--version", "v1"], check=True, env=env, stdout=subprocess.DEVNULL)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    cold = base / "cold" / name / "v1"
    try:
        for p in cold.rglob("*"):
            if p.is_file():
                drop_from_cache(p)
        r = run_counted(f"exec {py} -m weightd --config {cfg} --no-daemon preload {name}@v1 --tier warm --lease 0 "
                        "--json", dev, env)
        return {"bytes": size, "max_rss_bytes": r.max_rss_bytes, "seconds": round(r.seconds, 3),
                "process_read_x_checkpoint": round(r.proc_read_bytes / size, 3)}
    finally:
        subprocess.run([py, "-m", "weightd", "--config", str(cfg), "evict", name, "--force"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(base / "cold" / "bench" / f"rss-{size}", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=positive_size_arg, default="2GiB")
    ap.add_argument("--memory", type=positive_size_arg, default="384MiB", help="the memory cgroup's limit")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-spread", type=float, default=0.5)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--dir", default="/var/tmp", help="disk directory for the cold and warm tiers")
    ap.add_argument("--rss-sizes", type=list_arg(positive_size_arg), default=[],
                    help="checkpoint sizes to measure a preload's peak RSS at (e.g. 1GiB,8GiB)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: give at least 1")
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"--cases: unknown case {bad[0]!r} (one of {', '.join(CASES)})")
    probe = MemoryLimit(args.memory)
    probe.close()
    if not probe.active and any(c.endswith("_cg") for c in cases):
        print(json.dumps({"benchmark": "preload_cgroup", "error": f"no memory cgroup: {probe.why}"}))
        return 1
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-cgroup-", dir=args.dir))
    hot = Path(f"/dev/shm/weightd-bench-{uuid.uuid4().hex[:8]}")
    cfg = base / "weightd.toml"
    cfg.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "90%"\n'
                   f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "90%"\n[tiers.cold]\npath = "{base}/cold"\n')
    cfg_signed = base / "weightd-signed.toml"
    cfg_signed.write_text(cfg.read_text() + f'[trust]\nrequire_signature = true\npublic_keys = ["{base}/sign.pub.pem"]\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    py = sys.executable
    dst = base / "cp-warm"
    try:
        generate_keypair(base / "sign.pem", base / "sign.pub.pem")
        src = make_checkpoint(base / "src", total_bytes=args.size, shards=4, layers=16, seed="bench")
        subprocess.run([py, "-m", "weightd", "--config", str(cfg), "publish", str(src), "--name", NAME,
                        "--version", "v1", "--sign", str(base / "sign.pem")], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(src)
        cold = base / "cold" / NAME / "v1"
        files = [p for p in cold.rglob("*") if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        dev = device_of(base)
        runs: dict[str, list[Run]] = {c: [] for c in cases}
        left: list[float] = []

        def before(case: str) -> None:
            shutil.rmtree(dst, ignore_errors=True)
            subprocess.run([py, "-m", "weightd", "--config", str(cfg), "evict", f"{NAME}@v1", "--tier", "warm",
                            "--force"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for p in files:
                drop_from_cache(p)
            left.append(residency([str(cold)]).resident_bytes / total)

        def contender(case: str) -> Any:
            if case.startswith("cp_sync"):
                line = f"cp -r '{cold}' '{dst}' && sync"
            else:
                conf = cfg_signed if "signed" in case else cfg
                line = f"exec {py} -m weightd --config {conf} --no-daemon preload {NAME}@v1 --tier warm --lease 0 --json"

            def run() -> float:
                if case.endswith("_cg"):
                    with MemoryLimit(args.memory) as cg:
                        r = run_counted(cg.shell(line), dev, env)
                        r.cgroup_max_usage = cg.max_usage()
                else:
                    r = run_counted(line, dev, env)
                runs[case].append(r)
                return r.seconds
            return run

        m0 = machine_state()
        times = rounds({c: contender(c) for c in cases}, args.rounds, before=before, widen=args.max_spread,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
        m1 = machine_state()
        peak = {format_bytes(size): peak_rss(py, cfg, env, base, size, dev) for size in args.rss_sizes}
        read = {c: [r.read_bytes for r in runs[c]] for c in cases}
        written = {c: [r.written_bytes for r in runs[c]] for c in cases}
        proc_read = {c: [r.proc_read_bytes for r in runs[c]] for c in cases}
        sp = args.max_spread
        # bytes read: the device's sectors (diskstats: other work on the machine adds to them) and what the
        # command's own processes read from storage (ru_inblock), over cp's in the same rounds
        ratios: list[dict[str, Any]] = []
        for suffix in ("_cg", ""):
            w, cp = f"weightd{suffix}", f"cp_sync{suffix}"
            if w in cases and cp in cases:
                ratios.append(speedup(times, w, cp, max_spread=sp, target=1.0))
                # (named apart from the timed contenders: the table shows no seconds beside bytes)
                ratios.append(over({f"{k} device reads": v for k, v in read.items()}, f"{w} device reads",
                                   f"{cp} device reads", target_at_most=1.1))
                ratios.append(over({f"{k} process reads": v for k, v in proc_read.items()}, f"{w} process reads",
                                   f"{cp} process reads", target_at_most=1.1))
        if "weightd_cg" in cases and "weightd_signed_cg" in cases:
            ratios.append(speedup(times, "weightd_cg", "weightd_signed_cg", max_spread=sp, target_at_most=1.15))

        def per_case(c: str) -> dict[str, Any]:
            last = runs[c][-1]
            d: dict[str, Any] = {
                "read_x_checkpoint": summary([b / total for b in read[c]]),
                "written_x_checkpoint": summary([b / total for b in written[c]]),
                "process_read_x_checkpoint": summary([b / total for b in proc_read[c]]),
                "read_bytes": read[c], "written_bytes": written[c], "process_read_bytes": proc_read[c],
                "process_written_bytes": [r.proc_written_bytes for r in runs[c]],
                "max_rss_bytes": max(r.max_rss_bytes for r in runs[c]),
            }
            if c.endswith("_cg"):
                d["cgroup_max_usage_bytes"] = max(r.cgroup_max_usage or 0 for r in runs[c])
            if c.startswith("weightd"):
                try:
                    rep = json.loads(last.stdout)
                except ValueError:
                    rep = {}
                d["last_report"] = {k: rep.get(k) for k in ("seconds", "resident_percent", "warm_seconds",
                                                             "warm_skipped", "warm", "bytes_by_source")
                                    if k in rep}
            return d
        print(json.dumps(report(
            "preload_cgroup", times, ratios, rounds=args.rounds, max_spread=sp, machine=(m0, m1),
            bytes=total, files=len(files), memory_limit=args.memory, memory_limit_text=format_bytes(args.memory),
            device=f"{dev[0]}:{dev[1]}", source_resident_before_max=round(max(left), 4) if left else None,
            cases={c: per_case(c) for c in cases}, peak_rss=peak), indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(hot, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
