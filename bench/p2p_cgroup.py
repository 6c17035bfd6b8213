#!/usr/bin/env python3
"""A P2P download where the page cache cannot hold the checkpoint: a worker daemon in a memory cgroup
smaller than the checkpoint, with the device's own counters, against the same download without it.

    .venv/bin/python bench/p2p_cgroup.py [--size 1GiB] [--memory 256MiB] [--rounds 3] [--dir /var/tmp]

An origin daemon on 127.0.0.2 (outside any cgroup) seeds the published version from cold storage (a
directory on the disk under --dir), its copy read into its page cache before each run (untimed), so the
origin reads nothing from the device. Each run starts a fresh worker daemon on 127.0.0.3 (warm tier on
the same disk; the origin as its only peer and the only address it lets in), untimed, then times
`weightd preload NAME@V --tier warm --json` through that daemon (the real CLI, interpreter start
included), with the device's sectors read and written (/proc/diskstats) from its start until everything
it wrote is on the device (a `sync` before and after, the last untimed) and the worker daemon's own
storage I/O (/proc/PID/io read_bytes and write_bytes, plus the CLI's: what the worker itself read from
and dirtied for the device, which the shared machine's other work does not add to). Contenders:

  p2p_cg   the worker daemon and the CLI each started inside a fresh cgroup-v1 memory child limited to
           --memory (the daemon's command wrapped, so the process itself and every page it reads or
           writes are charged to it)
  p2p      the same without the cgroup (the baseline)

interleaved for --rounds rounds (bench/_rounds.py). Reported per contender: what was read and written
as multiples of the checkpoint (device and worker process), the preload's report (bytes by source,
warming, whether the node read the download back), and the time of p2p_cg over p2p. Targets (issue
#35): in the cgroup, read <= 0.1x and write <= 1.05x the checkpoint, time <= 1.1x the baseline's. The
version is unsigned and its torrent, made at publish, is bound to the manifest: libtorrent's SHA-256
piece checks are the check and nothing is read back (``read_back`` false; a signed version, or a torrent
made by another tool, is read back once: about 1.0x more).
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _memcg import MemoryLimit, Run, device_of, run_counted  # noqa: E402
from _rounds import machine_state, positive_size_arg, report, rounds, speedup, summary  # noqa: E402
from preload_cgroup import over  # noqa: E402
from swarm import ENV, Daemon, free_port  # noqa: E402

from tiering.content.units import format_bytes  # noqa: E402
from tiering.pagecache import residency  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402

NAME, VERSION = "bench/p2p-cgroup", "v1"
ORIGIN_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
CASES = ("p2p", "p2p_cg")


class Worker(Daemon):
    """A worker daemon started with its command wrapped (``MemoryLimit.wrap``: inside the cgroup from
    its first instruction); stopped, and its logs kept, as :class:`swarm.Daemon`."""

    def __init__(self, base: Path, cold: Path, origin: Daemon, cg: MemoryLimit | None) -> None:
        import uuid
        self.ip, self.role = WORKER_IP, "worker"
        self.dir = base / f"worker-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir(parents=True)
        self.hot = Path(f"/dev/shm/weightd-bench-p2pcg-{uuid.uuid4().hex[:8]}")
        self.port, self.mport = free_port(WORKER_IP), free_port(WORKER_IP)
        self.config = self.dir / "weightd.toml"
        self.config.write_text(
            f'state_dir = "{self.dir}/state"\n[tiers.hot]\npath = "{self.hot}"\ncapacity = "1GiB"\n'
            f'[tiers.warm]\npath = "{self.dir}/warm"\ncapacity = "90%"\n[tiers.cold]\npath = "{cold}"\n'
            f'[api]\nsocket = "{self.dir}/weightd.sock"\n[metrics]\nlisten = "{WORKER_IP}:{self.mport}"\n'
            f'[p2p]\nthreshold = "1MiB"\nlisten = "{WORKER_IP}:{self.port}"\nallow = ["{ORIGIN_IP}/32"]\n'
            f'peers = ["{ORIGIN_IP}:{origin.port}"]\nfallback_after_s = 120\n')
        cmd = [sys.executable, "-m", "weightd", "--config", str(self.config), "serve", "--role", "worker"]
        self.log = open(self.dir / "log", "w")
        self.proc = subprocess.Popen(cg.wrap(cmd) if cg is not None else cmd, stdout=self.log,
                                     stderr=subprocess.STDOUT, env=ENV)
        deadline = time.monotonic() + 60
        while not (self.dir / "weightd.sock").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker daemon did not start: {(self.dir / 'log').read_text()[-2000:]}")
            time.sleep(0.1)

    def io(self) -> dict[str, int]:
        """The daemon's storage I/O so far (/proc/PID/io: read_bytes, write_bytes)."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/io").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("read_bytes", "write_bytes"):
                out[key] = int(value)
        return out


