"""What the operations return: :class:`PublishReport`, :class:`PreloadReport` (written by the preload
flow only, from what the sources return) and the ``status`` document."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..inuse import process_name, processes_using
from ..layout import LOCAL_TIERS, VersionDir
from ..pagecache import resident_bytes
from ..sources.base import SourceFallback, as_dicts
from ..state import State
from ..versions import list_versions
from .roots import TierRoots
from .staging import staging_expected_bytes, staging_ids
from .trust import read_trust

SOURCES = ("local_reuse", "peer", "origin", "cold")


@dataclass(slots=True)
class PublishReport:
    name: str
    version: str
    path: str
    digest: str
    bytes: int
    unchanged: bool
    seconds: float
    signed_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "path": self.path, "digest": self.digest,
                "bytes": self.bytes, "unchanged": self.unchanged, "seconds": round(self.seconds, 4),
                "signed_by": self.signed_by}


@dataclass(slots=True)
class PreloadReport:
    name: str
    version: str
    tier: str
    path: str
    digest: str
    bytes: int
    seconds: float = 0.0
    bytes_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    already_present: bool = False
    requested_tier: str = ""
    tier_fallback: dict[str, str] | None = None   # {"from": "hot", "to": "warm", "reason": ...}
    source_fallbacks: list[SourceFallback] = field(default_factory=list)  # e.g. p2p stalled -> cold
    evicted: list[str] = field(default_factory=list)
    lease_expires_at: float | None = None
    resident_bytes: int = 0
    warm_seconds: float = 0.0
    # warming after placement: what was read into the page cache and why ({"warmed_bytes", "room_bytes",
    # "limited_by"}), and why it was not, when the checkpoint is larger than the page cache can hold
    warm: dict[str, Any] | None = None
    warm_skipped: str | None = None
    delta: dict[str, Any] | None = None   # donors used, bytes planned and refetched (a delta update)
    signature: dict[str, Any] | None = None  # who signed it, checked against every byte (None: unsigned)
    resumed_bytes: int = 0   # kept from an interrupted transfer of this version (checked, not moved again)
    store: dict[str, Any] | None = None  # object-store cold tier: requests, errors and bytes of this transfer
    swarm: dict[str, Any] | None = None  # P2P: what the piece plan did (slices, recovery, duplicates)
    part_of: dict[str, Any] | None = None  # a partial copy or a companion: of which version, what it holds

    @property
    def bytes_moved(self) -> int:
        return sum(self.bytes_by_source.values())

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "tier": self.tier,
                "requested_tier": self.requested_tier or self.tier, "path": self.path, "digest": self.digest,
                "bytes": self.bytes, "bytes_moved": self.bytes_moved, "bytes_by_source": self.bytes_by_source,
                "already_present": self.already_present, "tier_fallback": self.tier_fallback,
                "source_fallbacks": as_dicts(self.source_fallbacks), "evicted": self.evicted,
                "seconds": round(self.seconds, 4), "lease_expires_at": self.lease_expires_at,
                "resident_bytes": self.resident_bytes,
                "resident_percent": round(100 * self.resident_bytes / self.bytes, 2) if self.bytes else 100.0,
                "warm_seconds": round(self.warm_seconds, 4), "warm": self.warm, "warm_skipped": self.warm_skipped,
                "delta": self.delta, "signature": self.signature,
                "resumed_bytes": self.resumed_bytes, "store": self.store, "swarm": self.swarm,
                "part_of": self.part_of}


def _tier_status(roots: TierRoots, tier: str) -> tuple[dict[str, Any], list[VersionDir]]:
    """(the tier's line of the status document, its complete versions)."""
    spec = roots.tiers[tier]
    root = roots.dir(tier)
    versions = list_versions(root)
    area, ids = staging_ids(root)
    staging_bytes = 0
    in_flight = 0
    if area is not None:
        with area:
            for sid in ids:
                if area.is_dir(sid):
                    in_flight += 1
                    staging_bytes += staging_expected_bytes(area, sid)
    capacity = spec.capacity() if root is not None else spec.capacity_bytes or 0
    return {"path": str(spec.path), "capacity_bytes": capacity,
            "used_bytes": sum(v.size for v in versions), "staging_bytes": staging_bytes,
            "high_watermark": spec.high_watermark, "low_watermark": spec.low_watermark,
            "checkpoints": len(versions), "transfers_in_flight": in_flight}, versions


def storage_problems(roots: TierRoots) -> list[dict[str, str]]:
    """What of the configured storage is not there as configured (reads only, makes nothing): cold
    storage absent, unmounted or unreadable; a local tier that could not be made because its parent is
    missing, or whose root is not weightd's (it holds what weightd did not make: nothing is placed
    there; looked at without marking it). Each ``{"where", "path", "reason"}``; the daemon is not
    ready while any is listed."""
    from ..errors import TieringError
    from ..layout import COLD
    from ..safefs import unmade_parent
    out: list[dict[str, str]] = []
    if roots.cold is not None:
        try:
            roots.dir(COLD)
        except (TieringError, OSError) as exc:
            out.append({"where": COLD, "path": str(roots.cold), "reason": str(exc)})
    for t in LOCAL_TIERS:
        path = roots.tiers[t].path
        if not os.path.lexists(path) and (refused := unmade_parent(path)) is not None:
            out.append({"where": t, "path": str(path), "reason": str(refused)})
            continue
        try:
            why = roots.foreign(t, mark=False)
        except (TieringError, OSError) as exc:
            why = str(exc)
        if why is not None:
            out.append({"where": t, "path": str(path), "reason": why})
    return out


def status(roots: TierRoots, state: State) -> dict[str, Any]:
    """What is where; reads only (nothing is created, locked or removed in any tier)."""
    pinned = state.pinned()
    leases = state.leases()
    rows = {(r.tier, r.name, r.version): r for r in state.copies()}
    tiers: dict[str, Any] = {}
    checkpoints: dict[tuple[str, str], dict[str, Any]] = {}
    by_tier = {t: _tier_status(roots, t) for t in LOCAL_TIERS}
    # one /proc scan, reused for a second (any socket user may ask for status in a loop)
    using = processes_using([v.path for _, versions in by_tier.values() for v in versions], max_age_s=1.0)
    for t in LOCAL_TIERS:
        tiers[t], versions = by_tier[t]
        for v in versions:
            c = checkpoints.setdefault((v.name, v.version), {
                "name": v.name, "version": v.version, "digest": v.manifest.digest, "bytes": v.size,
                "pinned": (v.name, v.version) in pinned, "tiers": {},
                **({"part_of": v.manifest.of, "files": len(v.manifest.files)} if v.manifest.of is not None else {})})
            row = rows.get((t, v.name, v.version))
            res = resident_bytes([v.path])
            rec = read_trust(roots.dir(t), v.rel)
            c["tiers"][t] = {"path": str(v.path), "last_access": row.last_access if row else None,
                             "signature": None if rec is None else {
                                 "signed_by": rec.get("key_name"), "key_id": rec.get("key_id"),
                                 "algorithm": rec.get("algorithm"), "checked": True,
                                 "checked_at": rec.get("checked_at")},
                             "resident_bytes": res,
                             "resident_percent": round(100 * res / v.size, 2) if v.size else 100.0,
                             "leases": [{"holder": le.holder, "expires_at": le.expires_at} for le in leases
                                        if (le.tier, le.name, le.version) == (t, v.name, v.version)],
                             "in_use": [{"pid": pid, "process": process_name(pid)}
                                        for pid in sorted(using.get(v.path, ()))]}
    return {"tiers": tiers, "checkpoints": [checkpoints[k] for k in sorted(checkpoints)],
            "pins": [f"{n}@{v}" for n, v in sorted(pinned)]}
