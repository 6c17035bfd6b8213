"""One node's local data plane: cold storage, the hot and warm tiers, and the state that ties them.

Every operation here is synchronous and safe to run from several processes at once; the daemon calls
the same methods from worker threads. Nothing half-written is ever visible under ``NAME/VERSION``:
work happens in ``.staging/``, is verified against the manifest, and appears by ``rename``.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .build import build_manifest, verify_checkpoint
from .copy import CopyJob, copy_files
from .delta import Donor, plan_delta
from .delta import build_verified as build_delta
from .errors import (Busy, CheckpointNotFound, FileChanged, NoSpace, TieringError, TimedOut,
                     VersionConflict)
from .inuse import processes_using
from .layout import (COLD, HOT, LOCAL_TIERS, LOCKS, WARM, TierSpec, VersionDir, fsync_dir, list_versions,
                     lock_name, new_staging_dir, prune_empty_parents, read_version, remove_tree,
                     staging_entries, staging_expected_bytes, staging_keep, version_path)
from .locks import FileLock
from .manifest import MANIFEST_RELPATH, Manifest, write_manifest
from .names import validate_name, validate_version
from .pagecache import WarmOptions, residency, warm
from .placement import Candidate, EvictionPlan, plan_eviction
from .scan import scan_checkpoint
from .state import State

log = logging.getLogger(__name__)
ProgressFn = Callable[[int], None]
# fetch(source, staging, report, deadline, progress, delta) -> True if it filled staging (bytes counted in
# report.bytes_by_source), False to let the next source try; it must leave staging as it found it then.
# ``delta``: a DeltaPlan of local donor bytes to reuse, or None.
Fetcher = Callable[..., bool]
SOURCES = ("local_reuse", "peer", "origin", "cold")
DEFAULT_LEASE_S = 600.0


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
    fallback: str | None = None
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
                "already_present": self.already_present, "fallback": self.fallback, "evicted": self.evicted,
                "seconds": round(self.seconds, 4), "lease_expires_at": self.lease_expires_at,
                "resident_bytes": self.resident_bytes,
                "resident_percent": round(100 * self.resident_bytes / self.bytes, 2) if self.bytes else 100.0,
                "warm_seconds": round(self.warm_seconds, 4), "delta": self.delta}


class LocalNode:
    def __init__(self, *, hot: TierSpec, warm: TierSpec, cold: Path, state_dir: Path,
                 now: Callable[[], float] = time.time, copy_threads: int = 2, reconcile: bool = True,
                 warm_options: WarmOptions = WarmOptions(),
                 on_evict: Callable[[str, str, str, int], None] | None = None,
                 fetchers: list[Fetcher] | None = None,
                 on_placed: Callable[[str, VersionDir], None] | None = None) -> None:
        self.tiers = {HOT: hot, WARM: warm}
        self.fetchers = list(fetchers or [])  # e.g. P2P, tried after a local copy and before cold
        self.on_placed = on_placed            # e.g. start seeding what was just placed
        self.on_evict = on_evict  # (tier, ref, reason, bytes): the daemon counts evictions
        self.warm_options = warm_options
        self.cold = cold
        self.now = now
        self.copy_threads = copy_threads
        self.state = State(state_dir, now=now)
        if reconcile:
            self.reconcile()

    def close(self) -> None:
        self.state.close()

    def __enter__(self) -> "LocalNode":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------------------
    def _root(self, tier: str) -> Path:
        return self.cold if tier == COLD else self.tiers[tier].path

    def _lock(self, tier: str, name: str, version: str) -> FileLock:
        return FileLock(self._root(tier) / LOCKS / lock_name(name, version), f"{name}@{version} in {tier}")

    def _tier_lock(self, tier: str) -> FileLock:
        return FileLock(self._root(tier) / LOCKS / ".tier.lock", f"the {tier} tier's space reservation")

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    @staticmethod
    def _open_staging(root: Path, name: str, version: str, need: int, *,
                      resumable: bool = False) -> tuple[Path, FileLock]:
        """Create a staging area and lock it; call with the tier lock held (reconcile takes it too,
        so it never sees a staging area between its creation and its lock)."""
        staging, lockfile = new_staging_dir(root, name, version, need, resumable=resumable)
        slock = FileLock(lockfile)
        slock.acquire()
        return staging, slock

    @staticmethod
    def _close_staging(staging: Path, slock: FileLock) -> None:
        (staging.parent / f"{staging.name}.json").unlink(missing_ok=True)
        slock.path.unlink(missing_ok=True)
        slock.release()

    # -- reconcile ----------------------------------------------------------------------------------
    def reconcile(self) -> dict[str, Any]:
        """Remove stale staging and trash, adopt complete versions, forget vanished ones."""
        out: dict[str, Any] = {}
        for tier in (*LOCAL_TIERS, COLD):
            root = self._root(tier)
            removed = kept = 0
            entries = staging_entries(root)
            if entries:
                with self._tier_lock(tier):
                    for d, info, lockfile in entries:
                        lock = FileLock(lockfile)
                        if lock.try_acquire():  # nobody is working on it: stale (a crash, kill -9)
                            try:
                                if d.is_dir() and staging_keep(info):
                                    kept += 1  # a transfer that can resume where it stopped
                                    continue
                                shutil.rmtree(d, ignore_errors=True)
                                info.unlink(missing_ok=True)
                                lockfile.unlink(missing_ok=True)
                                removed += 1
                            finally:
                                lock.release()
            shutil.rmtree(root / ".trash", ignore_errors=True)
            if tier == COLD:
                out[tier] = {"stale_staging_removed": removed}
                continue
            present = [(v.name, v.version, v.manifest.digest, v.size) for v in list_versions(root)]
            adopted, forgotten = self.state.reconcile(tier, present)
            out[tier] = {"stale_staging_removed": removed, "resumable_staging_kept": kept, "adopted": adopted,
                         "forgotten": forgotten}
            if removed or adopted or forgotten:
                log.info("reconciled tier=%s stale_staging=%d adopted=%d forgotten=%d", tier, removed, adopted,
                         forgotten)
        self.state.expire_leases()
        return out

    # -- publish ------------------------------------------------------------------------------------
    def publish(self, src: Path, name: str, version: str, *, progress: ProgressFn | None = None) -> PublishReport:
        """Copy a checkpoint directory (or HF cache snapshot) into cold storage, immutably."""
        validate_name(name)
        validate_version(version)
        t0 = time.monotonic()
        files = scan_checkpoint(src)  # validates the source before anything is written
        ref = f"{name}@{version}"
        with self._lock(COLD, name, version):
            existing = read_version(self.cold, name, version)
            if existing is not None:
                m = build_manifest(src, files=files)
                if m.digest != existing.manifest.digest:
                    raise VersionConflict(ref, existing.manifest.digest, m.digest)
                return PublishReport(name, version, str(existing.path), m.digest, m.total_bytes, True,
                                     time.monotonic() - t0)
            final = version_path(self.cold, name, version)
            if final.exists():  # a directory without a valid manifest: not ours to overwrite
                raise VersionConflict(ref, "unknown (no valid manifest)", "-")
            total = sum(f.size for f in files)
            with self._tier_lock(COLD):
                staging, slock = self._open_staging(self.cold, name, version, total)
            try:
                jobs = [CopyJob(f.path, str(staging / f.relpath), f.size, f.mode) for f in files]
                copy_files(jobs, threads=self.copy_threads, preallocate=False, progress=progress)
                for f in files:  # the source must not have changed while it was copied
                    st = os.stat(f.path)
                    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
                        raise FileChanged(f.path, "changed while it was being published; try again")
                m = build_manifest(staging)
                m = m.with_labels(name=name, version=version,
                                  published_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
                write_manifest(m, staging / MANIFEST_RELPATH)
                self._commit(staging, final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            finally:
                self._close_staging(staging, slock)
            log.info("published name=%s version=%s digest=%s bytes=%d", name, version, m.digest, m.total_bytes)
            return PublishReport(name, version, str(final), m.digest, m.total_bytes, False, time.monotonic() - t0)

    @staticmethod
    def _commit(staging: Path, final: Path) -> None:
        """fsync the staged tree, then rename it into place (the commit point)."""
        for dirpath, _, _ in os.walk(staging):
            fsync_dir(Path(dirpath))
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staging, final)
        fsync_dir(final.parent)

    # -- resolve ------------------------------------------------------------------------------------
    def published_versions(self, name: str) -> list[VersionDir]:
        validate_name(name)
        base = self.cold / name
        if not base.is_dir():
            return []
        out = []
        for d in sorted(base.iterdir()):
            try:
                v = read_version(self.cold, name, d.name)
            except TieringError:
                continue
            if v is not None:
                out.append(v)
        return out

    def resolve(self, name: str, version: str | None) -> VersionDir:
        """The manifest of NAME@VERSION (latest published when VERSION is None): cold first, else local."""
        validate_name(name)
        if version is not None:
            validate_version(version)
            v = read_version(self.cold, name, version)
            if v is not None:
                return v
            for tier in LOCAL_TIERS:
                v = read_version(self.tiers[tier].path, name, version)
                if v is not None:
                    return v
            raise CheckpointNotFound(f"{name}@{version}", "not published and not on this node")
        candidates = self.published_versions(name)
        if not candidates:
            for tier in LOCAL_TIERS:
                candidates += [v for v in list_versions(self.tiers[tier].path) if v.name == name]
        if not candidates:
            raise CheckpointNotFound(name, "no version published and none on this node")
        return max(candidates, key=lambda v: (v.manifest.published_at or "", v.version))

    # -- usage and eviction -------------------------------------------------------------------------
    def tier_used(self, tier: str) -> int:
        """Bytes of complete versions plus the expected size of every staging area in the tier."""
        root = self._root(tier)
        used = sum(v.size for v in list_versions(root))
        used += sum(staging_expected_bytes(info) for d, info, _ in staging_entries(root) if d.exists())
        return used

    def _candidates(self, tier: str, exclude: tuple[str, str] | None) -> list[Candidate]:
        versions = [v for v in list_versions(self._root(tier)) if (v.name, v.version) != exclude]
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
                 deadline: float | None) -> tuple[Path, FileLock, list[str]]:
        """Make room (evicting by policy) and create the staging area, under the tier's lock."""
        spec = self.tiers[tier]
        spec.path.mkdir(parents=True, exist_ok=True)
        tlock = self._tier_lock(tier)
        tlock.acquire(self._remaining(deadline))
        try:
            capacity = spec.capacity()
            used = self.tier_used(tier)
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
                used = self.tier_used(tier)
                if used + need > capacity:  # a victim was busy after all
                    raise NoSpace(tier, need, max(0, capacity - used), "a checkpoint chosen for eviction was busy")
            st = os.statvfs(spec.path)
            free = st.f_bavail * st.f_frsize
            if free < need:
                raise NoSpace(tier, need, free, "the file system itself is full")
            staging, slock = self._open_staging(spec.path, name, version, need, resumable=True)
            return staging, slock, evicted
        finally:
            tlock.release()

    def _evict_one(self, tier: str, name: str, version: str, *, reason: str) -> bool:
        """Remove one version from a tier unless someone holds its lock; references before data."""
        lock = self._lock(tier, name, version)
        if not lock.try_acquire():
            return False
        try:
            path = version_path(self._root(tier), name, version)
            have = read_version(self._root(tier), name, version)
            self.state.forget_copy(tier, name, version)
            self.state.release_leases(name, version, tier)
            remove_tree(self._root(tier), path)
            prune_empty_parents(self._root(tier), path)
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
                if deadline is not None and time.monotonic() + poll_s > deadline:
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
            raise ValueError(f"tier must be one of {LOCAL_TIERS}")
        t0 = time.monotonic()
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
            report.fallback = f"hot tier: {exc}"
        report.requested_tier = tier
        self._warm(report)
        report.seconds = time.monotonic() - t0
        return report

    def _preload_into(self, src: VersionDir, tier: str, deadline: float | None,
                      progress: ProgressFn | None, lease_s: float) -> PreloadReport:
        name, version, m = src.name, src.version, src.manifest
        root = self.tiers[tier].path
        report = PreloadReport(name, version, tier, str(version_path(root, name, version)), m.digest, m.total_bytes)
        lock = self._lock(tier, name, version)
        lock.acquire(self._remaining(deadline))
        try:
            have = read_version(root, name, version)
            if have is not None and have.manifest.digest == m.digest:
                self.state.record_copy(tier, name, version, m.digest, m.total_bytes)
                report.already_present = True
                self._lease(report, lease_s)
                return report
            if have is not None:  # a different copy under the same name: replace it
                remove_tree(root, have.path)
            staging, slock, report.evicted = self._reserve(tier, name, version, m.total_bytes, deadline)
            try:
                verified = self._fill(staging, m, tier, name, version, report, deadline, progress)
                write_manifest(m, staging / MANIFEST_RELPATH)
                if not verified:
                    verify_checkpoint(staging, m).raise_for_problems()
                self._commit(staging, version_path(root, name, version))
            except OSError as exc:
                shutil.rmtree(staging, ignore_errors=True)
                if exc.errno == errno.ENOSPC:
                    raise NoSpace(tier, m.total_bytes, 0, "the file system filled up during the copy") from exc
                raise
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            finally:
                self._close_staging(staging, slock)
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
        t0 = time.monotonic()
        if report.tier == WARM:
            o = self.warm_options
            r = warm([report.path], concurrency=o.concurrency, rate_bytes_per_s=o.rate_bytes_per_s,
                     await_threshold_ms=o.await_threshold_ms)
            report.resident_bytes = r.resident_bytes
            for sk in r.skipped:
                log.warning("could not warm path=%s: %s", sk.path, sk.reason)
        else:
            report.resident_bytes = residency([report.path]).resident_bytes
        report.warm_seconds = time.monotonic() - t0

    def _lease(self, report: PreloadReport, lease_s: float) -> None:
        if lease_s > 0:
            self.state.add_lease(report.tier, report.name, report.version, lease_s)
            report.lease_expires_at = self.now() + lease_s

    def _fill(self, staging: Path, m: Manifest, tier: str, name: str, version: str, report: PreloadReport,
              deadline: float | None, progress: ProgressFn | None) -> bool:
        """Fill staging from the nearest complete copy: the other local tier, else local donors plus
        the swarm or cold. Returns True when it already verified the result against ``m``."""
        other = WARM if tier == HOT else HOT
        sources: list[tuple[str, Path]] = []
        local = read_version(self.tiers[other].path, name, version)
        if local is not None and local.manifest.digest == m.digest:
            sources.append(("local_reuse", local.path))
        cold = read_version(self.cold, name, version)
        if cold is not None and cold.manifest.digest == m.digest:
            sources.append(("cold", cold.path))
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
                for fetch in self.fetchers:
                    if fetch(cold, staging, report, deadline, progress, plan):
                        return False
                if plan is not None:
                    self._clear(staging)
                    # verified inside: a donor part that fails is fetched from cold and checked again
                    r = build_delta(plan, staging, cold.path, threads=self.copy_threads, deadline=deadline,
                                    progress=progress)
                    report.bytes_by_source["local_reuse"] += r.reused
                    report.bytes_by_source["cold"] += r.fetched
                    report.delta["refetched"] = r.donor_failures
                    for why in r.donor_failures:
                        log.warning("donor bytes rejected, fetched instead name=%s version=%s: %s", name, version, why)
                    return True
            finally:
                for lk in held:
                    lk.release()
        if not sources:
            raise CheckpointNotFound(f"{name}@{version}", "no complete copy to read from")
        last_error: Exception | None = None
        for label, base in sources:
            shared = self._lock(other, name, version) if label == "local_reuse" else None
            if shared is not None:
                try:  # hold the donor tier's lock shared so it is not evicted under us
                    shared.acquire(0, shared=True)
                except TimedOut:
                    continue
            try:
                self._clear(staging)
                jobs = [CopyJob(str(base / f.path), str(staging / f.path), f.size, f.mode) for f in m.files]
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

    @staticmethod
    def _clear(staging: Path) -> None:
        for child in staging.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()

    def _donors(self, tier: str, name: str, version: str) -> tuple[list[Donor], list[FileLock]]:
        """Every complete local version but the target, the staging tier's first (copy_file_range can
        share extents within a file system), each held with a shared lock so it cannot be evicted
        while it lends bytes (one that cannot be locked at once is skipped)."""
        donors: list[Donor] = []
        held: list[FileLock] = []
        for t in [tier] + [x for x in LOCAL_TIERS if x != tier]:
            for v in list_versions(self.tiers[t].path):
                if (v.name, v.version) == (name, version):
                    continue
                lk = self._lock(t, v.name, v.version)
                try:
                    lk.acquire(0, shared=True)
                except TimedOut:
                    continue
                if not (v.path / MANIFEST_RELPATH).is_file():  # evicted between the listing and the lock
                    lk.release()
                    continue
                held.append(lk)
                donors.append(Donor(f"{v.name}@{v.version}", v.path, v.manifest))
        return donors, held

    # -- queries and admin ----------------------------------------------------------------------------
    def path(self, name: str, version: str | None = None) -> tuple[str, Path]:
        """The best complete local copy (hot before warm) of NAME@VERSION (latest published if None)."""
        if version is None:
            version = self.resolve(name, None).version
        validate_version(version)
        for tier in LOCAL_TIERS:
            v = read_version(self.tiers[tier].path, name, version)
            if v is not None:
                self.state.touch(tier, name, version)
                return tier, v.path
        raise CheckpointNotFound(f"{name}@{version}", "not on this node (preload it first)")

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
            targets = [v for v in list_versions(self.tiers[t].path)
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
            if not spec.path.is_dir():
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
        pinned = self.state.pinned()
        leases = self.state.leases()
        rows = {(r.tier, r.name, r.version): r for r in self.state.copies()}
        tiers: dict[str, Any] = {}
        checkpoints: dict[tuple[str, str], dict[str, Any]] = {}
        for t in LOCAL_TIERS:
            spec = self.tiers[t]
            versions = list_versions(spec.path)
            staging = [(d, info) for d, info, _ in staging_entries(spec.path) if d.exists()]
            capacity = spec.capacity() if spec.path.is_dir() else spec.capacity_bytes or 0
            tiers[t] = {"path": str(spec.path), "capacity_bytes": capacity,
                        "used_bytes": sum(v.size for v in versions),
                        "staging_bytes": sum(staging_expected_bytes(i) for _, i in staging),
                        "high_watermark": spec.high_watermark, "low_watermark": spec.low_watermark,
                        "checkpoints": len(versions), "transfers_in_flight": len(staging)}
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
