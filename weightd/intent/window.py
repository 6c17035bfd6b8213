"""Transfer windows of intent entries: when a transfer may run, daily ``HH:MM-HH:MM`` (UTC; may span
midnight) or a cron expression (UTC, via croniter) with a length in minutes (``window_minutes``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

_HHMM = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)")


@dataclass(frozen=True)
class Window:
    """When a transfer may run: daily ``HH:MM-HH:MM`` (UTC; may span midnight) or a cron expression
    (UTC, via croniter) with a length in minutes."""
    text: str
    start_min: int = 0
    end_min: int = 0
    cron: str | None = None
    minutes: int = 60

    def is_open(self, t: float) -> bool:
        return self.opens_in(t) == 0.0

    def opens_in(self, t: float) -> float:
        """Seconds until the window is next open from unix time ``t`` (0: open now)."""
        now = datetime.fromtimestamp(t, timezone.utc)
        if self.cron is not None:
            from croniter import croniter
            it = croniter(self.cron, now + timedelta(seconds=1))
            last = it.get_prev(datetime)
            if now < last + timedelta(minutes=self.minutes):
                return 0.0
            return max(0.0, croniter(self.cron, now).get_next(datetime).timestamp() - t)
        minute = now.hour * 60 + now.minute + now.second / 60 + now.microsecond / 60e6
        s, e = self.start_min, self.end_min
        inside = s <= minute < e if s < e else (minute >= s or minute < e)
        if inside:
            return 0.0
        return ((s - minute) % 1440) * 60.0

    def closes_in(self, t: float) -> float:
        """Seconds until an open window closes (0 if it is closed)."""
        if not self.is_open(t):
            return 0.0
        now = datetime.fromtimestamp(t, timezone.utc)
        if self.cron is not None:
            from croniter import croniter
            last = croniter(self.cron, now + timedelta(seconds=1)).get_prev(datetime)
            return max(0.0, (last + timedelta(minutes=self.minutes) - now).total_seconds())
        minute = now.hour * 60 + now.minute + now.second / 60
        return ((self.end_min - minute) % 1440) * 60.0

    def __str__(self) -> str:
        return self.text if self.cron is None else f"{self.text} for {self.minutes} min (UTC)"


def parse_window(v: Any, minutes: Any = None) -> Window:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("expected \"HH:MM-HH:MM\" (UTC) or a cron expression like \"0 2 * * 1-5\"")
    text = v.strip()
    m = _HHMM.fullmatch(text.replace(" ", ""))
    if m is not None:
        if minutes is not None:
            raise ValueError("window_minutes goes with a cron window, not with HH:MM-HH:MM")
        h1, m1, h2, m2 = (int(x) for x in m.groups())
        s, e = h1 * 60 + m1, h2 * 60 + m2
        if s == e:
            raise ValueError(f"{text!r} is empty (start equals end); leave window out to allow any time")
        return Window(text, s, e)
    from croniter import croniter
    if len(text.split()) != 5 or not croniter.is_valid(text):
        raise ValueError(f"{text!r} is neither HH:MM-HH:MM nor a 5-field cron expression")
    n = 60 if minutes is None else minutes
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10080:
        raise ValueError("window_minutes: expected whole minutes from 1 to 10080 (a week)")
    return Window(text, cron=text, minutes=n)