def publish(base: Path, cold: Path, size: int) -> int:
    """A fresh checkpoint of ``size`` published to ``cold`` with a torrent; its bytes."""
    src = make_checkpoint(base / "src", total_bytes=size, shards=4, layers=8, seed="p2p-cgroup")
    cfg = base / "publish.toml"
    cfg.write_text(f'state_dir = "{base}/pubstate"\n[tiers.cold]\npath = "{cold}"\n'
                   f'[tiers.hot]\npath = "/dev/shm/weightd-bench-p2pcg-pub-{os.getpid()}"\n'
                   f'[tiers.warm]\npath = "{base}/pubwarm"\n[p2p]\nthreshold = "1MiB"\n')
    try:
        pub = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "--no-daemon", "publish",
                              str(src), "--name", NAME, "--version", VERSION, "--json"],
                             capture_output=True, text=True, env=ENV)
        if pub.returncode != 0:
            raise SystemExit(f"publish failed: {pub.stderr[-500:]}")
        return int(json.loads(pub.stdout)["bytes"])
    finally:
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(f"/dev/shm/weightd-bench-p2pcg-pub-{os.getpid()}", ignore_errors=True)


def cache_source(cold: Path) -> float:
    """The origin's copy read into the page cache (outside any cgroup); the share resident after."""
    files = [p for p in (cold / NAME / VERSION).rglob("*") if p.is_file()]
    for p in files:
        with open(p, "rb") as fh:
            while fh.read(8 << 20):
                pass
    total = sum(p.stat().st_size for p in files)
    return residency([str(cold / NAME / VERSION)]).resident_bytes / total if total else 1.0


def one_run(case: str, base: Path, cold: Path, origin: Daemon, memory: int, dev: tuple[int, int]) -> dict[str, Any]:
    """A fresh worker (in a fresh cgroup for ``*_cg``) and one preload through it, counted."""
    cg = MemoryLimit(memory) if case.endswith("_cg") else None
    worker = None
    try:
        worker = Worker(base, cold, origin, cg)
        line = (f"exec {sys.executable} -m weightd --config {worker.config} preload {NAME}@{VERSION} "
                "--tier warm --json")
        io0 = worker.io()
        r: Run = run_counted(cg.shell(line) if cg is not None else line, dev, ENV)
        io1 = worker.io()
        # the worker's own storage I/O: its daemon's (/proc/PID/io) and the CLI's (wait4's ru_inblock and
        # ru_oublock), whatever else the shared machine's disk does meanwhile
        return {"run": r, "worker_read": io1["read_bytes"] - io0["read_bytes"] + r.proc_read_bytes,
                "worker_written": io1["write_bytes"] - io0["write_bytes"] + r.proc_written_bytes,
                "cgroup_max_usage": cg.max_usage() if cg is not None else None}
    finally:
        if worker is not None:
            worker.stop()
            shutil.rmtree(worker.dir, ignore_errors=True)
        if cg is not None:
            cg.close()


