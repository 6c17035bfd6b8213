#!/usr/bin/env python3
"""Page-cache warming vs `vmtouch -t`, `cat` and `dd iflag=direct`; residency vs `vmtouch`; peak RSS.

    .venv/bin/python bench/warm.py [--size 2GiB] [--files 4] [--rss-size 4GiB] [--runs 3] [--dir /var/tmp]

Every warming run starts from files dropped from the page cache (POSIX_FADV_DONTNEED, what
`weightd cool` does); weightd, vmtouch, cat and dd alternate on the same files. weightd runs as the
real CLI (`weightd warm`), interpreter start included.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tiering.content.units import parse_size  # noqa: E402
from tiering.pagecache import drop_from_cache, residency  # noqa: E402

WD = [sys.executable, "-m", "weightd"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def write_random(path: Path, size: int) -> None:
    block = random.Random(7).randbytes(1 << 20)
    with open(path, "wb") as fh:
        for i in range(size >> 20):
            fh.write(i.to_bytes(8, "little") + block[8:])
    drop_from_cache(path)


def timed(cmd: list[str] | str, shell: bool = False) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, shell=shell, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rss-size", default="4GiB")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    for tool in ("vmtouch", "dd", "cat"):
        if not shutil.which(tool):
            print(json.dumps({"error": f"{tool} is needed (make tools)"}))
            return 1
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-warm-", dir=args.dir))
    try:
        per = parse_size(args.size) // args.files
        files = [base / f"shard-{i}.bin" for i in range(args.files)]
        for f in files:
            write_random(f, per)
        names = [str(f) for f in files]
        total = per * args.files

        def cool() -> None:
            for f in files:
                drop_from_cache(f)

        t: dict[str, list[float]] = {k: [] for k in ("weightd", "vmtouch", "cat", "dd_direct")}
        for _ in range(args.runs):
            cool()
            t["weightd"].append(timed([*WD, "warm", *names]))
            cool()
            t["vmtouch"].append(timed(["vmtouch", "-t", "-q", *names]))
            cool()
            t["cat"].append(timed("cat " + " ".join(names) + " > /dev/null", shell=True))
            cool()
            t["dd_direct"].append(timed(" && ".join(f"dd if={n} of=/dev/null bs=16M iflag=direct status=none"
                                                    for n in names), shell=True))
        med = {k: statistics.median(v) for k, v in t.items()}

        # residency of the same (now cached) set: the CLI end to end, the library call, vmtouch
        subprocess.run(["cat", *names], stdout=subprocess.DEVNULL, check=True)
        r: dict[str, list[float]] = {"weightd_cli": [], "weightd_call": [], "vmtouch": []}
        for _ in range(max(5, args.runs)):
            r["weightd_cli"].append(timed([*WD, "residency", *names]))
            t0 = time.perf_counter()
            residency(names)
            r["weightd_call"].append(time.perf_counter() - t0)
            r["vmtouch"].append(timed(["vmtouch", *names]))
        rmed = {k: statistics.median(v) for k, v in r.items()}

        # peak RSS of `weightd warm` on one large file
        big = base / "big.bin"
        write_random(big, parse_size(args.rss_size))
        out = subprocess.run(["/usr/bin/time", "-f", "%M", *WD, "warm", str(big)], capture_output=True, text=True,
                             env=ENV, check=True)
        peak_kb = int(out.stderr.strip().splitlines()[-1])
        big_resident = residency([big]).percent

        def gbps(k: str) -> float:
            return round(total / med[k] / 1e9, 3)

        print(json.dumps({
            "benchmark": "warm", "bytes": total, "files": len(files), "runs": args.runs,
            "warm": {"weightd_gbps": gbps("weightd"), "vmtouch_t_gbps": gbps("vmtouch"), "cat_gbps": gbps("cat"),
                     "dd_direct_gbps": gbps("dd_direct"),
                     "ratio_vs_vmtouch": round(med["vmtouch"] / med["weightd"], 3), "target_vs_vmtouch": 1.2,
                     "ratio_vs_dd_direct": round(med["dd_direct"] / med["weightd"], 3), "target_vs_dd": 0.9,
                     "ratio_vs_cat": round(med["cat"] / med["weightd"], 3)},
            "residency": {"weightd_cli_s": round(rmed["weightd_cli"], 4), "weightd_call_s": round(rmed["weightd_call"], 6),
                          "vmtouch_s": round(rmed["vmtouch"], 4),
                          "ratio_cli_vs_vmtouch": round(rmed["vmtouch"] / rmed["weightd_cli"], 3),
                          "ratio_call_vs_vmtouch": round(rmed["vmtouch"] / rmed["weightd_call"], 1), "target": 5.0},
            "rss": {"file_bytes": parse_size(args.rss_size), "peak_rss_mb": round(peak_kb / 1024, 1),
                    "target_mb": 200, "resident_after_percent": round(big_resident, 1)},
            "samples_s": {**t, **{f"residency_{k}": v for k, v in r.items()}},
        }, indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
