"""Which tensors an expert-parallel rank's copy holds, and that copy's manifest (issue 40).

The split is vLLM's and SGLang's with expert parallelism (vLLM ``determine_expert_map``, its default
"linear" placement): the ``n`` routed experts (``n_routed_experts`` in ``config.json``, DeepSeek;
``num_experts``, Qwen-MoE; ``num_local_experts``, Mixtral) in contiguous blocks, ``n // N`` per rank,
the first ``n % N`` ranks one more. A routed expert's tensors are named ``...mlp.experts.E.`` (DeepSeek,
Qwen) or ``...block_sparse_moe.experts.E.`` (Mixtral); every other tensor (attention, norms, the
router, shared experts, embeddings, head) is kept by every rank.

The copy's manifest is made here from the version's manifest alone, before a byte moves: each
safetensors shard keeps its name and holds the kept tensors in their order, behind a new header
(:func:`shard_header`, the same bytes every time), each tensor with the version's own hash; a shard
left with no tensor is left out (the index json no longer names it); ``*.safetensors.index.json`` is
written anew for the kept tensors (:func:`index_json`); every other file is the version's. So the
copy's digest is known in advance, and the repack (:mod:`.repack`) checks every byte it writes.
"""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from dataclasses import dataclass
from typing import Any

import xxhash

from ..content.manifest import FileEntry, Manifest, SafetensorsInfo, chunk_ranges, tree_hash
from ..content.names import LABEL_SEP
from ..content.safetensors_header import DTYPE_BITS
from ..content.select import Selection, is_rank_file, matches
from ..content.tensor_table import TensorTable
from ..errors import BadInput

EXPERT_RE = re.compile(r"(?:^|\.)(?:mlp|block_sparse_moe)\.experts\.(\d+)\.", re.ASCII)
CONFIG_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
CONFIG = "config.json"
INDEX_SUFFIX = ".safetensors.index.json"
TAG = "e"
MAX_EXPERTS = 1 << 16
OTHER_WEIGHTS = (".bin", ".pt", ".pth")   # (left out of a copy beside safetensors shards unless --include names them)


def rank_experts(rank: int, ranks: int, n: int) -> range:
    """The experts rank R of N holds (vLLM's linear placement: the first n % N ranks one more)."""
    base, extra = divmod(n, ranks)
    lo = rank * base + min(rank, extra)
    return range(lo, lo + base + (rank < extra))


def label_of(version: str, sel: Selection) -> str:
    """``V~e<R>of<N>`` (with file patterns too: ``-`` and 16 hex of them)."""
    assert sel.experts is not None
    r, n = sel.experts
    tag = f"{TAG}{r}of{n}"
    if sel.include or sel.exclude:
        tag += "-" + xxhash.xxh3_64(json.dumps([sel.include, sel.exclude]).encode()).hexdigest()
    return f"{version}{LABEL_SEP}{tag}"


def experts_in_config(raw: bytes, ref: str) -> int:
    """The number of routed experts ``config.json`` names (top level, else its ``text_config``)."""
    try:
        cfg = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadInput(f"{ref}: its config.json is not JSON; --experts cannot tell how many experts it has") from None
    for d in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        if not isinstance(d, dict):
            continue
        for k in CONFIG_KEYS:
            v = d.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_EXPERTS:
                return v
    raise BadInput(f"{ref}: its config.json names no number of routed experts ({', '.join(CONFIG_KEYS)}); "
                   f"not a mixture of experts?")


@dataclass(frozen=True, slots=True)
class ExpertSplit:
    rank: int
    ranks: int
    experts: int          # routed experts in the checkpoint
    kept: range           # this rank's

    def keeps(self, tensor: str) -> bool:
        e = expert_of(tensor)
        return e is None or e in self.kept


def expert_of(tensor: str) -> int | None:
    """The routed expert a tensor belongs to (:data:`EXPERT_RE`, ASCII digits only), None for any other."""
    m = EXPERT_RE.search(tensor) if ".experts." in tensor else None
    if m is None:
        return None
    g = m.group(1)
    if len(g) > 9:   # (int() of 4,300 digits or more raises; any such number is past a config's count)
        g = g.lstrip("0") or "0"
        if len(g) > 9:
            return MAX_EXPERTS + 1
    return int(g)


