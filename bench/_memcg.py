"""A cgroup-v1 memory child with a limit (``memory.limit_in_bytes``): a page cache smaller than the
checkpoint, as on a node whose free memory cannot hold the biggest models (page-cache pages, read and
written, are charged to the cgroup of the process that touched them). One child per run, so a run
never starts with what the previous one left charged. A no-op, saying why, when not root or without v1.

And the device's own counters (``/proc/diskstats``) around a run: sectors read and written."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


class MemoryLimit:
    def __init__(self, limit_bytes: int) -> None:
        self.path = ROOT / f"weightd-bench-{uuid.uuid4().hex[:8]}"
        self.limit = limit_bytes
        self.active = False
        self.why = ""
        if os.geteuid() != 0:
            self.why = "not root"
            return
        if not (ROOT / "memory.limit_in_bytes").is_file():
            self.why = "no cgroup v1 memory controller"
            return
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
            self.active = True
        except OSError as exc:
            self.why = str(exc)

    def shell(self, line: str) -> str:
        """A shell line run inside the limit (``sh`` moves itself in first)."""
        return f"echo $$ > {self.path}/cgroup.procs && {line}" if self.active else line

    def max_usage(self) -> int | None:
        """The cgroup's peak charge (page cache included), bytes."""
        try:
            return int((self.path / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if not self.active:
            return
        try:   # (whatever is still inside goes back to the root group first, else rmdir fails)
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (ROOT / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)
        except OSError:
            pass

    def __enter__(self) -> "MemoryLimit":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
