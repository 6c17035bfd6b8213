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
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import mmap
import os
import random
import resource
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .content.hashing import open_for_read

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
WINDOW = 16 << 20          # mapped at a time per file in flight: RSS stays ~concurrency x 16 MiB
MADV_POPULATE_READ = 22
SYS_CACHESTAT = 451        # same number on x86_64 and arm64 (new syscalls share numbers)
CAP_IPC_LOCK = 14

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.syscall.restype = ctypes.c_long
_MAP_FAILED = ctypes.c_void_p(-1).value


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64), ("nr_writeback", ctypes.c_uint64),
                ("nr_evicted", ctypes.c_uint64), ("nr_recently_evicted", ctypes.c_uint64)]


class PageCacheError(OSError):
    """A per-file problem (the caller warns and goes on)."""


# -- optional kernel features, probed once -----------------------------------------------------------
_features: dict[str, bool] = {}


def has_cachestat() -> bool:
    if "cachestat" not in _features:
        fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _features["cachestat"] = _cachestat(fd, 0, 0) is not None
        finally:
            os.close(fd)
    return _features["cachestat"]


def _cachestat(fd: int, off: int, length: int) -> int | None:
    """Pages of [off, off+length) in the page cache (length 0: to the end), or None without cachestat."""
    rng, cs = _CachestatRange(off, length), _Cachestat()
    rc = _libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(cs), 0)
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM):
            return None
        raise PageCacheError(err, os.strerror(err))
    return int(cs.nr_cache)


def _map(fd: int, length: int, offset: int, flags: int = mmap.MAP_SHARED) -> int:
    addr = _libc.mmap(None, length, mmap.PROT_READ, flags, fd, offset)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise PageCacheError(err, f"mmap: {os.strerror(err)}")
    return int(addr)


