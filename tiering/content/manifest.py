"""The manifest: the verified description of one checkpoint version (design §4, contract).

A manifest lists every regular file of a checkpoint with its size, permission bits and hash. Hashing is
done over *parts* so that both cores share every file and each byte is read once:

- a ``*.safetensors`` file's parts are its header (length prefix + JSON) and each tensor's byte range,
  in file order; the parser guarantees they tile the file exactly;
- any other file's parts are fixed ``chunk_size`` (16 MiB) chunks.

Each part is hashed with xxh3-128. A file's ``xxh3_128`` is xxh3-128 over the concatenation of its part
digests (16 bytes each, in file order): a two-level hash tree, so a whole-file comparison is one string
compare and a part comparison finds the first bad tensor. The manifest ``digest`` (the content id) is
xxh3-128 of the canonical JSON of ``{format, chunk_size, files}``: labels (name, version, published_at,
piece_size) do not change it, so the same content published twice has the same digest.

This module holds the manifest's types, its JSON and digest, and writing it; reading one (every
field untrusted) is :mod:`tiering.content.manifest_parse`.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from json.encoder import encode_basestring as _js  # (a str as json.dumps(..., ensure_ascii=False) writes it)
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, NamedTuple

import xxhash

from .tensor_table import TensorEntry, TensorTable

FORMAT = 1
DEFAULT_CHUNK_SIZE = 16 << 20
MAX_MANIFEST_BYTES = 512 << 20
MANIFEST_RELPATH = ".weightd/manifest.json"
EMPTY_XXH3_128 = xxhash.xxh3_128(b"").hexdigest()


def tree_hash(part_digests: list[str]) -> str:
    """A file's hash from its parts' hex digests."""
    return xxhash.xxh3_128(bytes.fromhex("".join(part_digests))).hexdigest()


class Part(NamedTuple):
    """A hashed byte range of one file: a safetensors header, a tensor, or a chunk. (A named tuple: a
    preload of a 90,000-tensor version makes one per tensor, several times.)"""
    label: str
    begin: int
    end: int
    xxh3_128: str | None = None

    @property
    def length(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class SafetensorsInfo:
    header_size: int
    header_xxh3_128: str
    metadata: dict[str, str]
    tensors: TensorTable  # (given as any sequence of TensorEntry, kept as columns)

    def __post_init__(self) -> None:
        if not isinstance(self.tensors, TensorTable):
            object.__setattr__(self, "tensors", TensorTable.of(self.tensors))


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int
    mode: int
    xxh3_128: str
    chunks: tuple[str, ...] = ()               # non-safetensors files
    safetensors: SafetensorsInfo | None = None  # safetensors files

    def spans(self, chunk_size: int) -> list[tuple[int, int]]:
        """Each part's ``(begin, end)``, in the order of :meth:`parts` (without making the parts)."""
        if self.safetensors is not None:
            return [(0, self.safetensors.header_size)] + self.safetensors.tensors.spans()
        return [(i * chunk_size, min(self.size, (i + 1) * chunk_size)) for i in range(len(self.chunks))]

    def part_digests(self) -> list[str]:
        """Each part's xxh3-128, in the order of :meth:`parts`."""
        if self.safetensors is not None:
            return [self.safetensors.header_xxh3_128] + self.safetensors.tensors.hex_digests()
        return list(self.chunks)

    def parts(self, chunk_size: int) -> list[Part]:
        if self.safetensors is not None:
            st = self.safetensors
            out = [Part("header", 0, st.header_size, st.header_xxh3_128)]
            t = st.tensors
            out += [Part(f"tensor {n!r}", b, e, h) for n, (b, e), h in zip(t.names(), t.spans(), t.hex_digests())]
            return out
        return [Part(f"chunk {i} (bytes {i * chunk_size}-{min(self.size, (i + 1) * chunk_size)})",
                     i * chunk_size, min(self.size, (i + 1) * chunk_size), h)
                for i, h in enumerate(self.chunks)]


