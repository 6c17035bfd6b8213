"""Which models will be loaded next: a small, explainable forecaster over this node's load history.

Why seasonal: demand for inference models follows the clock (office hours, nightly batch jobs,
weekdays against weekends), so the best plain guess for "what is loaded between 09:00 and 10:00 on
a Monday" is what was loaded then before. Two views are kept per model: the hour of the week (168
buckets: knows Monday from Saturday, but needs weeks of history) and the hour of the day (24
buckets: learns in a day, blind to weekends). They are blended, ``weekly_weight`` to the weekly
view once that hour of the week has been seen at least once (before that, the daily view alone).

Why decay: a model that fell out of use must fade and a new pattern must take over, so every load
weighs ``0.5 ** (age / half_life_s)``. A bucket's decayed count is divided by the decayed number of
times that bucket occurred since the history began (the *exposure*: an hour seen on three Mondays
is divided by about three), so a rate reads as "expected loads in that hour", and the score of a
horizon is the sum over the hours it covers (a fraction of the hour at either edge). Each hour's
rate borrows from the hours either side (``neighbour_weight`` each, 1/4 by default): schedules drift
by minutes from day to day, a load at 09:58 says as much about 10:00 as one at 09:02, and a handful
of loads per bucket is noisy. Only loads before ``at`` count: asking about the past never peeks at
what came after it.

Why UTC: a history file outlives time-zone changes and daylight saving; a shift of the local clock
moves a pattern by an hour, which the decay absorbs within a few half-lives. Every figure in
``reason`` is a count a person can check against the history; no model is trained and nothing is
opaque. The history is compact: per model a sorted list of load times, loads older than
``HISTORY_HALF_LIVES`` half-lives (< 0.4 % weight) dropped, at most ``max_events`` in all (the
oldest go first).

What to do with a ranking is the prewarm policy: pure functions that the daemon and
``bench/predict.py`` share, so the benchmark measures the daemon's policy. ``choose_prewarm`` picks
the models to place; ``plan_prewarm`` is a whole round for a tier that evicts the least recently used
first: the top expected models, those already held preloaded again (which refreshes their recency, so
the placements evict something not expected) and the others placed, the least expected first so
that the most expected ends as the most recently used.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

HOUR_S = 3600.0
DAY_H = 24
WEEK_H = 7 * DAY_H
HISTORY_HALF_LIVES = 8            # older loads weigh < 0.4 %: dropped
MAX_MODEL_CHARS = 300
MAX_HORIZON_S = 7 * 86400.0
MAX_UNIX_S = 1e11                 # (year 5138: a larger "time" is damage, not a date)
FORMAT = 1
_FILE_KEYS = {"format", "events", "half_life_s", "weekly_weight"}
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_EPOCH_HOW = 3 * DAY_H            # 1970-01-01 00:00 UTC was a Thursday: hour 72 of its week


@dataclass(frozen=True)
class Forecast:
    model: str
    score: float          # expected loads in the horizon
    reason: str           # one line a person reads
    weekly: float = 0.0   # expected loads by the hour-of-week view alone
    daily: float = 0.0    # expected loads by the hour-of-day view alone
    loads_weekly: int = 0  # loads counted at these hours on this weekday (undecayed, in the history)
    loads_daily: int = 0   # loads counted at these hours on any day


def hour_of_week(t: float) -> int:
    """Hour of the week of unix time ``t``, Monday 00:00-01:00 UTC = 0."""
    return (math.floor(t / HOUR_S) + _EPOCH_HOW) % WEEK_H


def _check_model(model: Any, where: str) -> str:
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_CHARS or not model.isprintable():
        raise ValueError(f"{where}: a model name must be a printable string of 1 to {MAX_MODEL_CHARS} characters, "
                         f"got {_short(model)}")
    return model


def _check_time(t: Any, where: str) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 <= t < MAX_UNIX_S:
        raise ValueError(f"{where}: {_short(t)} is not a unix time (finite seconds since 1970)")
    return float(t)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


class Forecaster:
    """The load history of one node and the seasonal forecast over it. Not thread-safe: one owner
    (the daemon's loop) records and ranks."""

    def __init__(self, *, half_life_s: float = 14 * 86400.0, weekly_weight: float = 0.6,
                 max_events: int = 100_000, neighbour_weight: float = 0.25) -> None:
        if isinstance(half_life_s, bool) or not isinstance(half_life_s, (int, float)) \
                or not math.isfinite(half_life_s) or half_life_s <= 0:
            raise ValueError(f"half_life_s: expected a finite number of seconds above 0, got {_short(half_life_s)}")
        if isinstance(weekly_weight, bool) or not isinstance(weekly_weight, (int, float)) \
                or not 0 <= weekly_weight <= 1:
            raise ValueError(f"weekly_weight: expected a number from 0 to 1, got {_short(weekly_weight)}")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events: expected a whole number above 0, got {_short(max_events)}")
        if isinstance(neighbour_weight, bool) or not isinstance(neighbour_weight, (int, float)) \
                or not 0 <= neighbour_weight <= 1 / 3:
            raise ValueError(f"neighbour_weight: expected a number from 0 to 1/3, got {_short(neighbour_weight)}")
        self.half_life_s, self.weekly_weight, self.max_events = float(half_life_s), float(weekly_weight), max_events
        w = self.neighbour_weight = float(neighbour_weight)
        self._kernel = ((-1, w), (0, 1 - 2 * w), (1, w)) if w else ((0, 1.0),)   # (hour offset, weight)
        self._events: dict[str, list[float]] = {}   # model -> load times, ascending
        self._count = 0
        self._newest = -math.inf

    # -- history ---------------------------------------------------------------------------------
    def record(self, model: str, at: float, kind: str = "load") -> None:
        """One load of ``model`` at unix time ``at``. Every ``kind`` (a lease taken, a version found
        in use, a preload) weighs the same: each says the model was needed then. ValueError for a
        name or time that could not be saved and read back."""
        _check_model(model, "record")
        at = _check_time(at, "record")
        if not isinstance(kind, str):
            raise ValueError(f"record: kind must be a string, got {_short(kind)}")
        ev = self._events.setdefault(model, [])
        if not ev or at >= ev[-1]:
            ev.append(at)
        else:
            bisect.insort(ev, at)
        self._count += 1
        self._newest = max(self._newest, at)
        # this model's loads too old to weigh anything (others' are dropped when saved or compacted)
        cut = bisect.bisect_left(ev, self._cutoff())
        if cut:
            del ev[:cut]
            self._count -= cut
        if self._count > self.max_events:
            self._compact(self.max_events * 9 // 10)   # (to 90%: a full history is not sorted at every load)

    def _cutoff(self) -> float:
        return self._newest - HISTORY_HALF_LIVES * self.half_life_s

    def _compact(self, keep: int) -> None:
        """Drop loads too old to weigh anything, then the oldest overall until ``keep`` remain."""
        cutoff = self._cutoff()
        for m in list(self._events):
            ev = self._events[m]
            del ev[:bisect.bisect_left(ev, cutoff)]
        count = sum(len(ev) for ev in self._events.values())
        if count > keep:
            oldest = sorted(t for ev in self._events.values() for t in ev)[count - keep - 1]
            for m in list(self._events):
                ev = self._events[m]
                del ev[:bisect.bisect_right(ev, oldest)]
        self._events = {m: ev for m, ev in self._events.items() if ev}
        self._count = sum(len(ev) for ev in self._events.values())

    @property
    def models(self) -> list[str]:
        return sorted(self._events)

    def loads(self, model: str) -> list[float]:
        """``model``'s load times in the history, ascending (a copy)."""
        return list(self._events.get(model, ()))

    def __len__(self) -> int:
        return self._count

    # -- the forecast ------------------------------------------------------------------------------
    def rank(self, at: float, horizon_s: float = HOUR_S, *, top: int | None = None) -> list[Forecast]:
        """Every model with a score above 0 for ``[at, at + horizon_s)``, highest first, ties by name."""
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
            raise ValueError(f"top: expected a whole number from 0, or None, got {_short(top)}")
        hours = self._hours(at, horizon_s)
        out = [f for f in (self._forecast(m, at, horizon_s, hours) for m in self._events) if f.score > 0]
        out.sort(key=lambda f: (-f.score, f.model))
        return out if top is None else out[:top]

    def explain(self, model: str, at: float, horizon_s: float = HOUR_S) -> Forecast:
        """The forecast of one model (score 0, and a reason that says so, for a model never loaded)."""
        _check_model(model, "explain")
        return self._forecast(model, at, horizon_s, self._hours(at, horizon_s))

    def _hours(self, at: float, horizon_s: float) -> list[tuple[float, float, list["_Exposure"]]]:
        """The hours ``[at, at + horizon_s)`` covers: (hour start, the fraction covered, the exposure
        of each hour in the kernel: the hour itself and its neighbours)."""
        at = _check_time(at, "at")
        if isinstance(horizon_s, bool) or not isinstance(horizon_s, (int, float)) \
                or not 0 < horizon_s <= MAX_HORIZON_S:
            raise ValueError(f"horizon_s: expected seconds above 0 and at most {MAX_HORIZON_S:g}, "
                             f"got {_short(horizon_s)}")
        since = self._since()
        end = at + horizon_s
        out = []
        h = math.floor(at / HOUR_S) * HOUR_S
        while h < end:
            frac = (min(end, h + HOUR_S) - max(at, h)) / HOUR_S
            out.append((h, frac, [_Exposure(self, since, at, h + k * HOUR_S) for k, _w in self._kernel]))
            h += HOUR_S
        return out

    def _since(self) -> float | None:
        """When the history begins: the hour of its oldest load."""
        first = min((ev[0] for ev in self._events.values() if ev), default=None)
        return None if first is None else math.floor(first / HOUR_S) * HOUR_S

    def _decay(self, age_s: float) -> float:
        return 0.5 ** (age_s / self.half_life_s)

    def _forecast(self, model: str, at: float, horizon_s: float,
                  hours: list[tuple[float, float, list["_Exposure"]]]) -> Forecast:
        week, day = [0.0] * WEEK_H, [0.0] * DAY_H       # decayed loads per bucket
        week_n, day_n = [0] * WEEK_H, [0] * DAY_H        # and undecayed, for the reason
        ev = self._events.get(model, [])
        for t in ev[:bisect.bisect_left(ev, at)]:        # (only the past: no peeking)
            x, how = self._decay(at - t), hour_of_week(t)
            week[how] += x
            day[how % DAY_H] += x
            week_n[how] += 1
            day_n[how % DAY_H] += 1
        score = weekly = daily = 0.0
        loads_w = loads_d = 0
        for h, frac, exposures in hours:
            for (k, kw), exp in zip(self._kernel, exposures):
                how = hour_of_week(h + k * HOUR_S)
                rw = week[how] / exp.weekly if exp.weekly > 0 else 0.0
                rd = day[how % DAY_H] / exp.daily if exp.daily > 0 else 0.0
                ww = self.weekly_weight * min(1.0, exp.weeks_seen)   # (this weekday's hour not seen yet: daily)
                score += frac * kw * (ww * rw + (1 - ww) * rd)
                weekly += frac * kw * rw
                daily += frac * kw * rd
            how = hour_of_week(h)
            loads_w += week_n[how]
            loads_d += day_n[how % DAY_H]
        return Forecast(model, score, self._reason(score, at, horizon_s, loads_w, loads_d),
                        weekly, daily, loads_w, loads_d)

    def _reason(self, score: float, at: float, horizon_s: float, loads_w: int, loads_d: int) -> str:
        """e.g. "expected 2.4 loads 09:00-10:00 UTC Mon (3 weeks of history): 3 load(s) on Mondays at this
        hour and 5 at this hour on any day (half-life 14 d)". The counts are loads at exactly the hours
        the horizon covers (on the weekday it starts on); the score also borrows from the hours either
        side and weighs each load by its age."""
        end = at + horizon_s
        how = hour_of_week(at)
        this = "this hour" if math.floor(at / HOUR_S) == math.floor((end - 1e-6) / HOUR_S) else "these hours"
        since = self._since()
        days = 0 if since is None else max(0, math.ceil((at - since) / 86400 - 1e-9))
        span = _n(days, "day") if days < 14 else _n(round(days / 7), "week")
        return (f"expected {score:.1f} loads {_hhmm(at)}-{_hhmm(end)} UTC {_DAYS[how // DAY_H][:3]} "
                f"({span} of history): {loads_w} load(s) on {_DAYS[how // DAY_H]}s at {this} and {loads_d} at "
                f"{this} on any day (half-life {self.half_life_s / 86400:g} d)")

    # -- persistence -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The history, for a file (``half_life_s`` and ``weekly_weight`` are there for a person:
        the reader's own settings apply). Loads too old to weigh anything are dropped first."""
        self._compact(self.max_events)
        return {"format": FORMAT, "half_life_s": self.half_life_s, "weekly_weight": self.weekly_weight,
                "events": {m: list(ev) for m, ev in sorted(self._events.items())}}

    @classmethod
    def from_json(cls, d: Any, **kw: Any) -> "Forecaster":
        """A saved history, checked as hostile input: ValueError with one line naming what is wrong
        (a damaged file never loads half). ``kw``: the constructor's settings (the file's are not
        used: settings are configuration, the file is history). More than ``max_events`` loads (but
        at most four times that) keep the newest."""
        f = cls(**kw)
        if not isinstance(d, dict):
            raise ValueError(f"load history: expected a JSON object, got {type(d).__name__}")
        unknown = sorted(str(k)[:40] for k in d if k not in _FILE_KEYS)
        if unknown:
            raise ValueError(f"load history: unknown key {unknown[0]!r} (expected {', '.join(sorted(_FILE_KEYS))})")
        if d.get("format") != FORMAT or isinstance(d.get("format"), bool):
            raise ValueError(f"load history: format {_short(d.get('format'))} is not {FORMAT}")
        for key in ("half_life_s", "weekly_weight"):
            v = d.get(key, 1.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"load history: {key} {_short(v)} is not a number")
        events = d.get("events")
        if not isinstance(events, dict):
            raise ValueError(f"load history: 'events' must map model names to lists of times, "
                             f"got {type(events).__name__}")
        limit = 4 * f.max_events
        if len(events) > limit:
            raise ValueError(f"load history: {len(events)} models, more than {limit}")
        total = 0
        loaded: dict[str, list[float]] = {}
        for m, ev in events.items():
            _check_model(m, "load history")
            if not isinstance(ev, list):
                raise ValueError(f"load history: events[{_short(m)}]: expected a list of times, "
                                 f"got {type(ev).__name__}")
            total += len(ev)
            if total > limit:
                raise ValueError(f"load history: more than {limit} load times (4 x max_events)")
            times = [_check_time(t, f"load history: events[{_short(m)}][{i}]") for i, t in enumerate(ev)]
            if times:
                loaded[m] = sorted(times)
        f._events = loaded
        f._count = total
        f._newest = max((ev[-1] for ev in loaded.values()), default=-math.inf)
        f._compact(f.max_events)
        return f


class _Exposure:
    """How much of one hour's buckets the history has seen before ``at``: the number of times this
    hour of the week (``weeks_seen``) and this hour of the day (``days_seen``) occurred between the
    history's start and ``at`` (fractions at the edges), and the same decayed by each occurrence's
    age (``weekly``, ``daily``): the denominators that turn decayed counts into rates."""

    __slots__ = ("weekly", "weeks_seen", "daily", "days_seen")

    def __init__(self, f: Forecaster, since: float | None, at: float, hour_s: float) -> None:
        self.weekly, self.weeks_seen = _occurrences(f, since, at, hour_s, WEEK_H * HOUR_S)
        self.daily, self.days_seen = _occurrences(f, since, at, hour_s, DAY_H * HOUR_S)


def _occurrences(f: Forecaster, since: float | None, at: float, hour_s: float, period_s: float) -> tuple[float, float]:
    if since is None:
        return 0.0, 0.0
    decayed = seen = 0.0
    oldest = at - HISTORY_HALF_LIVES * f.half_life_s - period_s
    start = hour_s
    while start + HOUR_S > since and start + HOUR_S > oldest:
        lo, hi = max(start, since), min(start + HOUR_S, at)
        if hi > lo:
            part = (hi - lo) / HOUR_S
            seen += part
            decayed += part * f._decay(at - (lo + hi) / 2)
        start -= period_s
    return decayed, seen


def _hhmm(t: float) -> str:
    s = int(t % 86400)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}"


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" if k == 1 else f"{k} {noun}s"


def choose_prewarm(ranked: list[Forecast], held: set[str], room: int, *, min_score: float = 0.5) -> list[Forecast]:
    """What to place, best first: the top ``room`` forecasts scoring at least ``min_score`` that are
    not already ``held``. Pure. A caller that wants "the top N expected models in the tier" passes as
    ``room`` how many of its top N it does not hold (``bench/predict.py`` does): going further down
    the ranking would only push a better one out."""
    if room <= 0:
        return []
    best = sorted(ranked, key=lambda f: (-f.score, f.model))
    return [f for f in best if f.score >= min_score and f.model not in held][:room]


def plan_prewarm(ranked: list[Forecast], held: set[str], slots: int, *, min_score: float = 0.5) -> list[Forecast]:
    """A prewarm round for a tier that holds ``slots`` models and evicts the least recently used: the
    models to preload, in order. The top ``slots`` forecasts scoring at least ``min_score``: those held
    are preloaded again (a no-op that refreshes their recency, so what the placements evict is a
    model not expected), the others placed (``choose_prewarm`` with as much room as the top holds
    models not held). The least expected go first, so the most expected ends as the most recently
    used and is the last of them a request for an unexpected model evicts."""
    top = sorted(ranked, key=lambda f: (-f.score, f.model))[:max(0, slots)]
    placed = choose_prewarm(ranked, held, sum(f.model not in held for f in top), min_score=min_score)
    refreshed = [f for f in top if f.model in held and f.score >= min_score]
    return sorted(refreshed + placed, key=lambda f: (f.score, f.model))
