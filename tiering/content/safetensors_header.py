"""Defensive parser for safetensors headers.

The format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON (an object mapping tensor
names to ``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an optional ``__metadata__``
object of strings), then the data section. ``data_offsets`` are relative to the data section.

Everything in the header is attacker-controlled, so this parser bounds the header length, rejects
duplicate keys, checks every dtype and shape, and requires the tensors to tile the data section
exactly: sorted, contiguous, no overlap, no hole, nothing past the end. The only exception it raises
is :class:`SafetensorsHeaderError`.

A header as the reference writer makes it (compact JSON, ``__metadata__`` first, each entry's fields
in the order ``dtype, shape, data_offsets``, names without escapes) is read by one regular expression
that accepts only that subset of JSON, where each captured text *is* the value (no escape, no
whitespace, no float): a MoE checkpoint's 90,000 entries in C instead of a JSON object and a
duplicate-key hook per entry (issue 40). Anything else, and anything the fast checks doubt, is parsed
by ``json.loads`` with the hook and checked entry by entry, which names the problem.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import struct
from dataclasses import dataclass
from itertools import chain, repeat
from typing import NamedTuple

from ..errors import SafetensorsHeaderError
from .names import has_lone_surrogate

MAX_HEADER_BYTES = 100_000_000  # the safetensors reference implementation's own bound
MAX_DIMS = 64
MAX_INT = (1 << 63) - 1  # a dimension or an offset (a manifest keeps them as 64-bit integers)

#: dtype -> size in bits (sub-byte types F4/F6 pack several elements per byte)
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}


class TensorInfo(NamedTuple):
    """One tensor of a header (a named tuple: a MoE shard lists hundreds, a checkpoint ~90,000)."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A checked header: its tensors as columns, in file order (``begins``/``ends`` absolute offsets)."""
    header_size: int  # 8 + N: where the data section starts
    file_size: int
    metadata: dict[str, str]
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    begins: tuple[int, ...]
    ends: tuple[int, ...]

    @property
    def tensors(self) -> tuple[TensorInfo, ...]:
        """One :class:`TensorInfo` per tensor, in file order (made on each call)."""
        return tuple(map(TensorInfo, self.names, self.dtypes, self.shapes, self.begins, self.ends))


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {dup!r}")
    return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_header_bytes(path: str, prefix: bytes, header_json: bytes, file_size: int) -> SafetensorsHeader:
    """Validate a header already read from ``path``: ``prefix`` is the 8 length bytes."""
    (n,) = struct.unpack("<Q", prefix)
    header_size = 8 + n
    if len(header_json) != n:
        raise SafetensorsHeaderError(path, f"header is {n} bytes but only {len(header_json)} could be read")
    try:
        text = header_json.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsHeaderError(path, f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.startswith("{"):
        raise SafetensorsHeaderError(path, "header is not a JSON object")
    fast = _compact_header(text, header_size, file_size)
    if fast is not None:
        return fast
    try:
        obj = json.loads(text, object_pairs_hook=_reject_duplicates)
    except (ValueError, RecursionError) as exc:
        raise SafetensorsHeaderError(path, f"header is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise SafetensorsHeaderError(path, "header is not a JSON object")
    if has_lone_surrogate(text, obj):
        raise SafetensorsHeaderError(path, "a name or value holds a lone UTF-16 surrogate (\\ud800-\\udfff): not text")

    metadata: dict[str, str] = {}
    raw_meta = obj.pop("__metadata__", None)
    if raw_meta is not None:
        if not isinstance(raw_meta, dict) or not all(isinstance(v, str) for v in raw_meta.values()):
            raise SafetensorsHeaderError(path, "__metadata__ must be an object of strings")
        metadata = raw_meta

    data_size = file_size - header_size
    tensors = _tensors_by_column(obj, header_size, data_size)
    if tensors is None:  # (something is off: checked one by one, which names the first bad entry)
        tensors = [_tensor_info(path, name, info, header_size, data_size) for name, info in obj.items()]
    tensors.sort(key=lambda t: (t.begin, t.end))
    _check_layout(path, tensors, header_size, file_size)
    names, dtypes, shapes, begins, ends = zip(*tensors) if tensors else ((),) * 5
    return SafetensorsHeader(header_size, file_size, metadata, names, dtypes, shapes, begins, ends)


# -- the compact header of the reference writer, at C speed -------------------------------------------
_NAT = r"(?:0|[1-9][0-9]{0,18})"     # a JSON integer >= 0 of at most 19 digits (no sign, no leading 0)
# a JSON string's text, escapes included (json.loads reads them). Possessive (Python 3.11): a
# backtracking repeat keeps ~130 bytes of state a character, 13 GB for a 99 MB metadata value; the two
# alternatives never match the same text, so possessive accepts exactly what the greedy form did
_STR = r'(?:[^"\\\x00-\x1f]++|\\.)*+'
#: ``,"name":{"dtype":"D","shape":[a,b],"data_offsets":[x,y]}``: a name without escape or control
#: character (its text is its value), then exactly these three fields in this order (a shape's
#: digits are checked after, once per distinct text)
_ENTRY = re.compile(r',"([^"\\\x00-\x1f]*)":\{"dtype":"([A-Z0-9_]{1,16})","shape":\[([0-9,]*)\],'
                    r'"data_offsets":\[(%s),(%s)\]\}' % (_NAT, _NAT))
_ENTRY_CHARS = len(',"":{"dtype":"","shape":[],"data_offsets":[,]}')  # (an entry's length less its captures)
_SHAPE = re.compile(r"(?:%s(?:,%s)*)?" % (_NAT, _NAT))
_METADATA = re.compile(r'\{"__metadata__":(\{(?:"%s":"%s"(?:,"%s":"%s")*+)?\})' % ((_STR,) * 4))


def _compact_header(text: str, header_size: int, file_size: int) -> SafetensorsHeader | None:
    """The header ``text`` when it is in the reference writer's compact form, its tensors in file order,
    and it passes every check of the general path; None otherwise (the general path decides).

    Sound by construction: the entries are matched one after another (the matches are disjoint, so
    their lengths adding up to the body's means they cover it all: nothing between, before or after
    them), a match's captured texts are its values, each entry has exactly the three fields once, no
    name is repeated nor ``__metadata__``, and ``__metadata__`` (first, an object of strings) is read
    by ``json.loads`` with the duplicate-key hook."""
    end = len(text.rstrip(" \t\n\r"))
    if text[end - 1:end] != "}":
        return None
    metadata: dict[str, str] = {}
    m = _METADATA.match(text)
    if m is not None:
        if m.end() >= end:   # (the object ends with the metadata's "}": the header's own is missing)
            return None
        try:
            metadata = json.loads(m.group(1), object_pairs_hook=_reject_duplicates)
        except (ValueError, RecursionError):
            return None
        if has_lone_surrogate(m.group(1), metadata):
            return None
        body = text[m.end():end - 1]
    else:
        body = "," + text[1:end - 1]
    found = _ENTRY.findall(body)
    if not found:   # (no tensor: only a header of nothing but metadata, over no data)
        return SafetensorsHeader(header_size, file_size, metadata, (), (), (), (), ()) \
            if not body and m is not None and file_size == header_size else None
    names, dtypes, shape_texts, begin_texts, end_texts = zip(*found)
    # in file order, tiling the data section: each begins where the one before ends, the first at 0
    if begin_texts[0] != "0" or begin_texts[1:] != end_texts[:-1]:
        return None
    if (len(found) * _ENTRY_CHARS + sum(map(len, names)) + sum(map(len, dtypes)) + sum(map(len, shape_texts))
            + 2 * sum(map(len, begin_texts)) - 1 + len(end_texts[-1])) != len(body):
        return None
    if len(set(names)) != len(names) or "__metadata__" in names or not set(dtypes) <= DTYPE_BITS.keys():
        return None
    if not all(map(_SHAPE.fullmatch, set(shape_texts))):   # (first: "[1,,1]" or 5,000 digits are no integers)
        return None
    shape_of = {t: tuple(map(int, t.split(","))) if t else () for t in set(shape_texts)}
    if not all(len(sh) <= MAX_DIMS and max(sh, default=0) <= MAX_INT for sh in shape_of.values()):
        return None
    elements = {t: math.prod(sh) for t, sh in shape_of.items()}
    at = list(map(int, (*begin_texts, end_texts[-1])))
    # each tensor's bits (elements x dtype bits) are 8x its span: whole bytes, and the span its size
    if at[-1] != file_size - header_size or list(map(operator.mul, map(elements.__getitem__, shape_texts), map(
            DTYPE_BITS.__getitem__, dtypes))) != list(map(operator.mul, map(operator.sub, at[1:], at[:-1]), repeat(8))):
        return None   # (also catches an offset past 2**63 - 1: the data section would be that long)
    at = tuple(map(operator.add, at, repeat(header_size)))
    return SafetensorsHeader(header_size, file_size, metadata, names, dtypes,
                             tuple(map(shape_of.__getitem__, shape_texts)), at[:-1], at[1:])


_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


def _tensors_by_column(obj: dict[str, object], header_size: int, data_size: int) -> list[TensorInfo] | None:
    """The entries of a well-formed header, checked a column at a time (what :func:`_tensor_info` checks,
    for a MoE shard's hundreds of tensors at C speed); None when any is off."""
    infos = list(obj.values())
    if not (all_exactly(dict, infos) and all(map(operator.eq, map(dict.keys, infos), repeat(_FIELDS)))):
        return None
    dtypes, shapes, offsets = ([i[k] for i in infos] for k in ("dtype", "shape", "data_offsets"))  # type: ignore[index]
    if not (all_exactly(str, dtypes) and set(dtypes) <= DTYPE_BITS.keys() and all_exactly(list, shapes)
            and all_exactly(list, offsets) and all(len(s) <= MAX_DIMS for s in shapes) and set(map(len, offsets)) <= {2}):
        return None
    dims = list(chain.from_iterable(shapes))
    begins, ends = [o[0] for o in offsets], [o[1] for o in offsets]
    if not (all_int64(dims) and all_int64(begins) and all_int64(ends)) or (ends and max(ends) > data_size):
        return None
    bits = list(map(operator.mul, map(math.prod, shapes), map(DTYPE_BITS.__getitem__, dtypes)))
    if any(b % 8 for b in bits) or list(map(operator.floordiv, bits, repeat(8))) != list(map(operator.sub, ends, begins)):
        return None  # (also catches begin > end: a size is never negative)
    return list(map(TensorInfo, obj.keys(), dtypes, map(tuple, shapes), map(operator.add, begins, repeat(header_size)),
                    map(operator.add, ends, repeat(header_size))))


def all_exactly(kind: type, values: list[object]) -> bool:
    """Every value of exactly this type (a bool is not an int here)."""
    return set(map(type, values)) <= {kind}


def all_int64(values: list[object]) -> bool:
    """Every value an integer (not a bool) in 0 .. 2**63-1 (what an array('q') of a manifest holds)."""
    return all_exactly(int, values) and (not values or (min(values) >= 0 and max(values) <= MAX_INT))  # type: ignore[type-var]


def _tensor_info(path: str, name: str, info: object, header_size: int, data_size: int) -> TensorInfo:
    """One entry of the header, checked: known fields and dtype, sane shape, offsets inside the data."""
    where = f"tensor {name[:200]!r}"
    if not isinstance(info, dict):
        raise SafetensorsHeaderError(path, f"{where}: entry is not an object")
    extra = set(info) - {"dtype", "shape", "data_offsets"}
    if extra:
        raise SafetensorsHeaderError(path, f"{where}: unknown field {sorted(extra)[0]!r}")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise SafetensorsHeaderError(path, f"{where}: unknown dtype {str(dtype)[:40]!r}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(_is_int(d) and 0 <= d <= MAX_INT for d in shape)):
        raise SafetensorsHeaderError(path, f"{where}: shape must be a list of at most {MAX_DIMS} non-negative integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
        raise SafetensorsHeaderError(path, f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end")
    if offsets[1] > data_size:
        raise SafetensorsHeaderError(path, f"{where}: data_offsets {offsets} run past the end of the file (data section is {data_size} bytes)")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise SafetensorsHeaderError(path, f"{where}: {dtype} x {shape} is not a whole number of bytes")
    if bits // 8 != offsets[1] - offsets[0]:
        raise SafetensorsHeaderError(
            path, f"{where}: {dtype} x {shape} is {bits // 8} bytes but data_offsets span {offsets[1] - offsets[0]}")
    return TensorInfo(name, dtype, tuple(shape), header_size + offsets[0], header_size + offsets[1])


def _check_layout(path: str, tensors: list[TensorInfo], header_size: int, file_size: int) -> None:
    """The tensors (sorted by offset) tile the data section exactly: no overlap, no hole, nothing after
    the last."""
    cursor = header_size
    for t in tensors:
        if t.begin < cursor:
            raise SafetensorsHeaderError(path, f"tensor {t.name[:200]!r} overlaps the previous tensor")
        if t.begin > cursor:
            raise SafetensorsHeaderError(path, f"hole of {t.begin - cursor} bytes before tensor {t.name[:200]!r}")
        cursor = t.end
    if cursor != file_size:
        raise SafetensorsHeaderError(path, f"{file_size - cursor} bytes after the last tensor are not described by the header")


def read_header(path: str | os.PathLike[str], fd: int | None = None) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file at ``path`` (or open ``fd``)."""
    spath = os.fspath(path)
    own = fd is None
    if own:
        from .hashing import open_for_read  # a FileRef inside a tier is opened by descriptor
        fd = open_for_read(path)  # type: ignore[arg-type]
    try:
        file_size = os.fstat(fd).st_size
        if file_size < 8:
            raise SafetensorsHeaderError(spath, f"file is {file_size} bytes, too short for a header")
        prefix = os.pread(fd, 8, 0)
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES:
            raise SafetensorsHeaderError(spath, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
        if 8 + n > file_size:
            raise SafetensorsHeaderError(spath, f"header length {n} exceeds the file size {file_size}")
        chunks, off = [], 8
        while off < 8 + n:
            chunk = os.pread(fd, min(8 + n - off, 16 << 20), off)
            if not chunk:
                break
            chunks.append(chunk)
            off += len(chunk)
        return parse_header_bytes(spath, prefix, b"".join(chunks), file_size)
    finally:
        if own:
            os.close(fd)
