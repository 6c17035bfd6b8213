"""The one-pass verified copy a preload places a version with (issue 35): every byte is read once, into
bounded buffers, hashed from the very buffer it is written from (the manifest's xxh3-128 parts, and a
signature's SHA-256 when the version is signed), and written once; nothing is read back to verify it.

A large file streams: a reader thread keeps STREAM_BUFFERS small buffers read ahead, the
worker checks each part as its last byte arrives and ``pwrite``s the buffer, write-back is started
behind the writes (``sync_file_range``) and waited for once WRITEBACK_BEHIND bytes are in flight (a
page cache smaller than the checkpoint never fills with dirty pages), and a signature's digest is taken
on a third thread behind the writer; one ``fsync`` per file at the end (the commit stays one durable
rename, :mod:`tiering.store.staging`). Small files go through the worker's own buffer, many of them
(a compile cache) made durable by one ``syncfs``. The deadlines of :mod:`tiering.copy` hold: a read that
never returns (a hung NFS server) leaves its reader behind, counted by ``refuse_if_stuck``.

Why not ``copy_file_range``/``sendfile`` (what plain copies use): the bytes would have to be read again
to hash them, from the device when the page cache cannot hold the checkpoint (3.3x the checkpoint
read in a 384 MiB memory cgroup for 2 GiB, docs/benchmarks.md).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Sequence

import xxhash

from ._syscalls import is_tmpfs, start_writeback, syncfs, wait_writeback
from .content.manifest import tree_hash
from .content.partcheck import PartCheck
from .content.scan import Parents
from .copy import (_BOUNDED, PROGRESS_CHUNK, SMALL_FILE_BYTES, SMALL_FILES, CopyJob, _create_dst, _open_src, prepare,
                   run_all, where)
from .copy_many import in_parents
from .errors import ChecksumMismatch, FileChanged, TimedOut
from .safefs import FileRef, open_source, sanitize_mode

IN_MEMORY_MAX = 64 << 20   # files up to this size are copied on the worker's thread through one buffer;
                           # larger ones stream, a reader thread ahead of the hashing and writing
# Bytes per read, hash and write, by where they are written. Small buffers stay in the CPU's caches
# between the read that fills them and the write that empties them: into a disk tier 2 GiB (cold, out
# of the page cache) copied in 1.94 s with 256 KiB and 2.14 s with 128 KiB against 2.80 s with 1 MiB
# (medians of 6 interleaved in-process preloads on this VM; the kernel's time in its copies to and from
# the buffers is what grows: 1.4-1.5 s against 1.9-3.4 s); into tmpfs, whose pages are new memory
# either way, 1 MiB copied 1 GiB in 0.25 s against 0.36 s with 128 KiB.
STREAM_BUFFER = 256 << 10
STREAM_BUFFER_TMPFS = 1 << 20
STREAM_BUFFERS = 8         # ... per file stream: the reader up to this many ahead of the hashing and writing
WRITEBACK_BEHIND = 32 << 20   # bytes of a stream that may be dirty or under write-back: older ones are waited
                              # for (a page cache smaller than the checkpoint never fills with dirty pages)
_local = threading.local()


def _chunk_size(fd: int, size: int) -> int:
    """The buffer size for writing ``size`` bytes to ``fd`` (tmpfs or not: see STREAM_BUFFER)."""
    return STREAM_BUFFER_TMPFS if size > STREAM_BUFFER and is_tmpfs(fd) else STREAM_BUFFER


def _buffer(n: int) -> memoryview:
    """``n`` bytes of this thread's buffer (kept: a fresh buffer costs zeroing and page faults first)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < n:
        buf = _local.buf = bytearray(n)
    return memoryview(buf)[:n]


def _write_all(fd: int, view: memoryview, off: int) -> None:
    w = 0
    while w < len(view):
        w += os.pwrite(fd, view[w:], off + w)


