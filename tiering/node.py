"""One node's local data plane: cold storage, the hot and warm tiers, and the state that ties them.

Every operation here is synchronous and safe to run from several processes at once; the daemon calls
the same methods from worker threads. Nothing half-written is ever visible under ``NAME/VERSION``:
work happens in ``.staging/``, is verified against the manifest, and appears by ``rename``.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .content.build import build_manifest, verify_checkpoint
from .copy import CopyJob, copy_files
from .delta import Donor, plan_delta
from .delta import build_verified as build_delta
from .errors import (BadInput, Busy, CheckpointNotFound, FileChanged, IntegrityError, NoSpace, TieringError,
                     TimedOut, VersionConflict)
from .inuse import processes_using
from .layout import (COLD, DIR_MODE, HOT, LOCAL_TIERS, LOCKS, PRIVATE_MODE, TRASH, WARM, StagingArea, TierSpec,
                     VersionDir, commit_staging, list_versions, lock_name, open_staging, prune_empty_parents,
                     published_versions, read_version, remove_tree, staging_expected_bytes, staging_id,
                     staging_ids, staging_keep, version_path, version_rel)
from .locks import FileLock
from .content.manifest import MANIFEST_RELPATH, Manifest
from .content.names import validate_name, validate_version
from .pagecache import WarmOptions, residency, warm
from .placement import Candidate, EvictionPlan, plan_eviction
from .safefs import Dir, FileRef, RootPolicy, open_cold_root, open_tier_root
from .content.scan import scan_checkpoint
from .sources import Fetcher, FetchRequest, SourceFallback, as_dicts
from .state import State

log = logging.getLogger(__name__)
ProgressFn = Callable[[int], None]
SOURCES = ("local_reuse", "peer", "origin", "cold")
DEFAULT_LEASE_S = 600.0
MAX_SECONDS = 7 * 24 * 3600.0   # leases and timeouts: finite, and at most a week
PUBLISH_LOCK_TIMEOUT_S = 600.0  # another publisher of the same NAME@VERSION (cold locks can be anyone's)


def check_seconds(key: str, value: float | None, *, allow_zero: bool) -> float | None:
    """A lease or timeout from a caller: finite, not negative, at most a week (NaN and Infinity are
    refused; they would silently mean "no lease" or "pinned forever")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero) or value > MAX_SECONDS:
        raise BadInput(f"{key}: expected a finite number of seconds from {'0' if allow_zero else 'more than 0'} "
                       f"to {int(MAX_SECONDS)} (a week), got {value!r}")
    return float(value)


@dataclass(slots=True)
class PublishReport:
    name: str
    version: str
    path: str
    digest: str
    bytes: int
    unchanged: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "path": self.path, "digest": self.digest,
                "bytes": self.bytes, "unchanged": self.unchanged, "seconds": round(self.seconds, 4)}


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
    delta: dict[str, Any] | None = None   # donors used, bytes planned and refetched (a delta update)

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
                "warm_seconds": round(self.warm_seconds, 4), "delta": self.delta}


