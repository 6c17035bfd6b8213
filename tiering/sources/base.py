"""The seam between the tiers and a transfer source (design §14): a request in, bytes by source out.

A source (the P2P swarm today, object storage next) implements :class:`Fetcher`. ``LocalNode`` asks
each configured fetcher in turn to fill a staging area for a version, and only ``LocalNode`` writes
the preload report from what they return; a fetcher never touches the report, the state or the
tier's other directories. A fetcher that cannot help returns ``FetchResult(filled=False)`` (with a
``fallback`` saying why, if it tried and gave up) and leaves the staging area as it found it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ..progress import ProgressFn

if TYPE_CHECKING:
    from ..delta import DeltaPlan
    from ..layout import VersionDir
    from ..store.staging import StagingArea


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Fill ``staging`` with the files of ``source`` (its manifest says what they are)."""
    source: "VersionDir"          # the published version (its manifest, its torrent beside it)
    staging: "StagingArea"        # ``.dir`` for everything weightd does, ``.path`` for libraries
    deadline: float | None        # on ``clock`` (time.monotonic unless LocalNode's is injected), or None
    progress: ProgressFn | None = None
    delta: "DeltaPlan | None" = None  # local donor bytes to reuse, if any
    clock: Callable[[], float] = time.monotonic  # the clock ``deadline`` is on (LocalNode's monotonic)
    files: "frozenset[str] | None" = None  # only these files of ``source`` (a partial copy), else all
    # with ``files``: of each file named here only these [begin, end) byte ranges (an expert-parallel
    # copy's kept tensors); the staged files are then sparse, whole-sized, holes elsewhere
    ranges: "Mapping[str, tuple[tuple[int, int], ...]] | None" = None


@dataclass(frozen=True, slots=True)
class SourceFallback:
    """A source that was tried and given up on, and where the bytes came from instead."""
    source: str                   # "p2p", ...
    to: str                       # "cold", ...
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"from": self.source, "to": self.to, "reason": self.reason}


@dataclass(slots=True)
class FetchResult:
    filled: bool                                   # staging holds every file, each fsynced
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    verified: bool = False                         # already checked against the manifest
    fallback: SourceFallback | None = None         # tried and gave up (filled is then False)
    notes: list[str] = field(default_factory=list)
    swarm: dict[str, Any] | None = None            # what the swarm's piece plan did (a P2P source)
    # the node found the filled bytes do not match the manifest (called with the reason, before it
    # copies from elsewhere): the source stops trusting whoever sent them (the swarm bans its peers)
    reject: Callable[[str], str] | None = None


class Fetcher(Protocol):
    def fetch(self, request: FetchRequest) -> FetchResult: ...


def as_dicts(fallbacks: list[SourceFallback]) -> list[dict[str, Any]]:
    return [f.to_dict() for f in fallbacks]
