"""Bandwidth while warming: a token bucket (a cap) and back-off while a 4 KiB random read on the device
waits longer than a threshold (:class:`AwaitMonitor` says why that, and not the diskstats average)."""

from __future__ import annotations

import mmap
import os
import random
import threading
import time
from typing import Callable

from .._syscalls import PAGE, block_device, read_diskstats
from .files import FileRef


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
                dev = block_device(f.path)
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
