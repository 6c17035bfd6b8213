"""A cgroup-v1 blkio child that caps reads from one device (``blkio.throttle.read_bps_device``): this
VM's disk is backed by host memory, so a cap emulates the contended device the seed reports describe.
Everything put in it (a command through :meth:`wrap`, a running process through :meth:`add`) shares
the one cap, as processes on a node share its disk. A no-op, saying why, when not root or without v1."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/blkio")


class Throttle:
    def __init__(self, device: tuple[int, int], bps: int) -> None:
        self.path = ROOT / f"weightd-bench-{uuid.uuid4().hex[:8]}"
        self.bps = bps
        self.active = False
        self.why = ""
        if bps <= 0:
            self.why = "no cap asked for"
            return
        if os.geteuid() != 0:
            self.why = "not root"
            return
        if not ROOT.is_dir():
            self.why = "no cgroup v1 blkio controller"
            return
        try:
            self.path.mkdir()
            (self.path / "blkio.throttle.read_bps_device").write_text(f"{device[0]}:{device[1]} {bps}\n")
            self.active = True
        except OSError as exc:
            self.why = str(exc)

    @classmethod
    def for_path(cls, path: "os.PathLike[str] | str", bps: int) -> "Throttle":
        st = os.stat(path)
        return cls((os.major(st.st_dev), os.minor(st.st_dev)), bps)

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside the cap (``sh`` moves itself in, then execs)."""
        if not self.active:
            return cmd
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *cmd]

    def shell(self, line: str) -> str:
        """A shell line run inside the cap."""
        return f"echo $$ > {self.path}/cgroup.procs && {line}" if self.active else line

    def add(self, pid: int) -> None:
        """Move a running process (all its threads) under the cap."""
        if self.active:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def close(self) -> None:
        if not self.active:
            return
        try:   # (whatever is still inside goes back to the root group first, else rmdir fails)
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (ROOT / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            self.path.rmdir()
        except OSError:
            pass
