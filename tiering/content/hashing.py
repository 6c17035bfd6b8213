"""Parallel, streaming xxh3-128 of byte ranges ("parts") of many files.

Each part is hashed by one worker (xxhash releases the GIL, so workers run on all cores); a file's
descriptor is shared by the workers hashing its parts and closed after its last part.

Two ways to read:

- ``mmap`` in bounded windows with ``MAP_POPULATE`` (no copy: ~1.3x faster than ``pread`` on cached
  data), used only for a file wholly in the page cache (``cachestat``: where the page cache is smaller
  than the file, mapping its pages makes the kernel drop read-ahead not yet hashed, read again later)
  and while the file is under a kernel **read lease** (``F_SETLEASE``). A lease makes
  anyone who opens the file for writing or truncates it wait (``/proc/sys/fs/lease-break-time``) until
  we let go, so the mapped file cannot shrink under us and a SIGBUS cannot happen. We poll the lease
  between windows and switch to ``pread`` the moment a break is pending.
- ``pread`` into a reusable 1 MiB buffer everywhere else (NFS and other file systems without leases,
  files we do not own, files open for writing, lease-break-time too short to trust).

Every file is re-checked with ``fstat`` after its last part: a file that changed while it was read
raises :class:`FileChanged`.
"""

from __future__ import annotations

import fcntl
import mmap
import operator
import os
import signal
import threading
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate, starmap
from typing import Any, Callable, Sequence

import xxhash

from .._syscalls import cachestat, leases_usable
from ..errors import BadInput, CheckpointNotFound, FileChanged
from ..safefs.paths import open_for_read  # noqa: F401  (its home is safefs; imported from here too)

READ_BYTES = 1 << 20
CRYPTO_READ_BYTES = 4 << 20   # whole-file reads for a signature check: fewer calls per byte hashed
MMAP_WINDOW = 8 << 20        # bounded: mapped pages count in RSS (32 MiB x 2 threads was 64 MB of a
                             # daemon's peak at the end of every download; 8 MiB hashes as fast here)
MMAP_MIN_PART = 4 << 20      # smaller parts are read with pread
MIN_LEASE_BREAK_S = 5        # below this a window could outlive the lease: do not map
PROGRESS_EVERY = 64 << 20
_F_SETSIG = getattr(fcntl, "F_SETSIG", 10)
_lease_ok: bool | None = None
ProgressFn = Callable[[int], None]


def default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class HashJob:
    """Hash ``ranges`` of the file at ``path``; ``size``/``mtime_ns`` are what the caller saw."""
    path: str
    ranges: Sequence[tuple[int, int]]
    size: int
    mtime_ns: int | None = None


def _leases_usable() -> bool:
    """Leases enabled and a break gives us long enough to finish a window (probed once, in
    ``_syscalls``; ``_lease_ok`` keeps the answer here, where tests set it to force ``pread``)."""
    global _lease_ok
    if _lease_ok is None:
        _lease_ok = leases_usable(MIN_LEASE_BREAK_S)
    return _lease_ok


