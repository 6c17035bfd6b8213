#!/usr/bin/env python3
"""`weightd bench disk` against fio on the same file, in the same run.

    .venv/bin/python bench/disk.py [--dir /var/tmp] [--size 1GiB] [--seconds 3] [--rounds 5]

4 KiB random reads with O_DIRECT at queue depths 1, 4 and 16 (fio: psync engine, numjobs = depth,
which is what weightd does: one synchronous reader per slot), and 16 MiB sequential O_DIRECT reads.
Each round runs fio at every depth, fio sequential and weightd (all depths and sequential in one
run) in a rotating order (bench/_rounds.py: up to twice the rounds while a figure's spread is wide,
no ratio past --max-spread); medians; reported as weightd/fio ratios (the issue's target: within
20%), and in the common shape: fio's p50 over weightd's and fio's time per GiB over weightd's
(target >= 0.8), with the machine's state.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_state, report, rounds, speedup  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from weightd.node.diskbench import make_test_file  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
DEPTHS = (1, 4, 16)


def fio(path: Path, rw: str, bs: str, jobs: int, seconds: float | None) -> dict:
    cmd = ["fio", "--name=b", f"--filename={path}", f"--rw={rw}", f"--bs={bs}", "--direct=1", "--ioengine=psync",
           f"--numjobs={jobs}", "--group_reporting", "--output-format=json", "--randrepeat=0"]
    cmd += ["--time_based", f"--runtime={seconds}"] if seconds else [f"--size={path.stat().st_size}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    read = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    pct = read["clat_ns"]["percentile"]
    return {"p50_us": pct["50.000000"] / 1000, "p99_us": pct["99.000000"] / 1000, "iops": read["iops"],
            "bytes_per_s": read["bw_bytes"]}


def weightd(path: Path, seconds: float, config: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "weightd", "--config", str(config), "--no-daemon", "bench", "disk",
                          str(path), "--seconds", str(seconds), "--json", "--no-record",
                          "--depths", ",".join(map(str, DEPTHS))], capture_output=True, text=True, env=ENV, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", "--runs", dest="runs", type=int, default=5,
                    help="rounds (fio and weightd in each, rotating; up to twice as many while a spread is wide)")
    ap.add_argument("--max-spread", type=float, default=0.5,
                    help="no ratio when a figure's interquartile range over its median exceeds it")
    args = ap.parse_args()
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed: run scripts/install-tools.sh")
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-disk-", dir=args.dir))
    try:
        f = make_test_file(base, parse_size(args.size))
        cfg = base / "weightd.toml"
        cfg.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "/dev/shm/weightd-bench-disk-{os.getpid()}"\n'
                       f'[tiers.warm]\npath = "{base}/warm"\n[tiers.cold]\npath = "{base}/cold"\n')
        w: dict[str, list[dict]] = {str(d): [] for d in DEPTHS}
        fr: dict[str, list[dict]] = {str(d): [] for d in DEPTHS}
        wseq, fseq = [], []

        # in the common shape: latency (p50) and time per GiB (sequential) as "seconds", lower is better
        def fio_depth(d: int) -> dict[str, float]:
            r = fio(f, "randread", "4k", d, args.seconds)
            fr[str(d)].append(r)
            return {f"fio_qd{d}_p50": r["p50_us"] / 1e6}

        def fio_seq() -> dict[str, float]:
            fseq.append(fio(f, "read", "16m", 1, None)["bytes_per_s"])
            return {"fio_seq_s_per_gib": (1 << 30) / fseq[-1]}

        def weightd_all() -> dict[str, float]:
            r = weightd(f, args.seconds, cfg)
            for d in DEPTHS:
                w[str(d)].append(r["randread_4k"][str(d)])
            wseq.append(r["seqread_16m"]["bytes_per_s"])
            return {**{f"weightd_qd{d}_p50": r["randread_4k"][str(d)]["p50_us"] / 1e6 for d in DEPTHS},
                    "weightd_seq_s_per_gib": (1 << 30) / wseq[-1]}

        contenders = {**{f"fio_qd{d}": (lambda d=d: fio_depth(d)) for d in DEPTHS}, "fio_seq": fio_seq,
                      "weightd": weightd_all}
        m0 = machine_state()
        times = rounds(contenders, args.runs, widen=args.max_spread,
                       log=lambda m: print(m, file=sys.stderr, flush=True))

        def med(rows: list[dict], k: str) -> float:
            return round(statistics.median(x[k] for x in rows), 1)

        rnd = {}
        for d in map(str, DEPTHS):
            rnd[f"qd{d}"] = {
                "weightd": {k: med(w[d], k) for k in ("p50_us", "p99_us", "iops")},
                "fio": {k: med(fr[d], k) for k in ("p50_us", "p99_us", "iops")},
            }
            rnd[f"qd{d}"]["ratio"] = {k: round(rnd[f"qd{d}"]["weightd"][k] / rnd[f"qd{d}"]["fio"][k], 3)
                                      for k in ("p50_us", "p99_us", "iops")}
        seq = {"weightd_bytes_per_s": round(statistics.median(wseq)), "fio_bytes_per_s": round(statistics.median(fseq))}
        seq["ratio"] = round(seq["weightd_bytes_per_s"] / seq["fio_bytes_per_s"], 3)
        ratios = [speedup(times, f"weightd_qd{d}_p50", f"fio_qd{d}_p50", max_spread=args.max_spread, target=0.8)
                  for d in DEPTHS]
        ratios.append(speedup(times, "weightd_seq_s_per_gib", "fio_seq_s_per_gib", max_spread=args.max_spread,
                              target=0.8))
        m1 = machine_state()
        within = [abs(1 - v) <= 0.2 for x in rnd.values() for k, v in x["ratio"].items() if k != "p99_us"]
        print(json.dumps(report("disk", times, ratios, rounds=args.runs, max_spread=args.max_spread,
                                machine=(m0, m1), file_bytes=f.stat().st_size, runs=args.runs,
                                seconds_per_test=args.seconds, randread_4k=rnd, seqread_16m=seq,
                                p50_iops_seq_within_20pct=all(within) and abs(1 - seq["ratio"]) <= 0.2,
                                target="latency and throughput within 20% of fio's"), indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
