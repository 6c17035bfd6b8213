"""The roots of one node's tiers, by descriptor: opened and checked to be weightd's own when first
needed (cold storage as configured), re-opened if removed behind our back, and the lock files
beneath them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..layout import COLD, LOCKS, TierSpec, lock_name
from ..locks import FileLock
from ..safefs import Dir, RootPolicy, open_cold_store, open_tier_root

if TYPE_CHECKING:
    from ..objstore import ObjectCold


class TierRoots:
    def __init__(self, tiers: dict[str, TierSpec], cold: "Path | ObjectCold") -> None:
        """``cold``: a path (shared storage), or an object store: then ``object`` is it, and the cold
        tier has no directory (``dir(COLD)`` is None; what reads or writes cold asks ``object``)."""
        self.tiers = tiers
        self.object: ObjectCold | None = None if isinstance(cold, (str, os.PathLike)) else cold
        self.cold = Path(cold) if self.object is None else None
        self._dirs: dict[str, Dir] = {}

    def close(self) -> None:
        for d in self._dirs.values():
            d.close()
        self._dirs.clear()

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
            d = open_tier_root(spec.path, RootPolicy(spec.root_mode, spec.group), create=create)
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
