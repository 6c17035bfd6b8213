"""The roots of one node's tiers, by descriptor: opened and checked to be weightd's own when first
needed (cold storage as configured), re-opened if removed behind our back, and the lock files
beneath them. And what weightd may remove from a local tier: only what it can prove it made
(:meth:`TierRoots.remove_version`): a root that carries weightd's marker (``.weightd-tier``, written
when weightd makes the root, or when it first finds one empty, or holding only weightd's layout and
versions its state records placing there by digest), and a version directory holding nothing its
manifest does not list, checked after it is moved out of reach (into ``.trash``) so that what is
deleted is what was checked. Anything else is left alone, logged and counted (``on_refuse``)."""

from __future__ import annotations

import logging
import os
import stat
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..content.manifest import MANIFEST_RELPATH
from ..errors import BadInput, NotOurs
from ..layout import COLD, LOCKS, TIER_MARKER, TRASH, TierSpec, fitted, lock_name, prune_empty_parents
from ..locks import FileLock
from ..ownership import unexpected_in_root, unlisted_entries
from ..safefs import Dir, RootPolicy, open_cold_store, open_tier_root
from ..versions import list_versions, manifest_of

log = logging.getLogger(__name__)
RefuseFn = Callable[[str, str, str], None]   # (tier, what, reason: foreign_root | unlisted_entries | no_manifest)
RecordedFn = Callable[[str], "dict[tuple[str, str], str]"]   # tier -> {(name, version): digest} state placed there
CHECKING = "checking."   # a version being removed, in .trash until its check passes (kept by reconciliation)
_MARKER_TEXT = b"weightd local tier v1: weightd removes only what it made here\n"

if TYPE_CHECKING:
    from ..content.manifest import Manifest
    from ..sources.oci.cold import OciCold
    from ..sources.s3.cold import ObjectCold


