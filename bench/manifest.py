#!/usr/bin/env python3
"""Hashing at the device limit: `weightd manifest build` and `weightd verify` on cold files against the
best sequential reader of the same files (`cat`, `dd bs=16M`, `dd iflag=direct`, `fio --rw=read`);
and on cached files, the hashing engine against `xxhsum -H2`.

    .venv/bin/python bench/manifest.py [--size 2GiB] [--shards 8] [--rounds 5] [--dir DIR]

An HF-style checkpoint is generated; its manifest is written to DIR/.weightd/manifest.json once, so
`verify` has something to check. Cold: every file dropped from the page cache (POSIX_FADV_DONTNEED)
before every run, contenders interleaved round by round in a rotating order, weightd as the real
CLI (interpreter start included). Target (issue #20): build and verify >= 0.95x the best reader.
Cached: files read once before; in this process `build_manifest` (tensor ranges hashed on all
cores) against `xxhsum -H2` (one core, whole files); both CPU-bound (target 2.0 from issue #3).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import io_between, machine_state, rounds, size_arg, speedup, stamp, summary, timer  # noqa: E402

from tiering import build_manifest  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from tiering.pagecache import drop_from_cache  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
WD = [sys.executable, "-m", "weightd"]
READERS = ("cat", "dd_16M", "dd_direct", "fio_read")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=size_arg, default="2GiB")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", dest="rounds", type=int, help=argparse.SUPPRESS)   # (the old flag)
    ap.add_argument("--max-spread", type=float, default=0.25)
    ap.add_argument("--dir", help="where to generate the checkpoint (a disk, not tmpfs; default /var/tmp)")
    args = ap.parse_args()
    for tool in ("xxhsum", "dd", "cat", "fio"):
        if not shutil.which(tool):
            print(json.dumps({"error": f"{tool} is needed (make tools)"}))
            return 1
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-", dir=args.dir or "/var/tmp"))
    try:
        ckpt = make_checkpoint(base / "ckpt", total_bytes=parse_size(args.size), shards=args.shards,
                               layers=max(8, 2 * args.shards), seed="bench")
        files = sorted(str(p) for p in ckpt.rglob("*") if p.is_file())
        total = sum(os.path.getsize(f) for f in files)
        subprocess.run([*WD, "manifest", "build", str(ckpt)], env=ENV, check=True, stdout=subprocess.DEVNULL)
        q = " ".join(files)
        cold = {
            "weightd_manifest_build": timer(" ".join([*WD, "manifest", "build", str(ckpt), "-o", "/dev/null"])),
            "weightd_verify": timer(" ".join([*WD, "verify", str(ckpt)])),
            "cat": timer(f"cat {q} > /dev/null"),
            "dd_16M": timer(" && ".join(f"dd if={f} of=/dev/null bs=16M status=none" for f in files)),
            "dd_direct": timer(" && ".join(f"dd if={f} of=/dev/null bs=16M iflag=direct status=none"
                                                 for f in files)),
            # (fio refuses files under its block size: the few small json files are read by cat instead)
            "fio_read": timer("fio --rw=read --bs=1M --ioengine=psync --output=/dev/null "
                                    + " ".join(f"--name=f{i} --filename={f}" for i, f in enumerate(files)
                                               if os.path.getsize(f) >= 1 << 20)
                                    + " && cat " + " ".join(f for f in files if os.path.getsize(f) < 1 << 20)
                                    + " > /dev/null"),
        }

        def evict(_k: str) -> None:
            for f in files:
                drop_from_cache(f)
        m0 = machine_state()
        tc = rounds(cold, args.rounds, before=evict, log=lambda m: log(f"cold {m}"), widen=args.max_spread,
                    warmup=True)
        meds = {k: summary(v) for k, v in tc.items()}
        best = min(READERS, key=lambda k: meds[k]["median_s"])

        # cached: read everything once, then the engine (in this process) against xxhsum
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)

        def engine() -> float:
            t0 = time.perf_counter()
            build_manifest(ckpt)
            return time.perf_counter() - t0
        cached = {"build_manifest": engine, "xxhsum_H2": timer(f"xxhsum -H2 {q} > /dev/null"),
                  "weightd_manifest_build_cli": cold["weightd_manifest_build"]}
        th = rounds(cached, args.rounds, log=lambda m: log(f"cached {m}"), widen=args.max_spread)
        m1 = machine_state()
        print(json.dumps({
            "benchmark": "manifest", "date": stamp(), "bytes": total, "files": len(files), "rounds": args.rounds,
            "threads": os.cpu_count(), "max_spread": args.max_spread,
            "cold": {"contenders": {k: {**s, "gbps": round(total / s["median_s"] / 1e9, 3)} for k, s in meds.items()},
                     "best_reader": best,
                     "ratios": [{**speedup(tc, w, best, max_spread=args.max_spread), "target": 0.95}
                                for w in ("weightd_manifest_build", "weightd_verify")]},
            "cached": {"contenders": {k: {**summary(v), "gbps": round(total / summary(v)["median_s"] / 1e9, 3)}
                                      for k, v in th.items()},
                       "ratios": [{**speedup(th, "build_manifest", "xxhsum_H2", max_spread=args.max_spread),
                                   "target": 2.0}]},
            "samples_s": {"cold": tc, "cached": th},
            "machine": {"before": m0, "after": m1, "other_io_sectors": io_between(m0, m1)},
        }, indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