def take_read_lease(fd: int) -> bool:
    """Try to hold a read lease on ``fd``; False where the file system or ownership does not allow it."""
    if not _leases_usable():
        return False
    try:
        # a lease break is signalled to the holder, by default with SIGIO, whose default action
        # terminates the process: route it to SIGURG, which is ignored by default; we poll instead
        fcntl.fcntl(fd, _F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        return True
    except OSError:
        return False


def lease_intact(fd: int) -> bool:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
    except OSError:
        return False


class _SharedFd:
    def __init__(self, job: HashJob) -> None:
        self.job = job
        self.remaining = len(job.ranges)
        self.fd: int | None = None
        self.leased = False
        self.lock = threading.Lock()

    def acquire(self) -> int:
        with self.lock:
            if self.fd is None:
                try:
                    self.fd = open_for_read(self.job.path)
                except FileNotFoundError:
                    raise CheckpointNotFound(self.job.path, "vanished while being read") from None
                except OSError as exc:
                    raise BadInput(f"{self.job.path}: {exc.strerror}") from None
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                wants_map = min(starmap(operator.sub, self.job.ranges), default=0) <= -MMAP_MIN_PART \
                    and _resident(self.fd, self.job.size)
                if wants_map and take_read_lease(self.fd):
                    # under the lease the file cannot shrink; it must be as long as the caller saw
                    self.leased = os.fstat(self.fd).st_size >= max(map(operator.itemgetter(1), self.job.ranges))
            return self.fd

    def may_map(self) -> bool:
        """True while the lease holds; drops it (and mapping) for good once a break is pending."""
        if not self.leased:
            return False
        if lease_intact(self.fd):  # type: ignore[arg-type]
            return True
        with self.lock:
            if self.leased and self.fd is not None:
                self.leased = False
                try:
                    fcntl.fcntl(self.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)  # let the writer go on
                except OSError:
                    pass
        return False

    def release(self, parts: int = 1) -> None:
        """``parts`` of the file's parts are done (their acquisitions let go): the last closes it."""
        with self.lock:
            self.remaining -= parts
            if self.remaining == 0 and self.fd is not None:
                try:
                    st = os.fstat(self.fd)
                finally:
                    os.close(self.fd)
                    self.fd = None
                if st.st_size != self.job.size or (self.job.mtime_ns is not None and st.st_mtime_ns != self.job.mtime_ns):
                    raise FileChanged(self.job.path, "file changed while it was being read")


def _resident(fd: int, size: int) -> bool:
    """Whether every page of the file's first ``size`` bytes is in the page cache (``cachestat``; True
    without it, so mapping goes on as before). A file that is not is read with ``pread``: where the page
    cache is smaller than the file (a small memory cgroup), mapped pages are kept over the read-ahead
    not yet hashed (dropped, then read again), and a fault on a page that is not resident reads around
    it, behind too. A checkpoint read back in a 256 MiB cgroup: 1.2x-1.4x its bytes from the device
    mapped, 0.75x-0.86x with ``pread``'s sequential read-ahead (the rest was still cached)."""
    try:
        n = cachestat(fd, 0, size)
    except OSError:
        return True
    return n is None or n >= (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE


def _hash_mapped(h: Any, fd: int, off: int, start: int, stop: int) -> bool:
    """Hash [off, stop) through a ``MAP_POPULATE`` window mapped from ``start`` (page-aligned); False
    when it cannot be mapped (shorter than expected, or not mappable: ``pread`` decides)."""
    try:
        m = mmap.mmap(fd, stop - start, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ,
                      offset=start)
    except (OSError, ValueError):
        return False
    try:
        with memoryview(m) as view:
            h.update(view[off - start:])
    finally:
        m.close()
    return True


def _hash_read(h: Any, path: str, fd: int, off: int, stop: int, view: memoryview) -> None:
    """Hash [off, stop) read with ``pread`` into ``view``."""
    while off < stop:
        n = os.preadv(fd, [view[:min(len(view), stop - off)]], off)
        if n <= 0:
            raise FileChanged(path, f"file ended at byte {off}, expected {stop} (truncated while being read?)")
        h.update(view[:n])
        off += n


def _hash_range(s: _SharedFd, fd: int, begin: int, end: int, progress: ProgressFn | None) -> str:
    """xxh3-128 of [begin, end) in windows: each mapped while the lease holds (a resident file), else
    read with ``pread`` (into one buffer, reused); once a window could not be mapped, ``pread`` for the
    rest."""
    h = xxhash.xxh3_128()
    off, unreported = begin, 0
    mapping = end - begin >= MMAP_MIN_PART
    view: memoryview | None = None
    while off < end:
        start = off - off % mmap.ALLOCATIONGRANULARITY
        stop = min(end, start + MMAP_WINDOW)
        mapped = False
        if mapping and s.may_map():
            mapped = mapping = _hash_mapped(h, fd, off, start, stop)
        if not mapped:
            if view is None:
                view = memoryview(bytearray(min(READ_BYTES, max(1, end - off))))
            _hash_read(h, s.job.path, fd, off, stop, view)
        unreported += stop - off
        off = stop
        if progress is not None and unreported >= PROGRESS_EVERY:
            progress(unreported)
            unreported = 0
    if progress is not None and unreported:
        progress(unreported)
    return h.hexdigest()


def _hash_run(s: _SharedFd, fd: int, spans: list[tuple[int, int]], progress: ProgressFn | None) -> list[str]:
    """xxh3-128 of each of ``spans`` (consecutive, together at most GROUP_BYTES), read with one ``pread``:
    a MoE shard holds hundreds of tensors of a few KB, and a read, a buffer and a hasher for each cost
    ~10 us a tensor, more than hashing them (and each tensor's digest is taken in a C loop)."""
    begin, end = spans[0][0], spans[-1][1]
    view = memoryview(bytearray(end - begin))
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], begin + got)
        if n <= 0:
            raise FileChanged(s.job.path, f"file ended at byte {begin + got}, expected {end} (truncated while being read?)")
        got += n
    at = list(accumulate(starmap(operator.sub, spans), operator.sub, initial=0))  # (each end - begin)
    out = list(map(xxhash.xxh3_128_hexdigest, map(view.__getitem__, map(slice, at, at[1:]))))
    if progress is not None:
        progress(end - begin)
    return out


