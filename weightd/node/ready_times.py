"""Time to ready as operators see it: from a preload request's arrival to its version verified,
placed and warm in the tier, per ``(model, tier)``.

The Prometheus histogram ``weightd_time_to_ready_seconds{model,tier}`` has buckets; ``status --json``
gives exact p50/p95 over the most recent requests instead, from a bounded window kept here (a
request that found the copy in place counts too: its caller waited that long as well).
"""

from __future__ import annotations

import math
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
