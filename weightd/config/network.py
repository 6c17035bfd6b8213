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


class NetworkSettings(FrozenModel):
    enabled: bool | None = Field(None, doc="lower weightd's own P2P rates while other traffic (serving) uses the "
                                           "link; unset: on when the link's capacity is known (capacity, or the "
                                           "interface's reported speed)")
    capacity: int = Field(0, unit="bytes/s", doc="the link's capacity, per interface; 0: /sys/class/net/IF/speed "
                                                 "(virtual NICs such as veth report none)")
    ceiling: float = Field(0.8, gt=0, le=1, doc="keep the link's total under this share of capacity while other "
                                               "traffic is on it (a fraction or '80%'); alone, weightd may use it all")
    floor: float = Field(0.05, ge=0, le=1, doc="weightd's own rates never go below this share of capacity, so "
                                               "weights still arrive (a fraction or '5%')")
    interfaces: tuple[str, ...] = Field((), doc="the interfaces carrying weightd's traffic; empty: found from the "
                                                "routes to [p2p] peers, trackers, listen addresses and cold storage")

    _fractions = field_validator("ceiling", "floor", mode="before")(fraction)
    _capacity = field_validator("capacity", mode="before")(lambda v: parse_size(v))

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
