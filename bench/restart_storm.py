#!/usr/bin/env python3
"""The seed reports' multi-instance cold start: 4 servers load the same ~2 GiB checkpoint at once.

    .venv/bin/python bench/restart_storm.py [--size 2GiB] [--procs 4] [--bps 200MB] [--runs 2]

Each process runs `safetensors.torch.load_file` on every shard (needs the `torch` extra). Cases:
  (a) from the warm tier with the page cache dropped (what a fleet restart does today),
  (b) from the warm tier after `weightd warm`,
  (c) from the hot tier (/dev/shm).
This VM's disk is backed by host memory, so a cold read is nearly as fast as a cached one; as root,
the loaders (and the warming) run in a cgroup-v1 blkio child with `blkio.throttle.read_bps_device`
set to --bps, which emulates the contended device the seed reports describe. Reported: time until all
processes have loaded, per-process times, and the device's read await / utilisation during (a).
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tiering.content.units import parse_size  # noqa: E402
from tiering.pagecache import drop_from_cache  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
LOADER = """
import sys, time, glob
t0 = time.perf_counter()
from safetensors.torch import load_file
n = 0
for shard in sorted(glob.glob(sys.argv[1] + "/*.safetensors")):
    n += sum(t.numel() for t in load_file(shard).values())
print(time.perf_counter() - t0, n)
"""


class Throttle:
    """A blkio (cgroup v1) child that caps reads from one device; a no-op when not available."""

    def __init__(self, device: tuple[int, int], bps: int) -> None:
        self.path = Path(f"/sys/fs/cgroup/blkio/weightd-bench-{uuid.uuid4().hex[:8]}")
        self.active = False
        self.why = ""
        if os.geteuid() != 0:
            self.why = "not root"
            return
        if not Path("/sys/fs/cgroup/blkio").is_dir():
            self.why = "no cgroup v1 blkio controller"
            return
        try:
            self.path.mkdir()
            (self.path / "blkio.throttle.read_bps_device").write_text(f"{device[0]}:{device[1]} {bps}\n")
            self.active = True
        except OSError as exc:
            self.why = str(exc)

    def wrap(self, cmd: list[str]) -> list[str]:
        if not self.active:
            return cmd
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *cmd]

    def close(self) -> None:
        if self.active:
            try:
                self.path.rmdir()
            except OSError:
                pass


def diskstats(dev: tuple[int, int]) -> tuple[int, int, int]:
    with open("/proc/diskstats") as fh:
        for line in fh:
            f = line.split()
            if (int(f[0]), int(f[1])) == dev:
                return int(f[3]), int(f[6]), int(f[12])  # reads, ms reading, ms doing I/O
    return 0, 0, 0


def storm(path: Path, procs: int, throttle: Throttle) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    ps = [subprocess.Popen(throttle.wrap([sys.executable, "-c", LOADER, str(path)]), stdout=subprocess.PIPE,
                           text=True, env=ENV) for _ in range(procs)]
    outs = [p.communicate(timeout=900)[0] for p in ps]
    wall = time.perf_counter() - t0
    if any(p.returncode for p in ps):
        raise SystemExit(f"a loader failed: {[p.returncode for p in ps]}")
    return wall, [float(o.split()[0]) for o in outs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--bps", default="200MB", help="emulated device read bandwidth (bytes/s)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        print(json.dumps({"error": "needs torch: .venv/bin/pip install -e '.[torch]'"}))
        return 1
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-storm-", dir=args.dir))
    hot = Path(f"/dev/shm/weightd-bench-storm-{uuid.uuid4().hex[:8]}")
    cfg = base / "weightd.toml"
    cfg.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "90%"\n'
                   f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "90%"\n[tiers.cold]\npath = "{base}/cold"\n')
    wd = [sys.executable, "-m", "weightd", "--config", str(cfg)]
    st = os.stat(base)
    dev = (os.major(st.st_dev), os.minor(st.st_dev))
    throttle = Throttle(dev, parse_size(args.bps))
    try:
        src = make_checkpoint(base / "src", total_bytes=parse_size(args.size), shards=4, layers=16, seed="storm",
                              dtype="F16")
        subprocess.run([*wd, "publish", str(src), "--name", "bench/storm", "--version", "v1"], check=True, env=ENV,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(src)
        warm_path = Path(subprocess.run([*wd, "preload", "bench/storm@v1", "--tier", "warm", "--lease", "0"],
                                        check=True, env=ENV, capture_output=True, text=True).stdout.split()[-1])
        hot_path = Path(subprocess.run([*wd, "preload", "bench/storm@v1", "--tier", "hot", "--lease", "0"],
                                       check=True, env=ENV, capture_output=True, text=True).stdout.split()[-1])
        files = [p for p in warm_path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)

        res: dict[str, list[float]] = {"a_cold": [], "b_warmed": [], "c_hot": [], "b_warm_seconds": []}
        per: dict[str, list[list[float]]] = {"a_cold": [], "b_warmed": [], "c_hot": []}
        awaits, utils = [], []
        for _ in range(args.runs):
            for p in files:
                drop_from_cache(p)
            s0, t0 = diskstats(dev), time.perf_counter()
            wall, each = storm(warm_path, args.procs, throttle)
            s1, dt = diskstats(dev), time.perf_counter() - t0
            awaits.append((s1[1] - s0[1]) / max(1, s1[0] - s0[0]))
            utils.append(100 * (s1[2] - s0[2]) / (dt * 1000))
            res["a_cold"].append(wall)
            per["a_cold"].append(each)

            for p in files:
                drop_from_cache(p)
            t0 = time.perf_counter()
            subprocess.run(throttle.wrap([*wd, "warm", str(warm_path)]), check=True, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            res["b_warm_seconds"].append(time.perf_counter() - t0)
            wall, each = storm(warm_path, args.procs, throttle)
            res["b_warmed"].append(wall)
            per["b_warmed"].append(each)

            wall, each = storm(hot_path, args.procs, throttle)
            res["c_hot"].append(wall)
            per["c_hot"].append(each)
        med = {k: statistics.median(v) for k, v in res.items()}
        print(json.dumps({
            "benchmark": "restart_storm", "bytes": size, "processes": args.procs, "runs": args.runs,
            "emulated_device_read_bps": parse_size(args.bps) if throttle.active else None,
            "throttle": "cgroup v1 blkio.throttle.read_bps_device" if throttle.active else f"none ({throttle.why})",
            "all_loaded_s": {"a_cold_warm_tier": round(med["a_cold"], 3), "b_after_weightd_warm": round(med["b_warmed"], 3),
                             "c_hot_tier": round(med["c_hot"], 3)},
            "weightd_warm_s": round(med["b_warm_seconds"], 3),
            "speedup_vs_a": {"b": round(med["a_cold"] / med["b_warmed"], 2), "c": round(med["a_cold"] / med["c_hot"], 2),
                             "target": 2.0},
            "device_during_a": {"read_await_ms": round(statistics.median(awaits), 2),
                                "util_percent": round(statistics.median(utils), 1)},
            "per_process_s": per, "samples_s": res,
        }, indent=2))
        return 0
    finally:
        throttle.close()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(hot, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
