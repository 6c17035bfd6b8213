"""Eviction planning: which versions to remove so that a new one fits (a pure function).

Policy: least-recently-used first. Never a pinned version, one under an unexpired lease, one in
use (a file of it open or mapped by any process), or one weightd may not remove (it cannot prove it
made it: ``Candidate.refused``). When usage plus the new checkpoint would cross the
high watermark, evict down to the low watermark; if even evicting everything allowed would not make
it fit under the capacity, evict nothing (destroying copies for no gain helps no one).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    version: str
    bytes: int
    last_access: float
    pinned: bool = False
    leased: bool = False
    in_use: bool = False
    refused: str | None = None   # why weightd may not remove it (it cannot prove it made it), if so

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def protected_by(self) -> str | None:
        return ("pinned" if self.pinned else "leased" if self.leased else "in use" if self.in_use
                else self.refused)


@dataclass(slots=True)
class EvictionPlan:
    fits: bool
    evict: list[Candidate] = field(default_factory=list)
    used_after: int = 0
    protected: list[Candidate] = field(default_factory=list)

    @property
    def freed(self) -> int:
        return sum(c.bytes for c in self.evict)


def plan_eviction(*, capacity: int, used: int, need: int, high: float, low: float,
                  candidates: list[Candidate]) -> EvictionPlan:
    protected = [c for c in candidates if c.protected_by]
    if used + need <= capacity * high:
        return EvictionPlan(True, [], used, protected)
    evictable = sorted((c for c in candidates if not c.protected_by), key=lambda c: (c.last_access, c.ref))
    chosen, after = [], used
    for c in evictable:
        if after + need <= capacity * low:
            break
        chosen.append(c)
        after -= c.bytes
    if after + need > capacity:
        return EvictionPlan(False, [], used, protected)
    return EvictionPlan(True, chosen, after, protected)
