#!/usr/bin/env python3
"""50 concurrent preloads of one checkpoint through the daemon vs one in-process preload.

    .venv/bin/python bench/daemon.py [--size 1GiB] [--clients 50] [--rounds 5] [--tier warm]

The daemon is the real `weightd serve` subprocess; the clients are threads making real HTTP requests
on its unix socket (the same client the CLI uses), so the figure is the daemon's, not 50 interpreter
start-ups. Reported: wall-time ratio (target <= 1.2), bytes copied (must be exactly one checkpoint,
read from the daemon's own metrics), and the daemon's RSS sampled during the run (target < 150 MB).
The in-process preload and the clients alternate round by round in a rotating order, the copy
evicted before each (bench/_rounds.py: up to twice the rounds while a spread is wide, no ratio past
--max-spread); the JSON is in the common shape, with the machine's state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_state, report, rounds, speedup  # noqa: E402

from tiering.content.units import parse_size  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402
from weightd.client import DaemonClient  # noqa: E402
from weightd.config import load_config  # noqa: E402
from weightd.node.local import open_node  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", "--runs", dest="runs", type=int, default=5, help="rounds (each: one in-process "
                    "preload and the clients through the daemon, in a rotating order; up to twice as many while "
                    "a spread is wide)")
    ap.add_argument("--max-spread", type=float, default=0.5,
                    help="no ratio when a contender's interquartile range over its median exceeds it")
    ap.add_argument("--tier", default="warm", choices=["hot", "warm"])
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-daemon-", dir=args.dir))
    hot = Path(f"/dev/shm/weightd-bench-daemon-{uuid.uuid4().hex[:8]}")
    sock = base / "weightd.sock"
    port = free_port()
    cfg_path = base / "weightd.toml"
    cfg_path.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "90%"\n'
                        f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "90%"\n[tiers.cold]\npath = "{base}/cold"\n'
                        f'[api]\nsocket = "{sock}"\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
    cfg = load_config(cfg_path)
    daemon = None
    try:
        src = make_checkpoint(base / "src", total_bytes=parse_size(args.size), shards=4, layers=16, seed="d")
        with open_node(cfg) as node:
            node.publish(src, "bench/daemon", "v1")
        shutil.rmtree(src)

        def evict() -> None:
            with open_node(cfg) as node:
                try:
                    node.evict("bench/daemon", "v1", args.tier, force=True)
                except Exception:
                    pass

        sizes: list[int] = []

        def one_in_process() -> float:
            """The baseline: one in-process preload (the daemon idle meanwhile)."""
            with open_node(cfg) as node:
                t0 = time.perf_counter()
                r = node.preload("bench/daemon", "v1", tier=args.tier, lease_s=0)
                seconds = time.perf_counter() - t0
            sizes.append(r.bytes)
            return seconds

        daemon = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(cfg_path), "serve"], env=ENV,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = DaemonClient(sock)
        deadline = time.monotonic() + 30
        while not client.available():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the daemon did not start")
            time.sleep(0.1)

        def cold_bytes() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
                for line in resp.read().decode().splitlines():
                    if line.startswith('weightd_bytes_transferred_total{source="cold"}'):
                        return float(line.split()[-1])
            return 0.0

        moved: list[float] = []
        peak = [0.0]

        def clients_through_daemon() -> float:
            before = cold_bytes()
            stop = threading.Event()
            samples: list[float] = []

            def sample() -> None:
                while not stop.is_set():
                    samples.append(rss_mb(daemon.pid))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                reports = list(pool.map(lambda _: DaemonClient(sock).call(
                    "POST", "preload", {"ref": "bench/daemon@v1", "tier": args.tier, "lease_s": 0}), range(args.clients)))
            seconds = time.perf_counter() - t0
            stop.set()
            sampler.join()
            peak[0] = max(peak[0], max(samples, default=0.0))
            moved.append(cold_bytes() - before)
            assert all(rep["path"] == reports[0]["path"] for rep in reports)
            return seconds

        m0 = machine_state()
        times = rounds({"single_in_process": one_in_process, "clients_through_daemon": clients_through_daemon},
                       args.runs, before=lambda _: evict(), widen=args.max_spread,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
        m1 = machine_state()
        single, many, size = times["single_in_process"], times["clients_through_daemon"], sizes[0]
        print(json.dumps(report(
            "daemon", times, [speedup(times, "single_in_process", "clients_through_daemon",
                                      max_spread=args.max_spread, target_at_most=1.2)],
            rounds=args.runs, max_spread=args.max_spread, machine=(m0, m1), bytes=size, clients=args.clients,
            tier=args.tier, runs=args.runs,
            single_in_process_s=round(statistics.median(single), 3),
            clients_through_daemon_s=round(statistics.median(many), 3),
            ratio=round(statistics.median(many) / statistics.median(single), 3), target_ratio=1.2,
            bytes_copied_per_run=moved, exactly_one_checkpoint=all(m == size for m in moved),
            daemon_peak_rss_mb=round(peak[0], 1), target_rss_mb=150), indent=2))
        return 0
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(hot, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
