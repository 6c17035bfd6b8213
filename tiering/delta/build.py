"""Donor parts copied (``copy_file_range``) to their new offsets without checking them, for a P2P
download to complete and check (``prefill``: libtorrent checks every piece). A build that must be
verified is :func:`tiering.delta.verified.build_verified`'s, in one pass."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .._syscalls import start_writeback
from ..safefs.paths import open_for_read
from ..copy import PROGRESS_CHUNK
from ..errors import TimedOut
from ..safefs import Dir, FileRef, sanitize_mode
from .plan import DeltaPlan, FilePlan, Span


_FALLBACK = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}
IO_CHUNK = 64 << 20


def _ref(base: "Path | Dir", rel: str) -> "str | FileRef":
    return FileRef(base, rel) if isinstance(base, Dir) else str(base / rel)


def _new_file(base: "Path | Dir", rel: str) -> int:
    if isinstance(base, Dir):
        return base.create(rel, 0o600, flags=os.O_RDWR)
    dst = base / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    return os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)


def _exists(base: "Path | Dir", rel: str) -> bool:
    return base.lstat(rel) is not None if isinstance(base, Dir) else (base / rel).exists()


@dataclass(slots=True)
class BuildResult:
    reused: int = 0           # bytes taken from donors (and verified)
    fetched: int = 0          # bytes read from the source
    donor_failures: list[str] = field(default_factory=list)   # "ref/path [a, b): why" for each refetch
    # every file's crypto digest (a signature's SHA-256) by manifest path, when the build was asked to take it
    crypto_digests: dict[str, str] | None = None
    parts: dict[str, set[str]] = field(default_factory=dict)   # build_verified: the parts checked, by file


def _copy_range(sfd: int, soff: int, dfd: int, doff: int, n: int, method: list[str],
                progress: Callable[[int], None] | None = None) -> None:
    """``progress``: told of the bytes as each step lands (a gap read from cold storage can be a
    shard's worth)."""
    buf: bytearray | None = None
    while n > 0:
        step = min(n, IO_CHUNK if progress is None else PROGRESS_CHUNK)
        got = 0
        if method[0] == "copy_file_range":
            try:
                got = os.copy_file_range(sfd, dfd, step, soff, doff)
            except OSError as exc:
                if exc.errno not in _FALLBACK:
                    raise
                method[0] = "readwrite"
                continue
        else:
            if buf is None:
                buf = bytearray(min(step, 4 << 20))
            view = memoryview(buf)[:min(step, len(buf))]
            got = os.preadv(sfd, [view], soff)
            w = 0
            while w < got:
                w += os.pwrite(dfd, view[w:got], doff + w)
        if got <= 0:
            raise EOFError(f"source ended at byte {soff}")
        soff, doff, n = soff + got, doff + got, n - got
        if progress is not None:
            progress(got)


def _build_file(plan: DeltaPlan, fp: FilePlan, dest: "Path | Dir", result: BuildResult,
                deadline: float | None, progress: Callable[[int], None] | None, fsync: bool,
                clock: Callable[[], float] = time.monotonic) -> None:
    """One file of ``plan.target`` under ``dest``: its donor parts copied, what no donor holds left zero."""
    f = fp.entry
    dfd = _new_file(dest, f.path)
    donor_fds: dict[tuple[int, str], int | None] = {}
    try:
        if f.size:
            try:
                os.posix_fallocate(dfd, 0, f.size)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise
                os.ftruncate(dfd, f.size)
        _, reused = _reuse_donor_spans(plan, fp, dfd, donor_fds, result, deadline, progress, fsync, clock)
        result.reused += reused
        os.fchmod(dfd, sanitize_mode(f.mode))
        if fsync:
            os.fsync(dfd)
    finally:
        os.close(dfd)
        for fd in donor_fds.values():
            if fd is not None:
                os.close(fd)


def _reuse_donor_spans(plan: DeltaPlan, fp: FilePlan, dfd: int, donor_fds: dict[tuple[int, str], int | None],
                       result: BuildResult, deadline: float | None, progress: Callable[[int], None] | None,
                       fsync: bool, clock: Callable[[], float]) -> tuple[list[Span], int]:
    """Copy every donor span of one file (opening each donor file once, into ``donor_fds``); returns
    the spans still to fetch (no donor, or a donor that failed) and the bytes reused."""
    method = ["copy_file_range"]
    to_fetch: list[Span] = []
    reused = 0
    for s in fp.spans:
        if deadline is not None and clock() > deadline:
            raise TimedOut(f"timed out building {fp.entry.path}")
        if s.donor is None:
            to_fetch.append(s)
            continue
        key = (s.donor, s.donor_path)
        if key not in donor_fds:
            try:
                d = plan.donors[s.donor]
                donor_fds[key] = open_for_read(FileRef(d.dir, s.donor_path) if d.dir is not None
                                               else str(d.path / s.donor_path))
            except (OSError, ValueError) as exc:  # evicted, deleted or replaced since the plan: fetch
                donor_fds[key] = None
                result.donor_failures.append(f"{plan.donors[s.donor].ref}/{s.donor_path}: "
                                             f"{getattr(exc, 'strerror', None) or exc}")
        sfd = donor_fds[key]
        why = ""
        if sfd is not None:
            try:
                _copy_range(sfd, s.donor_offset, dfd, s.begin, s.size, method)
                if fsync:
                    start_writeback(dfd, s.begin, s.size)  # so the final fsync does not wait for it all
            except (OSError, EOFError) as exc:
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    raise
                why = str(exc)
        else:
            why = "donor file gone"
        if why:
            if sfd is not None:
                result.donor_failures.append(f"{plan.donors[s.donor].ref}/{s.donor_path} "
                                             f"[{s.donor_offset}, {s.donor_offset + s.size}): {why}")
            to_fetch.append(s)
        else:
            reused += s.size
            if progress is not None:
                progress(s.size)
    return to_fetch, reused


def prefill(plan: DeltaPlan, dest: "Path | Dir", *, deadline: float | None = None,
            clock: Callable[[], float] = time.monotonic) -> BuildResult:
    """Donor bytes at their new offsets, holes elsewhere (for a P2P download to check and complete).
    Files that already exist under ``dest`` (a resumed transfer) are left alone."""
    todo = DeltaPlan(plan.target, plan.donors,
                     [fp for fp in plan.files if fp.reuse_bytes and not _exists(dest, fp.entry.path)])
    only_donors = DeltaPlan(todo.target, todo.donors,
                            [FilePlan(fp.entry, [s for s in fp.spans if s.donor is not None]) for fp in todo.files])
    result = BuildResult()
    for fp in only_donors.files:  # _build_file sizes the file; what no donor holds stays zero (libtorrent
        # then checks every piece: a rotten donor only fails its pieces, which are downloaded)
        _build_file(only_donors, fp, dest, result, deadline, None, False, clock)
    return result
