"""The origin's fleet-wide cap on rollout movers (``[intent] max_movers``): ``cap`` numbered slots
(0 to cap-1). A node rolling an ``@latest`` entry forward to a new version holds one while it moves,
renewing it; a slot not renewed within ``ttl_s`` (a node that died mid-move) is taken back.

With several origins (docs/origins.md) a worker moves only while it holds the SAME slot number from a
strict majority of them: two majorities share an origin, and that origin gives a number to one node
at a time, so at most ``cap`` nodes move fleet-wide whichever origins are down. A worker names the
number it asks for (``number``); an answer says which numbers are free here, so a refused worker asks
next for one free at a majority. Held slots are kept in ``path`` (written on every change, read at
start), so an origin that restarts still knows who holds what and never hands out a slot leased
elsewhere. Owned by the origin's asyncio loop (no lock)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)
SLOT_TTL_S = 120.0


def origins_refusal(asked: str | None, held: dict[str, int]) -> str | None:
    """Why a worker whose list of origins hashes to ``asked`` gets no slot here, given how many held
    reports carry each list (``held``), else None: refused when a strict plurality of the reports carry
    another list (that worker would count its majority over other origins than the fleet's, and the cap
    would not hold). A worker that does not say, or nothing known yet, or a tie: not refused."""
    if asked is None or not held:
        return None
    top = sorted(held.values(), reverse=True)
    usual = max(held, key=lambda h: held[h])
    if asked == usual or (len(top) > 1 and top[0] == top[1]):
        return None
    return (f"this worker lists other origins than {held[usual]} of {sum(held.values())} reporting nodes: set the "
            "same [intent] origin (or [p2p] trackers) on every worker")


class MoverSlots:
    def __init__(self, cap: int, *, ttl_s: float = SLOT_TTL_S, clock: Callable[[], float] = time.time,
                 path: Path | None = None) -> None:
        self.cap, self.ttl_s, self.clock, self.path = cap, ttl_s, clock, path
        self.held: dict[str, tuple[float, str, int]] = {}   # node -> (renewed at, what it moves, slot number)
        self._said: str | None = None
        if path is not None:
            self.held = self._load(path)
        self.restored, self.started = set(self.held), clock()

    def _expire(self) -> None:
        now = self.clock()
        for node in [n for n, (t, _w, _s) in self.held.items() if now - t > self.ttl_s]:
            del self.held[node]

    def _free(self, node: str) -> list[int]:
        """The slot numbers nobody but ``node`` holds (none without a cap)."""
        taken = {s for n, (_t, _w, s) in self.held.items() if n != node}
        return [i for i in range(self.cap) if i not in taken]

    def ask(self, node: str, what: str, number: int | None = None) -> dict[str, Any]:
        """Grant (or renew) slot ``number`` to ``node`` if nobody else holds it (None: the one it holds,
        else the lowest free; cap 0: no cap, always granted). The answer: ``granted``, ``slot`` (when
        granted), ``free`` (the numbers free for it), ``movers`` and ``cap``."""
        self._expire()
        free = self._free(node)
        if number is None:
            mine = self.held.get(node)
            number = mine[2] if mine is not None and mine[2] in free else (free[0] if free else None)
        granted = self.cap <= 0 or number in free
        if granted:
            self.held[node] = (self.clock(), what, number or 0)
            self._save()
        return {"granted": granted, "movers": len(self.held), "cap": self.cap, "free": free,
                **({"slot": number or 0} if granted else {})}

    def restored_holder(self, node: str) -> bool:
        """Whether ``node`` holds a slot this origin read back at start, within a slot's life of the
        start: it may renew it before its first report reaches the restarted origin."""
        return node in self.restored and node in self.held and self.clock() - self.started <= self.ttl_s

    def release(self, node: str) -> None:
        if self.held.pop(node, None) is not None:
            self._save()

    def movers(self) -> list[dict[str, Any]]:
        self._expire()
        now = self.clock()
        return [{"node": n, "moving": w, "slot": s, "renewed_s_ago": round(now - t, 1)}
                for n, (t, w, s) in sorted(self.held.items())]

    def _load(self, path: Path) -> dict[str, tuple[float, str, int]]:
        """The slots held when this origin last wrote them, those not expired since (a missing or
        unreadable file: none, said in the log)."""
        try:
            rows = json.loads(path.read_text())["held"]
            held = {str(r["node"]): (float(r["renewed_at"]), str(r["moving"]), int(r["slot"])) for r in rows}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("rollout slots: %s not read (%s): starting with none held", path, exc)
            return {}
        now = self.clock()
        kept = {n: h for n, h in held.items() if now - h[0] <= self.ttl_s}
        if kept:
            log.info("rollout slots: %d held slot(s) restored from %s", len(kept), path)
        return kept

    def _save(self) -> None:
        """The held slots into ``path`` (replaced whole: a crash leaves the old file or the new one)."""
        if self.path is None:
            return
        rows = [{"node": n, "renewed_at": t, "moving": w, "slot": s} for n, (t, w, s) in sorted(self.held.items())]
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"format": 1, "held": rows}))
            os.replace(tmp, self.path)
            self._said = None
        except OSError as exc:
            if self._said != str(exc):
                log.warning("rollout slots: not written to %s: %s (an origin restart forgets them)", self.path, exc)
            self._said = str(exc)