class TierRoots:
    def __init__(self, tiers: dict[str, TierSpec], cold: "Path | ObjectCold | OciCold") -> None:
        """``cold``: a path (shared storage), or an object store or registry (the same calls): then
        ``object`` is it, and the cold tier has no directory (``dir(COLD)`` is None; what reads or
        writes cold asks ``object``)."""
        self.tiers = tiers
        self.object: ObjectCold | OciCold | None = None if isinstance(cold, (str, os.PathLike)) else cold
        self.cold = Path(cold) if self.object is None else None
        self._dirs: dict[str, Dir] = {}
        self._ours: dict[str, tuple[int, int]] = {}   # tier -> (dev, ino) of a root known to carry the marker
        self.on_refuse: RefuseFn | None = None
        self.recorded: RecordedFn | None = None   # what state records weightd placing (None: nothing)

    def close(self) -> None:
        for d in self._dirs.values():
            d.close()
        self._dirs.clear()
        close = getattr(self.object, "close", None)   # (a registry's kept-alive connections)
        if close is not None:
            close()

    def dir(self, tier: str, *, create: bool = False) -> Dir | None:
        """The tier's root by descriptor (a local tier: None if it does not exist and ``create`` is
        false; cold storage as a path: StorageUnavailable if it is absent, unmounted or unreadable)."""
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
            if self.cold is None:
                return None  # object storage: no directory
            d = open_cold_store(self.cold, create=create)   # (absent or unmounted: StorageUnavailable)
        else:
            spec = self.tiers[tier]
            made = create and not os.path.lexists(spec.path)
            d = open_tier_root(spec.path, RootPolicy(spec.root_mode, spec.group), create=create)
            if made and d is not None and not d.entries():
                _mark(d)   # (a root weightd has just made carries its marker from the start)
        if d is not None:
            self._dirs[tier] = d
        return d

    def must(self, tier: str) -> Dir:
        """The tier's root, made if missing."""
        d = self.dir(tier, create=True)
        assert d is not None
        return d

    def locks(self, tier: str) -> Dir:
        return self.must(tier).private(LOCKS)

    def lock(self, tier: str, name: str, version: str) -> FileLock:
        return FileLock(self.locks(tier), lock_name(name, version), f"{name}@{version} in {tier}")

    def tier_lock(self, tier: str) -> FileLock:
        return FileLock(self.locks(tier), ".tier.lock", f"the {tier} tier's space reservation")

    # -- what weightd may remove ----------------------------------------------------------------
    def foreign(self, tier: str, *, mark: bool = True) -> str | None:
        """Why the local tier's root is not weightd's, or None when it is: it carries TIER_MARKER, or
        it is empty, or it holds only weightd's layout and every version in it is one state records
        weightd placing in this tier (same digest): then it is marked now (adopted; not with
        ``mark=False``, the read-only look of checks and status). A version shaped like weightd's
        proves nothing by its shape (an operator's copy of a published one is shaped so), and a root
        that is not weightd's is one weightd neither places into nor removes anything from."""
        d = self.dir(tier)
        if d is None:
            return None
        st = os.fstat(d.fd)
        if self._ours.get(tier) == (st.st_dev, st.st_ino):
            return None
        if not d.is_file(TIER_MARKER):
            try:
                found = unexpected_in_root(d)
                if not found:
                    recorded = self.recorded(tier) if self.recorded is not None else {}
                    found = [f"weightd has no record of placing {v.ref}" for v in list_versions(d)
                             if recorded.get((v.name, v.version)) != v.manifest.digest][:3]
            except OSError as exc:   # (the root itself could not be listed)
                found = [f"it cannot be listed: {exc.strerror or exc}"]
            if found:
                shown = ", ".join(found)
                return (f"the {tier} tier's root holds what weightd did not make ({shown}) and has no {TIER_MARKER} "
                        f"marker: weightd neither places nor removes anything there (point [tiers.{tier}] path at "
                        f"a new or empty directory; if an earlier weightd made this tier, mark it: touch "
                        f"{d.path / TIER_MARKER})")
            if not mark:
                return None
            _mark(d)
            log.info("adopted tier=%s root=%s: empty or only weightd's layout (marked %s)", tier, d.path, TIER_MARKER)
        self._ours[tier] = (st.st_dev, st.st_ino)
        return None

    def check_ours(self, tier: str) -> None:
        """NotOurs unless the tier's root is weightd's (before anything is placed there)."""
        why = self.foreign(tier)
        if why is not None:
            raise NotOurs(str(self.tiers[tier].path), why, "foreign_root")

    def refuse(self, tier: str, what: str, exc: NotOurs, *, level: int = logging.WARNING) -> NotOurs:
        """Log and count a removal weightd refused; returns ``exc`` for the caller to raise (``level``:
        INFO when the caller's own answer says it, an admin's explicit evict)."""
        log.log(level, "not removing %s from tier=%s reason=%s: %s", what, tier, exc.kind, exc)
        if self.on_refuse is not None:
            self.on_refuse(tier, what, exc.kind)
        return exc

    def removal_refused(self, tier: str, root: Dir, rel: str, known: "Manifest | None" = None) -> NotOurs | None:
        """Why ``root/rel`` (a version directory of a local tier) must not be removed, or None when
        weightd can prove it made it (as far as can be told before it is moved: :meth:`remove_version`
        checks again what it moved): the root is weightd's, and the directory holds a manifest and
        nothing that manifest does not list. A symlink or an empty name is removable (the link itself
        goes; nothing of anyone's is lost)."""
        where = str(root.path / rel)
        why = self.foreign(tier)
        if why is not None:
            return NotOurs(where, f"not removed: {why}", "foreign_root")
        st = root.lstat(rel)
        if st is None or not stat.S_ISDIR(st.st_mode):
            return None if st is None or stat.S_ISLNK(st.st_mode) else NotOurs(
                where, "not removed: a file weightd did not make is where a version would be", "no_manifest")
        try:
            with root.sub(rel) as d:
                return _not_provably_made(d, rel, where, self._vouched(tier, rel, known))
        except (BadInput, OSError) as exc:
            return NotOurs(where, f"not removed: it could not be listed ({exc})", "unlisted_entries")

    def remove_version(self, tier: str, root: Dir, rel: str, *, level: int = logging.WARNING,
                       known: "Manifest | None" = None) -> bool:
        """Remove the version directory ``root/rel`` if weightd can prove it made it (then empty
        ``org/`` parents too); else log, count and raise :class:`NotOurs`, leaving it where it was.

        The proof and the removal are one step: the directory is first renamed into ``.trash`` (out of
        reach of every path), checked there, and only then deleted; one that fails its check is renamed
        back. What is deleted is exactly what was checked: a file added by path a moment earlier is
        seen, one added a moment later cannot be added to it. (A crash while it is being checked
        leaves it in ``.trash`` under ``checking.``, which reconciliation never deletes.)"""
        name, _, version = rel.rpartition("/")
        refused = self.removal_refused(tier, root, rel, known)
        if refused is None:
            refused, removed = self._move_check_remove(root, rel, self._vouched(tier, rel, known))
            if refused is None:
                prune_empty_parents(root, rel)
                return removed
        raise self.refuse(tier, f"{name}@{version}", refused, level=level)

    def _vouched(self, tier: str, rel: str, known: "Manifest | None") -> "Manifest | None":
        """``known`` (the published manifest of the version the caller is placing under ``rel``) stands
        for a copy's own manifest that was damaged or replaced by a link after weightd placed it: in a
        root that is weightd's, a directory at NAME/VERSION holding nothing that version's manifest does
        not list is what weightd made there. None when it is another version's."""
        name, _, version = rel.rpartition("/")
        return known if known is not None and (known.name, known.version) == (name, version) else None

    def _move_check_remove(self, root: Dir, rel: str, vouched: "Manifest | None" = None
                           ) -> tuple[NotOurs | None, bool]:
        where = str(root.path / rel)
        parent_rel, _, last = rel.rpartition("/")
        parent = root.sub_if_exists(parent_rel) if parent_rel else root
        if parent is None:
            return None, False
        trash = root.private(TRASH)
        tag = uuid.uuid4().hex[:12]
        checking, target = fitted(last, f".{tag}", CHECKING), fitted(last, f".{tag}")
        try:
            try:
                parent.rename(last, trash, checking)
            except FileNotFoundError:
                return None, False
            st = trash.lstat(checking)
            if st is not None and stat.S_ISDIR(st.st_mode):
                try:
                    with trash.sub(checking) as d:
                        refused = _not_provably_made(d, rel, where, vouched)
                except (BadInput, OSError) as exc:
                    refused = NotOurs(where, f"not removed: it could not be listed ({exc})", "unlisted_entries")
                if refused is not None:
                    try:
                        trash.rename(checking, parent, last)   # (never over what took its place meanwhile)
                    except FileExistsError:
                        kept = fitted(last, f".kept-{tag}", ".")
                        trash.rename(checking, parent, kept)
                        refused = NotOurs(where, f"{refused.reason}; something else took its place meanwhile, so "
                                                 f"it is kept beside it as {kept}", refused.kind)
                    parent.fsync()
                    return refused, False
            trash.rename(checking, trash, target)
            parent.fsync()
            trash.remove(target)
            return None, True
        finally:
            trash.close()
            if parent is not root:
                parent.close()


