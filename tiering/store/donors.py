"""Which local versions hold the parts of a new version: each part (xxh3-128, length) of every version
in the local tiers, with the versions holding it, kept in step with the tiers' listings.

A delta plan over every local version costs a set intersection per version (a LoRA set: hundreds of
adapters, every one sharing its safetensors header with the new one and nothing else); from this
index, the donors a plan would use are found in what the new version's parts cost, and the plan is
made over those alone: it is the plan over every version, as each part goes to the first version in
the candidates' order that holds it either way.
"""

from __future__ import annotations

import threading
from typing import KeysView

from ..content.manifest import Manifest
from ..delta.plan import part_index
from ..layout import VersionDir

Holder = tuple[str, str, str, str]   # (tier, NAME, VERSION, manifest digest)


def _holder(tier: str, v: VersionDir) -> Holder:
    return (tier, v.name, v.version, v.manifest.digest)


class PartHolders:
    """The index, one per process's tiers; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[Holder, KeysView[tuple[str, int]]] = {}
        self._holders: dict[tuple[str, int], set[Holder]] = {}

    def first_holders(self, m: Manifest, candidates: list[tuple[str, VersionDir]]) -> list[int]:
        """The positions in ``candidates`` ((tier, version), in the order donors are preferred) of
        the first one holding each part of ``m``, ascending: the donors a plan over all would use."""
        with self._lock:
            self._follow(candidates)
            pos = {_holder(t, v): i for i, (t, v) in enumerate(candidates)}
            used: set[int] = set()
            for key in part_index(m).keys():
                hs = self._holders.get(key)
                if hs:
                    used.add(min(pos[h] for h in hs))
            return sorted(used)

    def _follow(self, candidates: list[tuple[str, VersionDir]]) -> None:
        """Parts of the versions that came added, of those that went removed."""
        now = {_holder(t, v): v.manifest for t, v in candidates}
        for h in self._parts.keys() - now.keys():
            for key in self._parts.pop(h):
                hs = self._holders[key]
                hs.discard(h)
                if not hs:
                    del self._holders[key]
        for h in now.keys() - self._parts.keys():
            keys = part_index(now[h]).keys()
            self._parts[h] = keys
            for key in keys:
                self._holders.setdefault(key, set()).add(h)