def split_for(m: Manifest, sel: Selection, config: bytes | None) -> ExpertSplit:
    """Rank R of N's split of ``m`` (BadInput, naming what is wrong, for a checkpoint it cannot split)."""
    assert sel.experts is not None
    ref, (r, ranks) = f"{m.name}@{m.version}", sel.experts
    if any(is_rank_file(f.path) for f in m.files):
        raise BadInput(f"{ref}: laid out per tensor-parallel rank (model-rank-R-part-N.safetensors); --experts "
                       f"splits a whole checkpoint (use --tp-rank)")
    if config is None:
        raise BadInput(f"{ref}: has no config.json; --experts reads the number of routed experts from it")
    n = experts_in_config(config, ref)
    seen = [e for f in m.files if f.safetensors is not None for name in f.safetensors.tensors.names()
            if (e := expert_of(name)) is not None]
    if not seen:
        raise BadInput(f"{ref}: no per-expert tensors (...mlp.experts.E. or ...block_sparse_moe.experts.E.); "
                       f"nothing for --experts to split")
    if max(seen) >= n:
        shown = max(seen) if max(seen) <= MAX_EXPERTS else f"numbered over {MAX_EXPERTS}"
        raise BadInput(f"{ref}: holds expert {shown}, but its config.json says {n} routed experts")
    if ranks > n:
        raise BadInput(f"--experts {r}/{ranks}: more ranks than the {n} routed experts of {ref}")
    return ExpertSplit(r, ranks, n, rank_experts(r, ranks, n))


def shard_header(table: "TensorTable | list[Any]", header_size: int, metadata: dict[str, str]) -> bytes:
    """The safetensors header (length prefix and JSON, padded with spaces as safetensors pads it) of
    ``header_size`` bytes for ``table``, whose offsets are absolute in the shard (so from
    ``header_size`` on); AssertionError when it does not fit (:func:`header_size` finds the size)."""
    d: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    for t in table:
        d[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                     "data_offsets": [t.begin - header_size, t.end - header_size]}
    body = json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
    if len(body) + 8 > header_size:
        raise AssertionError("safetensors header larger than its size")
    body += b" " * (header_size - 8 - len(body))
    return len(body).to_bytes(8, "little") + body


