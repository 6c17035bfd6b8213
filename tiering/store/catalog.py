"""What is where: NAME@VERSION resolved (cold first, else local), the versions of a tier, published
lookups, and waiting for a version to be published. Reads only; through the checked roots."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from ..content.manifest import MANIFEST_RELPATH
from ..content.names import validate_name, validate_version
from ..errors import CheckpointNotFound, StorageUnavailable, TieringError, TimedOut
from ..layout import COLD, LOCAL_TIERS, VersionDir, is_whole
from ..safefs import Dir
from ..versions import list_versions, published_versions, read_version
from .roots import TierRoots


class Catalog:
    def __init__(self, roots: TierRoots, *, monotonic: Callable[[], float],
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.roots = roots
        self.monotonic = monotonic
        self.sleep = sleep

    def tier_dir(self, tier: str) -> Dir | None:
        """The tier's root, opened by descriptor and checked (None if it does not exist yet)."""
        return self.roots.dir(tier)

    def versions(self, tier: str) -> list[VersionDir]:
        """Every complete version in a tier (an object-store cold tier: every published one)."""
        obj = self.roots.object
        if tier == COLD and obj is not None:
            return [v for n in obj.names() for v in self.published_versions(n)]
        return list_versions(self.roots.dir(tier))

    def version(self, tier: str, name: str, version: str) -> VersionDir | None:
        """NAME@VERSION in ``tier`` (``cold`` included), or None."""
        obj = self.roots.object
        if tier == COLD and obj is not None:
            return obj.version_dir(name, version)
        return read_version(self.roots.dir(tier), name, version)

    def published_versions(self, name: str) -> list[VersionDir]:
        obj = self.roots.object
        if obj is not None:
            return [v for v in (obj.version_dir(name, label) for label in obj.versions(name)) if v is not None]
        return published_versions(self.roots.dir(COLD), name)

    def resolve(self, name: str, version: str | None, *, suggest: bool = True) -> VersionDir:
        """The manifest of NAME@VERSION (latest published when VERSION is None): cold first, else local.
        A version that is in cold storage with a damaged manifest is a ManifestError (exit 2)."""
        validate_name(name)
        if version is not None:
            validate_version(version)
            unavailable: StorageUnavailable | None = None
            try:
                v = read_version(self.roots.dir(COLD), name, version, strict=True)
            except StorageUnavailable as exc:   # a copy held here still serves while cold storage is away
                v, unavailable = None, exc
            if v is None and self.roots.object is not None:
                v = self.roots.object.version_dir(name, version)
            if v is not None:
                return v
            for tier in LOCAL_TIERS:
                v = read_version(self.roots.dir(tier), name, version)
                if v is not None:
                    return v
            if unavailable is not None:
                raise unavailable
            raise CheckpointNotFound(f"{name}@{version}", "not published and not on this node"
                                     + (self.suggestion(name) if suggest else ""))
        # strict: a published version we cannot read is an error, never skipped (it may be the latest)
        candidates = published_versions(self.roots.dir(COLD), name, strict=True)
        obj = self.roots.object
        if obj is not None:  # every published label, each manifest read (none skipped: as strict as a path)
            candidates += [v for v in (obj.version_dir(name, label) for label in obj.versions(name)) if v is not None]
        if not candidates:
            for tier in LOCAL_TIERS:
                # (whole versions only: a partial copy or a companion is never "the latest")
                candidates += [v for v in list_versions(self.roots.dir(tier)) if v.name == name and is_whole(v)]
        if not candidates:
            raise CheckpointNotFound(name, "no version published and none on this node"
                                     + (self.suggestion(name) if suggest else ""))
        return max(candidates, key=lambda v: (v.manifest.published_at or "", v.version))

    def listing(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every published version (of NAME, or of every name), with the local tiers holding the same
        content, and the local versions that are not (or no longer) in cold storage: ``weightd ls``."""
        from ..content.signature import SIGNATURE_RELPATH
        if name is not None:
            validate_name(name)
        cold = self.roots.dir(COLD)
        obj = self.roots.object
        if obj is not None:
            names = [name] if name is not None else obj.names()
            published = [v for n in names for v in self.published_versions(n)]
        else:
            published = published_versions(cold, name) if name is not None else \
                [v for v in list_versions(cold) if is_whole(v)]   # (a companion is not a version)
        local: dict[tuple[str, str], dict[str, VersionDir]] = {}
        for t in LOCAL_TIERS:
            for v in list_versions(self.roots.dir(t)):
                if (name is None or v.name == name) and is_whole(v):
                    local.setdefault((v.name, v.version), {})[t] = v
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for v in published:
            here = local.get((v.name, v.version), {})
            rows[(v.name, v.version)] = {
                "name": v.name, "version": v.version, "bytes": v.size, "digest": v.manifest.digest,
                "published_at": v.manifest.published_at, "published": True,
                "signed": (cold is not None and cold.is_file(f"{v.rel}/{SIGNATURE_RELPATH}")) or None,
                "local": [t for t, lv in here.items() if lv.manifest.digest == v.manifest.digest]}
        for key, here in local.items():
            if key not in rows:
                v = next(iter(here.values()))
                rows[key] = {"name": v.name, "version": v.version, "bytes": v.size, "digest": v.manifest.digest,
                             "published_at": v.manifest.published_at, "published": False, "signed": None,
                             "local": list(here)}
        return sorted(rows.values(), key=lambda r: (r["name"], r["published_at"] or "", r["version"]))

    def check_readable(self, limit: int = 50) -> dict[str, Any]:
        """Can this process read cold storage (``weightd doctor``, run by the daemon as its own user)?
        Up to ``limit`` published versions: each manifest, and each file opened for reading. Every
        directory, manifest or file it may not read is a problem; nothing is skipped quietly."""
        problems: list[dict[str, str]] = []
        checked = 0
        if self.roots.object is not None:
            return self._check_object(limit)
        try:
            cold = self.roots.dir(COLD)
        except StorageUnavailable as exc:   # absent, unmounted: not a matter of permissions
            return {"uid": os.geteuid(), "checked": 0, "unavailable": exc.reason, "path": exc.path,
                    "problems": [{"where": "cold", "reason": str(exc)}]}
        except (OSError, TieringError) as exc:
            return {"uid": os.geteuid(), "checked": 0, "problems": [{"where": "cold", "reason": str(exc)}]}
        if cold is None:
            return {"uid": os.geteuid(), "checked": 0, "problems": [{"where": "cold", "reason": "does not exist"}]}
        try:
            for name in _cold_names(cold, problems):
                if checked >= limit:
                    break
                checked += _check_versions(cold, name, limit - checked, problems)
        except PermissionError as exc:
            problems.append({"where": str(cold.path), "reason": exc.strerror or "permission denied"})
        return {"uid": os.geteuid(), "checked": checked, "problems": problems}

    def _check_object(self, limit: int) -> dict[str, Any]:
        """The object-store cold tier: list names, read up to ``limit`` manifests, HEAD every file."""
        import os
        obj = self.roots.object
        assert obj is not None
        problems: list[dict[str, str]] = []
        checked = 0
        try:
            for name in obj.names():
                for label in obj.versions(name):
                    if checked >= limit:
                        break
                    checked += 1
                    try:
                        m = obj.read_manifest(name, label)
                        for f in (m.files if m is not None else ()):
                            obj.head(f"{name}/{label}/{f.path}")
                    except (TieringError, OSError) as exc:
                        problems.append({"where": f"{name}@{label}", "reason": str(exc)})
        except (TieringError, OSError) as exc:
            problems.append({"where": obj.url, "reason": str(exc)})
        return {"uid": os.geteuid(), "checked": checked, "problems": problems}

    # -- not found: the one resolver of what a NAME[@VERSION] that is not there probably meant --------
    def not_found(self, name: str, version: str | None = None, *, tier: str | None = None) -> CheckpointNotFound:
        """The error for NAME[@VERSION] that is not where a command looked (``tier``: only there; else
        the node's local tiers), the same for every command that takes NAME[@VERSION]: whether it is
        published (and how to get it here), else what was probably meant (:meth:`suggestion`). Only
        on the error path: it lists cold storage."""
        ref = f"{name}@{version}" if version else name
        try:
            published = self._published_labels(name, limit=None)
            here = [t for t in LOCAL_TIERS if t != tier and version is not None
                    and read_version(self.roots.dir(t), name, version) is not None]
        except (OSError, TieringError):  # (a suggestion must never hide the real error)
            published, here = [], []
        if tier is not None and here:
            return CheckpointNotFound(ref, f"not in the {tier} tier (it is in {', '.join(here)})")
        if version is not None and "~" in version:   # a partial copy's or a companion's own label
            return CheckpointNotFound(ref, "not on this node (see weightd status)")
        if version is not None and version in published:
            return CheckpointNotFound(ref, f"published but not on this node (get it with: weightd preload {ref})")
        if version is None and published:
            return CheckpointNotFound(ref, f"no version on this node (published versions: "
                                           f"{', '.join(published[-8:])}; get one with: weightd preload {name}@{published[-1]})")
        if version is not None:
            return CheckpointNotFound(ref, "not published and not on this node" + self.suggestion(name))
        return CheckpointNotFound(ref, "no version published and none on this node" + self.suggestion(name))

    def _published_labels(self, name: str, limit: int | None = 8) -> list[str]:
        """NAME's published version labels, oldest first (the newest ``limit`` of them)."""
        vs = sorted(self.published_versions(name), key=lambda v: (v.manifest.published_at or "", v.version))
        labels = [v.version for v in vs]
        return labels if limit is None else labels[-limit:]

    def suggestion(self, name: str) -> str:
        """What the caller probably meant, for a not-found message: NAME's published versions, or the
        closest name (published, else held on this node) and its versions; "" when nothing is close."""
        import difflib
        try:
            own = self._published_labels(name)
            if own:
                return f" (published versions: {', '.join(own)})"
            obj = self.roots.object
            names = sorted(obj.names() if obj is not None else {v.name for v in list_versions(self.roots.dir(COLD))})
            near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            if near:
                return f" (did you mean {near[0]}? versions: {', '.join(self._published_labels(near[0]))})"
            local: dict[str, list[str]] = {}
            for t in LOCAL_TIERS:
                for v in list_versions(self.roots.dir(t)):
                    if is_whole(v):
                        local.setdefault(v.name, []).append(v.version)
            near = difflib.get_close_matches(name, sorted(local), n=1, cutoff=0.6)
        except (OSError, TieringError):  # (a suggestion must never hide the real error)
            return ""
        if not near:
            return ""
        return f" (did you mean {near[0]}? on this node: {', '.join(sorted(set(local[near[0]])))})"

    def wait_published(self, name: str, version: str | None, deadline: float | None,
                       poll_s: float = 1.0, cancel: "threading.Event | None" = None) -> VersionDir:
        """Resolve, waiting for the version to be published (until ``deadline``, then TimedOut; or
        until ``cancel`` is set: the caller went away, so the thread is not held by nobody's wait)."""
        ref = f"{name}@{version}" if version else name
        while True:
            try:
                return self.resolve(name, version, suggest=False)  # (no listing of cold on every poll)
            except CheckpointNotFound:
                if deadline is not None and self.monotonic() + poll_s > deadline:
                    raise TimedOut(f"{ref}: not published before the timeout") from None
            if cancel is None:
                self.sleep(poll_s)
            elif cancel.wait(poll_s):
                raise TimedOut(f"{ref}: the wait for its publication was abandoned")


def _cold_names(cold: Dir, problems: list[dict[str, str]]) -> list[str]:
    """The NAMEs in a path cold tier (``NAME`` or ``org/model``: a directory holding a version is a
    NAME), for :meth:`Catalog.check_readable`; a directory it may not list is a problem."""
    out: list[str] = []
    for a in _subdirs(cold, "", problems):
        try:
            validate_name(a)  # (lost+found and other entries that cannot be a name are not ours)
        except TieringError:
            continue
        for b in _subdirs(cold, a, problems):
            try:
                is_version = cold.lstat(f"{a}/{b}/{MANIFEST_RELPATH.split('/')[0]}") is not None
            except OSError as exc:
                problems.append({"where": f"{a}/{b}", "reason": exc.strerror or str(exc)})
                continue
            if is_version:
                out.append(a)  # a/b is a version of NAME a
                break
            try:
                validate_name(f"{a}/{b}")
            except TieringError:
                continue
            out.append(f"{a}/{b}")
    return out


def _check_versions(cold: Dir, name: str, limit: int, problems: list[dict[str, str]]) -> int:
    """Up to ``limit`` published versions of NAME read (the manifest) and opened (each file, up to the
    first that fails): how many were checked; what this process may not read goes to ``problems``."""
    try:
        versions = published_versions(cold, name, strict=True)
    except (TieringError, OSError) as exc:   # (ManifestError is a TieringError)
        problems.append({"where": name, "reason": str(exc)})
        return 0
    checked = 0
    for v in versions[: max(0, limit)]:
        checked += 1
        for f in v.manifest.files:
            try:
                os.close(cold.open_read(f"{v.rel}/{f.path}"))
            except (OSError, TieringError) as exc:
                problems.append({"where": f"{v.ref}/{f.path}", "reason": getattr(exc, "strerror", None) or str(exc)})
                break
    return checked


def _subdirs(d: Dir, rel: str, problems: list[dict[str, str]]) -> list[str]:
    """The directories under ``d/rel`` that could be names or versions; one we may not list is a problem."""
    try:
        if rel:
            with d.sub(rel) as sub:
                return [x for x in sub.subdirs() if not x.startswith(".")]
        return [x for x in d.subdirs() if not x.startswith(".")]
    except (OSError, TieringError) as exc:
        problems.append({"where": str(d.path / rel), "reason": getattr(exc, "strerror", None) or str(exc)})
        return []
