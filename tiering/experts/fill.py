"""Where an expert-parallel copy's bytes come from, and the object a request for one names.

Nearest first: a complete local copy of the whole version (hot or warm, held with a shared lock), then
the swarm, then a cold tier on a path: the kept tensors' ranges are read from it directly
(:func:`.repack.repack`). From a cold tier in an object store or a registry, the same ranges (neighbours
coalesced, each part hashed as it arrives) are fetched by the ranged core into sparse files under the
staging area, then repacked from there.

Over the swarm (a configured fetcher: ``p2p.P2PFetcher``, asked with ``FetchRequest.ranges``), the
pieces of the whole version's torrent that cover the kept ranges are downloaded into the same kind of
sparse files (libtorrent checks each piece's SHA-256), then repacked with the same per-tensor checks.
A swarm that fails or stalls is a ``source_fallbacks`` entry and the ranges come from cold; swarm
bytes that pass their pieces' hashes but fail a tensor's xxh3 (a torrent that describes other bytes)
are dropped, the fetcher is told (it does not use that torrent again), and the copy is made from cold.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from contextlib import contextmanager

import xxhash

from ..content.manifest import Manifest, chunk_ranges
from ..content.units import piece_size_for
from ..errors import BadInput, CheckpointNotFound, IntegrityError, StorageUnavailable, TimedOut
from ..locks import FileLock
from ..layout import COLD, HOT, LOCAL_TIERS, WARM, VersionDir, version_rel
from ..content.select import Selection
from ..progress import ProgressFn, set_phase
from ..safefs import Dir
from ..sources.base import FetchRequest, SourceFallback
from ..store.sources import Fill, Sources
from ..store.staging import StagingArea
from ..store.trust import Trust
from ..versions import read_version
from .plan import CONFIG, INDEX_SUFFIX, ExpertSplit, expert_manifest, indexed, label_of, split_for
from .repack import Job, jobs_for, repack

log = logging.getLogger(__name__)
KIND = "experts"
RESUMABLE = ".resumable"
MADE_KEPT = 4
INDEX_LIMIT = 64 << 20


def is_expert_copy(m: Manifest) -> bool:
    return (m.of or {}).get("kind") == KIND


class ExpertSources:
    """The expert-parallel side of a preload, over the preload's :class:`Sources`."""

    def __init__(self, sources: Sources, trust: Trust, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.sources, self.roots, self.trust, self.monotonic = sources, sources.roots, trust, monotonic
        self._made: dict[tuple[Any, ...], tuple[ExpertSplit, Manifest]] = {}   # (a copy's manifest: 0.4 s at 90k)
        self._lock = threading.Lock()

    def object_of(self, src: VersionDir, sel: Selection) -> tuple[VersionDir, VersionDir, dict[str, Any]]:
        """Rank R of N's copy of ``src``: (the object, ``src``, what it is part of). Refused where
        signatures are required: a signature covers whole files, and the copy's files are new."""
        if self.trust.required:
            raise BadInput(f"{src.ref}: --experts makes files no signature covers (a signature covers the "
                           f"version's whole files); not with [trust] require_signature")
        key = (src.name, src.version, src.manifest.digest, sel)
        made = self._made.get(key)
        if made is None:
            split = split_for(src.manifest, sel, self.config_of(src))
            of = {"version": src.version, "digest": src.manifest.digest, "kind": KIND, "selection": sel.to_dict()}
            made = (split, expert_manifest(src.manifest, sel, split, label_of(src.version, sel), of,
                                           self.named_of(src)))
            with self._lock:   # (a daemon asks from several threads: the last few kept, by content)
                while len(self._made) >= MADE_KEPT:
                    self._made.pop(next(iter(self._made)))
                self._made[key] = made
        return self._object(src, *made)

    def _object(self, src: VersionDir, split: ExpertSplit, cm: Manifest
                ) -> tuple[VersionDir, VersionDir, dict[str, Any]]:
        label, of = cm.version or "", dict(cm.of or {})
        root = self.roots.dir(HOT) or self.roots.dir(WARM)
        obj = VersionDir(src.name, label, (root.path if root is not None else Path(".")) / src.name / label, cm)
        shards = [f for f in cm.files if f.safetensors is not None]
        part = {**of, "label": label, "files": len(cm.files), "bytes": cm.total_bytes,
                "of_bytes": src.manifest.total_bytes, "experts": [split.kept.start, split.kept.stop - 1],
                "of_experts": split.experts, "shards": len(shards),
                "tensors": sum(len(f.safetensors.tensors) for f in shards if f.safetensors is not None)}
        return obj, src, part

    def config_of(self, src: VersionDir) -> bytes | None:
        """The version's config.json, checked against its manifest (None: it has none)."""
        f = src.manifest.file(CONFIG)
        if f is None or f.size > 16 << 20:
            return None
        return self._small(src, CONFIG)

    def named_of(self, src: VersionDir) -> set[str] | None:
        """The shards the version's index json(s) name (None: it has none), each index read whole
        (at most :data:`INDEX_LIMIT`) and checked against the manifest as config.json is."""
        paths = [f.path for f in src.manifest.files if f.path.endswith(INDEX_SUFFIX)]
        if not paths:
            return None
        named: set[str] = set()
        for p in paths:
            f = src.manifest.file(p)
            if f is not None and f.size > INDEX_LIMIT:
                raise BadInput(f"{src.ref}: its {p} is {f.size} bytes, over the {INDEX_LIMIT >> 20} MiB an index "
                               f"json is read at")
            named |= indexed(self._small(src, p), p)
        return named

    def _small(self, src: VersionDir, rel: str) -> bytes:
        """A small file of the version, read whole and checked chunk by chunk against its manifest."""
        f = src.manifest.file(rel)
        assert f is not None
        with self._reader(src) as (_, d):
            raw = d.read_bytes(rel, f.size) if d is not None else self._object_meta(src, rel, f.size)
        ok = raw is not None and len(raw) == f.size and list(f.chunks) == [
            xxhash.xxh3_128(raw[a:b]).hexdigest() for a, b in chunk_ranges(len(raw), src.manifest.chunk_size)]
        if not ok:
            raise IntegrityError(f"{src.ref}: its {rel} does not match the manifest")
        assert raw is not None
        return raw

    def _object_meta(self, src: VersionDir, rel: str, size: int) -> bytes | None:
        obj = self.roots.object
        if obj is None:
            raise CheckpointNotFound(src.ref, "no complete copy to read from")
        return obj.read_meta(src.name, src.version, rel, max(size, 1))

    def fill(self, staging: StagingArea, tier: str, m: Manifest, origin: VersionDir, deadline: float | None,
             progress: ProgressFn | None) -> Fill:
        """Fill ``staging`` with the copy ``m`` of ``origin``, every byte checked as it is written."""
        fill = Fill(verified=True)
        jobs = jobs_for(m, origin.manifest)
        if self.sources.fetchers and not self._held_locally(origin) and \
                self._swarm(fill, staging, tier, jobs, origin, deadline, progress):
            return fill
        need = sum(j.read_bytes for j in jobs)
        with self._reader(origin) as (label, d):
            set_phase(progress, "copy", source=label, total=need)
            if d is not None:
                fill.add(label, repack(jobs, d, staging.dir, progress=progress, deadline=deadline,
                                       clock=self.monotonic))
                return fill
        self._ranged(fill, staging, tier, jobs, origin, deadline, progress)
        return fill

    def scratch_bytes(self, m: Manifest, origin: VersionDir) -> int:
        """What a fill of ``m`` holds in the tier beside the copy at its peak: the ranged download's
        sparse files (each kept range, and a block either side of each) when the version is read
        from an object store, or a whole piece either side of each when a swarm may serve it (no
        local copy); 0 when it is read from a path and no swarm is configured."""
        edge = piece_bytes(origin.manifest) if self.sources.fetchers and not self._held_locally(origin) else \
            8192 if self.roots.object is not None and not self._on_a_path(origin) else 0
        if not edge:
            return 0
        # (never more than the file: a manifest's piece size is outside its digest, and many small runs
        # with large pieces would otherwise reserve many times the shard)
        return sum(min(j.src.size, j.read_bytes + 2 * edge * max(1, len(j.runs))) for j in jobs_for(m, origin.manifest)
                   if j.src is not None)

    def _on_a_path(self, src: VersionDir) -> bool:
        for tier in (*LOCAL_TIERS, COLD):
            try:
                v = read_version(self.roots.dir(tier), src.name, src.version)
            except StorageUnavailable:
                v = None
            if v is not None and v.manifest.digest == src.manifest.digest:
                return True
        return False

    def _held_locally(self, src: VersionDir) -> bool:
        """A complete copy of ``src`` in a local tier (it is read, not the swarm)."""
        for tier in LOCAL_TIERS:
            v = read_version(self.roots.dir(tier), src.name, src.version)
            if v is not None and v.manifest.digest == src.manifest.digest:
                return True
        return False

    def _swarm(self, fill: Fill, staging: StagingArea, tier: str, jobs: list[Job], origin: VersionDir,
               deadline: float | None, progress: ProgressFn | None) -> bool:
        """The kept ranges' pieces from the swarm into sparse files (:func:`scratch_id`, as
        :meth:`_ranged`), then the repack from them; True when the copy is made. Each fetcher is asked
        in turn (one that does not serve the version, under its threshold or with no peers, says no
        at once); a fetcher that gave up is a fallback entry; bytes that fail a tensor's check are
        rejected (the fetcher is told why) and the copy comes from cold, as for a whole version."""
        files, ranges = wanted_ranges(jobs)
        if not files:
            return False
        with self._scratch(staging, tier, origin) as (sid, sparse):
            scratch = StagingArea(staging.area, sid, sparse, {"name": origin.name, "version": origin.version,
                                                              "bytes": sum(j.read_bytes for j in jobs)})
            for fetcher in self.sources.fetchers:
                got = fetcher.fetch(FetchRequest(origin, scratch, deadline, progress, None, self.monotonic, files,
                                                 ranges))
                if got.fallback is not None:
                    fill.source_fallbacks.append(got.fallback)
                if not got.filled:
                    continue
                try:
                    set_phase(progress, "copy", source="staging", total=sum(j.read_bytes for j in jobs))
                    for job in jobs:
                        repack([job], sparse, staging.dir, progress=progress, deadline=deadline,
                               clock=self.monotonic)
                        if job.src is not None:
                            sparse.unlink(job.src.path)
                except IntegrityError as exc:
                    why = f"its bytes failed the manifest check ({exc})"
                    if got.reject is not None:
                        why += got.reject(why)
                    log.warning("swarm bytes rejected name=%s version=%s, copying from cold instead: %s",
                                origin.name, origin.version, why)
                    fill.source_fallbacks.append(SourceFallback("p2p", "cold", why))
                    staging.dir.clear()
                    sparse.clear()
                    continue
                for label, n in got.bytes_by_source.items():
                    fill.add(label, n)
                fill.swarm = got.swarm
                return True
        return False

    @contextmanager
    def _scratch(self, staging: StagingArea, tier: str, origin: VersionDir) -> Iterator[tuple[str, Dir]]:
        """The sibling staging entry a copy's sparse files live in (:func:`scratch_id`): made empty, held
        by a lock of its own (the staging sweep leaves it while this runs, and removes what a kill
        left), removed on the way out whatever happens."""
        sid = scratch_id(staging.sid)
        lk = FileLock(self.roots.locks(tier), f"{sid.removesuffix(RESUMABLE)}.lock", f"{origin.ref}'s ranges in {tier}")
        lk.acquire(5.0)   # (we hold the copy's lock: only a sweep's brief try can hold this one)
        try:
            staging.area.remove(sid)
            staging.area.mkdir(sid, 0o700)
            with staging.area.sub(sid) as sparse:
                yield sid, sparse
        finally:
            staging.area.remove(sid)
            lk.release()

    def _ranged(self, fill: Fill, staging: StagingArea, tier: str, jobs: list[Job], origin: VersionDir,
                deadline: float | None, progress: ProgressFn | None) -> None:
        """The kept ranges by ranged GETs into sparse files (each part checked as it arrives), then the
        repack from them. The sparse files are a sibling staging entry (:func:`scratch_id`), never under
        the copy's own tree (no path of the version can meet them), each removed once its file is
        repacked and all of them on any failure; held by a lock of their own, so the staging sweep
        leaves them while this runs and removes what a kill left."""
        obj = self.roots.object
        if obj is None:
            raise CheckpointNotFound(origin.ref, "no complete copy to read from")
        sub, have = wanted_parts(jobs, origin.manifest)
        before = obj.stats.snapshot()
        with self._scratch(staging, tier, origin) as (_, sparse):
            try:
                # (a registry takes each blob's sha256 in order unless told the files stay sparse)
                from ..sources.oci.cold import OciCold   # (here: a registry's client costs ~45 ms to import)
                extra = {"only_wanted": True} if isinstance(obj, OciCold) else {}
                fill.add("cold", obj.fetch(sub, sparse, deadline=_wall(deadline, self.monotonic), have=have,
                                           **extra))
            finally:
                fill.store = obj.stats.since(before)
            set_phase(progress, "copy", source="staging", total=sum(j.read_bytes for j in jobs))
            for job in jobs:
                repack([job], sparse, staging.dir, progress=progress, deadline=deadline, clock=self.monotonic)
                if job.src is not None:
                    sparse.unlink(job.src.path)

    @contextmanager
    def _reader(self, src: VersionDir) -> Iterator[tuple[str, Dir | None]]:
        """(label, directory) of the nearest complete copy of ``src`` on a path (a local tier's, held
        with a shared lock, else cold's), or ("cold", None) when cold is an object store."""
        for tier in LOCAL_TIERS:
            held = self._local(tier, src)
            if held is not None:
                d, lk = held
                try:
                    yield "local_reuse", d
                finally:
                    d.close()
                    lk.release()
                return
        try:
            cold = read_version(self.roots.dir(COLD), src.name, src.version)
        except StorageUnavailable:
            cold = None
        if cold is not None and cold.manifest.digest == src.manifest.digest:
            with self.roots.must(COLD).sub(version_rel(src.name, src.version)) as d:
                yield "cold", d
            return
        if self.roots.object is None:
            raise CheckpointNotFound(src.ref, "no complete copy to read from")
        yield "cold", None

    def _local(self, tier: str, src: VersionDir) -> tuple[Dir, Any] | None:
        root = self.roots.dir(tier)
        v = read_version(root, src.name, src.version)
        if root is None or v is None or v.manifest.digest != src.manifest.digest:
            return None
        lk = self.roots.lock(tier, src.name, src.version)
        try:
            lk.acquire(0, shared=True)
        except TimedOut:
            return None
        d = root.sub_if_exists(v.rel)
        if d is None:
            lk.release()
            return None
        return d, lk


def wanted_parts(jobs: list[Job], version: Manifest) -> tuple[Manifest, dict[str, set[str]]]:
    """The version's files a copy reads (a sub-manifest under the version's name) and, per file, the
    labels of the parts it does not read (for the ranged core's ``have``: never asked for)."""
    want: dict[str, set[str] | None] = {}
    for j in jobs:
        if j.src is None:
            continue
        want[j.src.path] = {f"tensor {t[0]!r}" for r in j.runs for t in r.tensors} if j.runs else None
    files, have = [], {}
    for f in version.files:
        if f.path not in want:
            continue
        files.append(f)
        kept = want[f.path]
        if kept is not None:
            have[f.path] = {p.label for p in f.parts(version.chunk_size) if p.label not in kept}
    sub = Manifest(tuple(files), version.chunk_size, version.format, version.name, version.version,
                   version.published_at, version.piece_size)
    return sub, have


def wanted_ranges(jobs: list[Job]) -> tuple[frozenset[str], dict[str, tuple[tuple[int, int], ...]]]:
    """The version's files a copy reads and, per file read in runs (a repacked shard), the byte ranges
    of those runs (``FetchRequest.ranges``); a file copied whole is named without ranges."""
    files: set[str] = set()
    ranges: dict[str, tuple[tuple[int, int], ...]] = {}
    for j in jobs:
        if j.src is None:
            continue
        files.add(j.src.path)
        if j.runs or j.data:
            ranges[j.src.path] = tuple((r.begin, r.end) for r in j.runs)
    return frozenset(files), ranges


def piece_bytes(m: Manifest) -> int:
    """The piece size of the version's torrent: as published, else the default rule."""
    return m.piece_size or piece_size_for(m.total_bytes)


def scratch_id(sid: str) -> str:
    """The staging id of a copy's ranged download beside its staging area ``sid``: ``<copy>.ranges``
    as the sweep names ids (``.resumable`` last, so it takes the lock of that name, the one the fill holds)."""
    return f"{sid.removesuffix(RESUMABLE)}.ranges{RESUMABLE}"


def _wall(deadline: float | None, clock: Callable[[], float]) -> float | None:
    return None if deadline is None else time.monotonic() + (deadline - clock())
