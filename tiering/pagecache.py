"""Page-cache helpers (the full warming/residency engine builds on these)."""

from __future__ import annotations

import os


def drop_from_cache(path: str | os.PathLike[str]) -> None:
    """Write back and drop a file's pages from the page cache (POSIX_FADV_DONTNEED; no root needed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
