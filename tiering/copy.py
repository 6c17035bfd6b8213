"""Plain copies in the kernel (publish's, whose source is hashed apart; many files at once in
:mod:`tiering.copy_many`), and the deadlines every copy
and read of cold storage runs under (:func:`run_all`, :func:`run_bounded`, the stuck-read count).

``copy_file_range`` within a file system, else ``sendfile`` (``copy_file_range`` across file systems
fails with EXDEV on some kernels), else ``pread``/``pwrite`` through one 1 MiB buffer. The destination
is preallocated first on local tiers, so a full tier fails before bytes are written, and write-back
is started as the copy goes (``sync_file_range``) so the final ``fsync`` does not stall. A preload
copies with :mod:`tiering.verified_copy` instead: hashed on the way, each byte read once.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

from ._syscalls import start_writeback
from .content.scan import create_file_at, open_file_at
from .errors import FileChanged, TimedOut
from .safefs import FileRef, open_source, sanitize_mode

CHUNK = 64 << 20           # bytes per copy call without a progress to report to
PROGRESS_CHUNK = 8 << 20   # ... and with one: a watcher sees bytes move (a 5 GB shard is not 0 B for half a
                           # minute), at one system call per 8 MiB (a few microseconds per millisecond of copy)
_FALLBACK_ERRNOS = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM}
STUCK_CAP = 8              # threads left blocked in reads their caller gave up on: then new work is refused
T = TypeVar("T")


class ColdStorageStuck(TimedOut):
    """STUCK_CAP threads are still blocked in reads whose callers gave up (a hung mount): new work that
    reads the source is refused at once instead of adding a thread, until they return (exit 4)."""

    def __init__(self, n: int, age_s: float) -> None:
        self.n, self.age_s = n, age_s
        super().__init__(f"cold storage is not answering ({n} reads stuck for {age_s:.0f} s): refusing new work "
                         "that reads it until they return (is its mount hung? weightd doctor)")


class _Bounded:
    """The threads :func:`run_bounded` and :func:`run_all` run with a deadline, while they run: each
    ``[started, abandoned]``; abandoned once its caller stopped waiting (the thread is stuck in a
    system call that does not return: it cannot be interrupted, only counted and capped)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[int, list[Any]] = {}
        self.next = 0

    def enter(self) -> int:
        with self.lock:
            self.next += 1
            self.running[self.next] = [time.monotonic(), False]
            return self.next

    def leave(self, token: int) -> None:
        with self.lock:
            self.running.pop(token, None)

    def abandon(self, tokens: Sequence[int]) -> None:
        with self.lock:
            for t in tokens:
                if t in self.running:
                    self.running[t][1] = True

    def stuck(self) -> tuple[int, float]:
        with self.lock:
            started = [s for s, abandoned in self.running.values() if abandoned]
        return len(started), (time.monotonic() - min(started)) if started else 0.0


_BOUNDED = _Bounded()
_local = threading.local()


def stuck_reads() -> tuple[int, float]:
    """(threads left blocked in reads their callers gave up on, seconds since the oldest began)."""
    return _BOUNDED.stuck()


def refuse_if_stuck(cap: int | None = None) -> None:
    """ColdStorageStuck once ``cap`` (STUCK_CAP) threads are left blocked: called before any work that
    reads cold storage starts, so a hung mount costs at most ``cap`` threads, never one per request."""
    n, age = _BOUNDED.stuck()
    if n >= (STUCK_CAP if cap is None else cap):
        raise ColdStorageStuck(n, age)


def bounded_running() -> int:
    """Threads :func:`run_bounded` and :func:`run_bounded_async` started that have not returned yet."""
    with _BOUNDED.lock:
        return len(_BOUNDED.running)


def current_deadline() -> float | None:
    """The deadline (``time.monotonic``) of the :func:`run_bounded` call this thread works for, if any:
    a request made deep inside (an object-store GET) ends by it too."""
    return getattr(_local, "deadline", None)


@dataclass(frozen=True, slots=True)
class CopyJob:
    """``src``: a FileRef beneath a tier (cold storage, the other tier) or a path outside any tier (a
    directory being published); ``dst``: a new file beneath a staging area. ``mode`` is sanitised."""
    src: "str | FileRef"
    dst: "str | FileRef"   # a path only outside any tier (tools, tests)
    size: int
    mode: int


