"""Compare two manifests: which files and tensors changed, and how many bytes are new content."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .manifest import Manifest


@dataclass(frozen=True, slots=True)
class TensorChange:
    name: str
    path: str          # file in B (or in A when removed)
    kind: str          # added | removed | changed | moved
    nbytes: int
    detail: str = ""


@dataclass(slots=True)
class ManifestDiff:
    a_digest: str
    b_digest: str
    files_added: list[str] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)
    files_changed: list[str] = field(default_factory=list)
    tensors: list[TensorChange] = field(default_factory=list)
    changed_bytes: int = 0   # bytes of B whose content is not anywhere in A (part granularity)
    total_bytes: int = 0     # size of B

    @property
    def identical(self) -> bool:
        return self.a_digest == self.b_digest

    def count(self, kind: str) -> int:
        return sum(1 for t in self.tensors if t.kind == kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a_digest": self.a_digest, "b_digest": self.b_digest, "identical": self.identical,
            "files": {"added": self.files_added, "removed": self.files_removed, "changed": self.files_changed},
            "tensors": {k: [{"name": t.name, "path": t.path, "bytes": t.nbytes, "detail": t.detail}
                            for t in self.tensors if t.kind == k]
                        for k in ("added", "removed", "changed", "moved")},
            "changed_bytes": self.changed_bytes, "total_bytes": self.total_bytes,
        }


def diff_manifests(a: Manifest, b: Manifest) -> ManifestDiff:
    d = ManifestDiff(a.digest, b.digest, total_bytes=b.total_bytes)
    a_files = {f.path: f for f in a.files}
    b_files = {f.path: f for f in b.files}
    d.files_added = sorted(set(b_files) - set(a_files))
    d.files_removed = sorted(set(a_files) - set(b_files))
    d.files_changed = sorted(p for p in set(a_files) & set(b_files) if a_files[p].xxh3_128 != b_files[p].xxh3_128)

    # tensors by name across all shards (re-sharding moves tensors between files)
    a_t = {t.name: (f.path, t) for f, t in a.tensors()}
    b_t = {t.name: (f.path, t) for f, t in b.tensors()}
    for name, (bpath, bt) in b_t.items():
        if name not in a_t:
            d.tensors.append(TensorChange(name, bpath, "added", bt.nbytes, f"{bt.dtype} {list(bt.shape)}"))
            continue
        apath, at = a_t[name]
        if (at.xxh3_128, at.dtype, at.shape) != (bt.xxh3_128, bt.dtype, bt.shape):
            detail = "values" if (at.dtype, at.shape) == (bt.dtype, bt.shape) else \
                f"{at.dtype} {list(at.shape)} -> {bt.dtype} {list(bt.shape)}"
            d.tensors.append(TensorChange(name, bpath, "changed", bt.nbytes, detail))
        elif apath != bpath or at.begin != bt.begin:
            where = f"{apath} -> {bpath}" if apath != bpath else f"offset {at.begin} -> {bt.begin}"
            d.tensors.append(TensorChange(name, bpath, "moved", bt.nbytes, where))
    for name, (apath, at) in a_t.items():
        if name not in b_t:
            d.tensors.append(TensorChange(name, apath, "removed", at.nbytes, f"{at.dtype} {list(at.shape)}"))

    # new content, content-addressed at part granularity (a moved tensor is not new content)
    known_files = {f.xxh3_128 for f in a.files}
    known_parts = {p.xxh3_128 for f in a.files for p in f.parts(a.chunk_size)}
    for f in b.files:
        if f.xxh3_128 in known_files:
            continue
        d.changed_bytes += sum(p.length for p in f.parts(b.chunk_size) if p.xxh3_128 not in known_parts)
    return d
