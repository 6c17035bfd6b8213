"""Cross-process locks (``flock``) that save work; correctness never depends on them.

Two processes preloading the same version: the second waits on the version's lock, then finds the
version complete and moves nothing. A staging directory is "live" while its owner holds the flock on
its ``.lock`` file; start-up reconciliation removes staging whose lock it can take.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from types import TracebackType

from .errors import TimedOut
from .safefs import Dir


class FileLock:
    """``flock`` on ``name`` in ``directory`` (opened by descriptor, never through a symlink; mode 0600
    so no other user can hold one of weightd's locks)."""

    def __init__(self, directory: Dir, name: str, what: str = "") -> None:
        self.dir, self.name = directory, name
        self.what = what or str(directory.path / name)
        self.fd: int | None = None

    def acquire(self, timeout_s: float | None = None, *, shared: bool = False, poll_s: float = 0.05) -> None:
        fd = self.dir.open(self.name, os.O_RDWR | os.O_CREAT, 0o600)
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                self.fd = fd
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
            if deadline is not None and time.monotonic() >= deadline:
                os.close(fd)
                raise TimedOut(f"timed out waiting for {self.what} (another weightd is working on it)")
            time.sleep(poll_s)

    def try_acquire(self) -> bool:
        try:
            self.acquire(timeout_s=0)
            return True
        except TimedOut:
            return False

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "FileLock":
        if self.fd is None:
            self.acquire()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
