"""Prediction for fleet intent: the history of loads (every preload, and each model found in use at
most once an hour) that the forecaster (:mod:`weightd.intent.forecast`) ranks, and prewarming: in
``[intent.prewarm] window``, when no intent fetch is waiting, the models most likely to be asked for
next are placed (or refreshed) in their tier, each at most once a period. What was prewarmed, and
why, is kept for ``weightd intent explain``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..intent.forecast import choose_prewarm
from ..intent.window import parse_window
from .intent_state import load_history, save_history

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
PREWARM_KEPT = 100
USE_SAMPLE_S = 3600.0      # a model found in use is recorded at most once an hour


class Prewarmer:
    def __init__(self, d: "DaemonContext", clock: Callable[[], float], history_path: Path) -> None:
        self.d, self.clock, self.history_path = d, clock, history_path
        self.forecaster = load_history(history_path)
        self._history_dirty = False
        self.last_use: dict[str, float] = {}
        self.prewarms: deque[dict[str, Any]] = deque(maxlen=PREWARM_KEPT)
        self.task: asyncio.Task[None] | None = None
        self._prewarmed: dict[str, int] = {}    # model -> the period it was last prewarmed (or refreshed) in

    @property
    def cfg(self) -> Any:
        return self.d.config.settings.intent.prewarm

    def record(self, name: str, at: float, kind: str) -> None:
        """One load of ``name`` (``kind``: "preload" or "in_use"), on the daemon's loop."""
        self.forecaster.record(name, at, kind)
        self._history_dirty = True

    def note_in_use(self, status: dict[str, Any], now: float) -> None:
        """The models a server has open now, each recorded at most every USE_SAMPLE_S."""
        for c in status["checkpoints"]:
            if any(t.get("in_use") for t in c["tiers"].values()):
                if now - self.last_use.get(c["name"], 0.0) >= USE_SAMPLE_S:
                    self.last_use[c["name"]] = now
                    self.record(c["name"], now, "in_use")

    async def save_history(self) -> None:
        """The load history to disk, when a load was recorded since the last save."""
        if self._history_dirty:
            self._history_dirty = False
            await self.d.run_blocking("misc", save_history, self.history_path, self.forecaster)

    def maybe_prewarm(self, status: dict[str, Any], now: float, *, busy: bool) -> None:
        """Start prewarming, if its window is open and nothing else moves (``busy``: an intent fetch
        running or waiting; or a prewarm still running)."""
        pw = self.cfg
        window = parse_window(pw.window, pw.window_minutes)
        if not window.is_open(now) or busy or (self.task is not None and not self.task.done()):
            return
        ranked = self.forecaster.rank(now, pw.horizon_s)
        held = {c["name"] for c in status["checkpoints"] if pw.tier in c["tiers"]}
        chosen = choose_prewarm(ranked, held, pw.top, min_score=pw.min_score)
        hour = int(now // pw.horizon_s)
        chosen = [f for f in chosen if self._prewarmed.get(f.model) != hour]   # (once per model and period)
        if chosen:
            for f in chosen:
                self._prewarmed[f.model] = hour
            self.task = asyncio.get_running_loop().create_task(self._prewarm(chosen, now))

    async def _prewarm(self, chosen: list[Any], now: float) -> None:
        pw = self.cfg
        for fc in chosen:
            rec = {"at": now, "model": fc.model, "tier": pw.tier, "score": round(fc.score, 3), "reason": fc.reason,
                   "outcome": ""}
            try:
                # lease 0: a prewarmed copy is evictable like any cached one (LRU), never ahead of what
                # intent wants or what is pinned, leased or in use (those are protected from eviction)
                r = await self.d.api.preload({"ref": fc.model, "tier": pw.tier, "strict": True, "lease_s": 0},
                                             holder="intent prewarm", waited_on=False)
                if r.get("already_present"):   # (recency refreshed and the page cache warmed)
                    rec["outcome"] = f"refreshed {fc.model}@{r.get('version')} in {r.get('tier')} (already there)"
                else:
                    rec["outcome"] = f"placed {fc.model}@{r.get('version')} in {r.get('tier')}"
                    self.d.metrics.intent_prewarms.labels(pw.tier).inc()
            except Exception as exc:  # noqa: BLE001
                rec["outcome"] = f"not placed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
            log.info("intent: prewarm %s: %s (%s)", fc.model, rec["outcome"], fc.reason)
            self.prewarms.append(rec)

    def explain(self) -> dict[str, Any]:
        """What ``weightd intent explain`` shows: the prewarm settings, the forecast, the last prewarms."""
        now = self.clock()
        pw = self.cfg
        horizon = pw.horizon_s if pw is not None else 3600.0
        return {"prewarm": None if pw is None else {"window": pw.window, "tier": pw.tier, "top": pw.top,
                                                    "min_score": pw.min_score, "horizon_s": pw.horizon_s},
                "forecast": [{"model": f.model, "score": round(f.score, 3), "reason": f.reason}
                             for f in self.forecaster.rank(now, horizon, top=20)],
                "prewarms": list(self.prewarms)}
