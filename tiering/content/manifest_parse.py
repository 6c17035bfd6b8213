"""Reading a manifest (design §4): every field of one read from disk or the network is untrusted.

:func:`manifest_from_dict` checks each field's type, range and pattern (paths, names, labels, hex
digests), that the files' parts tile them and hash to the file's hash, and that the whole hashes to the
manifest's ``digest``; every problem is a :class:`~tiering.errors.ManifestError` naming the field.
:func:`parse_manifest` reads it from bytes (bounded), :func:`load_manifest` from a file.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
import threading
import weakref
from itertools import chain, repeat
from typing import Any

import xxhash

from ..errors import ManifestError
from . import parse_cache
from .manifest import FORMAT, MAX_MANIFEST_BYTES, FileEntry, Manifest, SafetensorsInfo, tree_hash
from .names import TAG_RE, has_lone_surrogate, VERSION_RE, split_label, validate_label, validate_name, validate_relpath, validate_version
from .safetensors_header import DTYPE_BITS, all_exactly, all_int64
from .tensor_table import TensorEntry, TensorTable

_HEX128 = re.compile(r"[0-9a-f]{32}")


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, reason: str) -> ManifestError:
        return ManifestError(self.source, f"{where}: {reason}" if where else reason)

    def obj(self, v: Any, where: str, keys: set[str], required: set[str]) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, "expected an object")
        unknown = set(v) - keys
        if unknown:
            raise self.fail(where, f"unknown field {sorted(unknown)[0]!r}")
        missing = required - set(v)
        if missing:
            raise self.fail(where, f"missing field {sorted(missing)[0]!r}")
        return v

    def int(self, v: Any, where: str, minimum: int = 0) -> int:
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            raise self.fail(where, f"expected an integer >= {minimum}")
        return v

    def hex(self, v: Any, where: str) -> str:
        if not isinstance(v, str) or not _HEX128.fullmatch(v):
            raise self.fail(where, "expected 32 lowercase hex digits (xxh3-128)")
        return v

    def opt_str(self, v: Any, where: str) -> str | None:
        if v is not None and not isinstance(v, str):
            raise self.fail(where, "expected a string or null")
        return v


def manifest_from_dict(data: Any, source: str = "manifest") -> Manifest:
    r = _Reader(source)
    top = r.obj(data, "", {"format", "name", "version", "published_at", "digest", "piece_size",
                           "total_bytes", "chunk_size", "files", "of"}, {"format", "digest", "chunk_size", "files"})
    if top["format"] != FORMAT:
        raise r.fail("format", f"unsupported format {top['format']!r} (this weightd reads format {FORMAT})")
    chunk_size = r.int(top["chunk_size"], "chunk_size", 1)
    name = r.opt_str(top.get("name"), "name")
    version = r.opt_str(top.get("version"), "version")
    if name is not None:
        validate_name(name)
    of = _read_of(r, top["of"]) if top.get("of") is not None else None
    if version is not None:
        # a local object's label (V~p<hex>, V~<kind>~<key>) with "of" saying what it belongs to, and
        # "of" only with such a label: a published version's manifest cannot claim to be a part
        (validate_label if of is not None else validate_version)(version)
        if of is not None:
            base, tag, key = split_label(version)
            if tag is None:
                raise r.fail("of", f"a whole version ({version!r}) is not part of another")
            if base != of["version"]:
                raise r.fail("of", f"version {of['version']!r} is not the one in the label {version!r}")
            if (of["kind"] == "partial") != (key is None and tag.startswith("p")):
                raise r.fail("of", f"kind {of['kind']!r} does not match the label {version!r}")
    elif of is not None:
        raise r.fail("of", "a manifest saying what it is part of must name its version label")
    piece_size = top.get("piece_size")
    if piece_size is not None:
        r.int(piece_size, "piece_size", 1)
    if not isinstance(top["files"], list):
        raise r.fail("files", "expected a list")

    seen: set[str] = set()  # (each entry adds its path)
    files = [_read_file_entry(r, i, fd, source, chunk_size, seen) for i, fd in enumerate(top["files"])]

    # a path cannot be both a file and a directory
    for p in seen:
        parent = p.rpartition("/")[0]
        while parent:
            if parent in seen:
                raise r.fail(f"file {p!r}", f"{parent!r} is listed as a file and as a directory")
            parent = parent.rpartition("/")[0]

    m = Manifest(tuple(sorted(files, key=lambda f: f.path)), chunk_size, FORMAT, name, version,
                 r.opt_str(top.get("published_at"), "published_at"), piece_size, of)
    if m.digest != r.hex(top["digest"], "digest"):
        raise r.fail("digest", f"does not match the content (expected {m.digest}): the manifest was edited or is corrupt")
    return m


_OF_KEYS = {"version", "digest", "kind", "key", "selection"}
MAX_OF_BYTES = 64 << 10


def _read_of(r: _Reader, v: Any) -> dict[str, Any]:
    """``of``: what a partial copy or a companion belongs to (checked; a selection is kept as written,
    bounded, for people to read: what the object holds is its file list)."""
    v = r.obj(v, "of", _OF_KEYS, {"version", "digest", "kind"})
    if not isinstance(v["version"], str):
        raise r.fail("of.version", "expected a string")
    validate_version(v["version"])
    r.hex(v["digest"], "of.digest")
    if not isinstance(v["kind"], str) or not TAG_RE.fullmatch(v["kind"]):
        raise r.fail("of.kind", "expected [a-z0-9-], at most 40 characters")
    if "key" in v and (not isinstance(v["key"], str) or not VERSION_RE.fullmatch(v["key"])):
        raise r.fail("of.key", "expected [A-Za-z0-9._-]+")
    if "selection" in v:
        if not isinstance(v["selection"], dict) or len(json.dumps(v["selection"])) > MAX_OF_BYTES:
            raise r.fail("of.selection", f"expected an object of at most {MAX_OF_BYTES} bytes")
    return dict(v)


def _read_file_entry(r: _Reader, i: int, fd: Any, source: str, chunk_size: int, seen: set[str]) -> FileEntry:
    """``files[i]``, checked: its fields, a path not seen before (added to ``seen``), part hashes."""
    where = f"files[{i}]"
    fd = r.obj(fd, where, {"path", "size", "mode", "xxh3_128", "chunks", "safetensors"},
               {"path", "size", "mode", "xxh3_128"})
    path = validate_relpath(fd["path"], source)
    where = f"file {path!r}"
    if path in seen:
        raise r.fail(where, "listed twice")
    seen.add(path)
    size = r.int(fd["size"], where + ": size")
    mode_s = fd["mode"]
    if not isinstance(mode_s, str) or not re.fullmatch(r"0[0-7]{3}", mode_s):
        raise r.fail(where + ": mode", "expected an octal string like '0644'")
    fhash = r.hex(fd["xxh3_128"], where + ": xxh3_128")
    st_info = None
    chunks: tuple[str, ...] = ()
    if "safetensors" in fd:
        if "chunks" in fd:
            raise r.fail(where, "has both 'chunks' and 'safetensors'")
        st_info = _read_safetensors(r, fd["safetensors"], where, size)
        file_hash = xxhash.xxh3_128(bytes.fromhex(st_info.header_xxh3_128) + st_info.tensors.digest_bytes).hexdigest()
    else:
        raw = fd.get("chunks")
        if not isinstance(raw, list):
            raise r.fail(where, "missing 'chunks' list")
        chunks = tuple(r.hex(h, f"{where}: chunks[{j}]") for j, h in enumerate(raw))
        if len(chunks) != max(1, -(-size // chunk_size)):  # (as many as chunk_ranges makes, without making them)
            raise r.fail(where, f"{len(chunks)} chunk hashes for a {size}-byte file in {chunk_size}-byte chunks")
        file_hash = tree_hash(list(chunks))
    if file_hash != fhash:
        raise r.fail(where, "file hash does not match its part hashes")
    return FileEntry(path, size, int(mode_s, 8), fhash, chunks, st_info)


def _read_safetensors(r: _Reader, v: Any, where: str, size: int) -> SafetensorsInfo:
    v = r.obj(v, where + ": safetensors", {"header_size", "header_xxh3_128", "metadata", "tensors"},
              {"header_size", "header_xxh3_128", "tensors"})
    header_size = r.int(v["header_size"], where + ": header_size", 8)
    meta = v.get("metadata", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in meta.items()):
        raise r.fail(where, "metadata must be an object of strings")
    if not isinstance(v["tensors"], list):
        raise r.fail(where, "tensors must be a list")
    table = _tensor_columns(v["tensors"], header_size, size) or _tensors_one_by_one(r, v["tensors"], where,
                                                                                   header_size, size)
    return SafetensorsInfo(header_size, r.hex(v["header_xxh3_128"], where), dict(meta), table)


_TENSOR_KEYS = frozenset({"name", "dtype", "shape", "begin", "end", "xxh3_128"})
_HEX_RUN = re.compile(r"[0-9a-f]*")


def _tensor_columns(raw: list[Any], header_size: int, size: int) -> TensorTable | None:
    """The tensors of a well-formed file, checked a column at a time (90,000 tensors in tens of ms); None
    when anything is off, and :func:`_tensors_one_by_one` then names the first bad tensor. Checks the same
    as that: exactly the six fields, a string name, a known dtype, a list of integers >= 0 for the shape,
    ranges tiling the file in order from the header's end to its size, 32 lowercase hex digits."""
    if not (all_exactly(dict, raw) and all(map(operator.eq, map(dict.keys, raw), repeat(_TENSOR_KEYS)))):
        return None
    names, dtypes, shapes = [t["name"] for t in raw], [t["dtype"] for t in raw], [t["shape"] for t in raw]
    begins, ends, digests = [t["begin"] for t in raw], [t["end"] for t in raw], [t["xxh3_128"] for t in raw]
    if not (all_exactly(str, names) and all_exactly(str, dtypes) and set(dtypes) <= DTYPE_BITS.keys()
            and all_exactly(list, shapes)):
        return None
    dims = list(chain.from_iterable(shapes))
    if not all_int64(dims) or not all_int64(begins) or not all_int64(ends):
        return None
    if not raw:
        return TensorTable([], [], [], [], [], b"") if header_size == size else None
    if begins[0] != header_size or begins[1:] != ends[:-1] or ends[-1] != size:
        return None
    if not all(map(operator.le, begins, ends)):
        return None
    if not all_exactly(str, digests):
        return None
    joined = "".join(digests)
    if set(map(len, digests)) != {32} or not _HEX_RUN.fullmatch(joined):  # (each 32: else two could share)
        return None
    return TensorTable(names, dtypes, shapes, begins, ends, bytes.fromhex(joined))


def _tensors_one_by_one(r: _Reader, raw: list[Any], where: str, header_size: int, size: int) -> TensorTable:
    tensors = []
    cursor = header_size
    for j, t in enumerate(raw):
        tw = f"{where}: tensors[{j}]"
        t = r.obj(t, tw, set(_TENSOR_KEYS), set(_TENSOR_KEYS))
        if not isinstance(t["name"], str):
            raise r.fail(tw, "name must be a string")
        if not isinstance(t["dtype"], str) or t["dtype"] not in DTYPE_BITS:  # (a list is unhashable)
            raise r.fail(tw, f"unknown dtype {str(t['dtype'])[:40]!r}")
        if not isinstance(t["shape"], list):
            raise r.fail(tw, "shape must be a list")
        shape = tuple(r.int(d, tw + ": shape") for d in t["shape"])
        begin, end = r.int(t["begin"], tw + ": begin"), r.int(t["end"], tw + ": end")
        if begin != cursor or end < begin:
            raise r.fail(tw, "tensor ranges must tile the file in order")
        cursor = end
        tensors.append(TensorEntry(t["name"], t["dtype"], shape, begin, end, r.hex(t["xxh3_128"], tw)))
    if cursor != size:
        raise r.fail(where, "tensor ranges do not end at the end of the file")
    try:
        return TensorTable.of(tensors)
    except OverflowError:
        raise r.fail(where, "an offset or dimension beyond 2**63") from None


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read and fully validate a manifest file; every problem is a ManifestError naming it."""
    spath = os.fspath(path)
    try:
        with open(spath, "rb") as fh:
            raw = fh.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        from ..errors import CheckpointNotFound
        raise CheckpointNotFound(spath, "no manifest here") from None
    except IsADirectoryError:
        raise ManifestError(spath, "is a directory") from None
    except OSError as exc:
        raise ManifestError(spath, exc.strerror or str(exc)) from None
    return parse_manifest(raw, spath)


def parse_manifest(raw: bytes, source: str) -> Manifest:
    """A manifest from its bytes (read by the caller, e.g. by descriptor inside a tier). Copies of one
    version (a warm and a hot copy, a partial copy's whole) have byte-identical manifests: while one
    parse is held anywhere in the process, the same bytes give the same object (by SHA-256, so a
    crafted file cannot stand in for another), and a 90,000-tensor version is held once."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(source, f"larger than {MAX_MANIFEST_BYTES} bytes")
    key = hashlib.sha256(raw).digest()
    with _SHARED_LOCK:
        m = _SHARED.get(key)
    if m is not None:
        return m
    kept = parse_cache.load(key) if len(raw) >= parse_cache.MIN_BYTES else None
    if kept is not None:
        with _SHARED_LOCK:
            return _SHARED.setdefault(key, kept)
    try:
        text = raw.decode("utf-8")
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(source, f"not valid JSON: {str(exc)[:200]}") from None
    if has_lone_surrogate(text, data):
        raise ManifestError(source, "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff): not text")
    m = manifest_from_dict(data, source)
    if len(raw) >= parse_cache.MIN_BYTES:
        parse_cache.store(key, m)
    with _SHARED_LOCK:
        return _SHARED.setdefault(key, m)


_SHARED: "weakref.WeakValueDictionary[bytes, Manifest]" = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