def _not_provably_made(d: Dir, rel: str, where: str, vouched: "Manifest | None" = None) -> NotOurs | None:
    """NotOurs unless the directory ``d`` (the version ``rel``, wherever it is now) holds the manifest
    of that version (or, when its own is unreadable, ``vouched``: the manifest state records weightd
    placing there) and nothing that manifest does not list."""
    name, _, version = rel.rpartition("/")
    m = manifest_of(d, name, version) or vouched
    if m is None:
        return NotOurs(where, f"not removed: it has no readable {MANIFEST_RELPATH} of {name}@{version}, so "
                              "weightd cannot tell it made it (remove it yourself if it is not wanted)", "no_manifest")
    extra = unlisted_entries(d, m)
    if extra:
        return NotOurs(where, f"not removed: it holds {', '.join(extra)}, which its manifest does not list "
                              "(weightd removes only what it made: move those out, or remove the directory "
                              "yourself)", "unlisted_entries")
    return None


def foreign_root(tier: str, spec: TierSpec, state_dir: Path) -> str | None:
    """Why the local tier root of ``spec`` is not weightd's (as :meth:`TierRoots.foreign` says it),
    looked at read-only: nothing is made or marked, the state database is only read. None when it
    is weightd's, could be adopted, or does not exist."""
    from ..state import recorded_copies
    roots = TierRoots({tier: spec}, Path(state_dir))   # (cold is never opened here)
    roots.recorded = lambda t: recorded_copies(state_dir, t)
    try:
        return roots.foreign(tier, mark=False)
    finally:
        roots.close()


def _mark(d: Dir) -> None:
    try:
        d.write_atomic(TIER_MARKER, _MARKER_TEXT, 0o644)
    except OSError as exc:   # (a read-only root: nothing can be placed or removed there either)
        log.warning("could not mark tier root %s: %s", d.path, exc)
