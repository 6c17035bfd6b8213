"""Time to ready as operators see it: from a preload request's arrival to its version verified,
placed and warm in the tier, per ``(model, tier)``.

The Prometheus histogram ``weightd_time_to_ready_seconds{model,tier}`` has buckets; ``status --json``
gives exact p50/p95 over the most recent requests instead, from a bounded window kept here (a
request that found the copy in place counts too: its caller waited that long as well).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import OrderedDict, deque
from typing import Any

WINDOW = 256          # requests kept per (model, tier)
MAX_KEYS = 1024       # (model, tier) pairs kept; the least recently seen is forgotten first


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (a value that was measured, never interpolated)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


class ReadyTimes:
    def __init__(self, window: int = WINDOW, max_keys: int = MAX_KEYS) -> None:
        self.window, self.max_keys = window, max_keys
        self._lock = threading.Lock()
        self._by: OrderedDict[tuple[str, str], tuple[deque[float], list[float]]] = OrderedDict()

    def observe(self, model: str, tier: str, seconds: float) -> None:
        key = (model, tier)
        with self._lock:
            entry = self._by.pop(key, None)
            if entry is None:
                entry = (deque(maxlen=self.window), [0.0])
            entry[0].append(seconds)
            entry[1][0] = time.time()
            self._by[key] = entry
            while len(self._by) > self.max_keys:
                self._by.popitem(last=False)

    def summary(self) -> list[dict[str, Any]]:
        with self._lock:
            items = [(k, sorted(v[0]), v[0][-1], v[1][0]) for k, v in self._by.items()]
        return [{"model": m, "tier": t, "requests": len(s), "p50_s": round(quantile(s, 0.5), 4),
                 "p95_s": round(quantile(s, 0.95), 4), "max_s": round(s[-1], 4), "last_s": round(last, 4),
                 "last_at": round(at, 3)}
                for (m, t), s, last, at in sorted(items)]


# -- the rates the ready estimate reads (weightd.node.ready_estimate) ----------------------------------
RATE_WINDOW = 5            # recent transfers kept per (source, tier); the estimate takes their median
RATE_MIN_BYTES = 16 << 20  # a smaller transfer measures start-up latency more than a rate
RATE_DOMINANT = 0.9        # a transfer measures one source when that source moved this share of its bytes
SOURCE_GROUP = {"cold": "cold", "peer": "swarm", "origin": "swarm"}   # (local_reuse measures no source)


class TransferRates:
    """The rates this node measured from its own recent preloads, per ``(source, tier)``: ``cold``
    (cold storage: a path, S3 or a registry) or ``swarm`` (peers and the origin over P2P), landing in
    ``hot`` or ``warm``. One sample: the bytes a preload moved over its whole time (transfer,
    verification against the manifest, placement and warming: what a caller waits for), kept only
    when one source moved at least 90% of at least 16 MiB. A swarm transfer's report times its
    download (``swarm.seconds``): its rate is the bytes over that, and the rest of the preload's time
    (adding the torrent, a read-back, placement, warming) is kept as its fixed part (``fixed_s``). Also the page-cache warming read rate per
    tier (the warm report's ``bytes_per_s``), for copies that are here but not resident."""

    def __init__(self, window: int = RATE_WINDOW, clock: Any = time.time) -> None:
        self._lock = threading.Lock()
        self.window, self.clock = window, clock
        self._rates: dict[tuple[str, str], deque[tuple[float, float, float]]] = {}
        self._reads: dict[str, deque[tuple[float, float, float]]] = {}

    def _add(self, into: dict[Any, deque[tuple[float, float, float]]], key: Any, rate: float,
             fixed_s: float = 0.0) -> None:
        with self._lock:
            into.setdefault(key, deque(maxlen=self.window)).append((rate, self.clock(), fixed_s))

    def observe(self, report: dict[str, Any], seconds: float) -> None:
        """One preload's report (``PreloadReport.to_dict``) that took ``seconds`` end to end."""
        tier = report.get("tier")
        warm = report.get("warm") or {}
        if warm.get("bytes_per_s") and (warm.get("warmed_bytes") or 0) >= RATE_MIN_BYTES:
            self._add(self._reads, tier, float(warm["bytes_per_s"]))
        by = report.get("bytes_by_source") or {}
        moved = sum(by.values())
        if report.get("already_present") or moved < RATE_MIN_BYTES or not seconds > 0:
            return
        groups: dict[str, int] = {}
        for src, n in by.items():
            if src in SOURCE_GROUP:
                groups[SOURCE_GROUP[src]] = groups.get(SOURCE_GROUP[src], 0) + n
        best = max(groups, key=lambda g: groups[g], default=None)
        if best is None or groups[best] < RATE_DOMINANT * moved:
            return
        swarm_s = (report.get("swarm") or {}).get("seconds") or 0.0
        if best == "swarm" and 0 < swarm_s < seconds:   # the download apart from the rest (a fixed cost)
            self._add(self._rates, (best, tier), moved / swarm_s, seconds - swarm_s)
        else:
            self._add(self._rates, (best, tier), moved / seconds)

    @staticmethod
    def _summary(samples: deque[tuple[float, float, float]] | None, now: float) -> dict[str, Any] | None:
        if not samples:
            return None
        return {"bytes_per_s": statistics.median(r for r, _, _ in samples),
                "fixed_s": statistics.median(f for _, _, f in samples), "transfers": len(samples),
                "age_s": round(max(0.0, now - samples[-1][1]), 1)}

    def rate(self, source: str, tier: str) -> dict[str, Any] | None:
        """The median of the recent rates of ``source`` into ``tier`` (else into any tier): ``{bytes_per_s,
        transfers, age_s}``, or None when none was measured."""
        with self._lock:
            samples = self._rates.get((source, tier))
            if not samples:
                samples = max((v for (s, _t), v in self._rates.items() if s == source),
                              key=lambda v: v[-1][1], default=None)
            return self._summary(samples and deque(samples), self.clock())

    def read_rate(self, tier: str) -> dict[str, Any] | None:
        """The median recent page-cache warming rate of ``tier``'s copies, or None."""
        with self._lock:
            samples = self._reads.get(tier)
            return self._summary(samples and deque(samples), self.clock())
