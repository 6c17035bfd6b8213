"""The verified delta build, one pass over the bytes (issue 35): each file of the new version is built
in offset order, every part (a span of the plan: the manifest's parts tile each file) read once from
its donor or from the source into a bounded buffer, hashed (xxh3-128, and a signature's SHA-256 of the
file when asked) from the very buffer it is written from, and written once. A donor part that does not
hash to the manifest (a donor rotted on disk), cannot be read or has vanished is read from the source
instead, over the bytes it left; the source's bytes are checked the same way (a source that changed is
ChecksumMismatch or FileChanged, and the caller aborts its staging area). Nothing is read back: the
result is verified, and the commit takes the digests from it.

The buffers, write-back and durability are the one-pass copy's (:mod:`tiering.verified_copy`). Donor
bytes are not shared with ``copy_file_range`` (a reflink) any more: they would have to be read again
to be checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import xxhash

from .._syscalls import PAGE, is_tmpfs, start_writeback, wait_writeback
from ..safefs.paths import open_for_read
from ..copy import PROGRESS_CHUNK, run_all
from ..errors import ChecksumMismatch, FileChanged, TimedOut
from ..safefs import Dir, FileRef, sanitize_mode
from ..verified_copy import STREAM_BUFFER, STREAM_BUFFER_TMPFS, WRITEBACK_BEHIND, _buffer, _write_all
from .build import BuildResult, _new_file, _ref
from .plan import DeltaPlan, FilePlan, Span

READ_AHEAD = 8 << 20   # a span's bytes asked of the kernel ahead of its reads, a window at a time (bounded:
                       # a page cache smaller than the span never holds read-ahead that is evicted unread)
WILL_NEED_CALL = 128 << 10   # bytes per WILLNEED call: the smallest read-ahead a Linux device has by default


def build_verified(plan: DeltaPlan, dest: "Path | Dir", source: "Path | Dir | None", *, threads: int = 2,
                   deadline: float | None = None, progress: Callable[[int], None] | None = None,
                   fsync: bool = True, clock: Callable[[], float] = time.monotonic,
                   crypto: Callable[[], Any] | None = None) -> BuildResult:
    """Write every file of ``plan.target`` under ``dest`` (which must not hold them yet), each part
    checked against the manifest on the way: donor parts from their donors, the rest (and any donor
    part that fails) from ``source``, the new version's directory, at the same offsets. ``threads``
    files at a time, largest first. With ``crypto`` (a signature's hasher factory) every file's digest
    is taken in the same pass (``BuildResult.crypto_digests``). Raises ChecksumMismatch or FileChanged
    when the source's own bytes are not the manifest's: what was written is the caller's to abort.

    ``source`` None: donor parts only (an object store fetches the rest): only files that borrow are
    made, at their full size, and a donor part that fails is left for the caller to fetch; the parts
    written and checked are ``BuildResult.parts``."""
    result = BuildResult(crypto_digests={} if crypto is not None and source is not None else None)
    lock = threading.Lock()

    def one(fp: FilePlan) -> None:
        if deadline is not None and clock() > deadline:
            raise TimedOut(f"timed out building {fp.entry.path}")
        done = _FileBuild(plan, fp, source, crypto, progress, deadline, clock).run(dest, fsync)
        with lock:
            result.reused += done.reused
            result.fetched += done.fetched
            result.donor_failures += done.failures
            result.parts[fp.entry.path] = done.parts
            if result.crypto_digests is not None and done.digest is not None:
                result.crypto_digests[fp.entry.path] = done.digest

    order = sorted((fp for fp in plan.files if source is not None or fp.reuse_bytes), key=lambda fp: -fp.entry.size)
    run_all(one, order, threads=threads, name="weightd-delta", deadline=deadline, clock=clock)
    return result


class _FileBuild:
    """One file of the new version, built part by part in offset order (see the module's docstring)."""

    def __init__(self, plan: DeltaPlan, fp: FilePlan, source: "Path | Dir | None", crypto: Callable[[], Any] | None,
                 progress: Callable[[int], None] | None, deadline: float | None, clock: Callable[[], float]) -> None:
        self.plan, self.fp, self.path, self.source = plan, fp, fp.entry.path, source
        self.crypto = crypto() if crypto is not None else None
        self.progress, self.deadline, self.clock = progress, deadline, clock
        self.donor_fds: dict[tuple[int, str], int | None] = {}
        self.sfd: int | None = None
        self.dfd = -1
        self.buf: memoryview = memoryview(b"")
        self.reused = self.fetched = self.unreported = self.clean = 0
        self.written = 0   # (bytes the current part has written)
        self.overcounted = 0   # (a failed donor part's bytes, reported already: not reported again)
        self.writeback = True
        self.failures: list[str] = []
        self.parts: set[str] = set()   # (the labels of the parts written and checked)
        self.digest: str | None = None
        self.got = ""   # (the last part's xxh3-128 as read)
        self.run_ends: list[int] = []
        self.run_end = 0       # (where the current span's run of contiguous bytes ends in the file it is read from)
        self.advised: dict[int, int] = {}   # (descriptor -> the offset its read-ahead was asked up to)

    def run(self, dest: "Path | Dir", fsync: bool) -> "_FileBuild":
        f = self.fp.entry
        self.dfd = _new_file(dest, f.path)
        try:
            tmpfs = is_tmpfs(self.dfd)
            if f.size and not tmpfs:   # (a full tier fails here; on tmpfs it would zero pages written next)
                try:
                    os.posix_fallocate(self.dfd, 0, f.size)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise
            self.buf = _buffer(STREAM_BUFFER_TMPFS if tmpfs else STREAM_BUFFER)
            self.writeback = fsync and not tmpfs
            spans = sorted(self.fp.spans, key=lambda s: s.begin)
            self.run_ends = _run_ends(spans)
            for i, s in enumerate(spans):
                if self.deadline is not None and self.clock() > self.deadline:
                    raise TimedOut(f"timed out building {f.path}")
                self.run_end = self.run_ends[i]
                if s.donor is not None and self._from_donor(s):
                    self.parts.add(s.label)
                elif self.source is not None:
                    self._from_source(s)
                    self.parts.add(s.label)
            if self.source is None and os.fstat(self.dfd).st_size != f.size:
                os.ftruncate(self.dfd, f.size)   # (holes for the caller to fill)
            if self.sfd is not None and os.fstat(self.sfd).st_size != f.size:
                raise FileChanged(str(_ref(self.source, f.path)), "source changed size while the delta was built")
            self._report(0, flush=True)
            self.digest = self.crypto.hexdigest() if self.crypto is not None and self.source is not None else None
            os.fchmod(self.dfd, sanitize_mode(f.mode))
            if fsync:
                os.fsync(self.dfd)
            return self
        finally:
            for fd in [self.dfd, *self.donor_fds.values(), self.sfd]:
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:   # (EIO on a network file system: the others are closed all the same)
                        pass

    def _from_donor(self, s: Span) -> bool:
        """The part from its donor; False (and why, in ``failures``) when it must be fetched instead."""
        assert s.donor is not None
        donor = self.plan.donors[s.donor]
        where = f"{donor.ref}/{s.donor_path}"
        key = (s.donor, s.donor_path)
        if key not in self.donor_fds:
            try:
                self.donor_fds[key] = _open_for_spans(FileRef(donor.dir, s.donor_path) if donor.dir is not None
                                                       else str(donor.path / s.donor_path))
            except (OSError, ValueError) as exc:  # evicted, deleted or replaced since the plan: fetch
                self.donor_fds[key] = None
                self.failures.append(f"{where}: {getattr(exc, 'strerror', None) or exc}")
        fd = self.donor_fds[key]
        if fd is None:
            return False
        saved = self.crypto.copy() if self.crypto is not None else None
        why = self._span(fd, s.donor_offset, s, donor=True, limit=self.run_end)
        if why is None:
            self.reused += s.size
            return True
        self.crypto = saved   # (the donor's bytes are written over: the digest goes on from before them)
        self.overcounted += self.written   # (and their progress, reported once, is not reported again)
        self.failures.append(f"{where} [{s.donor_offset}, {s.donor_offset + s.size}) for {self.path} "
                             f"{s.label}: {why}")
        return False

    def _from_source(self, s: Span) -> None:
        assert self.source is not None
        if self.sfd is None and s.size:
            self.sfd = _open_for_spans(_ref(self.source, self.path))
        why = self._span(self.sfd if self.sfd is not None else -1, s.begin, s, donor=False,
                         limit=self.run_end if s.donor is None else 0)   # (a donor's part read again: its own bytes)
        if why is not None:
            src = str(_ref(self.source, self.path))
            if not self.got:
                raise FileChanged(src, f"source {why} (shorter than its manifest says)")
            raise ChecksumMismatch(src, s.label, s.xxh3_128, self.got)
        self.fetched += s.size

    def _span(self, fd: int, at: int, s: Span, *, donor: bool, limit: int = 0) -> str | None:
        """Bytes [at, at + s.size) of ``fd`` hashed and written at ``s.begin``; None when they are the
        part, else why not: "ended at byte N", a donor's read error, or "content differs from the
        manifest" (``self.got``: the hash read). Errors writing (ENOSPC), and the source's reading, raise.
        The kernel is asked to read ahead up to ``limit`` (where the run of contiguous spans this one
        belongs to ends in ``fd``), a window at a time; a donor's span read again from the source, only
        its own bytes."""
        self.got = ""
        self.written = 0
        h = xxhash.xxh3_128()
        limit = max(at + s.size, limit)
        off = 0
        while off < s.size:
            pos, adv = at + off, self.advised.get(fd, -1)
            adv = adv if adv >= pos else pos
            if adv < limit and adv - pos < READ_AHEAD // 2:   # (the next window, before the reads reach it)
                self.advised[fd] = min(limit, adv + READ_AHEAD)
                _will_need(fd, adv, self.advised[fd] - adv)
            view = self.buf[:min(len(self.buf), s.size - off)]
            filled = 0
            try:
                while filled < len(view):
                    n = os.preadv(fd, [view[filled:]], at + off + filled)
                    if n <= 0:
                        return f"ended at byte {at + off + filled}"
                    filled += n
            except OSError as exc:
                if not donor:
                    raise
                return exc.strerror or str(exc)
            h.update(view)
            if self.crypto is not None:
                self.crypto.update(view)
            self._write(view, s.begin + off)
            off += len(view)
        got = h.hexdigest()
        if got == s.xxh3_128:
            return None
        self.got = got
        return "content differs from the manifest"

    def _write(self, view: memoryview, off: int) -> None:
        _write_all(self.dfd, view, off)
        n = len(view)
        self.written += n
        if self.writeback:   # started as it goes; waited for once WRITEBACK_BEHIND bytes are in flight
            # (whole pages only: a span's last page, partly written, would be written back and then
            # dirtied again by the next span: 1.7% of a delta build's pages written twice)
            first, end = off & ~(PAGE - 1), (off + n) & ~(PAGE - 1)
            if end > first:
                start_writeback(self.dfd, first, end - first)
            if off + n - self.clean > WRITEBACK_BEHIND:
                wait_writeback(self.dfd, self.clean, off + n - WRITEBACK_BEHIND // 2 - self.clean)
                self.clean = off + n - WRITEBACK_BEHIND // 2
        self._report(n)

    def _report(self, n: int, flush: bool = False) -> None:
        absorbed = min(n, self.overcounted)
        self.overcounted -= absorbed
        self.unreported += n - absorbed
        if self.progress is not None and self.unreported and (flush or self.unreported >= PROGRESS_CHUNK):
            self.progress(self.unreported)
            self.unreported = 0


def _run_ends(spans: list[Span]) -> list[int]:
    """For each span (in the new file's order), where the run of contiguous bytes it belongs to ends in
    the file it is read from (a donor's file at ``donor_offset``, or the source at ``begin``): the spans
    that follow it there, one after another, are read ahead with it."""
    ends = [0] * len(spans)
    for i in range(len(spans) - 1, -1, -1):
        s = spans[i]
        start = s.donor_offset if s.donor is not None else s.begin
        ends[i] = start + s.size
        if i + 1 < len(spans):
            n = spans[i + 1]
            if (n.donor, n.donor_path) == (s.donor, s.donor_path) and \
                    (n.donor_offset if n.donor is not None else n.begin) == ends[i]:
                ends[i] = ends[i + 1]
    return ends


def _open_for_spans(ref: "str | FileRef") -> int:
    """A donor or the source, read span by span: the kernel's own read-ahead is off (the source gives
    only the changed ranges, a donor only what it lends: read-ahead past each span, 8 MiB on this VM's
    disk and doubled for a sequential file, read 1.22-1.25x the checkpoint for a 10% delta), and each
    span is read ahead by :func:`_will_need` instead, within its own bounds."""
    fd = open_for_read(ref)
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def _will_need(fd: int, off: int, n: int) -> None:
    """Ask the kernel to read [off, off + n) now, WILL_NEED_CALL bytes a call (a hint: a file system
    without it reads on demand). One call reads at most the device's read-ahead or request size
    (max(read_ahead_kb, max_sectors_kb): 8 MiB here, often 128 KiB to 1 MiB), so a window is asked for
    in pieces no device cuts short."""
    with contextlib.suppress(OSError):
        for o in range(off, off + n, WILL_NEED_CALL):
            os.posix_fadvise(fd, o, min(WILL_NEED_CALL, off + n - o), os.POSIX_FADV_WILLNEED)
