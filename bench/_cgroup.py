"""A child of a cgroup-v1 controller for one benchmark run (``/sys/fs/cgroup/CONTROLLER/weightd-bench-*``),
set up by the subclass (:mod:`_blkio`'s read cap, :mod:`_memcg`'s memory limit). Commands and processes
put in it share its limits; :meth:`close` moves whatever is still inside back to the root group and
removes it. A no-op, saying why in ``why``, when not root or without the controller."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path


class V1Child:
    controller = ""
    needs = ""   # a file of the controller's root that must exist (it is mounted and has the feature)

    def __init__(self) -> None:
        self.root = Path("/sys/fs/cgroup") / self.controller
        self.path = self.root / f"weightd-bench-{uuid.uuid4().hex[:8]}"
        self.active = False
        self.why = ""

    def create(self, settings: dict[str, str]) -> None:
        """Make the child and write ``settings`` (file -> value) into it; ``why`` says what prevented it."""
        if os.geteuid() != 0:
            self.why = "not root"
            return
        if not (self.root / self.needs).exists():
            self.why = f"no cgroup v1 {self.controller} controller"
            return
        try:
            self.path.mkdir()
            for name, value in settings.items():
                (self.path / name).write_text(f"{value}\n")
            self.active = True
        except OSError as exc:
            self.why = str(exc)

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside (``sh`` moves itself in, then execs)."""
        if not self.active:
            return cmd
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *cmd]

    def shell(self, line: str) -> str:
        """A shell line run inside (``sh`` moves itself in first)."""
        return f"echo $$ > {self.path}/cgroup.procs && {line}" if self.active else line

    def add(self, pid: int) -> None:
        """Move a running process (all its threads) inside."""
        if self.active:
            (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def close(self) -> None:
        if not self.active:
            return
        try:   # (whatever is still inside goes back to the root group first, else rmdir fails)
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self.root / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            for _ in range(50):   # (a memory child can stay busy a moment while its charges go)
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)
        except OSError:
            pass

    def __enter__(self) -> "V1Child":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
