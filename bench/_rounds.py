"""Interleaved rounds for the benchmarks: every contender once per round, in a rotating order, so the
noise of this shared VM falls on all of them alike; medians with their min-max, and ratios of medians
with the spread of the per-round ratios. The machine's state (load average, other I/O on the disks)
is recorded beside the figures."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def process_cpu_s(pid: "int | str") -> float:
    """A process's CPU seconds so far (user + system, from ``/proc/PID/stat``)."""
    f = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def machine_state() -> dict[str, Any]:
    """Load average, the block devices' completed I/O so far (``/proc/diskstats``), and this VM's
    memory reclaimer: DAMON's kdamond threads (``/sys/kernel/mm/damon``), on here with a pageout
    scheme, take CPU and drop page cache on their own; their CPU seconds so far are recorded."""
    out: dict[str, Any] = {"loadavg": os.getloadavg(), "cpus": os.cpu_count()}
    damon = {}
    for d in sorted(__import__("glob").glob("/sys/kernel/mm/damon/admin/kdamonds/[0-9]*")):
        try:
            state = _read(f"{d}/state").strip()
            pid = _read(f"{d}/pid").strip()
            cpu = None
            if pid.isdigit() and int(pid) > 0:
                cpu = process_cpu_s(pid)
            damon[os.path.basename(d)] = {"state": state, "cpu_s": cpu}
        except OSError:
            continue
    if damon:
        out["kdamonds"] = damon
    try:
        with open("/proc/diskstats") as fh:
            out["diskstats"] = {p[2]: {"reads": int(p[3]), "read_sectors": int(p[5]), "writes": int(p[7])}
                                for p in (line.split() for line in fh) if not p[2].startswith(("loop", "ram"))}
    except OSError:
        pass
    return out


def io_between(a: dict[str, Any], b: dict[str, Any]) -> dict[str, int]:
    """Sectors read per device between two machine states (what else the disks did in a run)."""
    da, db = a.get("diskstats", {}), b.get("diskstats", {})
    return {k: db[k]["read_sectors"] - da[k]["read_sectors"] for k in db if k in da
            and db[k]["read_sectors"] != da[k]["read_sectors"]}


def rounds(contenders: dict[str, Callable[[], "float | dict[str, float]"]], n: int, *,
           before: Callable[[str], None] | None = None, log: Callable[[str], None] | None = None,
           widen: float | None = None, max_n: int | None = None, warmup: bool = False) -> dict[str, list[float]]:
    """Each contender returns the seconds it took (measured by itself, so set-up is not counted), or a
    dict of named figures when one run measures several (fio at three queue depths: each name gets
    its own samples); ``before(name)`` runs before each one (untimed: clean the target, drop caches).
    With ``widen``: more rounds, up to ``max_n`` (default 2n), while a contender's spread (interquartile
    range over median, as speedup() refuses by) is above it: "more rounds when the spread is wide".
    With ``warmup``: one untimed round first (a fresh set's write-back, the tools' own pages, a
    daemon's first answers)."""
    names = list(contenders)
    if warmup:
        for k in names:
            if before is not None:
                before(k)
            contenders[k]()
    out: dict[str, list[float]] = {}
    limit = n if widen is None else max(n, max_n or 2 * n)
    r = 0
    while r < limit:
        if r >= n and all(summary(v)["iqr_spread"] <= widen for v in out.values()):   # (widen is set here)
            break
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            if before is not None:
                before(k)
            s = contenders[k]()
            for name, x in (s.items() if isinstance(s, dict) else ((k, s),)):
                out.setdefault(name, []).append(x)
                if log is not None:
                    log(f"round {r + 1}/{n}{' (extra: spread wide)' if r >= n else ''} {name}: {x:.4g}")
        r += 1
    return out


def _sig(x: float) -> float:
    """Five significant digits (a 40 µs latency and a 40 s copy alike)."""
    return float(f"{x:.5g}")


