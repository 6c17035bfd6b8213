"""A delta plan, from manifests alone: for every part of every file of the new version, a donor holding
the same bytes (at whatever offset, in whatever file) or nothing (fetch it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..content.manifest import FileEntry, Manifest
from ..safefs import Dir


@dataclass(frozen=True, slots=True)
class Donor:
    """A complete local version that may lend bytes."""
    ref: str           # NAME@VERSION (display)
    path: Path         # its directory (display, and opening when ``dir`` is None)
    manifest: Manifest
    dir: Dir | None = None  # its directory by descriptor (a version in a tier)


@dataclass(frozen=True, slots=True)
class Span:
    """Bytes [begin, end) of a new file: from ``donor``'s ``donor_path`` at ``donor_offset``, or fetched
    (donor None). ``xxh3_128``: the manifest hash of this part."""
    begin: int
    end: int
    xxh3_128: str
    donor: int | None = None
    donor_path: str = ""
    donor_offset: int = 0
    label: str = ""        # the manifest part's label (what verify names)

    @property
    def size(self) -> int:
        return self.end - self.begin


@dataclass(slots=True)
class FilePlan:
    entry: FileEntry
    spans: list[Span]

    @property
    def reuse_bytes(self) -> int:
        return sum(s.size for s in self.spans if s.donor is not None)

    @property
    def fetch_bytes(self) -> int:
        return sum(s.size for s in self.spans if s.donor is None)

    def regions(self, reused: bool) -> list[tuple[int, int]]:
        """Merged byte ranges that are reused (or fetched)."""
        out: list[tuple[int, int]] = []
        for s in self.spans:
            if (s.donor is not None) != reused or s.size == 0:
                continue
            if out and out[-1][1] == s.begin:
                out[-1] = (out[-1][0], s.end)
            else:
                out.append((s.begin, s.end))
        return out


@dataclass(slots=True)
class DeltaPlan:
    target: Manifest
    donors: list[Donor]
    files: list[FilePlan] = field(default_factory=list)

    @property
    def reuse_bytes(self) -> int:
        return sum(f.reuse_bytes for f in self.files)

    @property
    def fetch_bytes(self) -> int:
        return sum(f.fetch_bytes for f in self.files)

    @property
    def total_bytes(self) -> int:
        return self.target.total_bytes

    def piece_bytes(self, piece_size: int) -> int:
        """What a BitTorrent v2 download would move after a prefill: every piece (aligned per file)
        that a fetched range touches."""
        total = 0
        for f in self.files:
            pieces: set[int] = set()
            for b, e in f.regions(False):
                pieces.update(range(b // piece_size, (e - 1) // piece_size + 1))
            total += sum(min(piece_size, f.entry.size - i * piece_size) for i in pieces)
        return total

    def donors_used(self) -> list[int]:
        return sorted({s.donor for f in self.files for s in f.spans if s.donor is not None})

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": {"name": self.target.name, "version": self.target.version, "digest": self.target.digest},
            "donors": [{"ref": self.donors[i].ref, "digest": self.donors[i].manifest.digest}
                       for i in self.donors_used()],
            "total_bytes": self.total_bytes, "reuse_bytes": self.reuse_bytes, "fetch_bytes": self.fetch_bytes,
            "files": [{"path": f.entry.path, "size": f.entry.size, "reuse_bytes": f.reuse_bytes,
                       "fetch_bytes": f.fetch_bytes,
                       "fetch_ranges": [list(r) for r in f.regions(False)],
                       "reuse_from": sorted({self.donors[s.donor].ref + "/" + s.donor_path
                                             for s in f.spans if s.donor is not None})}
                      for f in self.files],
        }


_INDEXES: "OrderedDict[str, dict[tuple[str, int], tuple[str, int]]]" = OrderedDict()
_INDEXES_LOCK = threading.Lock()
INDEXES_KEPT = 2048


def part_index(m: Manifest) -> dict[tuple[str, int], tuple[str, int]]:
    """(xxh3-128, length) of every non-empty part of ``m`` -> (its file, its offset): the first one.
    Kept by the manifest's digest (the same content has the same parts), so a node with hundreds of
    versions (a set of LoRA adapters) does not rebuild every donor's index for every preload."""
    with _INDEXES_LOCK:
        idx = _INDEXES.get(m.digest)
        if idx is not None:
            _INDEXES.move_to_end(m.digest)
            return idx
    idx = {}
    for f in m.files:
        for p in f.parts(m.chunk_size):
            if p.end > p.begin:
                idx.setdefault((p.xxh3_128, p.end - p.begin), (f.path, p.begin))
    with _INDEXES_LOCK:
        _INDEXES[m.digest] = idx
        while len(_INDEXES) > INDEXES_KEPT:
            _INDEXES.popitem(last=False)
    return idx


def plan_delta(target: Manifest, donors: Sequence[Donor]) -> DeltaPlan:
    """For every part of every file of ``target``: a donor holding the same bytes, or fetch.

    Donors earlier in the list win (put the ones on the staging file system first: copy_file_range
    can then share extents). A donor that shares no part is passed over at the cost of one set
    intersection."""
    wanted = part_index(target).keys()
    index: dict[tuple[str, int], tuple[int, str, int]] = {}
    for di, d in enumerate(donors):
        didx = part_index(d.manifest)
        for key in wanted & didx.keys():
            if key not in index:
                path, begin = didx[key]
                index[key] = (di, path, begin)
    plan = DeltaPlan(target, list(donors))
    for f in target.files:
        spans = []
        for p in f.parts(target.chunk_size):
            hit = index.get((p.xxh3_128, p.end - p.begin)) if p.end > p.begin else None
            if hit is None:
                spans.append(Span(p.begin, p.end, p.xxh3_128, label=p.label))
            else:
                spans.append(Span(p.begin, p.end, p.xxh3_128, hit[0], hit[1], hit[2], p.label))
        plan.files.append(FilePlan(f, spans))
    return plan
