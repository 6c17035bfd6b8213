"""``[network]``: weight traffic yields the link to everyone else's (``NetworkSettings``; the control
rule is in :mod:`weightd.node.network`).
"""

from __future__ import annotations

import re
from typing import Any

from tiering import parse_size

from .model import Field, field_validator, model_validator
from .values import FrozenModel

_IFNAME = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")


def fraction(v: Any) -> Any:
    """``0.8`` or ``"80%"`` -> 0.8 (bounds are the field's)."""
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            return float(v.strip()[:-1]) / 100
        except ValueError:
            raise ValueError(f"expected a fraction like 0.8 or a percentage like '80%', got {v!r}") from None
    return v


def floor_above_0(v: Any) -> Any:
    """The floor as a fraction, refused at 0 or below: 0 is libtorrent's "no limit" (never a limit of 0)."""
    v = fraction(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
        raise ValueError(f"must be above 0 (got {v!r}): weightd's limit would reach 0, which is no limit at all")
    return v


_BITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
         "bps": 1, "kbps": 10**3, "mbps": 10**6, "gbps": 10**9, "tbps": 10**12}
_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*(/s)?\s*")
MAX_CAPACITY = 10**13  # bytes/s (80 Tbit/s): anything above is a typo
MIN_CAPACITY = 10**6   # bytes/s: under 1 MB/s is no link weights travel on (a bare 100 meant as 100 Gbit)


def parse_capacity(v: Any) -> int:
    """A link's capacity in bytes/s: ``"100Gbit"``, ``"10 Gbit/s"``, ``"25Gbps"`` (bits), ``"12.5GB"``,
    ``"12.5GB/s"`` or a bare number (bytes); 0: unset. Under MIN_CAPACITY is refused."""
    if isinstance(v, str):
        m = _RATE.fullmatch(v)
        unit = m.group(2) if m else ""
        n = -1
        try:
            if m and (unit.lower().endswith("bit") or unit.endswith("bps")) and unit.lower() in _BITS:
                n = int(float(m.group(1)) * _BITS[unit.lower()] / 8)
            elif m:
                n = parse_size(m.group(1) + unit)
        except (ValueError, OverflowError):  # (OverflowError: 10**310 as a float)
            n = -1
        if n < 0:
            raise ValueError(f"expected a rate like '100Gbit', '25Gbit/s' or '12.5GB' (bytes/s), got {v[:40]!r}")
    else:
        try:
            n = parse_size(v)
        except OverflowError:
            n = MAX_CAPACITY + 1
    if n > MAX_CAPACITY:
        raise ValueError(f"{str(v)[:40]!r} is over {MAX_CAPACITY // 10**12} TB/s: write the link's rate, like '100Gbit'")
    if 0 < n < MIN_CAPACITY:
        raise ValueError(f"{v!r} is {n} bytes/s, under 1 MB/s (a bare number is bytes/s): write the link's "
                         f"rate with its unit, like '100Gbit' or '12.5GB'")
    return n


class NetworkSettings(FrozenModel):
    enabled: bool | None = Field(None, doc="lower weightd's own P2P rates while other traffic (serving) uses the "
                                           "link; unset: on when the link's capacity is known (capacity, or the "
                                           "interface's reported speed)")
    capacity: int = Field(0, unit="bytes/s", doc="the link's capacity, per interface, in bits ('100Gbit', "
                                                 "'25Gbit/s', '10Gbps') or bytes per second ('12.5GB'; a bare "
                                                 "number is bytes/s; at least 1 MB/s); 0: "
                                                 "/sys/class/net/IF/speed (virtual NICs such as veth report none)")
    ceiling: float = Field(0.8, gt=0, le=1, doc="keep the link's total under this share of capacity while other "
                                               "traffic is on it (a fraction or '80%'); alone, weightd may use it all")
    floor: float = Field(0.05, gt=0, le=1, doc="weightd's own rates never go below this share of capacity, so "
                                               "weights still arrive (a fraction or '5%')")
    interfaces: tuple[str, ...] = Field((), doc="the interfaces carrying weightd's traffic; empty: found from the "
                                                "routes to [p2p] peers, trackers, listen addresses and cold storage")

    _fractions = field_validator("ceiling", mode="before")(fraction)
    _floor = field_validator("floor", mode="before")(floor_above_0)
    _capacity = field_validator("capacity", mode="before")(parse_capacity)

    @field_validator("interfaces", mode="before")
    @classmethod
    def _interfaces(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise ValueError("expected a list of interface names like ['eth0']")
        bad = [x for x in v if not _IFNAME.fullmatch(x)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not an interface name")
        return tuple(v)

    @model_validator(mode="after")
    def _floor_below(self) -> "NetworkSettings":
        if self.floor > self.ceiling:
            raise ValueError(f"floor ({self.floor:g}) must be at most ceiling ({self.ceiling:g})")
        return self
