"""Which files of a version a partial copy holds (design §15: a partial copy is a local object of its own).

A :class:`Selection` is what a caller asked for: file patterns with the semantics of huggingface_hub's
``allow_patterns`` / ``ignore_patterns`` (``fnmatch`` on the path relative to the version, case
sensitive, ``*`` also crossing ``/``, a pattern ending in ``/`` meaning everything beneath; a file is
kept when it matches some include pattern, or there are none, and no exclude pattern), a pipeline
stage (``layers``: ``model.layers.N.*`` from A to B inclusive) and a tensor-parallel rank (``tp_rank``
R of N, for checkpoints laid out per rank as vLLM's ``sharded_state`` writes them:
``model-rank-R-part-K.safetensors``), and an expert-parallel rank (``experts`` R of N: every tensor
but the routed experts of other ranks, repacked: :mod:`tiering.experts`).

:func:`choose` resolves it against a manifest into the exact set of files and says why each file
that holds both wanted and unwanted tensors moves whole (a server opens files, not tensors). The
layer and rank filters apply to ``*.safetensors`` files only; every other file (``config.json``, the
tokenizer, ``model.safetensors.index.json``) follows the patterns alone, since a server reads them
whatever its stage. The partial copy's label is ``VERSION~p<32 hex>``, the xxh3-128 of the chosen file set: two
selections that choose the same files are the same object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import xxhash

from ..errors import BadInput
from .manifest import FileEntry, Manifest
from .names import LABEL_SEP

MAX_PATTERNS = 64
MAX_PATTERN_CHARS = 512
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_RANK_FILE = re.compile(r"(?:^|/)model-rank-(\d+)-part-(\d+)\.safetensors$")
PARTIAL_TAG = "p"


@dataclass(frozen=True, slots=True)
class Selection:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    layers: tuple[int, int] | None = None     # A-B inclusive
    tp_rank: tuple[int, int] | None = None    # (R, N)
    experts: tuple[int, int] | None = None    # (R, N): an expert-parallel rank's copy (tiering.experts)

    @property
    def whole(self) -> bool:
        return not (self.include or self.exclude or self.layers or self.tp_rank or self.experts)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.include:
            d["include"] = list(self.include)
        if self.exclude:
            d["exclude"] = list(self.exclude)
        if self.layers is not None:
            d["layers"] = list(self.layers)
        if self.tp_rank is not None:
            d["tp_rank"] = list(self.tp_rank)
        if self.experts is not None:
            d["experts"] = list(self.experts)
        return d

    def describe(self) -> str:
        parts = [f"include {','.join(self.include)}"] if self.include else []
        parts += [f"exclude {','.join(self.exclude)}"] if self.exclude else []
        parts += [f"layers {self.layers[0]}-{self.layers[1]}"] if self.layers else []
        parts += [f"tp-rank {self.tp_rank[0]}/{self.tp_rank[1]}"] if self.tp_rank else []
        parts += [f"experts {self.experts[0]}/{self.experts[1]}"] if self.experts else []
        return "; ".join(parts) or "whole"

    def merged_with(self, default: "Selection") -> "Selection":
        """This selection, with a configured default's patterns where it names none."""
        return Selection(self.include or default.include, self.exclude or default.exclude, self.layers, self.tp_rank,
                         self.experts)


def _patterns(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, (list, tuple)) or len(v) > MAX_PATTERNS:
        raise BadInput(f"{where}: expected a list of at most {MAX_PATTERNS} glob patterns")
    out = []
    for p in v:
        if not isinstance(p, str) or not p or len(p) > MAX_PATTERN_CHARS or "\x00" in p or p.startswith("/"):
            raise BadInput(f"{where}: {str(p)[:60]!r} is not a pattern (a non-empty glob relative to the version, "
                           f"at most {MAX_PATTERN_CHARS} characters)")
        out.append(p + "*" if p.endswith("/") else p)  # (huggingface_hub: a directory means what is beneath)
    return tuple(out)


def parse_layers(v: Any, where: str = "--layers") -> tuple[int, int] | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        a, b = v
    else:
        m = re.fullmatch(r"\s*(\d{1,6})\s*(?:-\s*(\d{1,6})\s*)?", str(v))
        if m is None:
            raise BadInput(f"{where}: expected A-B (layer numbers, inclusive), got {str(v)[:40]!r}")
        a, b = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
    if not 0 <= a <= b:
        raise BadInput(f"{where}: expected A-B with 0 <= A <= B, got {a}-{b}")
    return a, b


def parse_rank(v: Any, where: str = "--tp-rank") -> tuple[int, int] | None:
    if v is None:
        return None
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        r, n = v
    else:
        m = re.fullmatch(r"\s*(\d{1,5})\s*/\s*(\d{1,5})\s*", str(v))
        if m is None:
            raise BadInput(f"{where}: expected R/N (this rank of N), got {str(v)[:40]!r}")
        r, n = int(m.group(1)), int(m.group(2))
    if not 0 <= r < n:
        raise BadInput(f"{where}: expected R/N with 0 <= R < N, got {r}/{n}")
    return r, n


def selection_from(include: Any = None, exclude: Any = None, layers: Any = None, tp_rank: Any = None,
                   *, where: str = "", experts: Any = None) -> Selection:
    """A Selection from a caller's values (CLI flags, an intent entry, a request), every one checked
    (``experts`` goes with file patterns only: an expert-parallel rank reads every layer)."""
    pre = f"{where}." if where else "--"
    sel = Selection(_patterns(include, f"{pre}include"), _patterns(exclude, f"{pre}exclude"),
                    parse_layers(layers, f"{pre}layers"), parse_rank(tp_rank, f"{pre}tp-rank"),
                    parse_rank(experts, f"{pre}experts"))
    if sel.experts is not None and (sel.layers is not None or sel.tp_rank is not None):
        raise BadInput(f"{pre}experts: not with {pre}layers or {pre}tp-rank (an expert-parallel rank reads "
                       f"every layer of a whole checkpoint)")
    return sel


def selection_from_dict(d: Any, where: str = "selection") -> Selection:
    if d is None:
        return Selection()
    if not isinstance(d, dict) or set(d) - {"include", "exclude", "layers", "tp_rank", "experts"}:
        raise BadInput(f"{where}: expected an object with include, exclude, layers, tp_rank, experts")
    return selection_from(d.get("include"), d.get("exclude"), d.get("layers"), d.get("tp_rank"), where=where,
                          experts=d.get("experts"))


@dataclass(slots=True)
class Choice:
    """A selection resolved against one manifest."""
    paths: frozenset[str]
    whole: bool                        # every file of the version: this is the version itself
    bytes: int
    total_bytes: int
    mixed: list[dict[str, Any]] = field(default_factory=list)   # shards moved whole for part of them
    notes: list[str] = field(default_factory=list)

    def label(self, version: str) -> str:
        h = xxhash.xxh3_128("\n".join(sorted(self.paths)).encode()).hexdigest()
        return f"{version}{LABEL_SEP}{PARTIAL_TAG}{h}"

    def to_dict(self) -> dict[str, Any]:
        return {"files": len(self.paths), "bytes": self.bytes, "of_bytes": self.total_bytes,
                "mixed_shards": self.mixed, "notes": self.notes}


def _layer_of(tensor: str) -> int | None:
    m = _LAYER.search(tensor)
    return int(m.group(1)) if m else None


