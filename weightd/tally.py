"""The metrics interface without ``prometheus_client``, for in-process CLI commands.

An in-process command counts exactly what the daemon counts (``NodeService`` runs the same code on
either), but nothing scrapes a CLI process, and importing ``prometheus_client`` costs about 50 ms of
every command's start. A :class:`Tally` takes the same calls (``m.loading.labels(...).observe(s)``,
``m.bytes.labels("cold").inc(n)``, ``m.in_flight.labels("local").dec()``) and keeps the values in a
dict, where ``-vv`` logging or a test can read them.
"""

from __future__ import annotations

from typing import Any


class _Series:
    __slots__ = ("tally", "name", "labels_")

    def __init__(self, tally: "Tally", name: str, labels: tuple[str, ...] = ()) -> None:
        self.tally, self.name, self.labels_ = tally, name, labels

    def labels(self, *values: Any) -> "_Series":
        return _Series(self.tally, self.name, tuple(str(v) for v in values))

    def inc(self, amount: float = 1) -> None:
        self.tally.add(self.name, self.labels_, amount)

    def dec(self, amount: float = 1) -> None:
        self.tally.add(self.name, self.labels_, -amount)

    def set(self, value: float) -> None:
        self.tally.values[(self.name, self.labels_)] = value

    def observe(self, value: float) -> None:
        self.tally.add(f"{self.name}:count", self.labels_, 1)
        self.tally.add(f"{self.name}:sum", self.labels_, value)


class Tally:
    """What a command counted: ``values[(metric, label values)]``; histograms as ``:count``/``:sum``."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[str, ...]], float] = {}

    def add(self, name: str, labels: tuple[str, ...], amount: float) -> None:
        key = (name, labels)
        self.values[key] = self.values.get(key, 0) + amount

    def __getattr__(self, name: str) -> _Series:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Series(self, name)
