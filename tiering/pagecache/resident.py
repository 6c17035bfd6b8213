"""Residency (``cachestat(2)`` where the kernel has it, else ``mincore(2)``, flagged unreliable for files
the caller could not write) and dropping (``posix_fadvise(DONTNEED)``)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._syscalls import PAGE, cachestat, has_cachestat, mincore
from ..safefs.paths import open_for_read
from .files import FileRef, Skipped, collect_files


def resident_pages(fd: int, off: int, length: int, *, method: str | None = None) -> tuple[int, str]:
    """(resident pages in the range, method used)."""
    if length <= 0:
        return 0, "none"
    if method != "mincore" and has_cachestat():
        n = cachestat(fd, off, length)
        if n is not None:
            return n, "cachestat"
    return mincore(fd, off, length), "mincore"


@dataclass(slots=True)
class FileResidency:
    path: str
    size: int
    resident_bytes: int
    method: str
    reliable: bool = True

    @property
    def percent(self) -> float:
        return 100.0 * self.resident_bytes / self.size if self.size else 100.0


@dataclass(slots=True)
class ResidencyReport:
    files: list[FileResidency] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def resident_bytes(self) -> int:
        return sum(f.resident_bytes for f in self.files)

    @property
    def percent(self) -> float:
        return 100.0 * self.resident_bytes / self.size if self.size else 100.0

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "resident_bytes": self.resident_bytes, "percent": round(self.percent, 3),
                "files": [{"path": f.path, "size": f.size, "resident_bytes": f.resident_bytes,
                           "percent": round(f.percent, 3), "method": f.method, "reliable": f.reliable}
                          for f in self.files],
                "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped]}


def file_residency(ref: FileRef, *, method: str | None = None) -> FileResidency:
    fd = open_for_read(ref.path)
    try:
        size = os.fstat(fd).st_size
        pages, used = resident_pages(fd, 0, size, method=method)
    finally:
        os.close(fd)
    return FileResidency(ref.path, size, min(size, pages * PAGE), used,
                         reliable=used != "mincore" or ref.writable)


def residency(paths: Iterable[str | os.PathLike[str]], *, method: str | None = None) -> ResidencyReport:
    files, skipped = collect_files(paths)
    report = ResidencyReport(skipped=skipped)
    for f in files:
        try:
            report.files.append(file_residency(f, method=method))
        except OSError as exc:
            report.skipped.append(Skipped(f.path, exc.strerror or str(exc)))
    return report


def resident_bytes(paths: Iterable[str | os.PathLike[str]]) -> int:
    """How many bytes of these files (or the files under these directories) are in the page cache."""
    files, _ = collect_files(paths, ordered=False)
    total = 0
    for f in files:
        try:
            total += file_residency(f).resident_bytes
        except OSError:
            continue
    return total


def drop_from_cache(path: str | os.PathLike[str]) -> None:
    """Write back and drop a file's pages from the page cache (POSIX_FADV_DONTNEED; no root needed)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cool(paths: Iterable[str | os.PathLike[str]]) -> tuple[int, list[Skipped]]:
    files, skipped = collect_files(paths)
    dropped = 0
    for f in files:
        try:
            drop_from_cache(f.path)
            dropped += f.size
        except OSError as exc:
            skipped.append(Skipped(f.path, exc.strerror or str(exc)))
    return dropped, skipped
