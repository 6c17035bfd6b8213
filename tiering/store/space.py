"""Space in a local tier: what is used (complete versions plus what staging areas expect), making
room for a new version by policy (``plan_eviction``) under the tier's lock, and eviction: one
version (references before data), by an admin (refused while pinned, leased or in use unless
forced), and down to the low watermark (``gc``)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from typing import Any, Callable

from ..content.units import format_bytes, format_duration
from ..errors import Busy, CheckpointNotFound, NoSpace, NotOurs, TimedOut
from ..inuse import process_name, processes_using
from ..layout import LOCAL_TIERS, version_rel
from ..placement import Candidate, EvictionPlan, plan_eviction
from ..state import State
from ..versions import list_versions, read_version
from .roots import TierRoots
from .staging import StagingArea, open_staging, staging_expected_bytes, staging_id, staging_ids

log = logging.getLogger(__name__)
EvictFn = Callable[[str, str, str, int], None]   # (tier, ref, reason, bytes)


class Space:
    def __init__(self, roots: TierRoots, state: State, *, now: Callable[[], float],
                 remaining: Callable[[float | None], float | None], on_evict: EvictFn | None = None) -> None:
        self.roots, self.state, self.now, self.remaining = roots, state, now, remaining
        self.on_evict = on_evict
        # this process's preloads queue for a tier's lock here, each woken as the one before lets go:
        # the file lock (other processes) is polled, and a set of hundreds fanned out over threads
        # would otherwise spend 50 ms polls waiting on itself
        self._reserving = {t: threading.Lock() for t in LOCAL_TIERS}

    def tier_used(self, tier: str, *, exclude: str | None = None) -> int:
        """Bytes of complete versions plus the expected size of every staging area in the tier but
        ``exclude`` (a retry's own staging area never counts against it)."""
        root = self.roots.dir(tier)
        # staging areas first, then versions: a version renamed out of staging between the two reads
        # is counted twice (a moment's overestimate), never missed (its side file goes after the rename)
        used = 0
        area, ids = staging_ids(root)
        if area is not None:
            with area:
                used += sum(staging_expected_bytes(area, sid) for sid in ids if sid != exclude)
        return used + sum(v.size for v in list_versions(root))

    def candidates(self, tier: str, exclude: tuple[str, str] | None, *,
                   removable: bool = False) -> list[Candidate]:
        """The tier's versions as eviction candidates; with ``removable``, each one weightd may not
        remove (:meth:`TierRoots.removal_refused`) is marked protected, with why, so that a plan never
        counts on space that will not be freed."""
        versions = [v for v in list_versions(self.roots.dir(tier)) if (v.name, v.version) != exclude]
        if not versions:
            return []
        pinned = self.state.pinned()
        leased = {(le.name, le.version) for le in self.state.leases() if le.tier == tier}
        rows = {(r.name, r.version): r for r in self.state.copies(tier)}
        using = processes_using([v.path for v in versions])
        root = self.roots.dir(tier) if removable else None
        out = []
        for v in versions:
            refused = None
            if root is not None:
                exc = self.roots.removal_refused(tier, root, v.rel)
                refused = None if exc is None else \
                    f"(weightd cannot prove it made it: {exc.reason.removeprefix('not removed: ')})"
            out.append(Candidate(v.name, v.version, v.size,
                                 rows[(v.name, v.version)].last_access if (v.name, v.version) in rows else 0.0,
                                 (v.name, v.version) in pinned, (v.name, v.version) in leased, v.path in using,
                                 refused))
        return out

    def reserve(self, tier: str, name: str, version: str, need: int,
                deadline: float | None) -> tuple[StagingArea, list[str]]:
        """Make room (evicting by policy) and create the staging area, under the tier's lock (the
        caller holds the version's lock)."""
        spec = self.roots.tiers[tier]
        root = self.roots.must(tier)
        tlock = self.roots.tier_lock(tier)
        wait = self.remaining(deadline)
        if not self._reserving[tier].acquire(timeout=-1 if wait is None else max(0.0, wait)):
            raise TimedOut(f"timed out waiting for the {tier} tier's space reservation (another preload is "
                           f"making room)")
        try:
            tlock.acquire(self.remaining(deadline))
        except BaseException:
            self._reserving[tier].release()
            raise
        try:
            capacity = spec.capacity()
            own = staging_id(name, version)
            used = self.tier_used(tier, exclude=own)
            plan = EvictionPlan(True, [], used)
            if used + need > capacity * spec.high_watermark:
                plan = plan_eviction(capacity=capacity, used=used, need=need, high=spec.high_watermark,
                                     low=spec.low_watermark,
                                     candidates=self.candidates(tier, (name, version), removable=True))
            if not plan.fits:
                kept = ", ".join(f"{c.ref} {c.protected_by}" for c in plan.protected[:3])
                raise NoSpace(tier, need, max(0, capacity - used),
                              f"capacity {format_bytes(capacity)}, {format_bytes(used)} used"
                              + (f", kept: {kept}" if kept else "")
                              + f"; raise [tiers.{tier}] capacity, or unpin or evict what is kept (weightd status "
                                f"shows what holds each copy)")
            refused: list[str] = []
            evicted = [f"{c.ref} ({tier})" for c in plan.evict
                       if self._evict_or_refuse(tier, c.name, c.version, "capacity", refused)]
            if plan.evict:   # (whatever was or was not evicted: the budget is checked on what is there now)
                used = self.tier_used(tier, exclude=own)
                if used + need > capacity:
                    why = f"kept: {'; '.join(refused[:3])}" if refused else "a checkpoint chosen for eviction was busy"
                    raise NoSpace(tier, need, max(0, capacity - used),
                                  f"capacity {format_bytes(capacity)}, {format_bytes(used)} used, {why}")
            st = root.statvfs()
            free = st.f_bavail * st.f_frsize
            if free < need:
                raise NoSpace(tier, need, free, f"the file system under {spec.path} is full (weightd's capacity "
                                                f"is {format_bytes(capacity)}): free space there or lower "
                                                f"[tiers.{tier}] capacity")
            return open_staging(root, name, version, need, now=self.now), evicted
        finally:
            tlock.release()
            self._reserving[tier].release()

    def evict_one(self, tier: str, name: str, version: str, *, reason: str) -> bool:
        """Remove one version from a tier unless someone holds its lock; references before data.
        NotOurs (logged and counted) when weightd cannot prove it made it: nothing is touched."""
        rel = version_rel(name, version)
        root = self.roots.dir(tier)
        if root is None:
            return False
        level = logging.INFO if reason == "admin" else logging.WARNING   # (an admin's answer says it)
        refused = self.roots.removal_refused(tier, root, rel)   # (before a lock is made in a foreign root)
        if refused is not None:
            raise self.roots.refuse(tier, f"{name}@{version}", refused, level=level)
        lock = self.roots.lock(tier, name, version)
        if not lock.try_acquire():
            return False
        try:
            root = self.roots.must(tier)
            have = read_version(root, name, version)
            # (checked again and removed in one step; state forgets the copy only once it is gone)
            self.roots.remove_version(tier, root, rel, level=level)
            self.state.forget_copy(tier, name, version)
            self.state.release_leases(name, version, tier)
            log.info("evicted name=%s version=%s tier=%s reason=%s", name, version, tier, reason)
            if self.on_evict is not None:
                self.on_evict(tier, f"{name}@{version}", reason, have.size if have else 0)
            return True
        finally:
            lock.release()

    def evict(self, name: str, version: str | None, tier: str | None, *, force: bool) -> list[str]:
        """Remove NAME@VERSION (every local version of NAME if VERSION is None) from a tier or all."""
        out = []
        for t in [tier] if tier else list(LOCAL_TIERS):
            targets = [v for v in list_versions(self.roots.dir(t))
                       if v.name == name and (version is None or v.version == version)]
            if not targets:
                continue
            pinned = self.state.pinned()
            leased: dict[tuple[str, str], Any] = {}
            for le in self.state.leases():  # (ordered by expiry: the last one is the one that matters)
                if le.tier == t:
                    leased[(le.name, le.version)] = le
            using = processes_using([v.path for v in targets])
            for v in targets:
                key = (v.name, v.version)
                if not force:
                    if key in pinned:
                        raise Busy(v.ref, "pinned (weightd unpin it first, or --force)")
                    if key in leased:
                        le = leased[key]
                        until = time.strftime("%H:%M:%S UTC", time.gmtime(le.expires_at))
                        raise Busy(v.ref, f"leased in {t} by {le.holder or 'an unknown holder'} until {until} "
                                          f"({format_duration(le.expires_at - time.time())} left): wait for the lease "
                                          f"to expire, or --force")
                    if v.path in using:
                        pids = ", ".join(f"{p} ({process_name(p) or '?'})" for p in sorted(using[v.path])[:5])
                        raise Busy(v.ref, f"in use in {t} by pid {pids}: stop it first, or --force (its mappings "
                                          f"keep the bytes until it exits)")
                if self.evict_one(t, v.name, v.version, reason="admin"):
                    out.append(f"{v.ref} ({t})")
                else:
                    raise Busy(v.ref, f"another weightd is working on it in {t}")
        if not out:
            ref = f"{name}@{version}" if version else name
            raise CheckpointNotFound(ref, "not on this node" + (f" in the {tier} tier" if tier else ""))
        return out

    def _evict_or_refuse(self, tier: str, name: str, version: str, reason: str, refused: list[str]) -> bool:
        """evict_one, with a refusal (NotOurs: logged and counted there) noted in ``refused``."""
        try:
            return self.evict_one(tier, name, version, reason=reason)
        except NotOurs as exc:
            refused.append(f"{name}@{version} ({tier}): {exc.reason}")
            return False

    def to_low_watermarks(self, refused: list[str] | None = None) -> list[str]:
        """Bring every tier above its high watermark down to the low one (oldest unprotected first).
        ``refused``: gets a line for each version left alone because weightd cannot prove it made it."""
        evicted: list[str] = []
        refused = [] if refused is None else refused
        for t in LOCAL_TIERS:
            spec = self.roots.tiers[t]
            if self.roots.dir(t) is None:
                continue
            # (a root that is not weightd's gets no lock files either: each candidate is refused, counted)
            with nullcontext() if self.roots.foreign(t) is not None else self.roots.tier_lock(t):
                capacity, used = spec.capacity(), self.tier_used(t)
                if used <= capacity * spec.high_watermark:
                    continue
                cands = sorted((c for c in self.candidates(t, None) if not c.protected_by),
                               key=lambda c: c.last_access)
                for c in cands:
                    if used <= capacity * spec.low_watermark:
                        break
                    if self._evict_or_refuse(t, c.name, c.version, "watermark", refused):
                        used -= c.bytes
                        evicted.append(f"{c.ref} ({t})")
        return evicted

