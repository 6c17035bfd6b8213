"""Desired against actual, for one node: what to hold, what to fetch next, and why each entry is not
yet what it asks for (a pure function of what the daemon gathered; the daemon acts on the plan).

Versions an entry wants, for ``NAME@VERSION``: that version. For ``NAME@latest`` with ``versions = N``:
the newest published version (fetched) and up to N-1 older published versions *if they are here*
(kept for rollback, never fetched); while the newest is not here yet, the newest version that is here
is kept too, whatever N, so a node never gives up what it serves before its successor is ready.
Every wanted version that is here is held (leased by the entry, pinned if it says ``pin``); a version
no entry holds any more is left to the eviction policy, which never removes one that is pinned,
leased or open by a process.

Moving an ``@latest`` entry from an older version it holds to a newly published one is a *rollout*:
it starts ``jitter`` seconds (a per-node, per-version spread) after the node first saw the version,
and, when the origin caps movers, only with a slot. A first placement is not a rollout.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Any, Mapping

from .spec import KeepEntry

BACKOFF_S = (30.0, 60.0, 120.0, 300.0, 900.0)   # a failed fetch is retried after these (then every 15 min)


@dataclass(frozen=True)
class Fetch:
    entry: KeepEntry
    version: str
    rollout: bool            # from an older version this node holds (fleet-wide mover cap applies)


@dataclass(frozen=True)
class Hold:
    entry: KeepEntry
    tier: str
    version: str


@dataclass
class Failure:
    at: float
    error: str
    count: int = 1

    def retry_at(self) -> float:
        return self.at + BACKOFF_S[min(self.count, len(BACKOFF_S)) - 1]


@dataclass
class Plan:
    rows: list[dict[str, Any]] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    fetches: list[Fetch] = field(default_factory=list)      # ready to start now, in priority order
    serving: dict[str, tuple[str, str]] = field(default_factory=dict)   # model ref -> (version, tier) ready


def jitter_s(node: str, name: str, version: str, spread_s: float) -> float:
    """This node's start delay for rolling to NAME@VERSION: uniform in [0, spread) across a fleet,
    stable for a node and version (a restarted daemon does not draw again)."""
    if spread_s <= 0:
        return 0.0
    h = hashlib.sha256(f"{node}\0{name}\0{version}".encode()).digest()
    return spread_s * int.from_bytes(h[:8], "big") / 2 ** 64


def _ago(t: float, now: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t)) + f" ({_dur(now - t)} ago)"


def _dur(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def plan(entries: list[KeepEntry], *, published: Mapping[str, list[str]], held: Mapping[tuple[str, str], set[str]],
         now: float, first_seen: Mapping[tuple[str, str], float], node: str, spread_s: float,
         failures: Mapping[tuple[str, str, str], Failure], inflight: set[tuple[str, str, str]],
         publish_errors: Mapping[str, str] | None = None,
         held_for: "Callable[[KeepEntry], Mapping[tuple[str, str], set[str]]] | None" = None) -> Plan:
    """``published``: name -> versions, newest first (from cold); ``held``: (name, version) -> the
    tiers with a complete copy; ``first_seen``: when this daemon first saw a published version.
    ``held_for(entry)``: what counts as held for an entry that keeps a partial copy (its object of
    each version, ``V~p<hex>``, under the version's name), instead of ``held``."""
    out = Plan()
    publish_errors = publish_errors or {}
    for e in entries:
        here = held_for(e) if held_for is not None and e.selection is not None else held
        row: dict[str, Any] = {**e.to_dict(), "want": None, "kept": [], "state": "ready", "reason": ""}
        out.rows.append(row)
        versions = published.get(e.name, [])
        wanted = _wanted(e, versions, here, publish_errors.get(e.name), row, out)
        if wanted is None:
            continue
        target, keep = wanted
        row["want"] = target
        row["kept"] = [v for v in keep if e.tier in here.get((e.name, v), ())]
        for v in row["kept"]:
            out.holds.append(Hold(e, e.tier, v))
        if row["kept"]:  # (newest first: the target once it is here, else the newest still here)
            out.serving[e.model] = (row["kept"][0], e.tier)
        if e.tier in here.get((e.name, target), ()):
            row["reason"] = f"{e.name}@{target} is in {e.tier}" + (" (pinned)" if e.pin else "")
            continue
        rollout = e.version is None and any(e.tier in here.get((e.name, v), ()) for v in versions[1:])
        if _may_fetch(e, target, rollout, row, now=now, first_seen=first_seen, node=node, spread_s=spread_s,
                      failures=failures, inflight=inflight):
            out.fetches.append(Fetch(e, target, rollout))
    return out


def _wanted(e: KeepEntry, versions: list[str], held: Mapping[tuple[str, str], set[str]], publish_error: str | None,
            row: dict[str, Any], out: Plan) -> tuple[str, list[str]] | None:
    """The version ``e`` should have (its target) and the versions it keeps, newest first; None when
    nothing is published to aim at (``row`` says so, and what is here stays held meanwhile)."""
    if e.version is not None:
        if e.version not in versions and (e.name, e.version) not in held:
            row.update(state="waiting", reason=publish_error or f"{e.model} is not published yet")
            return None
        return e.version, [e.version]
    if not versions:
        here = sorted(v for (n, v), tiers in held.items() if n == e.name and e.tier in tiers)
        row.update(state="waiting", reason=publish_error or f"no version of {e.name} is "
                   "published yet" + (f" (holding {', '.join(here)})" if here else ""))
        for v in here:  # (what is here stays until cold says what is newest)
            out.holds.append(Hold(e, e.tier, v))
        return None
    target = versions[0]
    keep = [target] + [v for v in versions[1:e.versions] if e.tier in held.get((e.name, v), ())]
    if e.tier not in held.get((e.name, target), ()):
        older = next((v for v in versions[1:] if e.tier in held.get((e.name, v), ())), None)
        if older is not None and older not in keep:
            keep.append(older)
    return target, keep


def _may_fetch(e: KeepEntry, target: str, rollout: bool, row: dict[str, Any], *, now: float,
               first_seen: Mapping[tuple[str, str], float], node: str, spread_s: float,
               failures: Mapping[tuple[str, str, str], Failure], inflight: set[tuple[str, str, str]]) -> bool:
    """Whether the fetch of ``target`` into ``e``'s tier may start now; if not, ``row`` says why
    (already under way, backing off after a failure, outside its window, a rollout's jitter)."""
    key = (e.name, target, e.tier)
    if key in inflight:
        row.update(state="transferring", reason=f"fetching {e.name}@{target} into {e.tier}")
        return False
    f = failures.get(key)
    if f is not None and now < f.retry_at():
        row.update(state="failed", reason=f"failed at {_ago(f.at, now)}: {f.error}; retrying in "
                                          f"{_dur(f.retry_at() - now)}", error=f.error, failed_at=f.at)
        return False
    if e.window is not None and not e.window.is_open(now):
        row.update(state="waiting", reason=f"waiting for window {e.window} (opens in "
                                           f"{_dur(e.window.opens_in(now))})")
        return False
    if rollout:
        start = first_seen.get((e.name, target), now) + jitter_s(node, e.name, target, spread_s)
        if now < start:
            row.update(state="waiting", reason=f"rollout to {e.name}@{target} starts in {_dur(start - now + 1)} "
                                               f"(jitter of up to {_dur(spread_s)})")
            return False
    row.update(state="pending", reason=f"{e.name}@{target} is not in {e.tier} yet" + (" (rollout)" if rollout else ""))
    return True
