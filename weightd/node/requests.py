"""What a request to the node's operations may say, checked alike for the in-process CLI and the
daemon (InvalidRequest naming the key, exit 2): refs, tier names, seconds, companions, and a validated
preload (:class:`PreloadRequest`). :class:`~weightd.node.service.NodeService` builds its requests from
these; the daemon's routes check their bodies with them before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tiering import HOT, LOCAL_TIERS, MAX_SECONDS, parse_ref

from ..errors import InvalidRequest


class _Default:
    """The lease a caller did not choose: ``tiering.DEFAULT_LEASE_S`` (its one home)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()


def check_seconds(key: str, value: Any) -> float:
    """Seconds: finite, from 0 to MAX_SECONDS (Infinity would lease forever, NaN would mean no lease)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_SECONDS:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else "a huge number"
        raise InvalidRequest(key, f"'{key}' must be a number of seconds from 0 to {MAX_SECONDS} (7 days), "
                             f"got {shown[:40]}")
    return float(value)


def check_tier(tier: Any, *, optional: bool = False) -> str | None:
    if tier is None and optional:
        return None
    if tier not in LOCAL_TIERS:
        raise InvalidRequest("tier", f"tier must be one of {', '.join(LOCAL_TIERS)}")
    return tier


def split_ref(ref: str, *, local: bool = False) -> tuple[str, str | None]:
    """NAME[@VERSION], validated (InvalidName, exit 2); ``local``: VERSION may be a local object's label
    (a partial copy ``V~p<hex>``, a companion ``V~<kind>~<key>``), as ``status`` shows them."""
    return parse_ref(ref, local=local)


def check_companion(v: Any) -> tuple[str, str] | None:
    """``{"kind": K, "key": KEY}`` (a companion artefact of the version), checked; None: the version."""
    if v is None:
        return None
    from tiering import LABEL_SEP, validate_label
    if not isinstance(v, dict) or set(v) != {"kind", "key"} or not all(isinstance(x, str) for x in v.values()):
        raise InvalidRequest("companion", "'companion' must be {\"kind\": KIND, \"key\": KEY}")
    try:
        validate_label(f"v{LABEL_SEP}{v['kind']}{LABEL_SEP}{v['key']}")
    except ValueError as exc:
        raise InvalidRequest("companion", f"companion kind {v['kind'][:40]!r} / key {v['key'][:80]!r}: {exc}") from None
    if v["kind"] == "p":
        raise InvalidRequest("companion", "companion kind 'p' is reserved (partial copies)")
    return v["kind"], v["key"]


@dataclass(frozen=True)
class PreloadRequest:
    """A validated preload; ``version`` is None until resolved (latest published)."""
    name: str
    version: str | None
    tier: str = HOT
    strict: bool = False
    lease_s: float = 0.0
    timeout_s: float | None = None
    wait: bool = False
    holder: str | None = None     # who the lease is for ("pid 4242 (vllm) uid 1000"); default: this process
    selection: Any = None         # a tiering.Selection: only these files, as a partial copy (None: all)
    companion: tuple[str, str] | None = None   # (kind, key): the version's companion artefact instead
    warm_for: tuple[int, ...] = ()  # pids the copy is for (a daemon's caller): warm only what their cgroups hold

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name

    @property
    def what(self) -> tuple[str, ...]:
        """Which object of the version (the single-flight key's last part): whole, a selection, a companion."""
        if self.companion is not None:
            return ("companion", *self.companion)
        if self.selection is not None and not self.selection.whole:
            import json
            return ("selection", json.dumps(self.selection.to_dict(), sort_keys=True))
        return ()