def header_size(table: "TensorTable | list[Any]", metadata: dict[str, str]) -> int:
    """A header's size for ``table`` whatever its offsets: written with every offset as long as it can
    get (the data's size), rounded up to 8 bytes."""
    total = sum(t.end - t.begin for t in table)
    d: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    for t in table:
        d[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [total, total]}
    return -(-(8 + len(json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode())) // 8) * 8


def repacked_shard(f: FileEntry, split: ExpertSplit) -> FileEntry | None:
    """``f`` with only the tensors ``split`` keeps, laid out anew (None: it keeps none)."""
    st = f.safetensors
    assert st is not None
    names = st.tensors.names()
    if len(set(names)) != len(names) or "__metadata__" in names:
        raise BadInput(f"{f.path}: a tensor name repeated, or named __metadata__, in the manifest")
    keep = [i for i, n in enumerate(names) if split.keeps(n)]
    if not keep:
        return None
    src = [st.tensors[i] for i in keep]
    sizes = [t.end - t.begin for t in src]
    if min(sizes) < 0:
        raise BadInput(f"{f.path}: a tensor ends before it begins in the manifest")
    for t, size in zip(src, sizes):
        if _nbytes(t.dtype, t.shape) != size:
            raise BadInput(f"{f.path}: tensor {t.name!r} is {size} bytes in the manifest, its dtype {t.dtype} "
                           f"and shape {list(t.shape)} say otherwise")
    digests = b"".join(st.tensors.digest_bytes[16 * i:16 * i + 16] for i in keep)

    def table(at: int) -> TensorTable:
        ends = [at + s for s in _cumsum(sizes)]
        return TensorTable([t.name for t in src], [t.dtype for t in src], [t.shape for t in src],
                           [e - s for e, s in zip(ends, sizes)], ends, digests)
    size = header_size(src, st.metadata)   # (offsets do not matter: their longest is assumed)
    out = table(size)
    header = shard_header(list(out), size, st.metadata)
    hh = xxhash.xxh3_128(header).hexdigest()
    info = SafetensorsInfo(size, hh, dict(st.metadata), out)
    return FileEntry(f.path, size + sum(sizes), f.mode, tree_hash([hh] + out.hex_digests()), (), info)


def _nbytes(dtype: str, shape: "tuple[int, ...] | list[int]") -> int | None:
    """Bytes a tensor of ``dtype`` and ``shape`` holds (None: a dtype safetensors does not name)."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        return None
    n = bits
    for d in shape:
        n *= d
    return -(-n // 8)


def _cumsum(xs: list[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


def index_json(shards: list[FileEntry], index_path: str) -> bytes:
    """The index json at ``index_path`` for the kept tensors of the shards beside it."""
    where = index_path.rpartition("/")[0]
    weight_map: dict[str, str] = {}
    total = 0
    for f in shards:
        d, _, base = f.path.rpartition("/")
        if d != where or f.safetensors is None:
            continue
        t = f.safetensors.tensors
        for n in t.names():
            if weight_map.setdefault(n, base) != base:
                raise BadInput(f"{index_path}: tensor {n!r} is in both {weight_map[n]} and {base}; a copy "
                               f"would keep one of them at random")
        total += sum(e - b for b, e in t.spans())
    return json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                      indent=2).encode() + b"\n"


def generated_entry(path: str, data: bytes, mode: int, chunk_size: int) -> FileEntry:
    chunks = tuple(xxhash.xxh3_128(data[a:b]).hexdigest() for a, b in chunk_ranges(len(data), chunk_size))
    return FileEntry(path, len(data), mode, tree_hash(list(chunks)), chunks)


def indexed(index: bytes, path: str) -> set[str]:
    """The shard paths an index json's ``weight_map`` names (beside the index, as its paths are)."""
    try:
        wm = json.loads(index).get("weight_map")
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        wm = None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise BadInput(f"{path}: not an index json (no weight_map of tensor names to files)")
    where = path.rpartition("/")[0]
    return {f"{where}/{v}" if where else v for v in wm.values()}


def expert_manifest(m: Manifest, sel: Selection, split: ExpertSplit, label: str, of: dict[str, Any],
                    named: "set[str] | None" = None) -> Manifest:
    """The manifest of rank R's copy of ``m`` (see the module's docstring). ``named``: the shards the
    version's own index json names (:func:`indexed`); a safetensors file beside them it does not name
    (a ``consolidated.safetensors``) is left out of the copy, as are ``*.bin``, ``*.pt`` and ``*.pth``
    weights beside safetensors shards unless the selection's ``--include`` names them."""
    files = [f for f in m.files if matches(f.path, sel)]
    if any(f.safetensors is not None for f in files):
        files = [f for f in files if not f.path.endswith(OTHER_WEIGHTS)
                 or any(fnmatchcase(f.path, p) for p in sel.include)]
    if named is not None:
        beside = {f.path.rpartition("/")[0] for f in m.files if f.path.endswith(INDEX_SUFFIX)}
        files = [f for f in files
                 if f.safetensors is None or f.path in named or f.path.rpartition("/")[0] not in beside]
    shards: list[FileEntry] = []
    out: dict[str, FileEntry] = {}
    for f in files:
        if f.safetensors is not None and f.path.endswith(".safetensors"):
            if (r := repacked_shard(f, split)) is not None:
                shards.append(r)
                out[f.path] = r
        elif not f.path.endswith(INDEX_SUFFIX):
            out[f.path] = f
    if not shards:
        raise BadInput(f"{m.name}@{m.version}: the selection ({sel.describe()}) keeps no safetensors shard")
    for f in files:
        if f.path.endswith(INDEX_SUFFIX):
            out[f.path] = generated_entry(f.path, index_json(shards, f.path), f.mode, m.chunk_size)
    ordered = tuple(out[f.path] for f in files if f.path in out)
    return Manifest(ordered, m.chunk_size, m.format, m.name, label, m.published_at, None, dict(of))
