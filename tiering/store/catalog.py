"""What is where: NAME@VERSION resolved (cold first, else local), the versions of a tier, published
lookups, and waiting for a version to be published. Reads only; through the checked roots."""

from __future__ import annotations

import time
from typing import Callable

from ..content.names import validate_name, validate_version
from ..errors import CheckpointNotFound, TieringError, TimedOut
from ..layout import COLD, LOCAL_TIERS, VersionDir, list_versions, published_versions, read_version
from ..safefs import Dir
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
        """Every complete version in a tier."""
        return list_versions(self.roots.dir(tier))

    def version(self, tier: str, name: str, version: str) -> VersionDir | None:
        """NAME@VERSION in ``tier`` (``cold`` included), or None."""
        return read_version(self.roots.dir(tier), name, version)

    def published_versions(self, name: str) -> list[VersionDir]:
        return published_versions(self.roots.dir(COLD), name)

    def resolve(self, name: str, version: str | None, *, suggest: bool = True) -> VersionDir:
        """The manifest of NAME@VERSION (latest published when VERSION is None): cold first, else local.
        A version that is in cold storage with a damaged manifest is a ManifestError (exit 2)."""
        validate_name(name)
        if version is not None:
            validate_version(version)
            v = read_version(self.roots.dir(COLD), name, version, strict=True)
            if v is not None:
                return v
            for tier in LOCAL_TIERS:
                v = read_version(self.roots.dir(tier), name, version)
                if v is not None:
                    return v
            raise CheckpointNotFound(f"{name}@{version}", "not published and not on this node"
                                     + (self._near(name) if suggest else ""))
        candidates = self.published_versions(name)
        if not candidates:
            for tier in LOCAL_TIERS:
                candidates += [v for v in list_versions(self.roots.dir(tier)) if v.name == name]
        if not candidates:
            raise CheckpointNotFound(name, "no version published and none on this node"
                                     + (self._near(name) if suggest else ""))
        return max(candidates, key=lambda v: (v.manifest.published_at or "", v.version))

    def _near(self, name: str, limit: int = 8) -> str:
        """What the caller probably meant, for a not-found message: NAME's published versions, or the
        closest published name and its versions (only on the error path: it lists cold storage)."""
        import difflib

        def versions_of(n: str) -> str:
            vs = sorted(self.published_versions(n), key=lambda v: (v.manifest.published_at or "", v.version))
            labels = [v.version for v in vs][-limit:]
            return ", ".join(labels) if labels else ""
        try:
            own = versions_of(name)
            if own:
                return f" (published versions: {own})"
            names = sorted({v.name for v in list_versions(self.roots.dir(COLD))})
        except (OSError, TieringError):  # (a suggestion must never hide the real error)
            return ""
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        if not near:
            return ""
        return f" (did you mean {near[0]}? versions: {versions_of(near[0])})"

    def wait_published(self, name: str, version: str | None, deadline: float | None,
                       poll_s: float = 1.0) -> VersionDir:
        """Resolve, waiting for the version to be published (until ``deadline``, then TimedOut)."""
        while True:
            try:
                return self.resolve(name, version, suggest=False)  # (no listing of cold on every poll)
            except CheckpointNotFound:
                if deadline is not None and self.monotonic() + poll_s > deadline:
                    ref = f"{name}@{version}" if version else name
                    raise TimedOut(f"{ref}: not published before the timeout") from None
            self.sleep(poll_s)