def _hash_whole(s: _SharedFd, fd: int, crypto: Callable[[], Any], progress: ProgressFn | None) -> tuple[list[str], str]:
    """One sequential read of the whole file feeding its ``crypto`` digest and every part's xxh3-128
    (the signature check costs CPU, not a second read)."""
    job = s.job
    order = sorted(range(len(job.ranges)), key=lambda i: job.ranges[i])
    parts = [xxhash.xxh3_128() for _ in job.ranges]
    whole = crypto()
    buf = bytearray(CRYPTO_READ_BYTES)
    view = memoryview(buf)
    off, first, unreported = 0, 0, 0
    while off < job.size:
        n = os.preadv(fd, [view[:min(len(buf), job.size - off)]], off)
        if n <= 0:
            raise FileChanged(job.path, f"file ended at byte {off}, expected {job.size} (truncated while being read?)")
        chunk = view[:n]
        whole.update(chunk)
        end = off + n
        while first < len(order) and job.ranges[order[first]][1] <= off:
            first += 1  # parts wholly behind us
        for i in order[first:]:
            b, e = job.ranges[i]
            if b >= end:
                break
            lo, hi = max(b, off), min(e, end)
            if hi > lo:
                parts[i].update(chunk[lo - off:hi - off])
        off = end
        unreported += n
        if progress is not None and unreported >= PROGRESS_EVERY:
            progress(unreported)
            unreported = 0
    if progress is not None and unreported:
        progress(unreported)
    return [h.hexdigest() for h in parts], whole.hexdigest()


GROUP_BYTES = 4 << 20


def _groups(ranges: Sequence[tuple[int, int]]) -> list[range]:
    """The ranges of one file as tasks: consecutive ones together up to GROUP_BYTES (a LoRA adapter's
    hundreds of small tensors, a compile cache's small files), a large one alone. (Found by bisection
    on the running total of sizes: a MoE shard's hundreds of ranges without a Python step each.)"""
    total = list(accumulate(starmap(operator.sub, ranges), operator.sub, initial=0))  # total[i]: sizes before i
    out: list[range] = []
    start, n = 0, len(ranges)
    while start < n:
        # the first range that would take the group past GROUP_BYTES (never the group's first)
        stop = max(start + 1, bisect_right(total, total[start] + GROUP_BYTES, start + 1) - 1)
        out.append(range(start, stop))
        start = stop
    return out


