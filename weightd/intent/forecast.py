"""Which models will be loaded next: a small, explainable forecaster over this node's load history.

Every load (a preload, a lease taken, a version found open by a server) is recorded with its time.
Demand for inference models follows the clock: office hours, nightly batch jobs, weekdays against
weekends. So the forecast is seasonal: for the hour ahead, how often was the model loaded at this hour
of the week (168 buckets) and at this hour of any day (24 buckets)? The weekly figure knows Monday
from Saturday but needs weeks of history; the daily one learns in a day. Both are blended
(``weekly_weight``). Old loads count less (exponential decay, ``half_life_s``), so a model that fell
out of use fades and a new pattern takes over within a couple of half-lives. Every figure is a count
a person can check, and ``reason`` says which: no model, no training, nothing opaque. Hours are UTC.

Each bucket's decayed count is divided by the (decayed) number of times that bucket occurred in the
history, so ``score`` reads as "expected loads in the horizon".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

HOUR = 3600.0
WEEK = 168
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")   # (1970-01-01, hour 0 of unix time, was a Thursday)
MAX_MODEL_CHARS = 512           # (tiering names: at most 255 + 1 + 255)


@dataclass(frozen=True)
class Forecast:
    model: str
    score: float          # expected loads in the horizon
    reason: str           # one line a person reads
    weekly: float = 0.0   # decayed loads at these hours of the week (all weeks)
    daily: float = 0.0    # decayed loads at these hours of any day


def _how(t: float) -> int:
    """Hour of the week, Monday 00:00 UTC = 0."""
    return (int(t // HOUR) + 3 * 24) % WEEK


class Forecaster:
    def __init__(self, *, half_life_s: float = 14 * 86400.0, weekly_weight: float = 0.6,
                 max_events: int = 100_000, smooth: float = 0.25) -> None:
        self.half_life_s, self.weekly_weight, self.max_events = half_life_s, weekly_weight, max_events
        # the hour itself and its neighbours, weighted (smooth 0: the hour alone)
        self.kernel = ((-1, smooth), (0, 1 - 2 * smooth), (1, smooth)) if smooth else ((0, 1.0),)
        self.events: dict[str, list[float]] = {}    # model -> load times (ascending)
        self.first: float | None = None             # the oldest time the history covers
        self._n = 0

    # -- history ---------------------------------------------------------------------------------
    def record(self, model: str, at: float, kind: str = "load") -> None:
        if not isinstance(model, str) or not model or len(model) > MAX_MODEL_CHARS or not math.isfinite(at):
            return
        ev = self.events.setdefault(model, [])
        if ev and at < ev[-1]:
            import bisect
            bisect.insort(ev, at)
        else:
            ev.append(at)
        self.first = at if self.first is None else min(self.first, at)
        self._n += 1
        if self._n > self.max_events:
            self._trim()

    def _trim(self) -> None:
        """Drop what weighs nothing any more (8 half-lives: < 0.4%), then the oldest overall."""
        newest = max(ev[-1] for ev in self.events.values() if ev)
        horizon = newest - 8 * self.half_life_s
        for m in list(self.events):
            self.events[m] = [t for t in self.events[m] if t >= horizon]
        allt = sorted(t for ev in self.events.values() for t in ev)
        keep = self.max_events * 9 // 10   # (down to 90%: a full history is not sorted again at every load)
        if len(allt) > keep:
            cut = allt[len(allt) - keep]
            for m in list(self.events):
                self.events[m] = [t for t in self.events[m] if t >= cut]
        self.events = {m: ev for m, ev in self.events.items() if ev}
        self._n = sum(len(ev) for ev in self.events.values())
        self.first = min((ev[0] for ev in self.events.values()), default=None)

    # -- the forecast ------------------------------------------------------------------------------
    def _decay(self, age_s: float) -> float:
        return 0.5 ** (age_s / self.half_life_s)

    def _occurrences(self, at: float, hour_start: float, period_h: int) -> float:
        """How many times (decayed) the bucket of ``hour_start`` occurred between the history's start
        and ``at``: the denominator that turns a count into a rate."""
        if self.first is None:
            return 0.0
        period = period_h * HOUR
        total, t = 0.0, hour_start - period
        while t + HOUR > self.first and at - t < 8 * self.half_life_s + period:
            total += self._decay(at - t)
            t -= period
        return total

    def explain(self, model: str, at: float, horizon_s: float = HOUR) -> Forecast:
        week = [0.0] * WEEK          # decayed loads per hour of the week, and per hour of the day
        day = [0.0] * 24
        week_n = [0] * WEEK
        day_n = [0] * 24
        for t in self.events.get(model, ()):
            if t >= at:              # (only the past: no peeking)
                break
            x, how = self._decay(at - t), _how(t)
            week[how] += x
            day[how % 24] += x
            week_n[how] += 1
            day_n[how % 24] += 1

        def rate(h: float) -> float:
            """Expected loads in the hour starting at ``h``: this hour and its neighbours (a load at
            09:58 says as much about 10:00 as one at 09:02), weekly and daily blended."""
            total = 0.0
            for k, kw in self.kernel:
                hk = h + k * HOUR
                how = _how(hk)
                ow, od = self._occurrences(at, hk, WEEK), self._occurrences(at, hk, 24)
                rw = week[how] / ow if ow > 0 else 0.0
                rd = day[how % 24] / od if od > 0 else 0.0
                ww = self.weekly_weight if ow >= 0.5 else 0.0   # (less than a week of history: daily only)
                total += kw * (ww * rw + (1 - ww) * rd)
            return total

        score = weekly_sum = daily_sum = 0.0
        weekly_n = daily_n = 0
        hour0 = math.floor(at / HOUR) * HOUR
        end = at + horizon_s
        h = hour0
        while h < end:
            frac = (min(end, h + HOUR) - max(at, h)) / HOUR
            score += frac * rate(h)
            how = _how(h)
            weekly_sum += week[how]
            daily_sum += day[how % 24]
            weekly_n += week_n[how]
            daily_n += day_n[how % 24]
            h += HOUR
        start = hour0 if horizon_s <= HOUR else at
        when = (f"{_hhmm(start)}-{_hhmm(start + max(horizon_s, HOUR))} UTC {_DAYS[_how(start) // 24]}")
        reason = (f"expected {score:.1f} loads {when}: {weekly_n} load(s) on {_DAYS[_how(start) // 24]}s at these "
                  f"hours and {daily_n} at these hours on any day (half-life {self.half_life_s / 86400:g} d)")
        return Forecast(model, score, reason, weekly_sum, daily_sum)

    def rank(self, at: float, horizon_s: float = HOUR, *, top: int | None = None) -> list[Forecast]:
        out = [f for f in (self.explain(m, at, horizon_s) for m in self.events) if f.score > 0]
        out.sort(key=lambda f: (-f.score, f.model))
        return out if top is None else out[:top]

    # -- persistence -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"format": 1, "half_life_s": self.half_life_s, "weekly_weight": self.weekly_weight,
                "events": {m: [round(t, 1) for t in ev] for m, ev in self.events.items()}}

    @classmethod
    def from_json(cls, d: Any, **kw: Any) -> "Forecaster":
        """A saved history, checked: ValueError naming what is wrong (a damaged file never loads half)."""
        if not isinstance(d, dict):
            raise ValueError("load history: expected a JSON object")
        if d.get("format") != 1:
            raise ValueError(f"load history: unknown format {str(d.get('format'))[:20]!r}")
        events = d.get("events")
        if not isinstance(events, dict):
            raise ValueError("load history: 'events' must map model names to lists of times")
        f = cls(**kw)
        total = 0
        for m, ev in events.items():
            if not isinstance(m, str) or not m or len(m) > MAX_MODEL_CHARS:
                raise ValueError("load history: a model name is not a short string")
            if not isinstance(ev, list):
                raise ValueError(f"load history: {m[:60]!r}: expected a list of times")
            total += len(ev)
            if total > 4 * f.max_events:
                raise ValueError(f"load history: more than {4 * f.max_events} events")
            for t in ev:
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 <= t < 1e11:
                    raise ValueError(f"load history: {m[:60]!r}: {str(t)[:20]!r} is not a unix time")
            f.events[m] = sorted(float(t) for t in ev)
        f._n = total
        f.first = min((ev[0] for ev in f.events.values() if ev), default=None)
        f.events = {m: ev for m, ev in f.events.items() if ev}
        if f._n > f.max_events:
            f._trim()
        return f


def _hhmm(t: float) -> str:
    s = int(t) % 86400
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}"


def choose_prewarm(ranked: list[Forecast], held: set[str], top: int, *, min_score: float = 0.5) -> list[Forecast]:
    """What to prewarm, in order: the ``top`` best forecasts at or above ``min_score``, held or not
    (preloading a held copy is a no-op that refreshes its recency and page cache), least expected
    first, so the most expected ends as the most recently used: the last of them that LRU gives up
    for a request nobody expected. Never one ranked below the top: it would only push out a better
    one. The daemon's policy, and the one bench/predict.py measures. (Ordering held copies first, then
    the others best first, removed 0.08-0.21 of LRU's excess misses in the mirror of bench/predict.py
    where this order removes 0.26-1.02; a helper's finding.)"""
    chosen = [f for f in ranked[:max(0, top)] if f.score >= min_score]
    return sorted(chosen, key=lambda f: (f.score, f.model))