def _create_dst(dst: "str | FileRef") -> int:
    """A new destination file: beneath a staging area by descriptor, or (outside any tier) by path;
    never an existing file and never through a symlink at the last component."""
    if isinstance(dst, FileRef):
        if "/" not in dst.rel:   # (directly in its directory: see Parents)
            return create_file_at(dst.dir, dst.rel)
        return dst.dir.create(dst.rel, 0o600)
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    return os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _open_src(src: "str | FileRef") -> int:
    """The source, as :func:`open_source` opens it; one directly in its (already open) directory by
    name (see Parents)."""
    if isinstance(src, FileRef) and "/" not in src.rel:
        return open_file_at(src.dir, src.rel)[0]
    return open_source(src)


def where(ref: "str | FileRef") -> str:
    """``ref`` for a message (a FileRef's ``str`` joins Paths: ~10 us, a tenth of a second for 10,000
    files when it is built for each file in case it fails)."""
    return f"{ref.dir.path}/{ref.rel}" if isinstance(ref, FileRef) else str(ref)


def _copy_chunk(sfd: int, dfd: int, off: int, n: int, method: list[str], buf: list[bytearray]) -> int:
    while True:
        try:
            if method[0] == "copy_file_range":
                return os.copy_file_range(sfd, dfd, n, off, off)
            if method[0] == "sendfile":
                os.lseek(dfd, off, os.SEEK_SET)
                return os.sendfile(dfd, sfd, off, n)
            if not buf:
                buf.append(bytearray(1 << 20))
            view = memoryview(buf[0])
            got = os.preadv(sfd, [view[:min(n, len(view))]], off)
            written = 0
            while written < got:
                written += os.pwrite(dfd, view[written:got], off + written)
            return got
        except OSError as exc:
            if exc.errno in _FALLBACK_ERRNOS and method[0] != "readwrite":
                method[0] = "sendfile" if method[0] == "copy_file_range" else "readwrite"
                continue
            raise


def prepare(sfd: int, dfd: int, size: int, *, sequential: bool = True) -> None:
    """Before a copy: ``size`` bytes preallocated at the destination (a full tier fails here, before a
    byte is written; other refusals, e.g. tmpfs or NFS without fallocate, are not errors) and the
    source read sequentially (not asked for a file read in one call)."""
    if size:
        try:
            os.posix_fallocate(dfd, 0, size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise
    if sequential and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)


def copy_file(job: CopyJob, *, preallocate: bool = True, progress: Callable[[int], None] | None = None,
              deadline: float | None = None, clock: Callable[[], float] = time.monotonic, fsync: bool = True) -> str:
    """Copy ``job.src`` to a new ``job.dst``; returns the method used. ENOSPC surfaces as OSError; a
    source shorter than ``job.size`` is FileChanged (an integrity failure, exit 5)."""
    sfd = _open_src(job.src)
    try:
        dfd = _create_dst(job.dst)
        try:
            prepare(sfd, dfd, job.size if preallocate else 0, sequential=job.size > SMALL_FILE_BYTES)
            method, buf = ["copy_file_range"], []
            off, step = 0, CHUNK if progress is None else PROGRESS_CHUNK
            while off < job.size:
                if deadline is not None and clock() > deadline:
                    raise TimedOut(f"timed out copying {job.src}")
                n = _copy_chunk(sfd, dfd, off, min(step, job.size - off), method, buf)
                if n <= 0:
                    raise FileChanged(where(job.src), f"source ended at byte {off}, expected {job.size} "
                                                      "(shorter than its manifest says)")
                if fsync:   # (many small files: one syncfs at the end; writeback started per file makes each
                    start_writeback(dfd, off, n)   # create wait on the journal, ~0.3 ms a file measured)
                off += n
                if progress is not None:
                    progress(n)
            if os.fstat(sfd).st_size != job.size:
                raise FileChanged(where(job.src), "source changed size while it was copied")
            os.fchmod(dfd, sanitize_mode(job.mode))
            if fsync:
                os.fsync(dfd)
            return method[0]
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


SMALL_FILES = 256          # more files than this, averaging under SMALL_FILE_BYTES: one syncfs, not an fsync each
SMALL_FILE_BYTES = 1 << 20


