"""A cgroup-v1 memory child with a limit (``memory.limit_in_bytes``): a page cache smaller than the
checkpoint, as on a node whose free memory cannot hold the biggest models (page-cache pages, read and
written, are charged to the cgroup of the process that touched them). One child per run, so a run
never starts with what the previous one left charged. A no-op, saying why, when not root or without v1.

And the device's own counters (``/proc/diskstats``) around a run: sectors read and written."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from _cgroup import V1Child


class MemoryLimit(V1Child):
    controller, needs = "memory", "memory.limit_in_bytes"

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit = limit_bytes
        self.create({"memory.limit_in_bytes": str(limit_bytes)})

    def max_usage(self) -> int | None:
        """The cgroup's peak charge (page cache included), bytes."""
        try:
            return int((self.path / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None


def device_of(path: "os.PathLike[str] | str") -> tuple[int, int]:
    st = os.stat(path)
    return os.major(st.st_dev), os.minor(st.st_dev)


def sectors(dev: tuple[int, int]) -> tuple[int, int]:
    """(sectors read, sectors written) of a block device so far (512 bytes each)."""
    with open("/proc/diskstats") as fh:
        for line in fh:
            f = line.split()
            if (int(f[0]), int(f[1])) == dev:
                return int(f[5]), int(f[9])
    raise SystemExit(f"device {dev[0]}:{dev[1]} is not in /proc/diskstats")


@dataclass(slots=True)
class Run:
    seconds: float
    read_bytes: int
    written_bytes: int
    max_rss_bytes: int
    stdout: str
    proc_read_bytes: int = 0      # what the command's processes had read from storage (wait4's ru_inblock: the
    proc_written_bytes: int = 0   # kernel's per-task I/O accounting, other work on the machine not included)
    cgroup_max_usage: int | None = None   # (set by the caller that ran it in a MemoryLimit)


def run_counted(cmd: str, dev: tuple[int, int], env: dict[str, str]) -> Run:
    """``cmd`` (a shell line) timed, with the device's sectors read and written from its start until
    everything it wrote is on the device (a ``sync`` after it, untimed), its peak RSS (GNU time's %M:
    the largest of its processes), and the bytes its processes read from and
    wrote to storage (wait4's ru_inblock and ru_oublock, in 512-byte units: page-cache misses, read-ahead
    and faults of mapped files included, so other work on the machine does not count; written bytes are
    counted when the process dirties the pages)."""
    import shlex
    import tempfile
    os.sync()
    r0, w0 = sectors(dev)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("w+", suffix=".rss") as rss:
        # (the peak RSS through GNU time: a child forked from this interpreter would count its pages
        # until it execs)
        timed = f"/usr/bin/time -q -f %M -o {rss.name} sh -c {shlex.quote(cmd)}" if os.path.exists("/usr/bin/time") \
            else cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(timed, shell=True, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        s = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, etext = out.read(), err.read()
        peak = rss.read().strip().splitlines()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[:200]}: exit {p.returncode}: {etext[-500:]}")
    os.sync()
    r1, w1 = sectors(dev)
    return Run(s, (r1 - r0) * 512, (w1 - w0) * 512, int(peak[-1]) * 1024 if peak and peak[-1].isdigit() else 0, text,
               proc_read_bytes=usage.ru_inblock * 512, proc_written_bytes=usage.ru_oublock * 512)
