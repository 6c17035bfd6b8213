"""What one transfer is doing right now, for whoever watches it: the CLI's bar (in-process), the
daemon's progress stream, ``status`` rows and the metrics (design §5). The data plane only ever
sees a :data:`ProgressFn` (advance by N bytes); the steps that know which phase
they are in say so with :func:`set_phase`, which does nothing for a plain callable.

Phases, in order: ``wait`` (for the version's lock or for space), ``copy`` (with its ``source``:
``cold``, ``local_reuse``, ``p2p``, ``delta``), ``verify``, ``fsync``, ``warm`` (with the page-cache
throttle's state when warming yields to serving), then ``done``. Each phase counts its own bytes
against its own total, so the rate and the ETA are the phase's, never a blend of a copy and a hash.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

__all__ = ["PHASES", "Progress", "ProgressFn", "set_phase", "watch_throttle"]

ProgressFn = Callable[[int], None]   # what the data plane sees of a transfer's progress: advance by N bytes

PHASES = ("resolve", "queued", "wait", "copy", "verify", "fsync", "warm", "done")
RATE_WINDOW_S = 5.0        # the rate is measured over the last seconds, not since the start
_SAMPLE_EVERY_S = 0.2


class Progress:
    """A transfer's progress; thread-safe. Call it with a byte count to advance the current phase."""

    def __init__(self, label: str, total: int = 0, *, clock: Callable[[], float] = time.monotonic,
                 rate_bytes_per_s: int = 0) -> None:
        self.label, self.clock = label, clock
        # a cap on the transfer (an intent entry's bandwidth): every source reports its bytes here from
        # the thread that moves them, so waiting here paces copies and object-store reads; a swarm
        # download reads the figure and sets it as the torrent's own download limit instead
        self.rate_bytes_per_s = max(0, int(rate_bytes_per_s))
        self._bucket = None
        if self.rate_bytes_per_s:
            from .pagecache.throttle import TokenBucket
            self._bucket = TokenBucket(self.rate_bytes_per_s, clock=clock)
        self._lock = threading.Lock()
        self.phase, self.source, self.detail, self.tier = "queued", None, "", None
        self.total, self.done = max(0, int(total)), 0
        self.started = self.phase_started = clock()
        self._samples: deque[tuple[float, int]] = deque([(self.started, 0)])
        self._throttle: Callable[[], tuple[int, int]] | None = None
        self.waiters = 0

    def lift_cap(self) -> None:
        """No cap from now on (a caller without one joined the transfer: it must not wait for the
        cap of the caller that started it)."""
        with self._lock:
            self.rate_bytes_per_s, self._bucket = 0, None

    def __call__(self, n: int, *, paced: bool = True) -> None:
        """``paced=False``: bytes that were paced elsewhere (by libtorrent's own limit)."""
        bucket = self._bucket
        if bucket is not None and paced and n > 0 and self.phase == "copy":
            bucket.consume(n)
        with self._lock:
            self.done += n
            now = self.clock()
            if now - self._samples[-1][0] >= _SAMPLE_EVERY_S:
                self._samples.append((now, self.done))
                while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_S:
                    self._samples.popleft()

    def set_phase(self, phase: str, *, source: str | None = None, total: int | None = None,
                  detail: str = "", tier: str | None = None) -> None:
        """Enter ``phase`` (its bytes count from zero against ``total``; unchanged when None, as
        ``source`` and ``tier`` are)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        with self._lock:
            now = self.clock()
            self.phase, self.detail = phase, detail
            if source is not None:
                self.source = source
            if tier is not None:
                self.tier = tier
            if total is not None:
                self.total = max(0, int(total))
            self.done, self.phase_started = 0, now
            self._samples = deque([(now, 0)])
            if phase != "warm":
                self._throttle = None

    def watch_throttle(self, state: Callable[[], tuple[int, int]]) -> None:
        """While warming: ``state()`` is the page-cache throttle's ``(rate cap in bytes/s, 0 when
        uncapped; back-offs so far)``."""
        with self._lock:
            self._throttle = state

    def snapshot(self) -> dict[str, Any]:
        """A plain dict (the stream's and ``status``'s row): phase, source, done/total, rate over the
        last seconds, the phase's ETA (None while nothing moves or the total is unknown), back-off."""
        with self._lock:
            now = self.clock()
            t0, d0 = self._samples[0]
            if now - t0 < 0.05 and len(self._samples) == 1:
                rate = 0.0
            else:
                rate = (self.done - d0) / max(now - t0, 1e-3)
            left = max(0, self.total - self.done)
            eta = round(left / rate, 1) if rate >= 1 and self.total and self.phase in ("copy", "verify", "warm") else None
            snap: dict[str, Any] = {
                "label": self.label, "tier": self.tier, "phase": self.phase, "source": self.source, "detail": self.detail,
                "done": self.done, "total": self.total, "rate": round(rate), "eta_s": eta,
                "elapsed_s": round(now - self.started, 1), "phase_s": round(now - self.phase_started, 1),
                "waiters": self.waiters, "throttle": None}
            throttle = self._throttle
        if throttle is not None:
            try:
                cap, backoffs = throttle()
                snap["throttle"] = {"cap_bytes_per_s": int(cap), "backoffs": int(backoffs)}
            except Exception:  # (a view of a finished warm: nothing to say)
                pass
        return snap


def set_phase(progress: Any, phase: str, *, source: str | None = None, total: int | None = None,
              detail: str = "", tier: str | None = None) -> None:
    """Tell ``progress`` which phase the transfer entered, if it listens (a plain callback does not)."""
    fn = getattr(progress, "set_phase", None)
    if fn is not None:
        fn(phase, source=source, total=total, detail=detail, tier=tier)


def watch_throttle(progress: Any, state: Callable[[], tuple[int, int]]) -> None:
    fn = getattr(progress, "watch_throttle", None)
    if fn is not None:
        fn(state)