def run_all(fn: Callable[[T], object], items: Sequence[T], *, threads: int, name: str,
            deadline: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
    """``fn(item)`` for every item, ``threads`` at a time, in order; the first error cancels what has
    not started and is raised once the running ones finish.

    With a ``deadline`` (on ``clock``, ``time.monotonic`` unless the caller injects its own), the caller
    waits no longer than that: a worker stuck in a system call that never returns (a read from a hung
    NFS server cannot be interrupted) is left behind as a daemon thread, told to stop when it wakes,
    and the caller gets TimedOut."""
    if deadline is None and (threads <= 1 or len(items) <= 1):
        for it in items:
            fn(it)
        return
    lock = threading.Lock()
    done = threading.Event()
    state = {"next": 0, "running": 0, "error": None}
    todo = list(items)
    tokens: list[int] = []

    def worker() -> None:
        token = _BOUNDED.enter()
        tokens.append(token)
        try:
            while True:
                with lock:
                    if state["error"] is not None or state["next"] >= len(todo):
                        return
                    it = todo[state["next"]]
                    state["next"] += 1
                try:
                    fn(it)
                except BaseException as exc:
                    with lock:
                        if state["error"] is None:
                            state["error"] = exc
        finally:
            _BOUNDED.leave(token)
            with lock:
                state["running"] -= 1
                if state["running"] == 0:
                    done.set()

    n = max(1, min(threads, len(todo)))
    state["running"] = n
    if not todo:
        return
    for i in range(n):
        threading.Thread(target=worker, name=f"{name}-{i}", daemon=True).start()
    timeout = None if deadline is None else max(0.0, deadline - clock())
    if not done.wait(timeout):
        _BOUNDED.abandon(tokens)
        with lock:
            if state["error"] is None:
                state["error"] = TimedOut("timed out: a read did not return before the deadline "
                                          "(is the source storage hung?)")
            err = state["error"]
        raise err
    if state["error"] is not None:
        raise state["error"]


def run_bounded(fn: Callable[[], T], *, deadline: float | None, what: str,
                clock: Callable[[], float] = time.monotonic, grace_s: float = 1.0) -> T:
    """``fn()``, but the caller waits no longer than ``deadline`` (plus ``grace_s``, so that ``fn``'s own,
    more precise timeout wins when it is still responsive): any read inside it that never returns (a
    manifest on a hung NFS server, not only a copy) ends in TimedOut, the stuck work left behind on a
    daemon thread (it gives up by itself at its next deadline check)."""
    refuse_if_stuck()
    if deadline is None:
        return fn()
    box: dict[str, Any] = {}
    done = threading.Event()
    token = _BOUNDED.enter()
    # (a deadline on ``clock`` as the time.monotonic deadline a request made inside can end by)
    mono_deadline = time.monotonic() + max(0.0, deadline - clock())

    def work() -> None:
        _local.deadline = mono_deadline
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            _BOUNDED.leave(token)
            done.set()
    threading.Thread(target=work, name="weightd-bounded", daemon=True).start()
    if not done.wait(max(0.0, deadline - clock()) + grace_s):
        _BOUNDED.abandon([token])
        raise TimedOut(f"{what}: did not finish before its deadline (is the cold storage hung?)")
    if "error" in box:
        raise box["error"]
    return box["value"]


async def run_bounded_async(fn: Callable[[], T], *, seconds: float, what: str, grace_s: float = 1.0) -> T:
    """:func:`run_bounded` for a coroutine: ``fn()`` on a thread of its own, awaited no longer than
    ``seconds`` (plus ``grace_s``), and no pool thread waits for it meanwhile. A read that never returns
    is left on its thread, abandoned (counted by :func:`refuse_if_stuck`), and the caller gets TimedOut."""
    import asyncio
    refuse_if_stuck()
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[T]" = loop.create_future()
    token = _BOUNDED.enter()
    mono_deadline = time.monotonic() + max(0.0, seconds)

    def settle(outcome: tuple[bool, Any]) -> None:
        if not fut.done():
            if outcome[0]:
                fut.set_result(outcome[1])
            else:
                fut.set_exception(outcome[1])

    def work() -> None:
        _local.deadline = mono_deadline
        try:
            outcome: tuple[bool, Any] = (True, fn())
        except BaseException as exc:
            outcome = (False, exc)
        finally:
            _BOUNDED.leave(token)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:   # (the loop closed while it ran: nobody waits any more)
            pass
    threading.Thread(target=work, name="weightd-bounded", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(fut), max(0.0, seconds) + grace_s)
    except asyncio.TimeoutError:
        _BOUNDED.abandon([token])
        raise TimedOut(f"{what}: did not finish before its deadline (is the cold storage hung?)") from None
    except asyncio.CancelledError:
        _BOUNDED.abandon([token])
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise
