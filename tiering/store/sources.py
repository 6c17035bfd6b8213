"""Where a preload's bytes come from, nearest first: the other local tier (``local_reuse``); with no
local copy, other local versions lending what they share (a delta), each configured
:class:`~tiering.sources.base.Fetcher` (the swarm), then a delta build or a plain copy from cold. What was
used is returned as a :class:`Fill`; the preload flow alone writes it into the report."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..content.build import good_parts, verify_checkpoint
from ..content.manifest import MANIFEST_RELPATH, Manifest
from .._syscalls import is_tmpfs
from ..copy import CopyJob
from ..delta import DeltaPlan, Donor, plan_delta
from ..delta import build_verified as build_delta
from ..errors import CheckpointNotFound, StorageUnavailable, TimedOut
from ..layout import COLD, HOT, LOCAL_TIERS, WARM, VersionDir, version_rel
from ..locks import FileLock
from ..progress import ProgressFn, set_phase
from ..safefs import FileRef
from ..sources.base import Fetcher, FetchRequest, SourceFallback
from ..verified_copy import copy_verified
from ..versions import list_versions, read_version
from .donors import PartHolders
from .roots import TierRoots
from .staging import StagingArea

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Fill:
    """What filled a staging area: bytes by source label, whether they are already verified against
    the manifest, the sources given up on, and the delta used (donors, bytes planned, refetched)."""
    verified: bool = False
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    source_fallbacks: list[SourceFallback] = field(default_factory=list)
    delta: dict[str, Any] | None = None
    resumed: int = 0       # bytes an interrupted transfer left that passed their check (not moved again)
    store: dict[str, Any] | None = None   # an object store's requests and bytes for this fill
    swarm: dict[str, Any] | None = None   # the swarm's piece plan for this fill (P2P)
    # every file's crypto digest (a signature's SHA-256), by manifest path, when the fill took them from
    # the bytes it wrote (the commit then checks the signature without reading the files again)
    crypto_digests: dict[str, str] | None = None

    def add(self, label: str, n: int) -> None:
        self.bytes_by_source[label] = self.bytes_by_source.get(label, 0) + n


class Sources:
    def __init__(self, roots: TierRoots, fetchers: list[Fetcher], *, copy_threads: int,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.roots, self.fetchers, self.copy_threads, self.monotonic = roots, fetchers, copy_threads, monotonic
        self.part_holders = PartHolders()

    def fill(self, staging: StagingArea, m: Manifest, tier: str, name: str, version: str,
             deadline: float | None, progress: ProgressFn | None, *, origin: VersionDir | None = None,
             crypto: Callable[[], Any] | None = None) -> Fill:
        """Fill staging from the nearest complete copy: the other local tier, else local donors plus
        the swarm or cold. ``origin``: the published version whose files these are, when ``version``
        is another object's label (a partial copy: only the files of ``m`` are read from it).
        ``crypto``: a signature's hasher; a plain copy and a delta build take every file's digest on
        the way (``Fill.crypto_digests``)."""
        fill = Fill()
        other = WARM if tier == HOT else HOT
        src_version = origin.version if origin is not None else version
        src_digest = origin.manifest.digest if origin is not None else m.digest
        labels: list[tuple[str, str, str]] = []
        local = read_version(self.roots.dir(other), name, version)
        if local is not None and local.manifest.digest == m.digest:
            labels.append(("local_reuse", other, version))
        try:
            cold = read_version(self.roots.dir(COLD), name, src_version)
        except StorageUnavailable:
            if not labels:
                raise
            cold = None   # cold storage is away, the other local tier has the copy
        if cold is not None and cold.manifest.digest == src_digest:
            labels.append(("cold", COLD, src_version))
        if cold is not None and not any(label == "local_reuse" for label, _, _ in labels):
            # no local copy: other local versions lend what they share with this one (a delta update),
            # then the swarm, then a copy from cold
            if self._remote(fill, staging, m, cold, tier, name, version, deadline, progress, crypto):
                return fill
        if not labels and self.roots.object is not None:
            self._from_object(fill, staging, m, tier, name, version, deadline, progress, origin, crypto)
            return fill
        if not labels:
            raise CheckpointNotFound(f"{name}@{version}", "no complete copy to read from")
        self._copy(fill, staging, m, labels, other, name, version, deadline, progress, crypto)
        return fill

    def _remote(self, fill: Fill, staging: StagingArea, m: Manifest, cold: VersionDir, tier: str, name: str,
                version: str, deadline: float | None, progress: ProgressFn | None,
                crypto: Callable[[], Any] | None = None) -> bool:
        """Donors, then each fetcher, then a delta build from cold; False: copy from cold instead."""
        with self._lending(tier, name, version, m) as donors:
            plan = plan_delta(m, donors) if donors else None
            if plan is not None and not worth_a_delta(plan):
                plan = None
            if plan is not None:
                fill.delta = {"donors": [donors[i].ref for i in plan.donors_used()],
                              "planned_reuse_bytes": plan.reuse_bytes, "refetched": []}
            if self._try_fetchers(fill, cold, staging, plan, deadline, progress, _subset(m, cold), m, crypto):
                return True
            if plan is not None:
                self._build_delta(staging, plan, fill, name, cold.version, deadline, progress, crypto)
                return True
        return False

    def _try_fetchers(self, fill: Fill, src: VersionDir, staging: StagingArea, plan: DeltaPlan | None,
                      deadline: float | None, progress: ProgressFn | None,
                      files: frozenset[str] | None, m: Manifest, crypto: Callable[[], Any] | None = None) -> bool:
        """Each fetcher (the swarm) in turn; True when one filled the staging area with the bytes of
        ``m`` (``files``: only these files of ``src``, for a partial copy). What a fetcher filled is
        checked against ``m`` here, before it counts: bytes that fail (a torrent a cold writer replaced
        describes other bytes than the manifest, and its pieces pass the swarm's own check) are
        removed, the fetcher is told (it bans who sent them), and the next source is used, as a
        fallback with the reason. With ``crypto`` (a signed version), that check takes every file's digest
        in the same read, so the commit does not read the bytes again for the signature."""
        for fetcher in self.fetchers:
            got = fetcher.fetch(FetchRequest(src, staging, deadline, progress, plan, self.monotonic, files))
            if got.fallback is not None:
                fill.source_fallbacks.append(got.fallback)
            if not got.filled:
                continue
            if not got.verified:
                set_phase(progress, "verify", total=m.total_bytes)
                report = verify_checkpoint(staging.dir, m, threads=self.copy_threads, progress=progress,
                                           crypto=crypto)
                if report.problems:
                    label = "p2p"   # (the one fetcher there is)
                    why = f"its bytes failed the manifest check ({report.problems[0]}" + \
                        (f", and {len(report.problems) - 1} more" if len(report.problems) > 1 else "") + ")"
                    if got.reject is not None:
                        try:
                            why += got.reject(why)
                        except Exception as exc:  # noqa: BLE001 (the fallback matters more than the ban)
                            log.warning("source %s: could not act on bad bytes: %s", label, exc)
                    log.warning("swarm bytes rejected name=%s version=%s, copying from cold instead: %s",
                                src.name, src.version, why)
                    fill.source_fallbacks.append(SourceFallback(label, "cold", why))
                    staging.dir.clear()
                    continue
            for label, n in got.bytes_by_source.items():
                fill.add(label, n)
            fill.verified, fill.swarm = True, got.swarm
            if crypto is not None and not got.verified:
                fill.crypto_digests = report.crypto_digests
            return True
        return False

    def _from_object(self, fill: Fill, staging: StagingArea, m: Manifest, tier: str, name: str, version: str,
                     deadline: float | None, progress: ProgressFn | None, origin: VersionDir | None = None,
                     crypto: Callable[[], Any] | None = None) -> None:
        """Object storage: the swarm first (peers that hold it, the origin's local copy), else ranged
        GETs along the manifest's parts, each hashed as it arrives, for the parts not already here:
        what an interrupted transfer of this version left (checked part by part), else what other
        local versions share with it (a delta: donor bytes copied, checked). The staging area is kept
        on a failure (every part is checked again on the next try). With ``crypto`` (a signed version),
        an S3 download takes every file's digest in order as its ranges arrive (reading back from the
        page cache only what arrived ahead of the hashed prefix, or was here already)."""
        obj = self.roots.object
        assert obj is not None
        whole = origin.manifest if origin is not None else m   # what is published (its torrent, its keys)
        # (a partial copy's files are read under the whole version's keys)
        src_m = m if origin is None else replace(m, version=origin.version, of=None)
        # a kept area is resumed only for the very content it was filled for (NAME@VERSION can be
        # deleted and published again with other bytes); anything else is cleared
        resumed = bool(staging.info.get("resumable") and staging.info.get("digest") == m.digest
                       and staging.dir.entries())
        have: dict[str, set[str]] = {}
        with self._lending(tier, name, version, m) as donors:
            plan = plan_delta(m, donors) if donors else None
            if plan is not None and not worth_a_delta(plan):
                plan = None
            if not resumed and self.fetchers and \
                    self._try_fetchers(fill, obj.as_version_dir(whole), staging, plan, deadline, progress,
                                       _subset(m, obj.as_version_dir(whole)), m, crypto):
                if plan is not None:
                    fill.delta = {"donors": [donors[i].ref for i in plan.donors_used()],
                                  "planned_reuse_bytes": plan.reuse_bytes, "refetched": []}
                return
            staging.dir.remove(version)  # (what a swarm transfer left inside: libtorrent's own layout)
            if resumed:
                set_phase(progress, "verify", total=m.total_bytes, detail="what an interrupted transfer left")
                have = good_parts(staging.dir, m, progress=progress)
                fill.resumed = _part_bytes(m, have)
            else:
                staging.dir.clear()
                if plan is not None:
                    set_phase(progress, "copy", source="delta", total=plan.reuse_bytes)
                    # donor parts only, each checked as it is copied (none read back): the store fetches the
                    # rest, and any donor part that failed
                    r = build_delta(plan, staging.dir, None, threads=self.copy_threads, deadline=deadline,
                                    progress=progress, clock=self.monotonic)
                    have = r.parts
                    fill.add("local_reuse", r.reused)
                    fill.delta = {"donors": [donors[i].ref for i in plan.donors_used()],
                                  "planned_reuse_bytes": plan.reuse_bytes, "refetched": r.donor_failures}
        staging.info["digest"] = m.digest
        staging.mark_resumable()
        staging.keep_on_error = True
        self._ranged(fill, staging, m, src_m, have, deadline, progress, crypto)

    def _ranged(self, fill: Fill, staging: StagingArea, m: Manifest, src_m: Manifest, have: dict[str, set[str]],
                deadline: float | None, progress: ProgressFn | None, crypto: Callable[[], Any] | None) -> None:
        """The parts not in ``have`` by ranged GETs, each checked as it arrives (and with ``crypto``, on
        a store that can, every file's digest in order: ``Fill.crypto_digests``)."""
        obj = self.roots.object
        assert obj is not None
        set_phase(progress, "copy", source="cold", total=m.total_bytes - _part_bytes(m, have))
        before = obj.stats.snapshot()
        # (the registry tier hashes every blob in order on the way, against its layer digest, but takes no
        # digests here (no takes_digests): a signed version is read back at commit there)
        digests: dict[str, str] | None = {} if crypto is not None and getattr(obj, "takes_digests", False) else None
        extra = {"crypto": crypto, "digests": digests} if digests is not None else {}
        try:
            fill.add("cold", obj.fetch(src_m, staging.dir, deadline=_wall(deadline, self.monotonic), progress=progress,
                                       have=have, **extra))
        finally:
            fill.store = obj.stats.since(before)
        fill.verified = True
        if digests is not None and set(digests) == {f.path for f in m.files}:
            fill.crypto_digests = digests

    def _build_delta(self, staging: StagingArea, plan: DeltaPlan, fill: Fill, name: str, version: str,
                     deadline: float | None, progress: ProgressFn | None,
                     crypto: Callable[[], Any] | None = None) -> None:
        set_phase(progress, "copy", source="delta")
        staging.dir.clear()
        # verified on the way, in one pass: a donor part that fails is read from cold instead, and the
        # commit reads nothing back (with ``crypto``, every file's digest is taken in the same pass)
        with self.roots.dir(COLD).sub(version_rel(name, version)) as cold_dir:   # (never made by a read)
            r = build_delta(plan, staging.dir, cold_dir, threads=self.copy_threads, deadline=deadline,
                            progress=progress, clock=self.monotonic, crypto=crypto)
        fill.add("local_reuse", r.reused)
        fill.add("cold", r.fetched)
        assert fill.delta is not None
        fill.delta["refetched"] = r.donor_failures
        for why in r.donor_failures:
            log.warning("donor bytes rejected, fetched instead name=%s version=%s: %s", name, version, why)
        fill.verified = True
        fill.crypto_digests = r.crypto_digests

    def _copy(self, fill: Fill, staging: StagingArea, m: Manifest, labels: list[tuple[str, str, str]], other: str,
              name: str, version: str, deadline: float | None, progress: ProgressFn | None,
              crypto: Callable[[], Any] | None = None) -> None:
        """A copy of every file of ``m`` from the first source that is still there, each part checked
        against ``m`` on the way (one read and one write per byte; with ``crypto``, every file's digest
        taken in the same pass); each source is (label, tier, the version label it is read under)."""
        last_error: Exception | None = None
        for label, src_tier, src_label in labels:
            rel = version_rel(name, src_label)
            shared = self.roots.lock(other, name, version) if label == "local_reuse" else None
            if shared is not None:
                try:  # hold the donor tier's lock shared so it is not evicted under us
                    shared.acquire(0, shared=True)
                except TimedOut:
                    continue
            try:
                staging.dir.clear()
                set_phase(progress, "copy", source=label, total=m.total_bytes)
                tmpfs = is_tmpfs(staging.dir.fd)
                with self.roots.must(src_tier).sub(rel) as base:
                    jobs = [(CopyJob(FileRef(base, f.path), FileRef(staging.dir, f.path), f.size, f.mode), f)
                            for f in m.files]
                    # made durable here (tmpfs needs no fsync); on tmpfs a preallocation zero-fills every
                    # page for the copy to write it again: the reservation has already checked the room
                    digests = copy_verified(jobs, m.chunk_size, threads=self.copy_threads, crypto=crypto,
                                            progress=progress, deadline=deadline, clock=self.monotonic,
                                            fsync=not tmpfs, preallocate=not tmpfs)
                    fill.verified = True
                    fill.crypto_digests = digests if crypto is not None else None
                fill.add(label, m.total_bytes)
                return
            except FileNotFoundError as exc:  # the donor vanished (evicted): try the next source
                last_error = exc
                log.warning("source vanished name=%s version=%s source=%s: %s", name, version, label, exc)
            finally:
                if shared is not None:
                    shared.release()
        assert last_error is not None
        raise CheckpointNotFound(f"{name}@{version}", f"every source vanished during the copy ({last_error})")

    @contextmanager
    def _lending(self, tier: str, name: str, version: str, m: Manifest) -> Iterator[list[Donor]]:
        """The donors of :meth:`_donors` for ``m``, held (locked, open) for the block and released after it."""
        donors, held = self._donors(tier, name, version, m)
        try:
            yield donors
        finally:
            for d in donors:
                if d.dir is not None:
                    d.dir.close()
            for lk in held:
                lk.release()

    def _donors(self, tier: str, name: str, version: str, m: Manifest) -> tuple[list[Donor], list[FileLock]]:
        """The complete local versions but the target that share bytes with ``m`` worth a delta, the
        staging tier's first (copy_file_range can share extents within a file system), each held with
        a shared lock so it cannot be evicted while it lends bytes (one that cannot be locked at once
        is skipped). The plan is made from the (cached) manifests first: only the versions it uses are
        locked and opened, so a node holding hundreds of adapters locks none of them for a new one."""
        candidates = [(t, v) for t in [tier] + [x for x in LOCAL_TIERS if x != tier]
                      for v in list_versions(self.roots.dir(t)) if (v.name, v.version) != (name, version)]
        # (only the versions that hold a part first: the plan over them is the plan over all)
        sharing = [candidates[i] for i in self.part_holders.first_holders(m, candidates)]
        if not sharing:
            return [], []
        plan = plan_delta(m, [Donor(f"{v.name}@{v.version}", v.path, v.manifest) for _, v in sharing])
        if not worth_a_delta(plan):
            return [], []
        donors: list[Donor] = []
        held: list[FileLock] = []
        for i in plan.donors_used():
            t, v = sharing[i]
            root = self.roots.dir(t)
            lk = self.roots.lock(t, v.name, v.version)
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


MIN_DELTA_REUSE = 1 << 20


def worth_a_delta(plan: DeltaPlan) -> bool:
    """A delta pays for its donor reads and checks when it reuses at least 1 MiB, or half of a small
    version; sharing only a safetensors header (every LoRA adapter of one shape does) is not one."""
    return plan.reuse_bytes > 0 and plan.reuse_bytes >= min(MIN_DELTA_REUSE, plan.total_bytes // 2)


def _subset(m: Manifest, src: VersionDir) -> frozenset[str] | None:
    """The files of ``src`` that ``m`` holds, when it holds fewer (a partial copy), else None."""
    paths = frozenset(f.path for f in m.files)
    return paths if len(paths) < len(src.manifest.files) else None


def _part_bytes(m: Manifest, have: dict[str, set[str]]) -> int:
    return sum(p.length for f in m.files for p in f.parts(m.chunk_size) if p.label in have.get(f.path, ()))


def _wall(deadline: float | None, clock: Callable[[], float]) -> float | None:
    """A deadline on ``clock`` as one on time.monotonic (what the object store's workers read)."""
    return None if deadline is None else time.monotonic() + (deadline - clock())
