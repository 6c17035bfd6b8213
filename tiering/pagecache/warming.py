"""Warming: bounded windows faulted in with ``madvise(MADV_POPULATE_READ)`` (else ``MAP_POPULATE``),
resident windows skipped, several files in flight, under the throttle."""

from __future__ import annotations

import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .._syscalls import PAGE, populate, populate_read_supported
from ..safefs.paths import open_for_read
from ..content.units import format_rate
from ..errors import PageCacheError
from ..progress import watch_throttle
from .files import FileRef, Skipped, collect_files
from .resident import resident_bytes, resident_pages
from .throttle import AwaitMonitor, LatencyProbe, TokenBucket

WINDOW = 16 << 20          # mapped at a time per file in flight: RSS stays ~concurrency x 16 MiB


@dataclass(frozen=True, slots=True)
class Tuning:
    """How warming reads (``bench/warm.py --explore`` measures each choice; the defaults are what it
    found fastest here, see docs/benchmarks.md): ``window`` bytes faulted in per call, ``precheck``
    (skip windows already resident: a cachestat/mincore per window first), ``probe`` (the 4 KiB random
    read that drives the back-off), ``hint``: ``sequential`` (POSIX_FADV_SEQUENTIAL: the kernel's
    read-ahead doubled), ``willneed`` (also POSIX_FADV_WILLNEED on the next window while this one is
    faulted in) or ``none``."""
    window: int = WINDOW
    precheck: bool = True
    probe: bool = True
    hint: str = "sequential"


@dataclass(frozen=True, slots=True)
class WarmOptions:
    concurrency: int = 2
    rate_bytes_per_s: int = 0
    await_threshold_ms: float = 5.0


@dataclass(slots=True)
class WarmReport:
    files: int = 0
    bytes: int = 0
    already_resident_bytes: int = 0
    warmed_bytes: int = 0
    resident_bytes: int = 0
    seconds: float = 0.0
    rate_limit: int = 0
    max_await_ms: float = 0.0
    await_threshold_ms: float = 0.0
    backoffs: int = 0
    backoff_seconds: float = 0.0
    max_probe_ms: float = 0.0
    probes: int = 0
    method: str = ""
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "already_resident_bytes": self.already_resident_bytes,
                "warmed_bytes": self.warmed_bytes, "resident_bytes": self.resident_bytes,
                "seconds": round(self.seconds, 4),
                "bytes_per_s": round(self.warmed_bytes / self.seconds) if self.seconds > 0 else None,
                "rate_limit": self.rate_limit, "method": self.method,
                "await": {"threshold_ms": self.await_threshold_ms,
                          "max_random_read_ms": round(self.max_probe_ms, 3), "probes": self.probes,
                          "max_diskstats_read_await_ms": round(self.max_await_ms, 3),
                          "backoffs": self.backoffs, "backoff_seconds": round(self.backoff_seconds, 3)},
                "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped], "notes": self.notes}


def _warm_file(ref: FileRef, bucket: TokenBucket, monitor: AwaitMonitor, report: WarmReport, lock: threading.Lock,
               progress: Callable[[int], None] | None, tuning: Tuning) -> None:
    fd = open_for_read(ref.path)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            with lock:
                report.notes.append(f"{ref.path}: empty file, nothing to warm")
            return
        if tuning.hint != "none":
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        # check first, touch only what is missing (before our own read-ahead changes the answer)
        w = tuning.window
        windows = [(off, min(w, size - off)) for off in range(0, size, w)]
        resident = ([min(n, resident_pages(fd, off, n)[0] * PAGE) for off, n in windows] if tuning.precheck
                    else [0] * len(windows))
        todo = [(i, *win) for i, (win, r) in enumerate(zip(windows, resident)) if r < win[1]]
        already = sum(resident)
        if progress is not None and already:
            progress(already)
        warmed = 0
        for j, (i, off, n) in enumerate(todo):
            monitor.pause(n)
            bucket.consume(n)
            if tuning.hint == "willneed" and j + 1 < len(todo):
                os.posix_fadvise(fd, todo[j + 1][1], todo[j + 1][2], os.POSIX_FADV_WILLNEED)
            try:
                populate(fd, off, n)
            except PageCacheError as exc:
                if exc.errno == errno.ENODEV:  # a file system without mmap: read it instead
                    _read_range(fd, off, n)
                else:
                    raise
            warmed += n - resident[i]
            if progress is not None:
                progress(n - resident[i])
        if os.fstat(fd).st_size < size:
            raise PageCacheError(errno.EFAULT, "file truncated while being warmed")
        with lock:
            report.already_resident_bytes += already
            report.warmed_bytes += warmed
    finally:
        os.close(fd)


def _read_range(fd: int, off: int, n: int) -> None:
    buf = bytearray(1 << 20)
    end = off + n
    while off < end:
        got = os.preadv(fd, [memoryview(buf)[:min(len(buf), end - off)]], off)
        if got <= 0:
            break
        off += got


def warm(paths: Iterable[str | os.PathLike[str]], *, concurrency: int = 2, rate_bytes_per_s: int = 0,
         await_threshold_ms: float = 5.0, progress: Callable[[int], None] | None = None,
         files: list[FileRef] | None = None, tuning: Tuning = Tuning()) -> WarmReport:
    """Bring files (or whole checkpoint directories) into the page cache. Per-file problems are
    reported in ``skipped`` and the rest goes on."""
    t0 = time.monotonic()
    skipped: list[Skipped] = []
    if files is None:
        files, skipped = collect_files(paths)
    report = WarmReport(files=len(files), bytes=sum(f.size for f in files), rate_limit=rate_bytes_per_s,
                        await_threshold_ms=await_threshold_ms, skipped=list(skipped),
                        method="madvise(MADV_POPULATE_READ)")
    probe = LatencyProbe(files if tuning.probe else [])
    # slack: each file in flight may have twice the device's read-ahead (8 MiB here) in flight too
    monitor = AwaitMonitor(probe.devices, await_threshold_ms, probe=probe if probe.targets else None,
                           slack_bytes=max(1, concurrency) * (32 << 20))
    bucket = TokenBucket(rate_bytes_per_s)
    watch_throttle(progress, lambda: (monitor.rate_cap, monitor.backoffs))  # (a Progress shows it live)
    lock = threading.Lock()

    def one(ref: FileRef) -> None:
        try:
            _warm_file(ref, bucket, monitor, report, lock, progress, tuning)
        except OSError as exc:
            with lock:
                report.skipped.append(Skipped(ref.path, exc.strerror or str(exc)))

    if files:
        fd = open_for_read(files[0].path) if files[0].size else None
        if fd is not None:
            try:
                if not populate_read_supported(fd):
                    report.method = "mmap(MAP_POPULATE)"
            except OSError:
                pass
            finally:
                os.close(fd)
    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="weightd-warm") as pool:
            list(pool.map(one, files))
    finally:
        probe.close()
    report.resident_bytes = resident_bytes([f.path for f in files]) if files else 0
    report.max_await_ms, report.backoffs, report.backoff_seconds = monitor.max_await_ms, monitor.backoffs, monitor.backoff_s
    report.max_probe_ms, report.probes = monitor.max_probe_ms, monitor.probes
    if monitor.backoffs:
        report.notes.append(f"backed off {monitor.backoffs} times (waited {monitor.backoff_s:.1f} s, down to "
                            f"{format_rate(monitor.min_rate)}): a 4 KiB random read waited up to "
                            f"{monitor.max_probe_ms:.1f} ms (threshold {await_threshold_ms} ms)")
    report.seconds = time.monotonic() - t0
    return report