def copy_verified(jobs: Sequence[tuple[CopyJob, Any]], chunk_size: int, *, threads: int = 2,
                  crypto: Callable[[], Any] | None = None, progress: Callable[[int], None] | None = None,
                  deadline: float | None = None, clock: Callable[[], float] = time.monotonic, fsync: bool = True,
                  preallocate: bool = True) -> dict[str, str]:
    """Copy files checking every part against its manifest entry (a ``FileEntry``) on the way: each
    byte is read once, hashed from the buffer it is written from, and written once; nothing is read
    back. With ``crypto`` (a hasher factory: a signature's SHA-256) every file's digest is taken in the
    same pass and returned by manifest path. A part that differs is ChecksumMismatch (exit 5) as soon as
    its last byte is read; what was written stays in the staging area, which the caller aborts.

    A file larger than IN_MEMORY_MAX streams: a reader thread keeps STREAM_BUFFERS buffers read ahead
    while the worker hashes and writes them, write-back is started behind each
    write (and waited for once WRITEBACK_BEHIND bytes are dirty or under write-back: a stream's dirty
    pages stay bounded, whatever the page cache's size), ``fsync`` at the end; ``threads`` files at a
    time, largest first; progress every PROGRESS_CHUNK bytes. Smaller files go through the worker's own
    buffer; many of them (a compile cache) one at a time and made durable by one ``syncfs``. With a
    ``deadline`` a read that never returns (a hung NFS server) cannot hold the caller: TimedOut, the
    stuck reader left behind and counted (:func:`refuse_if_stuck`)."""
    items = sorted(jobs, key=lambda it: -it[0].size)
    small = len(items) > SMALL_FILES and sum(j.size for j, _ in items) < SMALL_FILE_BYTES * len(items)
    out: dict[str, str] = {}
    lock = threading.Lock()

    def one(item: tuple[CopyJob, Any]) -> None:
        job, entry = item
        if deadline is not None and clock() > deadline:
            raise TimedOut(f"timed out copying {where(job.src)}")
        check: "PartCheck | _OnePart" = _OnePart(where(job.src), entry, chunk_size) \
            if crypto is None and entry.safetensors is None and len(entry.chunks) == 1 \
            and job.size <= min(chunk_size, IN_MEMORY_MAX) else PartCheck(where(job.src), entry, chunk_size, crypto)
        if job.size > IN_MEMORY_MAX:
            digest = _stream(job, check, progress=progress, deadline=deadline, clock=clock, fsync=fsync,
                             preallocate=preallocate)
        else:
            if isinstance(job.src, FileRef) and "/" in job.src.rel:   # (its directory opened once, here: on
                job = CopyJob(FileRef(*opened.split(job.src)), job.dst, job.size, job.mode)   # the deadline's thread)
            digest = _inline(job, check, progress=progress, fsync=fsync and not small)
        if digest is not None:
            with lock:
                out[entry.path] = digest

    made, opened = Parents(create=True), Parents()
    try:
        items = [(in_parents(j, made), e) for j, e in items]
        # small files on one thread: each costs a few system calls around a little Python, and threads
        # taking turns at the interpreter lock that often run slower than one (10,000 files of 10 KB:
        # 0.42 s on one thread, 0.88 s on two, 1.2 s on four); an adapter's preloads run at once instead
        large = sum(1 for j, _ in items if j.size > IN_MEMORY_MAX)
        run_all(one, items, threads=max(1, min(threads, large)), name="weightd-copy", deadline=deadline, clock=clock)
        if small and fsync:
            for d in {id(j.dst.dir): j.dst.dir for j, _ in items if isinstance(j.dst, FileRef)}.values():
                syncfs(d.fd)
                break   # (one file system: the staging area's)
            if any(not isinstance(j.dst, FileRef) for j, _ in items):
                os.sync()   # (paths outside any tier: tools and tests)
    finally:
        made.close()
        opened.close()
    return out


