"""The origin's fleet-wide cap on rollout movers (``[intent] max_movers``): a node rolling an
``@latest`` entry forward to a new version holds a slot while it moves, renewing it; a slot not
renewed within ``ttl_s`` (a node that died mid-move) is taken back. Owned by the origin's asyncio
loop (no lock)."""

from __future__ import annotations

import time
from typing import Any, Callable


class MoverSlots:
    def __init__(self, cap: int, *, ttl_s: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.cap, self.ttl_s, self.clock = cap, ttl_s, clock
        self.held: dict[str, tuple[float, str]] = {}   # node -> (renewed at, what it moves)

    def _expire(self) -> None:
        now = self.clock()
        for node in [n for n, (t, _) in self.held.items() if now - t > self.ttl_s]:
            del self.held[node]

    def ask(self, node: str, what: str) -> dict[str, Any]:
        """Grant (or renew) ``node``'s slot unless ``cap`` others hold one (cap 0: no cap)."""
        self._expire()
        granted = node in self.held or self.cap <= 0 or len(self.held) < self.cap
        if granted:
            self.held[node] = (self.clock(), what)
        return {"granted": granted, "movers": len(self.held), "cap": self.cap}

    def release(self, node: str) -> None:
        self.held.pop(node, None)

    def movers(self) -> list[dict[str, Any]]:
        self._expire()
        now = self.clock()
        return [{"node": n, "moving": w, "renewed_s_ago": round(now - t, 1)} for n, (t, w) in sorted(self.held.items())]
