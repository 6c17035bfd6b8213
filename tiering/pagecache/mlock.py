"""Locking files in memory (``mlock``): it lasts only while the process holding the mapping lives."""

from __future__ import annotations

import os

from .._syscalls import has_cap_ipc_lock, map_readonly, memlock_limit, mlock, unmap
from ..safefs.paths import open_for_read
from ..errors import MemlockTooLow
from .files import FileRef, Skipped


def check_memlock(need: int) -> None:
    limit = memlock_limit()
    if limit is not None and need > limit and not has_cap_ipc_lock():
        raise MemlockTooLow(need, limit)


class LockedFiles:
    """Files mapped and ``mlock``ed by this process; the lock lasts until :meth:`release` or exit."""

    def __init__(self) -> None:
        self.maps: list[tuple[str, int, int]] = []

    @property
    def bytes(self) -> int:
        return sum(n for _, _, n in self.maps)

    def lock(self, files: list[FileRef]) -> list[Skipped]:
        check_memlock(sum(f.size for f in files))
        skipped = []
        for f in files:
            if f.size == 0:
                continue
            fd = open_for_read(f.path)
            try:
                size = os.fstat(fd).st_size
                addr = map_readonly(fd, size, 0)
            except OSError as exc:
                skipped.append(Skipped(f.path, exc.strerror or str(exc)))
                continue
            finally:
                os.close(fd)
            err = mlock(addr, size)
            if err:
                unmap(addr, size)
                skipped.append(Skipped(f.path, f"mlock: {os.strerror(err)}"))
                continue
            self.maps.append((f.path, addr, size))
        return skipped

    def release(self) -> None:
        for _, addr, size in self.maps:
            unmap(addr, size)
        self.maps.clear()