class _OnePart:
    """:class:`PartCheck` for a file that is one part (a chunk: no more than ``chunk_size`` bytes, no
    crypto digest), as nearly every file of a compile cache is: the same checks (the part's xxh3-128
    when its last byte, the file's, has been read; then the file's tree hash), without building the
    file's list of parts (~10 us a file)."""

    __slots__ = ("path", "entry", "chunk_size", "h", "fed", "crypto")

    def __init__(self, path: str, entry: Any, chunk_size: int) -> None:
        self.path, self.entry, self.chunk_size = path, entry, chunk_size
        self.h, self.fed, self.crypto = xxhash.xxh3_128(), 0, None

    def update(self, chunk: "memoryview | bytes", off: int) -> None:
        if off != self.fed:
            raise ValueError(f"{self.path}: bytes fed out of order (at {off}, expected {self.fed})")
        self.h.update(chunk)
        self.fed = off + len(chunk)

    def finish(self) -> None:
        entry = self.entry
        if self.fed != entry.size:
            raise FileChanged(self.path, f"{self.fed} bytes read, expected {entry.size}")
        got = self.h.hexdigest()
        if got != entry.chunks[0]:
            raise ChecksumMismatch(self.path, entry.parts(self.chunk_size)[0].label, str(entry.chunks[0]), got)
        tree = tree_hash([got])
        if tree != entry.xxh3_128:
            raise ChecksumMismatch(self.path, "file", entry.xxh3_128, tree)
        return None


def _inline(job: CopyJob, check: Any, *, progress: Callable[[int], None] | None, fsync: bool) -> str | None:
    """A small file through this thread's buffer: read, hashed, written a chunk at a time."""
    sfd = _open_src(job.src)
    try:
        dfd = _create_dst(job.dst)
        try:
            chunk = _chunk_size(dfd, job.size)
            buf = _buffer(chunk)
            off = 0
            while off < job.size:
                n = os.readv(sfd, [buf[:min(chunk, job.size - off)]])
                if n <= 0:
                    raise FileChanged(where(job.src), f"source ended at byte {off}, expected {job.size} "
                                                      "(shorter than its manifest says)")
                check.update(buf[:n], off)
                w = 0
                while w < n:
                    w += os.write(dfd, buf[w:n])
                off += n
                if progress is not None:   # (as the bytes move, not a file at a time)
                    progress(n)
            if os.read(sfd, 1):
                raise FileChanged(where(job.src), f"source is longer than the {job.size} bytes its manifest says")
            digest = check.finish()
            os.fchmod(dfd, sanitize_mode(job.mode))
            if fsync:
                os.fsync(dfd)
            return digest
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