def summary(times: list[float]) -> dict[str, float]:
    """Median and min-max; ``spread`` is (max-min)/median, ``iqr_spread`` the interquartile range over the
    median: what the refusal and the extra rounds go by (one outlier round widens min-max for good,
    while more rounds narrow the quartiles when the noise was a passing one)."""
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return {"median_s": _sig(med), "min_s": _sig(min(times)), "max_s": _sig(max(times)),
            "spread": round((max(times) - min(times)) / med, 3) if med else 0.0,
            "iqr_spread": round((q[2] - q[0]) / med, 3) if med else 0.0}


def speedup(times: dict[str, list[float]], fast: str, slow: str, *, max_spread: float = 0.5,
            target: float | None = None, target_at_most: float | None = None) -> dict[str, Any]:
    """How many times faster ``fast`` is than ``slow``: the ratio of medians, with the min-max of the
    per-round ratios. No ratio (None) when a contender's spread exceeds ``max_spread`` (its median
    would say too little): the reason is given instead. With a target (the ratio at least ``target``,
    or at most ``target_at_most``): ``met`` says whether the ratio meets it (None when refused)."""
    a, b = times[fast], times[slow]
    per_round = [y / x for x, y in zip(a, b) if x > 0]
    wide = [k for k in (fast, slow) if summary(times[k])["iqr_spread"] > max_spread]
    out: dict[str, Any] = {"of": fast, "vs": slow, "rounds": len(per_round),
                           "per_round_min": round(min(per_round), 3) if per_round else None,
                           "per_round_max": round(max(per_round), 3) if per_round else None}
    if wide:
        out["ratio"] = None
        out["refused"] = f"spread of {', '.join(wide)} above {max_spread} (interquartile range over median): rerun"
    elif not per_round or not statistics.median(a) > 0:
        out["ratio"] = None
        out["refused"] = f"no time measured for {fast}"
    else:
        out["ratio"] = round(statistics.median(b) / statistics.median(a), 3)
    if target is not None or target_at_most is not None:
        if target is not None:
            out["target"] = target
        if target_at_most is not None:
            out["target_at_most"] = target_at_most
        r = out["ratio"]
        out["met"] = None if r is None else \
            (target is None or r >= target) and (target_at_most is None or r <= target_at_most)
    return out


def report(benchmark: str, times: dict[str, list[float]], ratios: list[dict[str, Any]], *, rounds: int,
           max_spread: float, machine: tuple[dict[str, Any], dict[str, Any]], unit: str = "s",
           **extra: Any) -> dict[str, Any]:
    """The JSON every bench prints, in one shape (bench/all.py builds docs/benchmarks.md's table from it)::

        {"benchmark": NAME, "date": stamp(), "rounds": N asked, "rounds_run": N run (more when widened),
         "max_spread": BOUND, "unit": "s" (or what the figures are: "misses" for a simulation),
         "contenders": {NAME: summary()}, "ratios": [speedup(..., target=...)],
         "machine": {"before": machine_state(), "after": ..., "other_io_sectors": io_between()},
         ...the bench's own keys..., "samples_s": {NAME: [every round's figure]}}

    ``machine`` is the (before, after) pair of machine_state(); the figures keep the ``*_s`` names
    whatever ``unit`` says they are. A bench's own keys come after the
    common ones and may not replace them."""
    m0, m1 = machine
    out: dict[str, Any] = {
        "benchmark": benchmark, "date": stamp(), "rounds": rounds,
        "rounds_run": max((len(v) for v in times.values()), default=0), "max_spread": max_spread, "unit": unit,
        "contenders": {k: summary(v) for k, v in times.items() if v}, "ratios": ratios,
        "machine": {"before": m0, "after": m1, "other_io_sectors": io_between(m0, m1)},
    }
    clash = set(out) & set(extra)
    if clash:
        raise ValueError(f"report(): {sorted(clash)} are the common keys")
    return {**out, **extra, "samples_s": times}