def _hash_group(s: _SharedFd, ri: range, out: list[str], progress: ProgressFn | None) -> None:
    """The parts ``ri`` of one file (a task of :func:`_groups`) into ``out``; each part acquires and
    releases the file once."""
    spans = list(s.job.ranges[ri.start:ri.stop])
    if len(spans) > 1 and list(map(operator.itemgetter(1), spans[:-1])) == list(map(operator.itemgetter(0), spans[1:])):
        try:   # (consecutive small parts of one file, tiling: one read for all of them)
            out[ri.start:ri.stop] = _hash_run(s, s.acquire(), spans, progress)
        finally:
            s.release(len(spans))
        return
    for r in ri:   # (consecutive small parts of one file are one task: a future each would cost more)
        begin, end = s.job.ranges[r]
        try:
            if end > begin:
                out[r] = _hash_range(s, s.acquire(), begin, end, progress)
            else:
                out[r] = xxhash.xxh3_128(b"").hexdigest()
                s.acquire()  # the file must still exist and be readable
        finally:
            s.release()


def hash_files(jobs: Sequence[HashJob], *, threads: int | None = None, progress: ProgressFn | None = None,
               crypto: Callable[[], Any] | None = None, crypto_out: list[str] | None = None) -> list[list[str]]:
    """Hex digests of every range of every job, in the same order. Parts run in file order.

    With ``crypto`` (a hasher factory, e.g. ``hashlib.sha256``) each file is read once, whole and in
    order by one worker, and its digest is put in ``crypto_out`` (one per job, same order); files still
    run in parallel."""
    shared = [_SharedFd(j) for j in jobs]
    if crypto is not None:
        assert crypto_out is not None
        crypto_out[:] = [""] * len(jobs)
        tasks = [(ji, -1) for ji in range(len(jobs))]
    else:
        tasks = [(ji, ri) for ji, j in enumerate(jobs) for ri in _groups(j.ranges)]
    results: list[list[str]] = [[""] * len(j.ranges) for j in jobs]

    def run(task: tuple[int, Any]) -> None:
        ji, ri = task
        s = shared[ji]
        if ri == -1:  # the whole file, crypto digest included
            s.remaining = 1
            try:
                results[ji], crypto_out[ji] = _hash_whole(s, s.acquire(), crypto, progress)  # type: ignore[index,arg-type]
            finally:
                s.release()
            return
        _hash_group(s, ri, results[ji], progress)

    n = threads or default_threads()
    if len(jobs) > 256 and -sum(sum(starmap(operator.sub, j.ranges)) for j in jobs) < len(jobs) << 20:
        n = 1   # many small files: threads taking turns at the interpreter lock run slower than one
    try:
        if n == 1 or len(tasks) <= 1:
            for t in tasks:
                run(t)
        else:
            _run_batches(_batches(jobs, tasks), run, n)
    except BaseException:
        for s in shared:  # (a failed or cancelled part never released its file: closed here)
            if s.fd is not None:
                os.close(s.fd)
                s.fd = None
        raise
    return results


def _batches(jobs: Sequence[HashJob], tasks: list[tuple[int, Any]]) -> list[list[tuple[int, Any]]]:
    """Tasks grouped a few per future, up to GROUP_BYTES (many small files, a compile cache)."""
    def size(t: tuple[int, Any]) -> int:
        ranges = jobs[t[0]].ranges
        return -sum(starmap(operator.sub, ranges if t[1] == -1 else ranges[t[1].start:t[1].stop]))
    batches: list[list[tuple[int, Any]]] = []
    acc = GROUP_BYTES
    for t in tasks:
        sz = size(t)
        if not batches or acc + sz > GROUP_BYTES or len(batches[-1]) >= 64:
            batches.append([])
            acc = 0
        batches[-1].append(t)
        acc += sz
    return batches


def _run_batches(batches: list[list[tuple[int, Any]]], run: Callable[[tuple[int, Any]], None], n: int) -> None:
    """Every batch on ``n`` threads; the first error cancels the batches not started and is raised."""
    def run_batch(batch: list[tuple[int, Any]]) -> None:
        for t in batch:
            run(t)
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="weightd-hash") as pool:
        futures = [pool.submit(run_batch, b) for b in batches]
        first_error: BaseException | None = None
        for f in futures:
            try:
                f.result()
            except BaseException as exc:  # collect and cancel the rest
                if first_error is None:
                    first_error = exc
                    for other in futures:
                        other.cancel()
        if first_error is not None:
            raise first_error