def _mincore(fd: int, off: int, length: int) -> int:
    """Resident pages of [off, off+length) by mincore over a temporary read-only mapping."""
    start = off - off % PAGE
    span = off + length - start
    addr = _map(fd, span, start)
    try:
        pages = (span + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(addr, span, vec) != 0:
            err = ctypes.get_errno()
            raise PageCacheError(err, f"mincore: {os.strerror(err)}")
        return sum(b & 1 for b in bytes(vec))
    finally:
        _libc.munmap(addr, span)


def resident_pages(fd: int, off: int, length: int, *, method: str | None = None) -> tuple[int, str]:
    """(resident pages in the range, method used)."""
    if length <= 0:
        return 0, "none"
    if method != "mincore" and has_cachestat():
        n = _cachestat(fd, off, length)
        if n is not None:
            return n, "cachestat"
    return _mincore(fd, off, length), "mincore"


def _populate_read_supported(fd: int) -> bool:
    if "populate_read" not in _features:
        addr = _map(fd, PAGE, 0)
        try:
            ok = _libc.madvise(addr, PAGE, MADV_POPULATE_READ) == 0 or ctypes.get_errno() != errno.EINVAL
        finally:
            _libc.munmap(addr, PAGE)
        _features["populate_read"] = ok
    return _features["populate_read"]


def _populate(fd: int, off: int, length: int) -> None:
    """Fault [off, off+length) into the page cache without touching mapped memory from Python."""
    if _populate_read_supported(fd):
        addr = _map(fd, length, off)
        try:
            if _libc.madvise(addr, length, MADV_POPULATE_READ) != 0:
                err = ctypes.get_errno()
                if err == errno.EFAULT:  # the file is shorter than the mapping: truncated under us
                    raise PageCacheError(err, "file truncated while being warmed")
                raise PageCacheError(err, f"madvise: {os.strerror(err)}")
        finally:
            _libc.munmap(addr, length)
    else:
        addr = _map(fd, length, off, mmap.MAP_SHARED | mmap.MAP_POPULATE)
        _libc.munmap(addr, length)


# -- the files of a request --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class FileRef:
    path: str
    size: int
    writable: bool  # mincore is reliable only for files the caller could write


@dataclass(slots=True)
class Skipped:
    path: str
    reason: str


def loader_order(directory: Path, files: list[Path]) -> list[Path]:
    """Small non-weight files first (a loader reads config and tokenizer first), then safetensors
    shards in index order, then the rest."""
    index_order: dict[str, int] = {}
    for idx in sorted(directory.glob("*.safetensors.index.json")):
        try:
            wm = json.loads(idx.read_text()).get("weight_map", {})
            for shard in wm.values():
                index_order.setdefault(str(idx.parent / shard), len(index_order))
        except (OSError, ValueError, AttributeError):
            continue

    def key(p: Path) -> tuple[int, int, str]:
        s = str(p)
        if p.name.endswith(".safetensors"):
            return (1, index_order.get(s, len(index_order)), s)
        if p.suffix in (".json", ".txt", ".model", ".tiktoken", ".jinja"):
            return (0, 0, s)
        return (2, 0, s)
    return sorted(files, key=key)


def collect_files(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[FileRef], list[Skipped]]:
    """Regular files named or under the named directories (symlinks followed, hard links once)."""
    out: list[FileRef] = []
    skipped: list[Skipped] = []
    seen: set[tuple[int, int]] = set()

    def add(p: Path) -> None:
        try:
            st = p.stat()
        except FileNotFoundError:
            skipped.append(Skipped(str(p), "no such file or directory"))
            return
        except OSError as exc:
            skipped.append(Skipped(str(p), exc.strerror or str(exc)))
            return
        if stat.S_ISDIR(st.st_mode):
            try:
                children = [c for c in p.rglob("*") if ".weightd" not in c.relative_to(p).parts]
            except OSError as exc:
                skipped.append(Skipped(str(p), exc.strerror or str(exc)))
                return
            files = []
            for c in children:
                try:
                    if c.is_dir():
                        if not os.access(c, os.R_OK | os.X_OK):
                            skipped.append(Skipped(str(c), "permission denied"))
                        continue
                except OSError:
                    continue
                files.append(c)
            for c in loader_order(p, files):
                add(c)
            return
        if not stat.S_ISREG(st.st_mode):
            skipped.append(Skipped(str(p), "not a regular file (FIFO, socket or device)"))
            return
        if (st.st_dev, st.st_ino) in seen:
            return
        seen.add((st.st_dev, st.st_ino))
        if not os.access(p, os.R_OK):
            skipped.append(Skipped(str(p), "permission denied"))
            return
        out.append(FileRef(str(p), st.st_size, os.access(p, os.W_OK) or st.st_uid == os.geteuid()))

    for p in paths:
        add(Path(p))
    return out, skipped


# -- residency ---------------------------------------------------------------------------------------

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


# -- dropping ----------------------------------------------------------------------------------------

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


# -- bandwidth: a cap, and back-off on device await ----------------------------------------------------

class TokenBucket:
    """Thread-safe byte rate limiter (0 = unlimited). ``clock``/``sleep`` are injectable for tests."""

    def __init__(self, rate_bytes_per_s: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate_bytes_per_s
        self.clock, self.sleep = clock, sleep
        self.lock = threading.Lock()
        self.next_free = clock()

    def consume(self, n: int) -> float:
        """Account ``n`` bytes; sleeps as needed and returns the time slept."""
        if self.rate <= 0:
            return 0.0
        with self.lock:
            now = self.clock()
            start = max(now, self.next_free)
            self.next_free = start + n / self.rate
            wait = start - now
        if wait > 0:
            self.sleep(wait)
        return max(0.0, wait)


def _block_device(path: str) -> tuple[int, int] | None:
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    return None if major == 0 else (major, minor)  # tmpfs, overlay, NFS: no block device


def read_diskstats(path: str = "/proc/diskstats") -> dict[tuple[int, int], tuple[int, int, int]]:
    """(major, minor) -> (reads completed, milliseconds spent reading, sectors read)."""
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                f = line.split()
                if len(f) >= 7:
                    out[(int(f[0]), int(f[1]))] = (int(f[3]), int(f[6]), int(f[5]))
    except OSError:
        pass
    return out


def probe_read_latency_ms(fd: int, size: int, buf: mmap.mmap, rng: random.Random) -> float | None:
    """One 4 KiB O_DIRECT read at a random aligned offset: what a serving process's random read sees."""
    if size < PAGE:
        return None
    off = rng.randrange(0, size // PAGE) * PAGE
    t0 = time.perf_counter()
    try:
        os.preadv(fd, [memoryview(buf)[:PAGE]], off)
    except OSError:
        return None
    return (time.perf_counter() - t0) * 1000


class AwaitMonitor:
    """Slows warming while reads on its devices wait longer than the threshold (a rate controller).

    The signal is the latency of a 4 KiB ``O_DIRECT`` random read, probed at most every ``interval_s``:
    exactly the read a serving process makes, behind whatever queue our warming built. The device's
    read await from ``/proc/diskstats`` is recorded too, but it is not the trigger: it is an average per
    request, and warming issues requests of up to ``max_sectors_kb`` (4 MiB on this VM), so a lone
    sequential reader already shows ~20 ms while a 4 KiB read behind it waits well under 1 ms.

    Backing off only helps someone else, so it happens only when the device reads clearly more than
    warming asked for in the interval (other readers: serving processes loading or paging). Then a slow
    probe halves the allowed rate (from what was achieved), never below ``floor_bytes_per_s`` so warming
    always progresses; a fast probe, or no other reader, raises it by half, and the cap is lifted once it
    is well above what is being read.
    """

    def __init__(self, devices: set[tuple[int, int]], threshold_ms: float, *, interval_s: float = 0.2,
                 read: Callable[[], dict[tuple[int, int], tuple[int, ...]]] = read_diskstats,
                 probe: Callable[[], float | None] | None = None, floor_bytes_per_s: int = 32 << 20,
                 slack_bytes: int = 32 << 20, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.devices, self.threshold_ms, self.interval_s, self.read = devices, threshold_ms, interval_s, read
        self.probe, self.floor, self.clock, self.slack = probe, floor_bytes_per_s, clock, slack_bytes
        self.lock = threading.Lock()
        self.last = read() if devices else {}
        self.last_t = clock()
        self.bytes_since = 0
        self.bucket = TokenBucket(0, clock=clock, sleep=sleep)
        self.max_await_ms = 0.0       # diskstats read await (per request), informational
        self.max_probe_ms = 0.0       # 4 KiB random read latency: the trigger
        self.min_rate = 0             # the lowest cap applied (0: never capped)
        self.probes = 0
        self.backoffs = 0
        self.backoff_s = 0.0
        self.others_seen = 0          # intervals in which other readers used the device
        self.window: list[tuple[float, int, int]] = []  # (time, device bytes, our bytes) over ~1 s

    @property
    def rate_cap(self) -> int:
        return self.bucket.rate

    def _diskstats(self) -> tuple[float, int]:
        """(worst read await in ms, bytes read from the devices) since the last sample."""
        cur = self.read()
        worst, nbytes = 0.0, 0
        for dev in self.devices:
            if dev in cur and dev in self.last:
                dr = cur[dev][0] - self.last[dev][0]
                dt = cur[dev][1] - self.last[dev][1]
                nbytes += (cur[dev][2] - self.last[dev][2]) * 512
                if dr > 0:
                    worst = max(worst, dt / dr)
        self.last = cur
        return worst, nbytes

    def pause(self, nbytes: int = 0) -> None:
        """Call before reading ``nbytes``: samples when due, adjusts the cap, waits for it."""
        with self.lock:
            self.bytes_since += nbytes
            now = self.clock()
            elapsed = now - self.last_t
            if (self.devices or self.probe) and elapsed >= self.interval_s:
                ours = self.bytes_since
                achieved = ours / elapsed if elapsed > 0 else 0.0
                self.last_t, self.bytes_since = now, 0
                others = True  # without device counters, assume someone may be reading
                if self.devices:
                    await_ms, device_bytes = self._diskstats()
                    self.max_await_ms = max(self.max_await_ms, await_ms)
                    # over the last second, did the device read clearly more than we asked for? (our own
                    # read-ahead and the window being read shift bytes in time by up to ``slack``)
                    self.window = [w for w in self.window if now - w[0] < 1.0] + [(now, device_bytes, ours)]
                    others = sum(w[1] for w in self.window) > 1.25 * sum(w[2] for w in self.window) + self.slack
                    self.others_seen += others
                latency = self.probe() if self.probe is not None else None
                if latency is not None:
                    self.probes += 1
                    self.max_probe_ms = max(self.max_probe_ms, latency)
                    cap = self.bucket.rate
                    if others and latency > self.threshold_ms:
                        base = min(cap, achieved) if cap else achieved
                        self.bucket.rate = int(max(self.floor, base / 2))
                        self.min_rate = min(self.min_rate or self.bucket.rate, self.bucket.rate)
                        self.backoffs += 1
                    elif cap:
                        cap = int(cap * 1.5)
                        self.bucket.rate = 0 if cap > 4 * max(achieved, 1) else cap
        waited = self.bucket.consume(nbytes)
        if waited:
            with self.lock:
                self.backoff_s += waited


class LatencyProbe:
    """4 KiB O_DIRECT probes of one file per device (none on tmpfs and other device-less file systems)."""

    def __init__(self, files: list["FileRef"]) -> None:
        self.rng = random.Random()
        self.targets: list[tuple[int, int]] = []
        self.buf = mmap.mmap(-1, PAGE)  # page-aligned, as O_DIRECT needs
        seen: set[tuple[int, int]] = set()
        for f in files:
            try:
                dev = _block_device(f.path)
            except OSError:
                continue
            if dev is None or dev in seen or f.size < PAGE:
                continue
            try:
                fd = os.open(f.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError:  # no O_DIRECT here
                continue
            seen.add(dev)
            self.targets.append((fd, f.size))
        self.devices = seen

    def __call__(self) -> float | None:
        results = [probe_read_latency_ms(fd, size, self.buf, self.rng) for fd, size in self.targets]
        results = [r for r in results if r is not None]
        return max(results) if results else None

    def close(self) -> None:
        for fd, _ in self.targets:
            os.close(fd)
        self.targets.clear()
        self.buf.close()


# -- warming -------------------------------------------------------------------------------------------

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
               progress: Callable[[int], None] | None) -> None:
    fd = open_for_read(ref.path)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            with lock:
                report.notes.append(f"{ref.path}: empty file, nothing to warm")
            return
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        # check first, touch only what is missing (before our own read-ahead changes the answer)
        windows = [(off, min(WINDOW, size - off)) for off in range(0, size, WINDOW)]
        resident = [min(n, resident_pages(fd, off, n)[0] * PAGE) for off, n in windows]
        todo = [w for w, r in zip(windows, resident) if r < w[1]]
        already = sum(resident)
        if progress is not None and already:
            progress(already)
        warmed = 0
        for off, n in todo:
            monitor.pause(n)
            bucket.consume(n)
            try:
                _populate(fd, off, n)
            except PageCacheError as exc:
                if exc.errno == errno.ENODEV:  # a file system without mmap: read it instead
                    _read_range(fd, off, n)
                else:
                    raise
            warmed += n - resident[windows.index((off, n))]
            if progress is not None:
                progress(n - resident[windows.index((off, n))])
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
         files: list[FileRef] | None = None) -> WarmReport:
    """Bring files (or whole checkpoint directories) into the page cache. Per-file problems are
    reported in ``skipped`` and the rest goes on."""
    t0 = time.monotonic()
    skipped: list[Skipped] = []
    if files is None:
        files, skipped = collect_files(paths)
    report = WarmReport(files=len(files), bytes=sum(f.size for f in files), rate_limit=rate_bytes_per_s,
                        await_threshold_ms=await_threshold_ms, skipped=list(skipped),
                        method="madvise(MADV_POPULATE_READ)")
    probe = LatencyProbe(files)
    # slack: each file in flight may have twice the device's read-ahead (8 MiB here) in flight too
    monitor = AwaitMonitor(probe.devices, await_threshold_ms, probe=probe if probe.targets else None,
                           slack_bytes=max(1, concurrency) * (32 << 20))
    bucket = TokenBucket(rate_bytes_per_s)
    lock = threading.Lock()

    def one(ref: FileRef) -> None:
        try:
            _warm_file(ref, bucket, monitor, report, lock, progress)
        except OSError as exc:
            with lock:
                report.skipped.append(Skipped(ref.path, exc.strerror or str(exc)))

    if files:
        fd = open_for_read(files[0].path) if files[0].size else None
        if fd is not None:
            try:
                if not _populate_read_supported(fd):
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
    report.resident_bytes = residency([f.path for f in files]).resident_bytes if files else 0
    report.max_await_ms, report.backoffs, report.backoff_seconds = monitor.max_await_ms, monitor.backoffs, monitor.backoff_s
    report.max_probe_ms, report.probes = monitor.max_probe_ms, monitor.probes
    if monitor.backoffs:
        report.notes.append(f"backed off {monitor.backoffs} times (waited {monitor.backoff_s:.1f} s, down to "
                            f"{monitor.min_rate / 1e6:.0f} MB/s): a 4 KiB random read waited up to "
                            f"{monitor.max_probe_ms:.1f} ms (threshold {await_threshold_ms} ms)")
    report.seconds = time.monotonic() - t0
    return report


# -- locking -------------------------------------------------------------------------------------------

def memlock_limit() -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes (None = unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def has_cap_ipc_lock() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


class MemlockTooLow(PageCacheError):
    exit_code = 2  # a set-up problem the operator fixes (the message says how)

    def __init__(self, need: int, limit: int) -> None:
        self.need, self.limit = need, limit
        super().__init__(errno.ENOMEM,
                         f"locking needs {need} bytes but RLIMIT_MEMLOCK is {limit}: raise it "
                         f"(systemd: LimitMEMLOCK=infinity in the unit; containers: --ulimit memlock=-1:-1 "
                         f"or a Kubernetes runtime setting; a shell: ulimit -l unlimited)")


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
                addr = _map(fd, size, 0)
            except OSError as exc:
                skipped.append(Skipped(f.path, exc.strerror or str(exc)))
                continue
            finally:
                os.close(fd)
            if _libc.mlock(addr, size) != 0:
                err = ctypes.get_errno()
                _libc.munmap(addr, size)
                skipped.append(Skipped(f.path, f"mlock: {os.strerror(err)}"))
                continue
            self.maps.append((f.path, addr, size))
        return skipped

    def release(self) -> None:
        for _, addr, size in self.maps:
            _libc.munmap(addr, size)
        self.maps.clear()
