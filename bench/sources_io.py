#!/usr/bin/env python3
"""What a preload reads from and writes to the device, per source, where the page cache cannot hold the
checkpoint (issue 35: "a copy from cold, a delta build, an S3 download and a P2P download each read the
source once and write the tier once ... Say per source what is read and written, measured").

    .venv/bin/python bench/sources_io.py [--size 1GiB] [--rounds 3] [--memory 256MiB] [--changed 0.1]
                                         [--sources cold,delta,s3,p2p] [--timeout 600] [--dir /var/tmp]

Every run is the real CLI, `weightd preload NAME@V --tier warm --lease 0 --json --timeout T`, with its
processes in a fresh cgroup-v1 memory child limited to --memory (smaller than the checkpoint: page-cache
pages, read and written, are charged to it, so a second pass over the bytes cannot hide in the cache).
The warm tier is a directory on the disk under --dir. Sources:

  cold    `--no-daemon` preload of v1 from a cold tier on the same disk (a shared path); the cold copy
          dropped from the page cache before each run. Must read 1.0x from the device.
  delta   `--no-daemon` preload of v2 (--changed of its tensors differ from v1: every Nth tensor, in
          every shard) on a node whose warm tier holds v1 (the donor, preloaded once, untimed); the
          donor and cold v2 dropped from the page cache before each run. Must read 1.0x: the donor's
          unchanged bytes from warm and the changed ones from cold (no reflink on ext4).
  s3      `--no-daemon` preload of v1 from an object-store cold tier: moto (ThreadedMotoServer on
          127.0.0.1, in this process, as bench/objstore.py starts it), its objects' spill files in
          /dev/shm (tempfile's directory set there), so the server reads nothing from the device. Must
          read 0x.
  p2p     preload of v1 through a fresh worker daemon on 127.0.0.3, started in the cgroup (as
          bench/p2p_cgroup.py does: its Worker), from an origin daemon on 127.0.0.2 seeding a cold tier
          in /dev/shm (tmpfs: the origin reads nothing from the device). Must read 0x.

Before each run (untimed): the warm copy evicted, the source dropped from the page cache, `sync`. Counted
per run: the device's sectors read and written (/proc/diskstats, from the start of the command until a
`sync` after it: the shared machine's other work adds to them), and the preload's own processes'
storage I/O (the CLI's rusage ru_inblock/ru_oublock; for p2p also the worker daemon's /proc/PID/io), and
what the source did: for s3 this process's /proc/self/io (moto reading its data) and the bytes the store
served (the report's ``store``); for p2p the origin's /proc/PID/io, its libtorrent upload and the worker's
download (weightd_p2p_{upload,download}_bytes_total), and the report's ``bytes_by_source``. Each as a
multiple of the checkpoint's bytes, medians with min-max over the rounds (every source once per round,
rotating: bench/_rounds.py). Targets: reads by the preload <= 1.1x what must come from the disk (1.0x for
cold and delta; 0 for s3 and p2p, where 0.1x is allowed for the interpreter's and daemon's own files and
the machine's other work), writes <= 1.05x the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _iocount import io_since, proc_io, times_checkpoint  # noqa: E402
from _memcg import MemoryLimit, Run, device_of, run_counted  # noqa: E402
from _rounds import machine_state, positive_size_arg, report, rounds, summary  # noqa: E402

from tiering.content.units import format_bytes  # noqa: E402

NAME = "bench/sources-io"
SOURCES = ("cold", "delta", "s3", "p2p")
MUST_READ_X = {"cold": 1.0, "delta": 1.0, "s3": 0.0, "p2p": 0.0}   # what must come from the device
FLOOR_X = 0.1   # allowed where nothing must be read: the interpreter's files, the machine's other work
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # (one line, exit 2)
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = Parser(prog="sources_io.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=positive_size_arg, default="1GiB", help="the checkpoint's size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory", type=positive_size_arg, default="256MiB",
                    help="the preload's memory cgroup limit (smaller than --size)")
    ap.add_argument("--changed", type=float, default=0.1, help="delta: the share of v2's tensors that differ")
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, of {', '.join(SOURCES)}")
    ap.add_argument("--timeout", type=float, default=600.0, help="each preload's --timeout, seconds")
    ap.add_argument("--max-spread", type=float, default=0.5)
    ap.add_argument("--dir", default="/var/tmp", help="disk directory for cold storage and the warm tiers")
    a = ap.parse_args(argv)
    a.sources = [s.strip() for s in a.sources.split(",") if s.strip()]
    bad = [s for s in a.sources if s not in SOURCES]
    if bad or not a.sources:
        ap.error(f"--sources: unknown source {bad[0]!r} (one of {', '.join(SOURCES)})" if bad
                 else "--sources: give at least one")
    if a.rounds < 1:
        ap.error("--rounds: give at least 1")
    if not 0 < a.changed <= 0.5:
        ap.error("--changed: give a share above 0 and at most 0.5")
    if not 0 < a.timeout <= 7 * 86400:
        ap.error("--timeout: give seconds above 0")
    if a.memory >= a.size:
        ap.error(f"--memory ({format_bytes(a.memory)}) must be smaller than --size ({format_bytes(a.size)}): "
                 "the page cache must not hold the checkpoint")
    if not os.path.isdir(a.dir):
        ap.error(f"--dir: {a.dir} is not a directory")
    return a


def preload_line(cfg: Path, ref: str, timeout_s: float, *, no_daemon: bool = True) -> str:
    """The real CLI, bounded twice: its own --timeout, and `timeout` (in the foreground: Ctrl-C still
    reaches it) a minute later, for a hang outside the operation."""
    return (f"exec timeout --foreground -k 10 {int(timeout_s) + 60} {sys.executable} -m weightd --config {cfg}"
            f"{' --no-daemon' if no_daemon else ''} preload {ref} --tier warm --lease 0 --json --timeout {timeout_s:g}")


def wd(cfg: Path, *args: str, env: dict[str, str] | None = None) -> str:
    p = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), *args], env=env or ENV,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"weightd {' '.join(args)[:120]}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout


def evict(cfg: Path, ref: str, env: dict[str, str] | None = None) -> None:
    """``ref`` off the node's warm tier; not being there (exit 3) is fine."""
    p = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "--no-daemon", "-q", "evict", ref,
                        "--tier", "warm", "--force"], env=env or ENV, capture_output=True, text=True, timeout=120)
    if p.returncode not in (0, 3):
        raise SystemExit(f"weightd evict {ref}: exit {p.returncode}: {p.stderr.strip()[-400:]}")


