"""Start-up recovery of the local tiers (kraken's crash recovery): stale staging and trash removed,
resumable P2P staging kept for a day, complete versions state does not know adopted only after every
byte is verified (one that fails is removed), vanished ones forgotten. And the same verification
before serving a copy state does not know (:meth:`Reconciler.known_good`), which never deletes."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from ..content.build import verify_checkpoint
from ..errors import NotOurs, TieringError
from ..layout import LOCAL_TIERS, TRASH, VersionDir
from ..locks import FileLock
from ..safefs import Dir
from ..state import State
from ..versions import list_versions
from .roots import CHECKING, TierRoots
from .staging import staging_ids, staging_keep, staging_temporaries

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, roots: TierRoots, state: State, *, now: Callable[[], float], copy_threads: int) -> None:
        self.roots, self.state, self.now, self.copy_threads = roots, state, now, copy_threads

    def reconcile(self) -> dict[str, Any]:
        """Remove stale staging and trash, adopt complete versions (verified first), forget vanished
        ones. Local tiers only: cold storage is never written here."""
        out: dict[str, Any] = {}
        for tier in LOCAL_TIERS:
            root = self.roots.dir(tier, create=False)
            removed = kept = rejected = refused = 0
            foreign = self.roots.foreign(tier) if root is not None else None
            area, ids = staging_ids(root) if foreign is None else (None, [])   # (not ours: nothing removed)
            if root is not None and area is not None:
                with area:
                    temporaries = staging_temporaries(area)
                    for sid in ids:
                        removed_one, kept_one = self._reap_staging(tier, area, sid, temporaries.get(sid, ()))
                        removed += removed_one
                        kept += kept_one
            if root is not None and foreign is None and root.is_dir(TRASH):
                self._empty_trash(tier, root)
            elif root is not None and foreign is None and root.lstat(TRASH) is not None:
                root.remove(TRASH)   # a link or file planted under weightd's own name: the entry goes, not its target
            present = []
            known = {(r.name, r.version): r.digest for r in self.state.copies(tier)}
            for v in list_versions(root) if foreign is None else ():   # (not ours: neither adopted nor removed)
                if known.get((v.name, v.version)) != v.manifest.digest:
                    try:
                        good = self._adopt(tier, root, v)
                    except NotOurs:   # (bad, but not provably weightd's: left where it is, never served)
                        refused += 1
                        continue
                    if not good:
                        rejected += 1
                        continue
                present.append((v.name, v.version, v.manifest.digest, v.size))
            adopted, forgotten = self.state.reconcile(tier, present) if foreign is None else (0, 0)
            out[tier] = {"stale_staging_removed": removed, "resumable_staging_kept": kept, "adopted": adopted,
                         "forgotten": forgotten, "rejected": rejected, "refused": refused}
            if foreign is not None:
                out[tier]["not_ours"] = foreign
            if removed or adopted or forgotten or rejected or refused:
                log.info("reconciled tier=%s stale_staging=%d adopted=%d forgotten=%d rejected=%d refused=%d", tier,
                         removed, adopted, forgotten, rejected, refused)
        self.state.expire_leases()
        return out

    def _empty_trash(self, tier: str, root: Dir) -> None:
        """Delete what removals left in ``.trash``, but never a version a crash caught while it was
        being checked (``checking.*``: not yet proven weightd's; the operator decides)."""
        with root.private(TRASH) as trash:
            for n, _ in trash.entries():
                if n.startswith(CHECKING):
                    log.warning("tier=%s: %s was being checked for removal when weightd stopped; it is left there "
                                "(move it back, or remove it yourself)", tier, trash.path / n)
                    continue
                trash.remove(n)

    def _reap_staging(self, tier: str, area: Dir, sid: str, temporaries: Sequence[str] = ()) -> tuple[int, int]:
        """(removed, kept) for one staging id: live ones (their version's lock is held) are left alone,
        a P2P transfer that can resume is kept for a day, everything else goes."""
        base = sid[:-len(".resumable")] if sid.endswith(".resumable") else None
        lock = FileLock(self.roots.locks(tier), f"{base}.lock") if base else None
        if lock is not None and not lock.try_acquire():
            return 0, 0
        try:
            for tmp in temporaries:  # (a kill -9 inside write_atomic; no writer holds it; whatever it is)
                area.remove(tmp)
            if lock is not None and staging_keep(area, sid, self.now()):
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
        foreign = self.roots.foreign(tier) is not None
        lock = None if foreign else self.roots.lock(tier, v.name, v.version)   # (no lock files in a root not ours)
        if lock is not None and not lock.try_acquire():
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
            log.warning("not adopting name=%s version=%s tier=%s: %s", v.name, v.version, tier, why)
            self.roots.remove_version(tier, root, v.rel)   # (NotOurs, counted, if weightd cannot prove it made it)
            return False
        finally:
            if lock is not None:
                lock.release()

    def known_good(self, tier: str, root: Dir, v: VersionDir) -> bool:
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
