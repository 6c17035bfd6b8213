#!/usr/bin/env python3
"""Page-cache warming at the device limit: `weightd warm` against `cat`, `dd iflag=direct`, `vmtouch -t`
and `fio --rw=read` on the same cold files, on the raw device and under cgroup-v1 blkio read caps.

    .venv/bin/python bench/warm.py [--size 2GiB] [--files 4] [--caps 0,1GB,200MB] [--rounds 5] [--explore]

Every run starts from files dropped from the page cache (POSIX_FADV_DONTNEED, what `weightd cool`
does); the contenders are interleaved round by round in a rotating order. weightd runs as the real
CLI (`weightd warm FILES`), interpreter start included, as an operator runs it. Under a cap (root
only) every contender runs inside the same blkio child (`blkio.throttle.read_bps_device`), with a set
sized to take about --cap-seconds at the cap (the raw set's first files). Reported per condition: each
contender's median and min-max, weightd's ratio to the best of the others (target >= 0.95) and, under
a cap, weightd's throughput over the cap (target >= 0.95).

`--explore` measures what each choice inside `weightd warm` costs (window size, files in flight,
read-ahead hints, the back-off's probe, the residency pre-check), in this process through
`tiering.pagecache.warming.warm(..., tuning=Tuning(...))`, against `dd iflag=direct` in the same rounds,
and the CLI's fixed cost (`weightd warm` on files already resident). docs/benchmarks.md has the table.

Peak RSS of `weightd warm` on one --rss-size file is measured once (`/usr/bin/time`; target < 200 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _blkio import Throttle  # noqa: E402
from _rounds import io_between, list_arg, machine_state, rounds, size_arg, speedup, stamp, summary, timer  # noqa: E402

from tiering.content.units import parse_size  # noqa: E402
from tiering.pagecache import drop_from_cache, residency  # noqa: E402
from tiering.pagecache.warming import Tuning, warm  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
WD = [sys.executable, "-m", "weightd"]
BASELINES = ("cat", "dd_direct", "vmtouch_t", "fio_read")


def write_random(path: Path, size: int) -> None:
    block = random.Random(7).randbytes(1 << 20)
    with open(path, "wb") as fh:
        for i in range(size >> 20):
            fh.write(i.to_bytes(8, "little") + block[8:])
        os.fsync(fh.fileno())
    drop_from_cache(path)


def commands(names: list[str]) -> dict[str, str]:
    q = " ".join(names)
    return {
        "weightd": " ".join([*WD, "warm", q]),
        "cat": f"cat {q} > /dev/null",
        "dd_direct": " && ".join(f"dd if={n} of=/dev/null bs=16M iflag=direct status=none" for n in names),
        "vmtouch_t": f"vmtouch -t -q {q}",
        # one job per file, all at once (fio's own way of reading a set), buffered like the others
        "fio_read": "fio --rw=read --bs=1M --ioengine=psync --output=/dev/null "
                    + " ".join(f"--name=f{i} --filename={n}" for i, n in enumerate(names)),
    }


def condition(files: list[Path], throttle: Throttle | None, n: int, max_spread: float,
              log: Callable[[str], None]) -> dict[str, Any]:
    names = [str(f) for f in files]
    total = sum(f.stat().st_size for f in files)
    wrap = (lambda line: throttle.shell(line)) if throttle is not None else (lambda line: line)
    contenders = {k: timer(wrap(v)) for k, v in commands(names).items()}

    def cool(_k: str) -> None:
        for f in files:
            drop_from_cache(f)
    m0 = machine_state()
    times = rounds(contenders, n, before=cool, log=log, widen=max_spread, warmup=True)
    m1 = machine_state()
    meds = {k: summary(v) for k, v in times.items()}
    best = min(BASELINES, key=lambda k: meds[k]["median_s"])
    out: dict[str, Any] = {
        "bytes": total, "files": len(files),
        "contenders": {k: {**s, "gbps": round(total / s["median_s"] / 1e9, 3)} for k, s in meds.items()},
        "best_baseline": best,
        "ratios": [{**speedup(times, "weightd", best, max_spread=max_spread), "target": 0.95}]
        + [speedup(times, "weightd", k, max_spread=max_spread) for k in BASELINES if k != best],
        "samples_s": times,
        "machine": {"before": m0, "after": m1, "other_io_sectors": io_between(m0, m1)},
    }
    if throttle is not None and throttle.active:
        out["cap_bps"] = throttle.bps
        out["weightd_over_cap"] = round(total / meds["weightd"]["median_s"] / throttle.bps, 3)
        out["weightd_over_cap_range"] = [round(total / meds["weightd"]["max_s"] / throttle.bps, 3),
                                         round(total / meds["weightd"]["min_s"] / throttle.bps, 3)]
        out["target_over_cap"] = 0.95
    return out


def explore(files: list[Path], n: int, max_spread: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Each choice inside warming, one at a time from the defaults, in this process; dd as the yardstick."""
    names = [str(f) for f in files]
    d = Tuning()
    variants: dict[str, tuple[Tuning, int]] = {
        "default (16 MiB windows, 2 files, sequential hint, pre-check, probe)": (d, 2),
        "window 4 MiB": (Tuning(window=4 << 20), 2),
        "window 64 MiB": (Tuning(window=64 << 20), 2),
        "1 file in flight": (d, 1),
        "4 files in flight": (d, 4),
        "no read-ahead hint": (Tuning(hint="none"), 2),
        "WILLNEED on the next window": (Tuning(hint="willneed"), 2),
        "no residency pre-check": (Tuning(precheck=False), 2),
        "no latency probe (no back-off)": (Tuning(probe=False), 2),
    }

    def lib(t: Tuning, c: int) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            warm(names, concurrency=c, tuning=t)
            return time.perf_counter() - t0
        return run
    contenders: dict[str, Callable[[], float]] = {k: lib(*v) for k, v in variants.items()}
    contenders["dd_direct"] = timer(commands(names)["dd_direct"])
    contenders["weightd warm (CLI)"] = timer(commands(names)["weightd"])

    def cool(_k: str) -> None:
        for f in files:
            drop_from_cache(f)
    times = rounds(contenders, n, before=cool, log=log, widen=max_spread)
    # the CLI's fixed cost: the same command on files already resident (nothing to read)
    subprocess.run(["cat", *names], stdout=subprocess.DEVNULL, check=True)
    fixed = rounds({"weightd warm, all resident": timer(commands(names)["weightd"])}, n)
    total = sum(f.stat().st_size for f in files)
    rows = [{"variant": k, **summary(v), "gbps": round(total / summary(v)["median_s"] / 1e9, 3),
             "vs_dd_direct": speedup(times, k, "dd_direct", max_spread=max_spread)}
            for k, v in times.items() if k != "dd_direct"]
    return {"bytes": total, "rows": rows, "dd_direct": summary(times["dd_direct"]),
            "cli_fixed_cost": summary(fixed["weightd warm, all resident"]), "samples_s": {**times, **fixed}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=size_arg, default="2GiB", help="the raw set (split into --files files)")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--caps", type=list_arg(size_arg), default="0,1GB,200MB", help="conditions: 0 = the raw device, else a blkio read cap")
    ap.add_argument("--cap-seconds", type=float, default=2.5, help="under a cap, a set taking about this long")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", dest="rounds", type=int, help=argparse.SUPPRESS)   # (the old flag)
    ap.add_argument("--max-spread", type=float, default=0.25)
    ap.add_argument("--explore", action="store_true", help="also measure each choice inside warming")
    ap.add_argument("--rss-size", type=size_arg, default="4GiB", help="file for the peak-RSS check (0 = skip)")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    for tool in ("vmtouch", "dd", "cat", "fio"):
        if not shutil.which(tool):
            print(json.dumps({"error": f"{tool} is needed (make tools)"}))
            return 1
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-warm-", dir=args.dir))
    throttles: list[Throttle] = []
    try:
        per = parse_size(args.size) // args.files
        files = [base / f"shard-{i}.bin" for i in range(args.files)]
        for f in files:
            write_random(f, per)
        out: dict[str, Any] = {"benchmark": "warm", "date": stamp(), "rounds": args.rounds,
                               "max_spread": args.max_spread, "conditions": {}}
        for cap in args.caps:
            if cap == 0:
                out["conditions"]["raw"] = condition(files, None, args.rounds, args.max_spread,
                                                     lambda m: log(f"raw {m}"))
                continue
            th = Throttle.for_path(base, cap)
            throttles.append(th)
            label = f"cap {cap / 1e6:.0f} MB/s"
            if not th.active:
                out["conditions"][label] = {"skipped": th.why}
                continue
            want = int(cap * args.cap_seconds)
            subset = files[:max(1, min(len(files), -(-want // per)))]
            out["conditions"][label] = condition(subset, th, args.rounds, args.max_spread,
                                                 lambda m, lb=label: log(f"{lb} {m}"))
        if args.explore:
            out["explore"] = explore(files, args.rounds, args.max_spread, lambda m: log(f"explore {m}"))
        if parse_size(args.rss_size):
            big = base / "big.bin"
            write_random(big, parse_size(args.rss_size))
            p = subprocess.run(["/usr/bin/time", "-f", "%M", *WD, "warm", str(big)], capture_output=True, text=True,
                               env=ENV, check=True)
            out["rss"] = {"file_bytes": parse_size(args.rss_size),
                          "peak_rss_mb": round(int(p.stderr.strip().splitlines()[-1]) / 1024, 1), "target_mb": 200,
                          "resident_after_percent": round(residency([big]).percent, 1)}
        print(json.dumps(out, indent=2))
        return 0
    finally:
        for th in throttles:
            th.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