def node_config(d: Path, cold: str, shm: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "weightd.toml"
    cfg.write_text(f'state_dir = "{d}/state"\n[tiers.hot]\npath = "{shm}/hot-{d.name}"\ncapacity = "1GiB"\n'
                   f'[tiers.warm]\npath = "{d}/warm"\ncapacity = "90%"\n[tiers.cold]\n{cold}'
                   f'[api]\nsocket = "{d}/api.sock"\n')
    return cfg


def kill_inside(cg: MemoryLimit) -> None:
    """End what is still in our own cgroup (a preload interrupted by Ctrl-C), by pid."""
    if not cg.active:
        return
    try:
        pids = (cg.path / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def counted(line: str, memory: int, dev: tuple[int, int]) -> tuple[Run, int | None]:
    """``line`` in a fresh memory child, counted (:func:`_memcg.run_counted`); the child's peak charge."""
    cg = MemoryLimit(memory)
    try:
        r = run_counted(cg.shell(line), dev, {**os.environ, "PYTHONPATH": str(REPO)})   # (local_s3's keys too)
        return r, cg.max_usage()
    finally:
        kill_inside(cg)
        cg.close()


def settled(read: Callable[[], float], want: float, timeout_s: float = 5.0) -> float:
    """A counter read until it reaches ``want``, for at most ``timeout_s`` (libtorrent's stats reach
    the metrics on their own beat, a moment after the transfer)."""
    deadline, got = time.monotonic() + timeout_s, read()
    while got < want and time.monotonic() < deadline:
        time.sleep(0.5)
        got = read()
    return got


def report_of(r: Run) -> dict[str, Any]:
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"the preload printed no JSON report: {r.stdout[-300:]!r}") from None


def check_sources(source: str, rep: dict[str, Any], total: int) -> None:
    """The run did what it is named for (a copy left from before would make its counts meaningless)."""
    by = rep.get("bytes_by_source") or {}
    ok = {"cold": by.get("cold") == total, "s3": by.get("cold") == total,
          "delta": (by.get("local_reuse") or 0) > 0 and (by.get("cold") or 0) > 0,
          "p2p": (by.get("origin") or 0) + (by.get("peer") or 0) == total}[source]
    if not ok:
        raise SystemExit(f"{source}: the preload's bytes by source were {by} (checkpoint {total} bytes)")


# -- the sources: each set up once, returns (checkpoint bytes, before(), run() -> sample) ----------------------
Setup = tuple[int, Callable[[], None], Callable[[], dict[str, Any]]]


def make_versions(base: Path, size: int, changed: float) -> tuple[Path, Path, int]:
    """v1 and v2 (every 1/changed-th tensor of v1 rewritten, in file order: spread over all shards)."""
    from tiering import build_manifest
    from tiering.sample import make_checkpoint, mutate_tensor
    v1 = make_checkpoint(base / "src-v1", total_bytes=size, shards=4, layers=16, seed="sources-io")
    v2 = base / "src-v2"
    shutil.copytree(v1, v2)
    tensors = list(build_manifest(v1).tensors())
    step = max(1, round(1 / changed))
    changed_bytes = sum(mutate_tensor(v2 / f.path, t.name, seed="v2") for f, t in tensors[step // 2::step])
    return v1, v2, changed_bytes


def setup_cold(a: argparse.Namespace, base: Path, shm: Path, dev: tuple[int, int], src: Path) -> Setup:
    from tiering.pagecache import cool
    cfg = node_config(base / "node-cold", f'path = "{base}/cold"\n', shm)
    total = int(json.loads(wd(cfg, "--no-daemon", "publish", str(src), "--name", NAME, "--version", "v1",
                              "--json"))["bytes"])
    cold_v1 = base / "cold" / NAME / "v1"

    def before() -> None:
        evict(cfg, f"{NAME}@v1")
        cool([cold_v1])

    def run() -> dict[str, Any]:
        r, peak = counted(preload_line(cfg, f"{NAME}@v1", a.timeout), a.memory, dev)
        rep = report_of(r)
        check_sources("cold", rep, total)
        return {"run": r, "process_read": r.proc_read_bytes, "process_written": r.proc_written_bytes,
                "cgroup_max_usage": peak, "report": rep}
    return total, before, run


def setup_delta(a: argparse.Namespace, base: Path, shm: Path, dev: tuple[int, int], v2: Path,
                changed_bytes: int) -> Setup:
    from tiering.pagecache import cool
    cfg = node_config(base / "node-delta", f'path = "{base}/cold"\n', shm)   # (v1 published by setup_cold's
    if not (base / "cold" / NAME / "v1").is_dir():                           # node, or here)
        raise SystemExit("delta: v1 is not in cold")
    total = int(json.loads(wd(cfg, "--no-daemon", "publish", str(v2), "--name", NAME, "--version", "v2",
                              "--json"))["bytes"])
    wd(cfg, "--no-daemon", "-q", "preload", f"{NAME}@v1", "--tier", "warm", "--lease", "0")   # the donor
    warm, cold_v2 = base / "node-delta" / "warm", base / "cold" / NAME / "v2"

    def before() -> None:
        evict(cfg, f"{NAME}@v2")
        cool([warm, cold_v2])

    def run() -> dict[str, Any]:
        r, peak = counted(preload_line(cfg, f"{NAME}@v2", a.timeout), a.memory, dev)
        rep = report_of(r)
        check_sources("delta", rep, total)
        return {"run": r, "process_read": r.proc_read_bytes, "process_written": r.proc_written_bytes,
                "cgroup_max_usage": peak, "report": rep, "changed_tensor_bytes": changed_bytes}
    return total, before, run


def setup_s3(a: argparse.Namespace, base: Path, shm: Path, dev: tuple[int, int], src: Path, endpoint: str,
             bucket: str) -> Setup:
    cfg = node_config(base / "node-s3", f'url = "s3://{bucket}/models"\nendpoint = "{endpoint}"\n'
                                        'region = "us-east-1"\n', shm)
    env = dict(os.environ, PYTHONPATH=str(REPO))   # (local_s3 set the keys in this environment)
    total = int(json.loads(wd(cfg, "--no-daemon", "publish", str(src), "--name", NAME, "--version", "v1",
                              "--json", env=env))["bytes"])

    def before() -> None:
        evict(cfg, f"{NAME}@v1", env)

    def run() -> dict[str, Any]:
        server0 = proc_io("self")   # (moto serves from threads of this process)
        r, peak = counted(preload_line(cfg, f"{NAME}@v1", a.timeout), a.memory, dev)
        server_read, _ = io_since("self", server0)
        rep = report_of(r)
        check_sources("s3", rep, total)
        return {"run": r, "process_read": r.proc_read_bytes, "process_written": r.proc_written_bytes,
                "cgroup_max_usage": peak, "report": rep, "source_device_read": server_read,
                "served": (rep.get("store") or {}).get("bytes_read")}
    return total, before, run


def setup_p2p(a: argparse.Namespace, base: Path, shm: Path, dev: tuple[int, int], keep: list[Any]) -> Setup:
    import p2p_cgroup
    from swarm import Daemon
    cold = shm / "p2p-cold"   # (tmpfs: the origin's reads are not the device's)
    total = p2p_cgroup.publish(base, cold, a.size)
    origin = Daemon(base / "p2p", p2p_cgroup.ORIGIN_IP, cold, "0", "origin", None, f'"{p2p_cgroup.WORKER_IP}/32"')
    keep.append(origin)
    ref = f"{p2p_cgroup.NAME}@{p2p_cgroup.VERSION}"

    def run() -> dict[str, Any]:
        cg = MemoryLimit(a.memory)
        worker = None
        try:
            worker = p2p_cgroup.Worker(base / "p2p", cold, origin, cg)
            keep.append(worker)
            w0, o0 = proc_io(worker.proc.pid), proc_io(origin.proc.pid)
            up0 = origin.metric("weightd_p2p_upload_bytes_total")
            r = run_counted(cg.shell(preload_line(worker.config, ref, a.timeout, no_daemon=False)), dev, ENV)
            (wr, ww), (orr, _) = io_since(worker.proc.pid, w0), io_since(origin.proc.pid, o0)
            rep = report_of(r)
            check_sources("p2p", rep, total)
            return {"run": r, "process_read": wr + r.proc_read_bytes, "process_written": ww + r.proc_written_bytes,
                    "cgroup_max_usage": cg.max_usage(), "report": rep, "source_device_read": orr,
                    "served": settled(lambda: origin.metric("weightd_p2p_upload_bytes_total") - up0, total),
                    "downloaded": settled(lambda: worker.metric("weightd_p2p_download_bytes_total"), total)}
        finally:
            if worker is not None:
                worker.stop()
                keep.remove(worker)
                shutil.rmtree(worker.dir, ignore_errors=True)
            kill_inside(cg)
            cg.close()
    return total, lambda: None, run


# -- the report -------------------------------------------------------------------------------------------------
def per_source(source: str, runs: list[dict[str, Any]], total: int) -> dict[str, Any]:
    def x(values: list[int]) -> dict[str, float]:
        return summary([v / total for v in values])
    rep = runs[-1]["report"]
    out: dict[str, Any] = {
        "bytes": total, "must_read_x_checkpoint": MUST_READ_X[source],
        "device_read_x_checkpoint": x([r["run"].read_bytes for r in runs]),
        "device_written_x_checkpoint": x([r["run"].written_bytes for r in runs]),
        "process_read_x_checkpoint": x([r["process_read"] for r in runs]),
        "process_written_x_checkpoint": x([r["process_written"] for r in runs]),
        "device_read_bytes": [r["run"].read_bytes for r in runs],
        "device_written_bytes": [r["run"].written_bytes for r in runs],
        "process_read_bytes": [r["process_read"] for r in runs],
        "process_written_bytes": [r["process_written"] for r in runs],
        "cgroup_max_usage_bytes": max((r["cgroup_max_usage"] or 0 for r in runs), default=0) or None,
        "max_rss_bytes": max(r["run"].max_rss_bytes for r in runs),
        "last_report": {k: rep.get(k) for k in ("seconds", "bytes_by_source", "resident_percent", "warm",
                                                "warm_skipped", "warm_seconds", "store", "delta") if k in rep},
    }
    if source == "p2p":
        out["last_report"]["read_back"] = (rep.get("swarm") or {}).get("read_back")
    if "source_device_read" in runs[0]:
        out["source_device_read_bytes"] = [r["source_device_read"] for r in runs]
        out["source_served_x_checkpoint"] = x([int(r["served"] or 0) for r in runs])
    if "downloaded" in runs[0]:
        out["worker_downloaded_x_checkpoint"] = x([int(r["downloaded"]) for r in runs])
    if "changed_tensor_bytes" in runs[0]:
        out["changed_tensor_x_checkpoint"] = round(runs[0]["changed_tensor_bytes"] / total, 4)
    return out


def byte_ratios(source: str, runs: list[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    read_bound = round(max(1.1 * MUST_READ_X[source], FLOOR_X), 3)
    return [times_checkpoint([r["run"].read_bytes for r in runs], total, f"{source} device reads",
                             target_at_most=read_bound),
            times_checkpoint([r["run"].written_bytes for r in runs], total, f"{source} device writes",
                             target_at_most=1.05),
            times_checkpoint([r["process_read"] for r in runs], total, f"{source} process reads",
                             target_at_most=read_bound),
            times_checkpoint([r["process_written"] for r in runs], total, f"{source} process writes",
                             target_at_most=1.05)]


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    probe = MemoryLimit(a.memory)
    probe.close()
    if not probe.active:
        print(json.dumps({"benchmark": "sources_io", "error": f"no memory cgroup: {probe.why}"}))
        return 1

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-sources-io-", dir=a.dir))
    shm = Path(tempfile.mkdtemp(prefix="weightd-bench-sources-io-", dir="/dev/shm"))
    keep: list[Any] = []   # daemons to stop
    s3 = None
    old_tempdir = tempfile.tempdir
    try:
        dev = device_of(base)
        setups: dict[str, Setup] = {}
        v1, v2, changed_bytes = make_versions(base, a.size, a.changed)
        if "cold" in a.sources or "delta" in a.sources:
            setups["cold"] = setup_cold(a, base, shm, dev, v1)
        if "delta" in a.sources:
            setups["delta"] = setup_delta(a, base, shm, dev, v2, changed_bytes)
        if "s3" in a.sources:
            from tiering.sample import local_s3
            (shm / "moto").mkdir()
            tempfile.tempdir = str(shm / "moto")   # (moto's objects spill to tempfile's directory: tmpfs)
            bucket = f"weightd-bench-{uuid.uuid4().hex[:8]}"
            s3 = local_s3(bucket, key="bench")
            setups["s3"] = setup_s3(a, base, shm, dev, v1, s3.__enter__(), bucket)
        shutil.rmtree(v1)
        shutil.rmtree(v2)
        if "p2p" in a.sources:
            setups["p2p"] = setup_p2p(a, base, shm, dev, keep)
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in a.sources}

        def contender(s: str) -> Callable[[], float]:
            def one() -> float:
                got = setups[s][2]()
                runs[s].append(got)
                return got["run"].seconds
            return one

        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        m0 = machine_state()
        times = rounds({s: contender(s) for s in a.sources}, a.rounds, before=lambda s: setups[s][1](), log=log)
        m1 = machine_state()
        ratios = [row for s in a.sources for row in byte_ratios(s, runs[s], setups[s][0])]
        print(json.dumps(report(
            "sources_io", times, ratios, rounds=a.rounds, max_spread=a.max_spread, machine=(m0, m1),
            bytes=a.size, memory_limit=a.memory, memory_limit_text=format_bytes(a.memory),
            device=f"{dev[0]}:{dev[1]}", changed=a.changed,
            where="cold and warm tiers on the disk under --dir; moto's objects and the P2P origin's cold tier in "
                  "/dev/shm (tmpfs), so the device counts only the preload's side",
            sources={s: per_source(s, runs[s], setups[s][0]) for s in a.sources}), indent=2))
        return 0
    except KeyboardInterrupt:
        print("sources_io.py: interrupted; cleaned up", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for d in keep:
            d.stop()
            shutil.rmtree(d.dir, ignore_errors=True)
        if s3 is not None:
            s3.__exit__(None, None, None)
        tempfile.tempdir = old_tempdir
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
