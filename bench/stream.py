#!/usr/bin/env python3
"""What the progress stream costs: a preload through a real daemon, streamed (NDJSON progress every
0.5 s, what the CLI uses) against the same preload answered as one JSON document (the baseline),
interleaved round by round.

    .venv/bin/python bench/stream.py [--size 1GiB] [--rounds 5] [--tier hot|warm]

Each round evicts the copy and preloads it again from cold (the cold copy stays in the page cache:
this measures the daemon's path, not the disk). The two alternate in a rotating order for --rounds
rounds (more, up to twice, while either's spread is wide; no ratio past --max-spread). Prints JSON
in bench/_rounds.py's common shape: medians, ranges, the machine's state, and the ratio streamed /
plain (1.0 = free; target <= 1.05).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_state, report, rounds, speedup  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402
from weightd.client import DaemonClient, DaemonError  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GiB")
    ap.add_argument("--rounds", "--runs", dest="rounds", type=int, default=5,
                    help="rounds (both contenders in each; up to twice as many while a spread is wide)")
    ap.add_argument("--max-spread", type=float, default=0.5,
                    help="no ratio when a contender's interquartile range over its median exceeds it")
    ap.add_argument("--tier", choices=["hot", "warm"], default="hot")
    a = ap.parse_args()
    size = parse_size(a.size)
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-stream-"))
    hot = Path(tempfile.mkdtemp(prefix="weightd-bench-stream-", dir="/dev/shm"))
    daemon = None
    try:
        cfg = base / "weightd.toml"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}/t"\ncapacity = "{2 * size}"\n'
                       f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "{2 * size}"\n[tiers.cold]\npath = "{base}/cold"\n'
                       f'[api]\nsocket = "{base}/state/weightd.sock"\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        env = {**os.environ, "WEIGHTD_CONFIG": str(cfg)}
        wd = [sys.executable, "-m", "weightd", "--config", str(cfg)]
        src = make_checkpoint(base / "src", total_bytes=size, shards=8, layers=16, seed="stream")
        subprocess.run([*wd, "publish", str(src), "--name", "bench/stream", "--version", "v1"], check=True,
                       stdout=subprocess.DEVNULL, env=env, cwd=ROOT)
        daemon = subprocess.Popen([*wd, "serve"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        client = DaemonClient(base / "state/weightd.sock")
        deadline = time.monotonic() + 60
        while not client.available():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the daemon did not come up")
            time.sleep(0.2)
        lines = [0]
        body = {"ref": "bench/stream@v1", "tier": a.tier, "strict": True, "lease_s": 0}

        def evict(_name: str) -> None:
            try:
                client.evict("bench/stream@v1", force=True)
            except DaemonError:  # (not there yet: the first round)
                pass

        def preload(kind: str) -> float:
            t0 = time.perf_counter()
            if kind == "plain":
                rep = client.call("POST", "preload", body, timeout=600)
            else:
                rep = client.stream("preload", body, lambda snap: lines.__setitem__(0, lines[0] + 1))
            seconds = time.perf_counter() - t0
            assert rep["bytes_by_source"]["cold"] == rep["bytes"], rep
            return seconds

        m0 = machine_state()
        times = rounds({"plain": lambda: preload("plain"), "streamed": lambda: preload("streamed")}, a.rounds,
                       before=evict, widen=a.max_spread,
                       log=lambda m: print(m, file=sys.stderr, flush=True))
        med = {k: statistics.median(v) for k, v in times.items()}
        m1 = machine_state()
        # streamed / plain: how many times slower streaming is (1.0 = free)
        print(json.dumps(report(
            "stream", times, [speedup(times, "plain", "streamed", max_spread=a.max_spread, target_at_most=1.05)],
            rounds=a.rounds, max_spread=a.max_spread, machine=(m0, m1), bytes=size, tier=a.tier,
            plain_s=round(med["plain"], 3), plain_range_s=[round(min(times["plain"]), 3), round(max(times["plain"]), 3)],
            streamed_s=round(med["streamed"], 3),
            streamed_range_s=[round(min(times["streamed"]), 3), round(max(times["streamed"]), 3)],
            ratio_streamed_over_plain=round(med["streamed"] / med["plain"], 3),
            progress_lines=lines[0], gbps_plain=round(size / med["plain"] / 1e9, 3)), indent=2))
        return 0
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(hot, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