class _Reader:
    """A file stream's reader: fills free buffers in file order on a thread of its own and hands them
    over (``(offset, bytes read, buffer)``, or the error it met). It owns the source's descriptor and
    closes it when it ends; a reader whose consumer gave up while it was stuck in a read (a hung
    mount) is counted as abandoned until that read returns."""

    def __init__(self, sfd: int, size: int, chunk: int, name: str) -> None:
        import queue
        self.sfd, self.size = sfd, size
        self.free: "queue.SimpleQueue[bytearray | None]" = queue.SimpleQueue()
        self.full: "queue.SimpleQueue[tuple[int, int, bytearray, int | None] | BaseException]" = queue.SimpleQueue()
        for _ in range(min(STREAM_BUFFERS, max(1, -(-size // chunk)))):
            self.free.put(bytearray(chunk))
        self.stop = False
        self.token = _BOUNDED.enter()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            off = 0
            while off < self.size:
                buf = self.free.get()
                if buf is None or self.stop:
                    return
                want = min(len(buf), self.size - off)
                view = memoryview(buf)
                got = 0
                while got < want:
                    n = os.preadv(self.sfd, [view[got:want]], off + got)
                    if n <= 0 or self.stop:
                        break
                    got += n
                last = got < want or off + got >= self.size
                # (with the last bytes, the source's size then: one that changed meanwhile is FileChanged)
                self.full.put((off, got, buf, os.fstat(self.sfd).st_size if last else None))
                if last:
                    return
                off += got
        except BaseException as exc:   # (handed over: the consumer raises it)
            self.full.put(exc)
        finally:
            try:
                os.close(self.sfd)
            except OSError:   # (a file server that went away: ENOTCONN; nothing is left to release)
                pass
            _BOUNDED.leave(self.token)

    def get(self, deadline: float | None, clock: Callable[[], float]) -> tuple[int, int, bytearray, int | None]:
        import queue
        while True:
            wait = None if deadline is None else max(0.0, deadline - clock())
            try:
                item = self.full.get(timeout=None if wait is None else min(wait, 1.0))
            except queue.Empty:
                if deadline is not None and clock() > deadline:
                    raise TimedOut("timed out: a read did not return before the deadline "
                                   "(is the source storage hung?)") from None
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def close(self) -> None:
        """Stop reading (woken if it waits for a buffer); if it is still inside a read, it is abandoned."""
        self.stop = True
        self.free.put(None)
        _BOUNDED.abandon([self.token])


class _Digester:
    """A stream's crypto digest (a signature's SHA-256, about 1 GiB/s a core) on a thread of its own,
    behind the writer: each buffer is hashed in file order and then handed back to the reader, so the
    digest overlaps the reads and writes instead of adding to them."""

    def __init__(self, hasher: Any, free: Any, name: str) -> None:
        import queue
        self.h, self.free = hasher, free
        self.todo: "queue.SimpleQueue[tuple[bytearray, int] | None]" = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                return
            buf, n = item
            if self.error is None:
                try:
                    with memoryview(buf) as view:
                        self.h.update(view[:n])
                except BaseException as exc:   # (raised by finish())
                    self.error = exc
            self.free.put(buf)

    def add(self, buf: bytearray, n: int) -> None:
        self.todo.put((buf, n))

    def finish(self) -> str:
        self.close()
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.h.hexdigest()

    def close(self) -> None:
        self.todo.put(None)


def _open_stream(job: CopyJob, preallocate: bool) -> tuple[int, int]:
    """(source, new destination) descriptors; the destination preallocated on a local disk, so a full
    tier fails before bytes are written (ENOSPC)."""
    sfd = open_source(job.src)
    try:
        dfd = _create_dst(job.dst)
    except BaseException:
        os.close(sfd)
        raise
    try:
        prepare(sfd, dfd, job.size if preallocate else 0)
    except BaseException:
        os.close(sfd)
        os.close(dfd)
        raise
    return sfd, dfd


def _stream(job: CopyJob, check: Any, *, progress: Callable[[int], None] | None, deadline: float | None,
            clock: Callable[[], float], fsync: bool, preallocate: bool) -> str | None:
    """A large file: read ahead on a reader thread, hashed and written here from the same buffers."""
    sfd, dfd = _open_stream(job, preallocate)
    reader = _Reader(sfd, job.size, _chunk_size(dfd, job.size), "weightd-read")   # (it owns sfd from here)
    digester = None
    if check.crypto is not None:   # (taken over from the part check: hashed on its own thread)
        digester, check.crypto = _Digester(check.crypto, reader.free, "weightd-digest"), None
    try:
        off = clean = unreported = 0   # (clean: below it, written back)
        while off < job.size:
            at, n, buf, size_after = reader.get(deadline, clock)
            view = memoryview(buf)[:n]
            try:
                if n == 0 or (n < len(buf) and at + n < job.size):
                    raise FileChanged(str(job.src), f"source ended at byte {at + n}, expected {job.size} "
                                                    "(shorter than its manifest says)")
                if size_after is not None and size_after != job.size:
                    raise FileChanged(str(job.src), "source changed size while it was copied")
                check.update(view, at)
                _write_all(dfd, view, at)
            finally:
                view.release()
            if digester is not None:
                digester.add(buf, n)
            else:
                reader.free.put(buf)
            if fsync:
                start_writeback(dfd, at, n)
                if at + n - clean > WRITEBACK_BEHIND:
                    wait_writeback(dfd, clean, at + n - WRITEBACK_BEHIND // 2 - clean)
                    clean = at + n - WRITEBACK_BEHIND // 2
            off = at + n
            unreported += n
            if progress is not None and (unreported >= PROGRESS_CHUNK or off >= job.size):
                progress(unreported)   # (as the bytes move, not a file at a time)
                unreported = 0
        check.finish()
        digest = digester.finish() if digester is not None else None
        os.fchmod(dfd, sanitize_mode(job.mode))
        if fsync:
            os.fsync(dfd)
        return digest
    finally:
        reader.close()
        if digester is not None:
            digester.close()
        os.close(dfd)