def run_timed(cmd: "list[str] | str", env: "dict[str, str] | None" = None) -> float:
    """Seconds ``cmd`` took (a shell line when a string); a failure ends the benchmark, saying why. The
    default environment is this one with the repository on PYTHONPATH (the code under test)."""
    import subprocess
    from pathlib import Path
    if env is None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, shell=isinstance(cmd, str), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    s = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{str(cmd)[:200]}: exit {p.returncode}: {p.stderr[-500:]}")
    return s


def timer(cmd: "list[str] | str", env: "dict[str, str] | None" = None) -> Callable[[], float]:
    """A contender for :func:`rounds`: ``cmd`` run and timed by :func:`run_timed` each time it is called."""
    return lambda: run_timed(cmd, env)


def size_arg(text: str) -> int:
    """argparse ``type=`` for a size ('2GiB', '200MB', '0'): a bad one is argparse's one-line error."""
    import argparse
    from tiering.content.units import parse_size
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_size_arg(text: str) -> int:
    """:func:`size_arg` for the size of something to make or read: 0 is refused too."""
    import argparse
    n = size_arg(text)
    if n <= 0:
        raise argparse.ArgumentTypeError("give a size above zero")
    return n


def list_arg(item: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """argparse ``type=`` for a comma-separated list of ``item`` ('4,8'; '0,1GB,200MB' with size_arg)."""
    import argparse

    def parse(text: str) -> list[Any]:
        out = []
        for x in (x.strip() for x in text.split(",")):
            if not x:
                continue
            try:
                out.append(item(x))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r}: {x!r} is not a {getattr(item, '__name__', 'value')}") from None
        if not out:
            raise argparse.ArgumentTypeError(f"{text!r}: an empty list")
        return out
    return parse


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class BenchNode:
    """A weightd node for a benchmark: cold, warm and state under ``base`` (a disk directory), hot in
    /dev/shm, the real CLI (``wd``) and, once started, a real daemon; everything removed on exit."""

    def __init__(self, base: "os.PathLike[str] | str", hot: "os.PathLike[str] | str", *, hot_capacity: str = "60%",
                 warm_capacity: str = "50%") -> None:
        import sys
        from pathlib import Path
        self.base, self.hot = Path(base), Path(hot)
        self.cfg = self.base / "weightd.toml"
        self.cfg.write_text(f'state_dir = "{self.base}/state"\n[tiers.hot]\npath = "{self.hot}"\n'
                            f'capacity = "{hot_capacity}"\n[tiers.warm]\npath = "{self.base}/warm"\n'
                            f'capacity = "{warm_capacity}"\n[tiers.cold]\npath = "{self.base}/cold"\n'
                            f'[api]\nsocket = "{self.base}/state/weightd.sock"\n[p2p]\nlisten = "127.0.0.1:0"\n'
                            f'[metrics]\nlisten = "127.0.0.1:0"\n')
        root = Path(__file__).resolve().parent.parent
        self.env = {**os.environ, "PYTHONPATH": str(root)}
        self.wd = [sys.executable, "-m", "weightd", "--config", str(self.cfg)]
        self.daemon: Any = None

    def serve(self, timeout_s: float = 60.0) -> None:
        import subprocess
        log = self.base / "daemon.log"
        with open(log, "w") as fh:
            self.daemon = subprocess.Popen([*self.wd, "serve"], env=self.env, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not (self.base / "state/weightd.sock").exists():
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)

    def run(self, cmd: "list[str] | str") -> float:
        """Seconds ``cmd`` took, with this node's environment (:func:`run_timed`)."""
        return run_timed(cmd, self.env)

    def close(self, *extra: "os.PathLike[str] | str") -> None:
        import shutil
        import subprocess
        if self.daemon is not None:
            self.daemon.terminate()
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        for p in (self.hot, *extra, self.base):
            shutil.rmtree(p, ignore_errors=True)
