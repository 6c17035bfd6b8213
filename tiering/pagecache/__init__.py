"""The page-cache engine: warm, measure, lock and drop files in the page cache (design §9).

- Residency: ``cachestat(2)`` (Linux 6.5+: one call per file or range) where the kernel has it,
  ``mincore(2)`` over a read-only mapping otherwise. Since Linux 5.2 ``mincore`` reports *every* page
  resident for files the caller could not write (so that it leaks nothing); such results are flagged
  ``reliable=False``.
- Warming maps bounded windows and faults them in with ``madvise(MADV_POPULATE_READ)`` (Linux 5.14+,
  probed once), else ``mmap(MAP_POPULATE)``. Python never touches mapped memory, so a file truncated
  while it is warmed is an ``EFAULT`` from ``madvise``, never a SIGBUS. Windows already resident are
  skipped (checked first), ``posix_fadvise`` SEQUENTIAL doubles the kernel's read-ahead, several files
  are in flight at once, a token bucket caps bandwidth, and warming backs off while a 4 KiB random read
  on the device waits longer than a threshold (the seed reports' 5 ms; :class:`AwaitMonitor` says why
  the trigger is not the diskstats average).
- Locking (``mlock``) lasts only while the process holding the mapping lives.
- Dropping: ``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no root.

By concern: :mod:`.files` (what to touch, in loader order), :mod:`.resident` (measure, drop),
:mod:`.throttle` (rate cap, back-off), :mod:`.warming`, :mod:`.room` (how much page cache a process can
hold: what is worth warming), :mod:`.mlock`; the kernel calls are in
:mod:`tiering._syscalls`, the errors in :mod:`tiering.errors`.
"""

from __future__ import annotations

from .._lazy import surface

#: public name -> the module of this package that defines it (imported when first used: ``residency``
#: does not import warming's threads nor mlock's checks)
_SURFACE: dict[str, str] = {
    "FileRef": "files", "Skipped": "files", "collect_files": "files", "loader_order": "files",
    "LockedFiles": "mlock", "check_memlock": "mlock",
    "FileResidency": "resident", "ResidencyReport": "resident", "cool": "resident", "drop_from_cache": "resident",
    "file_residency": "resident", "residency": "resident", "resident_bytes": "resident",
    "Room": "room", "page_cache_room": "room",
    "AwaitMonitor": "throttle", "LatencyProbe": "throttle", "TokenBucket": "throttle",
    "WINDOW": "warming", "WarmOptions": "warming", "WarmReport": "warming", "warm": "warming",
}
_SURFACE.update({"PAGE": "tiering._syscalls", "read_diskstats": "tiering._syscalls"})

__getattr__, __dir__, __all__ = surface(__name__, _SURFACE)
