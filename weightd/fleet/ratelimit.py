"""A per-address rate limit (a token bucket per address), for what the origin accepts from the
network (``[intent] fleet_reports_per_s``: workers' reports)."""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimit:
    """Per address, at most ``rate`` requests a second on average and ``burst`` at once (a token
    bucket); at most ``max_addresses`` addresses are tracked (an idle one is forgotten once its bucket
    is full again), beyond which every new address is refused until some are. The loop's only."""

    def __init__(self, rate: float, burst: float, *, max_addresses: int = 65536,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_addresses, self.clock = float(rate), float(burst), max_addresses, clock
        self._buckets: dict[str, tuple[float, float]] = {}   # address -> (tokens, at)

    def allow(self, address: str) -> bool:
        now = self.clock()
        tokens, at = self._buckets.get(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if address not in self._buckets and len(self._buckets) >= self.max_addresses:
            full = [a for a, (t, when) in self._buckets.items() if t + (now - when) * self.rate >= self.burst]
            for a in full:
                del self._buckets[a]
            if len(self._buckets) >= self.max_addresses:
                return False
        if tokens < 1.0:
            self._buckets[address] = (tokens, now)
            return False
        self._buckets[address] = (tokens - 1.0, now)
        return True