def per_case(runs: list[dict[str, Any]], total: int) -> dict[str, Any]:
    def x(key: str) -> dict[str, float]:
        return summary([r[key] / total for r in runs])
    for r in runs:
        r["read"], r["written"] = r["run"].read_bytes, r["run"].written_bytes
    try:
        rep = json.loads(runs[-1]["run"].stdout)
    except ValueError:
        rep = {}
    swarm = rep.get("swarm") or {}
    return {"read_x_checkpoint": x("read"), "written_x_checkpoint": x("written"),
            "worker_read_x_checkpoint": x("worker_read"), "worker_written_x_checkpoint": x("worker_written"),
            "read_bytes": [r["read"] for r in runs], "written_bytes": [r["written"] for r in runs],
            "worker_read_bytes": [r["worker_read"] for r in runs],
            "worker_written_bytes": [r["worker_written"] for r in runs],
            "cgroup_max_usage_bytes": max((r["cgroup_max_usage"] or 0 for r in runs), default=0) or None,
            "last_report": {k: rep.get(k) for k in ("seconds", "bytes_by_source", "resident_percent", "warm",
                                                    "warm_skipped", "warm_seconds") if k in rep}
            | {"read_back": swarm.get("read_back")}}


def byte_ratios(runs: dict[str, list[dict[str, Any]]], total: int) -> list[dict[str, Any]]:
    """Bytes read and written in the cgroup over the checkpoint's, in the common shape (the table of
    bench/all.py shows them): counted at the device (other work on the machine adds to it) and by the
    worker's own processes."""
    out = []
    for what, key, bound in (("device reads", "read", 0.1), ("device writes", "written", 1.05),
                             ("worker reads", "worker_read", 0.1), ("worker writes", "worker_written", 1.05)):
        got = [r[key] for r in runs["p2p_cg"]]
        out.append(over({f"p2p_cg {what}": got, "checkpoint": [total] * len(got)}, f"p2p_cg {what}", "checkpoint",
                        target_at_most=bound))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=positive_size_arg, default="1GiB")
    ap.add_argument("--memory", type=positive_size_arg, default="256MiB", help="the worker's memory cgroup limit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-spread", type=float, default=0.5)
    ap.add_argument("--dir", default="/var/tmp", help="disk directory for cold storage and the worker's warm tier")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: give at least 1")
    probe = MemoryLimit(args.memory)
    probe.close()
    if not probe.active:
        print(json.dumps({"benchmark": "p2p_cgroup", "error": f"no memory cgroup: {probe.why}"}))
        return 1
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-p2pcg-", dir=args.dir))
    origin = None
    try:
        cold = base / "cold"
        total = publish(base, cold, args.size)
        dev = device_of(base)
        origin = Daemon(base, ORIGIN_IP, cold, "0", "origin", None, f'"{WORKER_IP}/32"')
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CASES}
        cached: list[float] = []

        def contender(case: str) -> Any:
            def run() -> float:
                r = one_run(case, base, cold, origin, args.memory, dev)
                runs[case].append(r)
                return r["run"].seconds
            return run

        m0 = machine_state()
        times = rounds({c: contender(c) for c in CASES}, args.rounds,
                       before=lambda _: cached.append(cache_source(cold)),
                       log=lambda m: print(m, file=sys.stderr, flush=True))
        m1 = machine_state()
        cases = {c: per_case(runs[c], total) for c in CASES}   # (sets each run's "read" and "written")
        ratios = [speedup(times, "p2p", "p2p_cg", max_spread=args.max_spread, target_at_most=1.1),
                  *byte_ratios(runs, total)]
        print(json.dumps(report(
            "p2p_cgroup", times, ratios, rounds=args.rounds, max_spread=args.max_spread, machine=(m0, m1),
            bytes=total, memory_limit=args.memory, memory_limit_text=format_bytes(args.memory),
            device=f"{dev[0]}:{dev[1]}", source_resident_min=round(min(cached), 4) if cached else None,
            cases=cases), indent=2))
        return 0
    finally:
        if origin is not None:
            origin.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