def chunk_ranges(size: int, chunk_size: int) -> list[tuple[int, int]]:
    """Fixed chunks of a non-safetensors file; an empty file has one empty chunk."""
    if size == 0:
        return [(0, 0)]
    return [(off, min(size, off + chunk_size)) for off in range(0, size, chunk_size)]


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Manifest:
    files: tuple[FileEntry, ...]
    chunk_size: int = DEFAULT_CHUNK_SIZE
    format: int = FORMAT
    name: str | None = None
    version: str | None = None
    published_at: str | None = None
    piece_size: int | None = None
    # what this object belongs to, when it is not a whole published version (a label, outside the
    # digest): {"version", "digest", "kind": "partial"|<companion kind>, "key"?, "selection"?}
    of: dict[str, Any] | None = field(default=None, compare=False)
    digest: str = field(default="")
    # the builder's readable tensor lines of each safetensors file (path -> (its table, the text)), made
    # with the digest's canonical ones from the same columns: taken (and dropped) by the first to_json
    rendered: dict[str, tuple[TensorTable, str]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", compute_digest(self))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> FileEntry | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def tensor_count(self) -> int:
        return sum(len(f.safetensors.tensors) for f in self.files if f.safetensors is not None)

    def tensors(self) -> Iterator[tuple[FileEntry, TensorEntry]]:
        for f in self.files:
            if f.safetensors is not None:
                for t in f.safetensors.tensors:
                    yield f, t

    def with_labels(self, *, name: str | None = None, version: str | None = None,
                    published_at: str | None = None, piece_size: int | None = None,
                    of: dict[str, Any] | None = None) -> Manifest:
        return replace(self, name=name, version=version, published_at=published_at, piece_size=piece_size, of=of)

    def restrict(self, paths: "set[str] | frozenset[str]", *, label: str, of: dict[str, Any]) -> Manifest:
        """The manifest of a partial copy: only the entries of ``paths`` (each verified as in the whole
        version), under its own ``label``, saying what it is part of."""
        files = tuple(f for f in self.files if f.path in paths)
        return Manifest(files, self.chunk_size, self.format, self.name, label, self.published_at, None, dict(of))

    # -- JSON -------------------------------------------------------------------------------------
    def to_dict(self, *, tensors: bool = True) -> dict[str, Any]:
        """As JSON has it; without ``tensors``, each safetensors file's list of them is left out."""
        return {
            "format": self.format,
            "name": self.name,
            "version": self.version,
            "published_at": self.published_at,
            "digest": self.digest,
            "piece_size": self.piece_size,
            **({"of": self.of} if self.of is not None else {}),
            "total_bytes": self.total_bytes,
            "chunk_size": self.chunk_size,
            "files": [_file_dict(f, tensors) for f in self.files],
        }

    def to_json(self) -> str:
        """Readable and diff-friendly: one line per file, and one per tensor."""
        def dump(v: Any) -> str:
            return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

        d = self.to_dict(tensors=False)
        lines = ["{"] + [f" {dump(k)}: {dump(v)}," for k, v in d.items() if k != "files"] + [' "files": [']
        for i, (f, entry) in enumerate(zip(d["files"], self.files)):
            end = "," if i < len(self.files) - 1 else ""
            st = f.pop("safetensors", None)
            if st is None:
                lines.append(f"  {dump(f)}{end}")
                continue
            table = entry.safetensors.tensors  # type: ignore[union-attr]
            held = self.rendered.pop(entry.path, None) if self.rendered else None
            rows = held[1] if held is not None and held[0] is table else table.json_text(canonical=False)
            head = dump(f)[:-1] + ', "safetensors": ' + dump(st)[:-1] + ', "tensors": ['
            lines.append("  " + head)
            if rows:
                lines.append(rows)
            lines.append(f"  ]}}}}{end}")
        lines += [" ]", "}"]
        return "\n".join(lines) + "\n"


def _file_dict(f: FileEntry, tensors: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {"path": f.path, "size": f.size, "mode": f"{f.mode:04o}", "xxh3_128": f.xxh3_128}
    if f.safetensors is not None:
        st = f.safetensors
        d["safetensors"] = {
            "header_size": st.header_size,
            "header_xxh3_128": st.header_xxh3_128,
            "metadata": dict(sorted(st.metadata.items())),
            **({"tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "begin": t.begin,
                             "end": t.end, "xxh3_128": t.xxh3_128} for t in st.tensors]} if tensors else {}),
        }
    else:
        d["chunks"] = list(f.chunks)
    return d


def compute_digest(m: Manifest, texts: "dict[str, tuple[TensorTable, str, str]] | None" = None) -> str:
    """The content id: xxh3-128 of the canonical JSON of ``{format, chunk_size, files}`` (sorted keys, no
    spaces, files in path order, each as :func:`_file_dict` has it), hashed a file at a time. ``texts``:
    path -> (table, its canonical tensor text, readable), rendered by the builder from the columns the
    table was made of (:meth:`TensorTable.built`); used for that very table only."""
    h = xxhash.xxh3_128(b'{"chunk_size":%d,"files":[' % m.chunk_size)
    for i, f in enumerate(m.files):
        h.update((b"," if i else b"") + _canonical_file(f, texts).encode())
    h.update(b'],"format":%d}' % m.format)
    return h.hexdigest()


def built_manifest(files: tuple[FileEntry, ...], chunk_size: int,
                   texts: dict[str, tuple[TensorTable, str, str]]) -> Manifest:
    """A manifest just built (no labels): its digest taken over the builder's canonical tensor texts,
    and the readable ones kept for its first :meth:`Manifest.to_json` (a build writes it)."""
    m = Manifest(files, chunk_size, digest="-")
    return replace(m, digest=compute_digest(m, texts),
                   rendered={path: (table, readable) for path, (table, _, readable) in texts.items()})


def _canonical(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical_file(f: FileEntry, texts: "dict[str, tuple[TensorTable, str, str]] | None" = None) -> str:
    """``_canonical(_file_dict(f))``, with a safetensors file's tensors written from their columns."""
    st = f.safetensors
    if st is None:
        return _canonical(_file_dict(f))
    held = texts.get(f.path) if texts else None
    rows = held[1] if held is not None and held[0] is st.tensors else st.tensors.json_text(canonical=True)
    # (the keys in sorted order: mode, path, safetensors {header_size, header_xxh3_128, metadata, tensors},
    # size, xxh3_128)
    return ('{"mode":%s,"path":%s,"safetensors":{"header_size":%d,"header_xxh3_128":%s,"metadata":%s,"tensors":[%s]},'
            '"size":%d,"xxh3_128":%s}' % (_js(f"{f.mode:04o}"), _js(f.path), st.header_size, _js(st.header_xxh3_128),
                                          _canonical(st.metadata), rows, f.size, _js(f.xxh3_128)))


def write_manifest(m: Manifest, path: str | os.PathLike[str]) -> None:
    """Write atomically: a unique temporary file in the same directory, fsync, rename."""
    spath = os.fspath(path)
    try:
        st = os.stat(spath)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):  # /dev/null, /dev/stdout, a FIFO: never replace it
        with open(spath, "w", encoding="utf-8") as fh:
            fh.write(m.to_json())
        return
    directory = os.path.dirname(os.path.abspath(spath))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".incomplete", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(m.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, spath)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