class LocalNode:
    """The tiers of one node. Tier roots are opened by descriptor (and checked to be weightd's own)
    when first needed; nothing is created for a query (``status``, ``path``), and cold storage is
    only ever written by ``publish``."""

    def __init__(self, *, hot: TierSpec, warm: TierSpec, cold: Path, state_dir: Path,
                 now: Callable[[], float] = time.time, copy_threads: int = 2, reconcile: bool = True,
                 warm_options: WarmOptions = WarmOptions(),
                 on_evict: Callable[[str, str, str, int], None] | None = None,
                 fetchers: list[Fetcher] | None = None,
                 on_placed: Callable[[str, VersionDir], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.tiers = {HOT: hot, WARM: warm}
        self.fetchers = list(fetchers or [])  # e.g. P2P, tried after a local copy and before cold
        self.on_placed = on_placed            # e.g. start seeding what was just placed
        self.on_evict = on_evict  # (tier, ref, reason, bytes): the daemon counts evictions
        self.warm_options = warm_options
        self.cold = cold
        self.now = now
        self.monotonic = monotonic
        self.copy_threads = copy_threads
        self._dirs: dict[str, Dir] = {}
        for t in LOCAL_TIERS:  # a foreign, loose or symlinked root is refused before anything else
            self._root_dir(t, create=False)
        self.state = State(state_dir, now=now)
        if reconcile:
            self.reconcile()

    def close(self) -> None:
        self.state.close()
        for d in self._dirs.values():
            d.close()
        self._dirs.clear()

    def __enter__(self) -> "LocalNode":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------------------
    def _root(self, tier: str) -> Path:
        return self.cold if tier == COLD else self.tiers[tier].path

    def _root_dir(self, tier: str, *, create: bool = False) -> Dir | None:
        """The tier's root by descriptor (None if it does not exist and ``create`` is false)."""
        d = self._dirs.get(tier)
        if d is not None:
            try:
                if os.fstat(d.fd).st_nlink > 0:
                    return d
            except OSError:
                pass
            d.close()  # removed behind our back: open (and check) it again
            del self._dirs[tier]
        if tier == COLD:
            d = open_cold_root(self.cold, create=create)
        else:
            spec = self.tiers[tier]
            d = open_tier_root(spec.path, RootPolicy(spec.root_mode, spec.group), create=create)
        if d is not None:
            self._dirs[tier] = d
        return d

    def _must_root(self, tier: str) -> Dir:
        d = self._root_dir(tier, create=True)
        assert d is not None
        return d

    def _locks(self, tier: str) -> Dir:
        return self._must_root(tier).private(LOCKS)

    def _lock(self, tier: str, name: str, version: str) -> FileLock:
        return FileLock(self._locks(tier), lock_name(name, version), f"{name}@{version} in {tier}")

    def _tier_lock(self, tier: str) -> FileLock:
        return FileLock(self._locks(tier), ".tier.lock", f"the {tier} tier's space reservation")

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - self.monotonic())

    # -- reconcile ----------------------------------------------------------------------------------
    def reconcile(self) -> dict[str, Any]:
        """Remove stale staging and trash, adopt complete versions (verified first), forget vanished
        ones. Local tiers only: cold storage is never written here."""
        out: dict[str, Any] = {}
        for tier in LOCAL_TIERS:
            root = self._root_dir(tier, create=False)
            removed = kept = rejected = 0
            area, ids = staging_ids(root)
            if root is not None and area is not None:
                with area:
                    for sid in ids:
                        removed_one, kept_one = self._reap_staging(tier, area, sid)
                        removed += removed_one
                        kept += kept_one
            if root is not None and root.lstat(TRASH) is not None:
                root.remove(TRASH)
            present = []
            known = {(r.name, r.version): r.digest for r in self.state.copies(tier)}
            for v in list_versions(root):
                if known.get((v.name, v.version)) != v.manifest.digest and not self._adopt(tier, root, v):
                    rejected += 1
                    continue
                present.append((v.name, v.version, v.manifest.digest, v.size))
            adopted, forgotten = self.state.reconcile(tier, present)
            out[tier] = {"stale_staging_removed": removed, "resumable_staging_kept": kept, "adopted": adopted,
                         "forgotten": forgotten, "rejected": rejected}
            if removed or adopted or forgotten or rejected:
                log.info("reconciled tier=%s stale_staging=%d adopted=%d forgotten=%d rejected=%d", tier, removed,
                         adopted, forgotten, rejected)
        self.state.expire_leases()
        return out

    def _reap_staging(self, tier: str, area: Dir, sid: str) -> tuple[int, int]:
        """(removed, kept) for one staging id: live ones (their version's lock is held) are left alone,
        a P2P transfer that can resume is kept for a day, everything else goes."""
        base = sid[:-len(".resumable")] if sid.endswith(".resumable") else None
        lock = FileLock(self._locks(tier), f"{base}.lock") if base else None
        if lock is not None and not lock.try_acquire():
            return 0, 0
        try:
            if lock is not None and staging_keep(area, sid):
                return 0, 1
            area.remove(sid)
            area.unlink(f"{sid}.json")
            area.unlink(f"{sid}.lock")   # (left by earlier weightd versions)
            return 1, 0
        finally:
            if lock is not None:
                lock.release()

    def _adopt(self, tier: str, root: Dir, v: VersionDir) -> bool:
        """A complete version on disk that state does not know (a crash between the rename and the
        record, or a state database rebuilt): verify every byte before it is served. One that fails
        is removed, so it is fetched again the next time it is wanted."""
        lock = self._lock(tier, v.name, v.version)
        if not lock.try_acquire():
            return True  # someone is placing it right now; they record it
        try:
            with root.sub(v.rel) as d:
                report = verify_checkpoint(d, v.manifest, threads=self.copy_threads)
        except (TieringError, OSError) as exc:
            report, why = None, str(exc)
        else:
            why = "; ".join(str(p) for p in report.problems[:3])
        try:
            if report is not None and report.ok:
                log.info("adopted name=%s version=%s tier=%s after verifying %d bytes", v.name, v.version, tier,
                         report.bytes_checked)
                return True
            log.warning("not adopting name=%s version=%s tier=%s: %s (removed)", v.name, v.version, tier, why)
            remove_tree(root, v.rel)
            prune_empty_parents(root, v.rel)
            return False
        finally:
            lock.release()

    # -- publish ------------------------------------------------------------------------------------
    def publish(self, src: Path, name: str, version: str, *, progress: ProgressFn | None = None) -> PublishReport:
        """Copy a checkpoint directory (or HF cache snapshot) into cold storage, immutably."""
        validate_name(name)
        validate_version(version)
        t0 = self.monotonic()
        files = scan_checkpoint(src)  # validates the source before anything is written
        ref = f"{name}@{version}"
        rel = version_rel(name, version)
        cold = self._must_root(COLD)
        lock = self._lock(COLD, name, version)
        lock.acquire(PUBLISH_LOCK_TIMEOUT_S)  # a lock held on a shared mount forever must not wedge us
        with lock:
            existing = read_version(cold, name, version)
            if existing is not None:
                m = build_manifest(src, files=files)
                if m.digest != existing.manifest.digest:
                    raise VersionConflict(ref, existing.manifest.digest, m.digest)
                return PublishReport(name, version, str(existing.path), m.digest, m.total_bytes, True,
                                     self.monotonic() - t0)
            if cold.lstat(rel) is not None:  # a directory without a valid manifest: not ours to overwrite
                raise VersionConflict(ref, "unknown (no valid manifest)", "-")
            total = sum(f.size for f in files)
            # (our lock: whatever a crashed publish, or anyone else, left under this id goes)
            staging = open_staging(cold, name, version, total, resume=False)
            try:
                jobs = [CopyJob(f.path, FileRef(staging.dir, f.relpath), f.size, f.mode) for f in files]
                copy_files(jobs, threads=self.copy_threads, preallocate=False, progress=progress)
                for f in files:  # the source must not have changed while it was copied
                    st = os.stat(f.path)
                    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
                        raise FileChanged(str(f.path), "changed while it was being published; try again")
                staged = scan_checkpoint(staging.dir)
                if sorted(f.relpath for f in staged) != sorted(f.relpath for f in files):
                    extra = sorted({f.relpath for f in staged} - {f.relpath for f in files})[:3]
                    raise FileChanged(str(staging.path), f"staging holds files that are not in {src}: "
                                                         f"{', '.join(extra)} (another writer?)")
                m = build_manifest(staging.dir, files=staged)
                m = m.with_labels(name=name, version=version,
                                  published_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
                self._write_manifest(staging, m)
                commit_staging(cold, staging, name, version)
            except BaseException:
                staging.area.remove(staging.sid)
                raise
            finally:
                staging.area.unlink(f"{staging.sid}.json")
                staging.close()
            final = cold.path / rel
            log.info("published name=%s version=%s digest=%s bytes=%d", name, version, m.digest, m.total_bytes)
            return PublishReport(name, version, str(final), m.digest, m.total_bytes, False, self.monotonic() - t0)

    @staticmethod
    def _write_manifest(staging: StagingArea, m: Manifest) -> None:
        meta, _, fname = MANIFEST_RELPATH.rpartition("/")
        with staging.dir.sub(meta, create=True, mode=DIR_MODE) as d:
            d.write_atomic(fname, m.to_json().encode("utf-8"), 0o644)

    # -- resolve ------------------------------------------------------------------------------------
    def published_versions(self, name: str) -> list[VersionDir]:
        return published_versions(self._root_dir(COLD), name)

    def resolve(self, name: str, version: str | None) -> VersionDir:
        """The manifest of NAME@VERSION (latest published when VERSION is None): cold first, else local.
        A version that is in cold storage with a damaged manifest is a ManifestError (exit 2)."""
        validate_name(name)
        if version is not None:
            validate_version(version)
            v = read_version(self._root_dir(COLD), name, version, strict=True)
            if v is not None:
                return v
            for tier in LOCAL_TIERS:
                v = read_version(self._root_dir(tier), name, version)
                if v is not None:
                    return v
            raise CheckpointNotFound(f"{name}@{version}", "not published and not on this node")
        candidates = self.published_versions(name)
        if not candidates:
            for tier in LOCAL_TIERS:
                candidates += [v for v in list_versions(self._root_dir(tier)) if v.name == name]
        if not candidates:
            raise CheckpointNotFound(name, "no version published and none on this node")
        return max(candidates, key=lambda v: (v.manifest.published_at or "", v.version))

    # -- usage and eviction -------------------------------------------------------------------------
    def tier_used(self, tier: str, *, exclude: str | None = None) -> int:
        """Bytes of complete versions plus the expected size of every staging area in the tier but
        ``exclude`` (a retry's own staging area never counts against it)."""
        root = self._root_dir(tier)
        used = sum(v.size for v in list_versions(root))
        area, ids = staging_ids(root)
        if area is not None:
            with area:
                used += sum(staging_expected_bytes(area, sid) for sid in ids if sid != exclude)
        return used

    def _candidates(self, tier: str, exclude: tuple[str, str] | None) -> list[Candidate]:
        versions = [v for v in list_versions(self._root_dir(tier)) if (v.name, v.version) != exclude]
        if not versions:
            return []
        pinned = self.state.pinned()
        leased = {(le.name, le.version) for le in self.state.leases() if le.tier == tier}
        rows = {(r.name, r.version): r for r in self.state.copies(tier)}
        using = processes_using([v.path for v in versions])
        return [Candidate(v.name, v.version, v.size,
                          rows[(v.name, v.version)].last_access if (v.name, v.version) in rows else 0.0,
                          (v.name, v.version) in pinned, (v.name, v.version) in leased, v.path in using)
                for v in versions]

    def _reserve(self, tier: str, name: str, version: str, need: int,
                 deadline: float | None) -> tuple[StagingArea, list[str]]:
        """Make room (evicting by policy) and create the staging area, under the tier's lock (the
        caller holds the version's lock)."""
        spec = self.tiers[tier]
        root = self._must_root(tier)
        tlock = self._tier_lock(tier)
        tlock.acquire(self._remaining(deadline))
        try:
            capacity = spec.capacity()
            own = staging_id(name, version)
            used = self.tier_used(tier, exclude=own)
            plan = EvictionPlan(True, [], used)
            if used + need > capacity * spec.high_watermark:
                plan = plan_eviction(capacity=capacity, used=used, need=need, high=spec.high_watermark,
                                     low=spec.low_watermark, candidates=self._candidates(tier, (name, version)))
            if not plan.fits:
                kept = ", ".join(f"{c.ref} {c.protected_by}" for c in plan.protected[:3])
                raise NoSpace(tier, need, max(0, capacity - used),
                              f"capacity {capacity} bytes, {used} used" + (f"; kept: {kept}" if kept else ""))
            evicted = [f"{c.ref} ({tier})" for c in plan.evict
                       if self._evict_one(tier, c.name, c.version, reason="capacity")]
            if evicted:
                used = self.tier_used(tier, exclude=own)
                if used + need > capacity:  # a victim was busy after all
                    raise NoSpace(tier, need, max(0, capacity - used), "a checkpoint chosen for eviction was busy")
            st = root.statvfs()
            free = st.f_bavail * st.f_frsize
            if free < need:
                raise NoSpace(tier, need, free, "the file system itself is full")
            return open_staging(root, name, version, need), evicted
        finally:
            tlock.release()

    def _evict_one(self, tier: str, name: str, version: str, *, reason: str) -> bool:
        """Remove one version from a tier unless someone holds its lock; references before data."""
        lock = self._lock(tier, name, version)
        if not lock.try_acquire():
            return False
        try:
            root = self._must_root(tier)
            rel = version_rel(name, version)
            have = read_version(root, name, version)
            self.state.forget_copy(tier, name, version)
            self.state.release_leases(name, version, tier)
            remove_tree(root, rel)
            prune_empty_parents(root, rel)
            log.info("evicted name=%s version=%s tier=%s reason=%s", name, version, tier, reason)
            if self.on_evict is not None:
                self.on_evict(tier, f"{name}@{version}", reason, have.size if have else 0)
            return True
        finally:
            lock.release()

    # -- preload ------------------------------------------------------------------------------------
    def wait_published(self, name: str, version: str | None, deadline: float | None,
                       poll_s: float = 1.0) -> VersionDir:
        """Resolve, waiting for the version to be published (until ``deadline``, then TimedOut)."""
        while True:
            try:
                return self.resolve(name, version)
            except CheckpointNotFound:
                if deadline is not None and self.monotonic() + poll_s > deadline:
                    ref = f"{name}@{version}" if version else name
                    raise TimedOut(f"{ref}: not published before the timeout") from None
            time.sleep(poll_s)

    def preload(self, name: str, version: str | None = None, *, tier: str = HOT, strict: bool = False,
                lease_s: float = DEFAULT_LEASE_S, timeout_s: float | None = None, wait: bool = False,
                progress: ProgressFn | None = None) -> PreloadReport:
        """Make NAME@VERSION complete and verified in ``tier`` (hot falls back to warm unless strict).

        ``wait``: if it is not published yet, wait for it (until ``timeout_s``).
        """
        if tier not in LOCAL_TIERS:
            raise BadInput(f"tier must be one of {', '.join(LOCAL_TIERS)}")
        lease_s = check_seconds("lease_s", lease_s, allow_zero=True) or 0.0
        timeout_s = check_seconds("timeout_s", timeout_s, allow_zero=False)
        t0 = self.monotonic()
        deadline = None if timeout_s is None else t0 + timeout_s
        src = self.wait_published(name, version, deadline) if wait else self.resolve(name, version)
        try:
            report = self._preload_into(src, tier, deadline, progress, lease_s)
        except NoSpace as exc:
            if tier != HOT or strict:
                raise
            log.info("hot tier cannot hold name=%s version=%s, falling back to warm: %s", src.name,
                     src.version, exc)
            report = self._preload_into(src, WARM, deadline, progress, lease_s)
            report.tier_fallback = {"from": HOT, "to": WARM, "reason": str(exc)}
        report.requested_tier = tier
        self._warm(report)
        report.seconds = self.monotonic() - t0
        return report

    def _preload_into(self, src: VersionDir, tier: str, deadline: float | None,
                      progress: ProgressFn | None, lease_s: float) -> PreloadReport:
        name, version, m = src.name, src.version, src.manifest
        root = self._must_root(tier)
        rel = version_rel(name, version)
        report = PreloadReport(name, version, tier, str(root.path / rel), m.digest, m.total_bytes)
        lock = self._lock(tier, name, version)
        lock.acquire(self._remaining(deadline))
        try:
            have = read_version(root, name, version)
            if have is not None and have.manifest.digest == m.digest:
                self.state.record_copy(tier, name, version, m.digest, m.total_bytes)
                report.already_present = True
                self._lease(report, lease_s)
                return report
            if have is not None or root.lstat(rel) is not None:
                # a different copy under the same name, or something that is not a version (a planted
                # symlink, a damaged directory): removed by descriptor, never followed
                remove_tree(root, rel)
            staging, report.evicted = self._reserve(tier, name, version, m.total_bytes, deadline)
            try:
                verified = self._fill(staging, m, tier, name, version, report, deadline, progress)
                self._write_manifest(staging, m)
                if not verified:
                    verify_checkpoint(staging.dir, m).raise_for_problems()
                commit_staging(root, staging, name, version)
            except OSError as exc:
                staging.area.remove(staging.sid)
                if exc.errno == errno.ENOSPC:
                    raise NoSpace(tier, m.total_bytes, 0, "the file system filled up during the copy") from exc
                raise
            except BaseException:
                staging.area.remove(staging.sid)
                raise
            finally:
                staging.area.unlink(f"{staging.sid}.json")
                staging.close()
            self.state.record_copy(tier, name, version, m.digest, m.total_bytes)
            self._lease(report, lease_s)
            if self.on_placed is not None:
                placed = read_version(root, name, version)
                if placed is not None:
                    self.on_placed(tier, placed)
            log.info("preloaded name=%s version=%s tier=%s bytes=%s", name, version, tier, report.bytes_by_source)
            return report
        finally:
            lock.release()

    def _warm(self, report: PreloadReport) -> None:
        """Bring a warm-tier copy into the page cache (a tmpfs copy is resident by nature)."""
        t0 = self.monotonic()
        if report.tier == WARM:
            o = self.warm_options
            r = warm([report.path], concurrency=o.concurrency, rate_bytes_per_s=o.rate_bytes_per_s,
                     await_threshold_ms=o.await_threshold_ms)
            report.resident_bytes = r.resident_bytes
            for sk in r.skipped:
                log.warning("could not warm path=%s: %s", sk.path, sk.reason)
        else:
            report.resident_bytes = residency([report.path]).resident_bytes
        report.warm_seconds = self.monotonic() - t0

    def _lease(self, report: PreloadReport, lease_s: float) -> None:
        if lease_s > 0:
            self.state.add_lease(report.tier, report.name, report.version, lease_s)
            report.lease_expires_at = self.now() + lease_s

    def _fill(self, staging: StagingArea, m: Manifest, tier: str, name: str, version: str, report: PreloadReport,
              deadline: float | None, progress: ProgressFn | None) -> bool:
        """Fill staging from the nearest complete copy: the other local tier, else local donors plus
        the swarm or cold. Returns True when it already verified the result against ``m``."""
        other = WARM if tier == HOT else HOT
        rel = version_rel(name, version)
        sources: list[tuple[str, str]] = []
        local = read_version(self._root_dir(other), name, version)
        if local is not None and local.manifest.digest == m.digest:
            sources.append(("local_reuse", other))
        cold = read_version(self._root_dir(COLD), name, version)
        if cold is not None and cold.manifest.digest == m.digest:
            sources.append(("cold", COLD))
        if cold is not None and not any(label == "local_reuse" for label, _ in sources):
            # no local copy: other local versions lend what they share with this one (a delta update),
            # then the swarm, then a copy from cold
            donors, held = self._donors(tier, name, version)
            try:
                plan = plan_delta(m, donors) if donors else None
                if plan is not None and plan.reuse_bytes == 0:
                    plan = None
                if plan is not None:
                    report.delta = {"donors": [donors[i].ref for i in plan.donors_used()],
                                    "planned_reuse_bytes": plan.reuse_bytes, "refetched": []}
                for fetcher in self.fetchers:
                    got = fetcher.fetch(FetchRequest(cold, staging, deadline, progress, plan))
                    if got.fallback is not None:
                        report.source_fallbacks.append(got.fallback)
                    if got.filled:
                        for label, n in got.bytes_by_source.items():
                            report.bytes_by_source[label] = report.bytes_by_source.get(label, 0) + n
                        return got.verified
                if plan is not None:
                    staging.dir.clear()
                    # verified inside: a donor part that fails is fetched from cold and checked again
                    with self._must_root(COLD).sub(rel) as cold_dir:
                        r = build_delta(plan, staging.dir, cold_dir, threads=self.copy_threads, deadline=deadline,
                                        progress=progress)
                    report.bytes_by_source["local_reuse"] += r.reused
                    report.bytes_by_source["cold"] += r.fetched
                    report.delta["refetched"] = r.donor_failures
                    for why in r.donor_failures:
                        log.warning("donor bytes rejected, fetched instead name=%s version=%s: %s", name, version, why)
                    return True
            finally:
                for d in donors:
                    if d.dir is not None:
                        d.dir.close()
                for lk in held:
                    lk.release()
        if not sources:
            raise CheckpointNotFound(f"{name}@{version}", "no complete copy to read from")
        last_error: Exception | None = None
        for label, src_tier in sources:
            shared = self._lock(other, name, version) if label == "local_reuse" else None
            if shared is not None:
                try:  # hold the donor tier's lock shared so it is not evicted under us
                    shared.acquire(0, shared=True)
                except TimedOut:
                    continue
            try:
                staging.dir.clear()
                with self._must_root(src_tier).sub(rel) as base:
                    jobs = [CopyJob(FileRef(base, f.path), FileRef(staging.dir, f.path), f.size, f.mode)
                            for f in m.files]
                    copy_files(jobs, threads=self.copy_threads, progress=progress, deadline=deadline)
                report.bytes_by_source[label] += m.total_bytes
                return False
            except FileNotFoundError as exc:  # the donor vanished (evicted): try the next source
                last_error = exc
                log.warning("source vanished name=%s version=%s source=%s: %s", name, version, label, exc)
            finally:
                if shared is not None:
                    shared.release()
        assert last_error is not None
        raise CheckpointNotFound(f"{name}@{version}", f"every source vanished during the copy ({last_error})")

    def _donors(self, tier: str, name: str, version: str) -> tuple[list[Donor], list[FileLock]]:
        """Every complete local version but the target, the staging tier's first (copy_file_range can
        share extents within a file system), each held with a shared lock so it cannot be evicted
        while it lends bytes (one that cannot be locked at once is skipped)."""
        donors: list[Donor] = []
        held: list[FileLock] = []
        for t in [tier] + [x for x in LOCAL_TIERS if x != tier]:
            root = self._root_dir(t)
            for v in list_versions(root):
                if (v.name, v.version) == (name, version):
                    continue
                lk = self._lock(t, v.name, v.version)
                try:
                    lk.acquire(0, shared=True)
                except TimedOut:
                    continue
                d = root.sub_if_exists(v.rel) if root is not None else None
                if d is None or not d.is_file(MANIFEST_RELPATH):  # evicted between the listing and the lock
                    if d is not None:
                        d.close()
                    lk.release()
                    continue
                held.append(lk)
                donors.append(Donor(f"{v.name}@{v.version}", v.path, v.manifest, d))
        return donors, held

    # -- what is where (for the control plane: through the checked roots, never by path) -------------
    def tier_dir(self, tier: str) -> Dir | None:
        """The tier's root, opened by descriptor and checked (None if it does not exist yet)."""
        return self._root_dir(tier)

    def versions(self, tier: str) -> list[VersionDir]:
        """Every complete version in a local tier."""
        return list_versions(self._root_dir(tier))

    def version(self, tier: str, name: str, version: str) -> VersionDir | None:
        """NAME@VERSION in ``tier`` (``cold`` included), or None."""
        return read_version(self._root_dir(tier), name, version)

    def published(self) -> list[VersionDir]:
        """Every version published in cold storage."""
        return list_versions(self._root_dir(COLD))

    def published_version(self, name: str, version: str) -> VersionDir | None:
        return read_version(self._root_dir(COLD), name, version)

    # -- queries and admin ----------------------------------------------------------------------------
    def path(self, name: str, version: str | None = None) -> tuple[str, Path]:
        """The best complete local copy (hot before warm) of NAME@VERSION (latest published if None)."""
        if version is None:
            version = self.resolve(name, None).version
        validate_version(version)
        for tier in LOCAL_TIERS:
            root = self._root_dir(tier)
            v = read_version(root, name, version)
            if v is None or not self._known_good(tier, root, v):
                continue
            self.state.touch(tier, name, version)
            return tier, v.path
        raise CheckpointNotFound(f"{name}@{version}", "not on this node (preload it first)")

    def _known_good(self, tier: str, root: Dir, v: VersionDir) -> bool:
        """Is this copy one weightd placed (state knows it by digest)? A copy state does not know (after
        a crash or a rebuilt state database) is verified before it is served, and recorded if good; a
        query never deletes one that is bad (reconciliation does)."""
        row = self.state.copy(tier, v.name, v.version)
        if row is not None and row.digest == v.manifest.digest:
            return True
        try:
            with root.sub(v.rel) as d:
                ok = verify_checkpoint(d, v.manifest, threads=self.copy_threads).ok
        except (TieringError, OSError):
            ok = False
        if ok:
            self.state.record_copy(tier, v.name, v.version, v.manifest.digest, v.size)
        else:
            log.warning("not serving name=%s version=%s tier=%s: it does not match its manifest", v.name,
                        v.version, tier)
        return ok

    def pin(self, name: str, version: str | None) -> tuple[str, bool]:
        version = version or self.resolve(name, None).version
        validate_name(name)
        validate_version(version)
        return version, self.state.pin(name, version)

    def unpin(self, name: str, version: str | None) -> tuple[str, bool]:
        version = version or self.resolve(name, None).version
        validate_version(version)
        return version, self.state.unpin(name, version)

    def evict(self, name: str, version: str | None, tier: str | None = None, *, force: bool = False) -> list[str]:
        """Remove NAME@VERSION (every local version of NAME if VERSION is None) from a tier or all."""
        validate_name(name)
        if version is not None:
            validate_version(version)
        tiers = [tier] if tier else list(LOCAL_TIERS)
        out = []
        for t in tiers:
            targets = [v for v in list_versions(self._root_dir(t))
                       if v.name == name and (version is None or v.version == version)]
            if not targets:
                continue
            pinned = self.state.pinned()
            leased = {(le.name, le.version) for le in self.state.leases() if le.tier == t}
            using = processes_using([v.path for v in targets])
            for v in targets:
                key = (v.name, v.version)
                if not force:
                    if key in pinned:
                        raise Busy(v.ref, "pinned (weightd unpin it first, or --force)")
                    if key in leased:
                        raise Busy(v.ref, f"leased in {t} (wait for the lease to expire, or --force)")
                    if v.path in using:
                        pids = ", ".join(map(str, sorted(using[v.path])[:5]))
                        raise Busy(v.ref, f"in use in {t} by pid {pids} (or --force)")
                if self._evict_one(t, v.name, v.version, reason="admin"):
                    out.append(f"{v.ref} ({t})")
                else:
                    raise Busy(v.ref, f"another weightd is working on it in {t}")
        if not out:
            ref = f"{name}@{version}" if version else name
            raise CheckpointNotFound(ref, "not on this node" + (f" in the {tier} tier" if tier else ""))
        return out

    def gc(self) -> dict[str, Any]:
        """Reconcile, expire leases, and bring every tier above its high watermark down to the low one."""
        report: dict[str, Any] = {"reconcile": self.reconcile(), "evicted": []}
        for t in LOCAL_TIERS:
            spec = self.tiers[t]
            if self._root_dir(t) is None:
                continue
            with self._tier_lock(t):
                capacity, used = spec.capacity(), self.tier_used(t)
                if used <= capacity * spec.high_watermark:
                    continue
                cands = sorted((c for c in self._candidates(t, None) if not c.protected_by),
                               key=lambda c: c.last_access)
                for c in cands:
                    if used <= capacity * spec.low_watermark:
                        break
                    if self._evict_one(t, c.name, c.version, reason="watermark"):
                        used -= c.bytes
                        report["evicted"].append(f"{c.ref} ({t})")
        return report

    def status(self) -> dict[str, Any]:
        """What is where; reads only (nothing is created, locked or removed in any tier)."""
        pinned = self.state.pinned()
        leases = self.state.leases()
        rows = {(r.tier, r.name, r.version): r for r in self.state.copies()}
        tiers: dict[str, Any] = {}
        checkpoints: dict[tuple[str, str], dict[str, Any]] = {}
        for t in LOCAL_TIERS:
            spec = self.tiers[t]
            root = self._root_dir(t)
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
            tiers[t] = {"path": str(spec.path), "capacity_bytes": capacity,
                        "used_bytes": sum(v.size for v in versions), "staging_bytes": staging_bytes,
                        "high_watermark": spec.high_watermark, "low_watermark": spec.low_watermark,
                        "checkpoints": len(versions), "transfers_in_flight": in_flight}
            for v in versions:
                c = checkpoints.setdefault((v.name, v.version), {
                    "name": v.name, "version": v.version, "digest": v.manifest.digest, "bytes": v.size,
                    "pinned": (v.name, v.version) in pinned, "tiers": {}})
                row = rows.get((t, v.name, v.version))
                res = residency([v.path]).resident_bytes
                c["tiers"][t] = {"path": str(v.path), "last_access": row.last_access if row else None,
                                 "resident_bytes": res,
                                 "resident_percent": round(100 * res / v.size, 2) if v.size else 100.0,
                                 "leases": [{"holder": le.holder, "expires_at": le.expires_at} for le in leases
                                            if (le.tier, le.name, le.version) == (t, v.name, v.version)]}
        return {"tiers": tiers, "checkpoints": [checkpoints[k] for k in sorted(checkpoints)],
                "pins": [f"{n}@{v}" for n, v in sorted(pinned)]}
