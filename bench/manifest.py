#!/usr/bin/env python3
"""Manifest build throughput vs `xxhsum -H2` (cached files) and vs `dd` (cold files).

    .venv/bin/python bench/manifest.py [--size 2GiB] [--shards 8] [--runs 3] [--dir DIR]

Generates an HF-style checkpoint, then alternates weightd and the baseline on the same files and
prints JSON with medians and ratios. Cached: files read once before, so both are CPU-bound; weightd
hashes tensor ranges on all cores. Cold: every file dropped from the page cache with
POSIX_FADV_DONTNEED before each run, so both are bound by the device.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiering import build_manifest  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from tiering.pagecache import drop_from_cache  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="where to generate the checkpoint (a disk, not tmpfs; default /var/tmp)")
    args = ap.parse_args()
    if not shutil.which("xxhsum") or not shutil.which("dd"):
        print(json.dumps({"error": "xxhsum and dd are needed (make tools)"}))
        return 1
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-", dir=args.dir or "/var/tmp"))
    try:
        ckpt = make_checkpoint(base / "ckpt", total_bytes=parse_size(args.size), shards=args.shards,
                               layers=max(8, 2 * args.shards), seed="bench")
        files = sorted(str(p) for p in ckpt.rglob("*") if p.is_file())
        total = sum(os.path.getsize(f) for f in files)

        def evict() -> None:
            for f in files:
                drop_from_cache(f)

        # cached: read everything once, then alternate
        run(["cat", *files])
        cached_w, cached_x = [], []
        for _ in range(args.runs):
            cached_w.append(timed(lambda: build_manifest(ckpt)))
            cached_x.append(timed(lambda: run(["xxhsum", "-H2", *files])))
        # the CLI end to end, interpreter start included (for reference, not the ratio)
        cli = [timed(lambda: run([sys.executable, "-m", "weightd", "manifest", "build", str(ckpt), "-o", "/dev/null"]))
               for _ in range(args.runs)]
        # cold: drop from the cache before every run
        cold_w, cold_d = [], []
        for _ in range(args.runs):
            evict()
            cold_w.append(timed(lambda: build_manifest(ckpt)))
            evict()
            cold_d.append(timed(lambda: [run(["dd", f"if={f}", "of=/dev/null", "bs=16M"]) for f in files]))

        def gbps(samples: list[float]) -> float:
            return round(total / statistics.median(samples) / 1e9, 3)

        result = {
            "benchmark": "manifest",
            "bytes": total, "files": len(files), "runs": args.runs, "threads": os.cpu_count(),
            "cached": {"weightd_gbps": gbps(cached_w), "xxhsum_H2_gbps": gbps(cached_x),
                       "ratio": round(statistics.median(cached_x) / statistics.median(cached_w), 3),
                       "target": 2.0, "weightd_cli_wall_gbps": gbps(cli)},
            "cold": {"weightd_gbps": gbps(cold_w), "dd_gbps": gbps(cold_d),
                     "ratio": round(statistics.median(cold_d) / statistics.median(cold_w), 3), "target": 0.9},
            "samples_s": {"cached_weightd": cached_w, "cached_xxhsum": cached_x, "cold_weightd": cold_w,
                          "cold_dd": cold_d, "cli": cli},
        }
        print(json.dumps(result, indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