def choose(m: Manifest, sel: Selection) -> Choice:
    """The files of ``m`` that ``sel`` keeps (BadInput when it keeps none, or asks for layers or a
    rank the checkpoint does not have). For ``sel.experts``, the files its patterns keep (the
    tensors within are chosen by :func:`tiering.experts.expert_manifest`)."""
    ref = f"{m.name}@{m.version}"
    files = [f for f in m.files if matches(f.path, sel)]
    notes: list[str] = []
    mixed: list[dict[str, Any]] = []
    if sel.tp_rank is not None:
        files = _by_rank(m, files, sel.tp_rank, ref)
    if sel.layers is not None:
        files, mixed, notes = _by_layers(m, files, sel.layers, ref)
    if not files:
        raise BadInput(f"{ref}: the selection ({sel.describe()}) keeps none of its {len(m.files)} files")
    paths = frozenset(f.path for f in files)
    return Choice(paths, len(paths) == len(m.files), sum(f.size for f in files), m.total_bytes, mixed, notes)


def matches(path: str, sel: Selection) -> bool:
    """Whether ``sel``'s file patterns keep ``path``."""
    return (not sel.include or any(fnmatchcase(path, p) for p in sel.include)) \
        and not any(fnmatchcase(path, p) for p in sel.exclude)


def is_rank_file(path: str) -> bool:
    """A file of a checkpoint laid out per tensor-parallel rank (vLLM sharded_state)."""
    return _RANK_FILE.search(path) is not None


def _by_rank(m: Manifest, files: list[FileEntry], rank: tuple[int, int], ref: str) -> list[FileEntry]:
    ranks = {int(g.group(1)) for f in m.files if (g := _RANK_FILE.search(f.path))}
    if not ranks:
        raise BadInput(f"{ref}: not laid out per rank (no model-rank-R-part-N.safetensors files); "
                       f"use --layers or patterns instead")
    r, n = rank
    if ranks != set(range(n)):
        raise BadInput(f"{ref}: laid out for {max(ranks) + 1} ranks (ranks {min(ranks)}-{max(ranks)}), not {n}")
    return [f for f in files if (g := _RANK_FILE.search(f.path)) is None or int(g.group(1)) == r]


def _by_layers(m: Manifest, files: list[FileEntry], layers: tuple[int, int], ref: str
               ) -> tuple[list[FileEntry], list[dict[str, Any]], list[str]]:
    """Shards holding a tensor of layers A-B; the embeddings go with the stage holding layer 0, every
    other tensor outside the layers (final norm, lm_head) with the stage holding the last layer, and
    the embeddings there too when there is no lm_head (tied embeddings: the head reads them)."""
    numbered = [n for _, t in m.tensors() if (n := _layer_of(t.name)) is not None]
    if not numbered:
        raise BadInput(f"{ref}: no tensor names with layer numbers (model.layers.N.*); --layers cannot choose")
    last = max(numbered)
    a, b = layers
    if b > last:
        raise BadInput(f"{ref}: has layers 0-{last}; --layers {a}-{b} goes beyond them")
    tied = not any("lm_head" in t.name for _, t in m.tensors())
    notes = [f"layers 0-{last}; stage {a}-{b}" + (" holds the embeddings" if a == 0 else "")
             + (" holds the final norm and head" if b == last else "")
             + (" (tied embeddings: the head reads them)" if b == last and tied and a != 0 else "")]

    def wanted(name: str) -> bool:
        n = _layer_of(name)
        if n is not None:
            return a <= n <= b
        if "embed" in name:
            return a == 0 or (b == last and tied)
        return b == last

    out, mixed = [], []
    for f in files:
        if f.safetensors is None or not f.path.endswith(".safetensors"):
            out.append(f)
            continue
        ts = f.safetensors.tensors
        want = [t for t in ts if wanted(t.name)]
        if not want:
            continue
        out.append(f)
        if len(want) < len(ts):
            wl = sorted({n for t in want if (n := _layer_of(t.name)) is not None})
            mixed.append({"file": f.path, "bytes": f.size, "wanted_bytes": sum(t.nbytes for t in want),
                          "wanted_tensors": len(want), "other_tensors": len(ts) - len(want),
                          "wanted_layers": [wl[0], wl[-1]] if wl else [],
                          "why": f"holds {len(want)} wanted tensor(s) beside {len(ts) - len(want)} others; "
                                 f"it moves whole because a server opens the file, not the tensor"})
    return out, mixed, notes
