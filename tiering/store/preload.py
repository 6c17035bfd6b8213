"""Preload: make NAME@VERSION complete and verified in a local tier, then warm it.

Under the version's lock: a copy already there with the same digest is recorded and leased; else
whatever is in its place is removed by descriptor, space is reserved (evicting by policy), the
staging area is filled from the nearest source and committed (verified against the manifest), the
copy is recorded, leased and announced (``on_placed``). Only this module writes a
:class:`~.reports.PreloadReport`."""

from __future__ import annotations

import errno
import logging
from typing import Any, Callable, Sequence

from .._syscalls import is_tmpfs
from ..content.signature import HASHERS
from ..content.units import format_bytes
from ..errors import NoSpace
from ..experts.fill import ExpertSources, is_expert_copy
from ..layout import WARM, VersionDir, version_rel
from ..pagecache import WarmOptions, page_cache_room, resident_bytes, warm
from ..progress import ProgressFn, set_phase
from ..safefs import Dir
from ..state import State
from ..versions import read_version
from .reports import PreloadReport
from .roots import TierRoots
from .sources import Fill, Sources
from .trust import Trust
from .space import Space

log = logging.getLogger(__name__)
PlacedFn = Callable[[str, VersionDir], None]


class Preloader:
    def __init__(self, roots: TierRoots, state: State, space: Space, sources: Sources, trust: Trust, *,
                 now: Callable[[], float], monotonic: Callable[[], float],
                 remaining: Callable[[float | None], float | None], warm_options: WarmOptions,
                 on_placed: PlacedFn | None = None) -> None:
        self.roots, self.state, self.space, self.sources, self.trust = roots, state, space, sources, trust
        self.now, self.monotonic, self.remaining = now, monotonic, remaining
        self.warm_options, self.on_placed = warm_options, on_placed
        self.experts = ExpertSources(sources, trust, monotonic)

    def preload_into(self, src: VersionDir, tier: str, deadline: float | None,
                     progress: ProgressFn | None, lease_s: float, holder: str | None = None,
                     origin: VersionDir | None = None) -> PreloadReport:
        """``src``: the local object to make (a version, a partial copy of one, a companion);
        ``origin``: the published version its bytes come from, when that is another (a partial copy's
        whole version: its signature is checked, and its files are the partial copy's sources)."""
        name, version, m = src.name, src.version, src.manifest
        root = self.roots.must(tier)
        self.roots.check_ours(tier)   # (a root weightd did not make, holding others' files: nothing placed there)
        rel = version_rel(name, version)
        report = PreloadReport(name, version, tier, str(root.path / rel), m.digest, m.total_bytes)
        # refused before anything is reserved or written
        signed = self.trust.check_source(origin if origin is not None else src)
        if signed is not None:
            report.signature = {"key_name": signed.statement.key_name, "key_id": signed.statement.key_id,
                                "algorithm": signed.statement.algorithm, "checked": True}
        lock = self.roots.lock(tier, name, version)
        set_phase(progress, "wait", total=m.total_bytes, tier=tier,
                  detail=f"for another transfer of {name}@{version} into {tier}")
        lock.acquire(self.remaining(deadline))
        try:
            have = read_version(root, name, version)
            if have is not None and have.manifest.digest == m.digest:
                self.trust.adopt_copy(root, have, None if is_expert_copy(m) else signed)  # (placed before checks)
                self.state.record_copy(tier, name, version, m.digest, m.total_bytes)
                report.already_present = True
                self.lease(report, lease_s, holder)
                return report
            if have is not None or root.lstat(rel) is not None:
                # a different copy under the same name, or a planted symlink: removed by descriptor, never
                # followed; anything weightd cannot prove it made is left alone (NotOurs, counted)
                self.roots.remove_version(tier, root, rel, known=m)
            # (an expert-parallel copy from an object store also holds its ranges' sparse files until repacked)
            need = m.total_bytes + (self.experts.scratch_bytes(m, origin) if origin is not None
                                    and is_expert_copy(m) else 0)
            set_phase(progress, "wait", detail=f"for {format_bytes(need)} of space in {tier}")
            staging, report.evicted = self.space.reserve(tier, name, version, need, deadline)
            with staging:  # aborted on any exception
                try:
                    # (signed: every file's digest is taken in the copy's own pass where the source allows)
                    fill, signed = self._fill(staging, m, tier, name, version, deadline, progress, origin, signed)
                    _record(report, fill)
                    staging.commit(root, name, version, m, verified=fill.verified, signed=signed,
                                   checked_at=self.now(), progress=progress, crypto_digests=fill.crypto_digests)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise NoSpace(tier, need, 0, "the file system filled up during the copy") from exc
                    raise
            self.state.record_copy(tier, name, version, m.digest, m.total_bytes)
            self.lease(report, lease_s, holder)
            if self.on_placed is not None:
                placed = read_version(root, name, version)
                if placed is not None:
                    self.on_placed(tier, placed)
            # (the control plane logs the outcome at INFO, with the caller; this is the data plane's view)
            log.debug("placed name=%s version=%s tier=%s %s", name, version, tier,
                      " ".join(f"{k}={v}" for k, v in report.bytes_by_source.items()))
            return report
        finally:
            lock.release()

    def _fill(self, staging: Any, m: Any, tier: str, name: str, version: str, deadline: float | None,
              progress: ProgressFn | None, origin: VersionDir | None, signed: Any) -> tuple[Fill, Any]:
        """Fill staging (and the signature its commit checks): an expert-parallel copy is repacked from
        its version's tensors, each checked against the version's manifest, whose signature was
        checked before (the copy's own files were never signed); anything else from :class:`Sources`
        (with a signed version, every file's digest taken on the way)."""
        if origin is not None and is_expert_copy(m):
            return self.experts.fill(staging, tier, m, origin, deadline, progress), None
        return self.sources.fill(staging, m, tier, name, version, deadline, progress, origin=origin,
                                 crypto=HASHERS[signed.statement.algorithm] if signed is not None
                                 else None), signed

    def warm(self, report: PreloadReport, progress: ProgressFn | None = None, warm_for: Sequence[int] = ()) -> None:
        """Bring a warm-tier copy into the page cache (a tmpfs copy is resident by nature), when it can
        stay there: a checkpoint larger than the page cache this process and ``warm_for`` (the pids of
        the callers a daemon works for) can hold (their memory cgroups, MemAvailable) is not read again
        (its own pages would evict each other); the report says which, and why."""
        t0 = self.monotonic()
        if report.tier == WARM:
            room = page_cache_room(warm_for)
            report.warm = {"warmed_bytes": 0, "room_bytes": room.bytes, "limited_by": room.what}
            if report.bytes > room.bytes:
                report.warm_skipped = (f"checkpoint {format_bytes(report.bytes)} > {format_bytes(room.bytes)} "
                                       f"{room.what} can hold")
                report.resident_bytes = resident_bytes([report.path])
                log.info("not warming name=%s version=%s: %s", report.name, report.version, report.warm_skipped)
            else:
                o = self.warm_options
                set_phase(progress, "warm", total=report.bytes)
                r = warm([report.path], concurrency=o.concurrency, rate_bytes_per_s=o.rate_bytes_per_s,
                         await_threshold_ms=o.await_threshold_ms, progress=progress)
                report.resident_bytes = r.resident_bytes
                report.warm["warmed_bytes"] = r.warmed_bytes
                for sk in r.skipped:
                    log.warning("could not warm path=%s: %s", sk.path, sk.reason)
        elif _tmpfs_without_swap(self.roots.dir(report.tier)):
            report.resident_bytes = report.bytes   # (tmpfs pages can only leave memory for swap: none here)
        else:
            report.resident_bytes = resident_bytes([report.path])
        report.warm_seconds = self.monotonic() - t0

    def lease(self, report: PreloadReport, lease_s: float, holder: str | None = None) -> None:
        if lease_s > 0:
            self.state.add_lease(report.tier, report.name, report.version, lease_s, holder)
            report.lease_expires_at = self.now() + lease_s


def _tmpfs_without_swap(root: "Dir | None") -> bool:
    """A tier on tmpfs on a machine with no swap: everything in it is resident (a walk with mincore
    over a compile cache's ten thousand files would say so in half a second)."""
    if root is None or not is_tmpfs(root.fd):
        return False
    try:
        with open("/proc/swaps") as fh:
            return len(fh.read().splitlines()) <= 1
    except OSError:
        return False


def _record(report: PreloadReport, fill: Fill) -> None:
    """What the sources did, into the report (the one place it is written)."""
    report.source_fallbacks.extend(fill.source_fallbacks)
    report.resumed_bytes += fill.resumed
    if fill.store is not None:
        report.store = fill.store
    if fill.swarm is not None:
        report.swarm = fill.swarm
    if fill.delta is not None:
        report.delta = fill.delta
    for label, n in fill.bytes_by_source.items():
        report.bytes_by_source[label] = report.bytes_by_source.get(label, 0) + n
