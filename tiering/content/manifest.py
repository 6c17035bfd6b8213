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
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import xxhash

from ..errors import ManifestError
from .names import TAG_RE, VERSION_RE, split_label, validate_label, validate_name, validate_relpath, validate_version
from .safetensors_header import DTYPE_BITS

FORMAT = 1
DEFAULT_CHUNK_SIZE = 16 << 20
MAX_MANIFEST_BYTES = 512 << 20
MANIFEST_RELPATH = ".weightd/manifest.json"
_HEX128 = re.compile(r"[0-9a-f]{32}")
EMPTY_XXH3_128 = xxhash.xxh3_128(b"").hexdigest()


def tree_hash(part_digests: list[str]) -> str:
    """A file's hash from its parts' hex digests."""
    return xxhash.xxh3_128(b"".join(bytes.fromhex(d) for d in part_digests)).hexdigest()


@dataclass(frozen=True, slots=True)
class Part:
    """A hashed byte range of one file: a safetensors header, a tensor, or a chunk."""
    label: str
    begin: int
    end: int
    xxh3_128: str | None = None

    @property
    def length(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute offsets in the file
    end: int
    xxh3_128: str

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class SafetensorsInfo:
    header_size: int
    header_xxh3_128: str
    metadata: dict[str, str]
    tensors: tuple[TensorEntry, ...]


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int
    mode: int
    xxh3_128: str
    chunks: tuple[str, ...] = ()               # non-safetensors files
    safetensors: SafetensorsInfo | None = None  # safetensors files

    def parts(self, chunk_size: int) -> list[Part]:
        if self.safetensors is not None:
            st = self.safetensors
            out = [Part("header", 0, st.header_size, st.header_xxh3_128)]
            out += [Part(f"tensor {t.name!r}", t.begin, t.end, t.xxh3_128) for t in st.tensors]
            return out
        return [Part(f"chunk {i} (bytes {i * chunk_size}-{min(self.size, (i + 1) * chunk_size)})",
                     i * chunk_size, min(self.size, (i + 1) * chunk_size), h)
                for i, h in enumerate(self.chunks)]


def chunk_ranges(size: int, chunk_size: int) -> list[tuple[int, int]]:
    """Fixed chunks of a non-safetensors file; an empty file has one empty chunk."""
    if size == 0:
        return [(0, 0)]
    return [(off, min(size, off + chunk_size)) for off in range(0, size, chunk_size)]


@dataclass(frozen=True, slots=True)
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

    def __post_init__(self) -> None:
        if not self.digest:
            object.__setattr__(self, "digest", compute_digest(self))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> FileEntry | None:
        return next((f for f in self.files if f.path == path), None)

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
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "name": self.name,
            "version": self.version,
            "published_at": self.published_at,
            "digest": self.digest,
            "piece_size": self.piece_size,
            **({"of": self.of} if self.of is not None else {}),
            "total_bytes": self.total_bytes,
            **_body(self),
        }

    def to_json(self) -> str:
        """Readable and diff-friendly: one line per file, and one per tensor."""
        def dump(v: Any) -> str:
            return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

        d = self.to_dict()
        lines = ["{"] + [f" {dump(k)}: {dump(v)}," for k, v in d.items() if k != "files"] + [' "files": [']
        for i, f in enumerate(d["files"]):
            end = "," if i < len(d["files"]) - 1 else ""
            st = f.pop("safetensors", None)
            if st is None:
                lines.append(f"  {dump(f)}{end}")
                continue
            tensors = st.pop("tensors")
            head = dump(f)[:-1] + ', "safetensors": ' + dump(st)[:-1] + ', "tensors": ['
            lines.append("  " + head)
            lines += [f"   {dump(t)}{',' if j < len(tensors) - 1 else ''}" for j, t in enumerate(tensors)]
            lines.append(f"  ]}}}}{end}")
        lines += [" ]", "}"]
        return "\n".join(lines) + "\n"


def _file_dict(f: FileEntry) -> dict[str, Any]:
    d: dict[str, Any] = {"path": f.path, "size": f.size, "mode": f"{f.mode:04o}", "xxh3_128": f.xxh3_128}
    if f.safetensors is not None:
        st = f.safetensors
        d["safetensors"] = {
            "header_size": st.header_size,
            "header_xxh3_128": st.header_xxh3_128,
            "metadata": dict(sorted(st.metadata.items())),
            "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                         "begin": t.begin, "end": t.end, "xxh3_128": t.xxh3_128} for t in st.tensors],
        }
    else:
        d["chunks"] = list(f.chunks)
    return d


def _body(m: Manifest) -> dict[str, Any]:
    return {"chunk_size": m.chunk_size, "files": [_file_dict(f) for f in m.files]}


def compute_digest(m: Manifest) -> str:
    body = {"format": m.format, **_body(m)}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return xxhash.xxh3_128(canonical.encode("utf-8")).hexdigest()


# -- parsing (every field of a manifest read from disk is untrusted) ------------------------------

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
        part_hashes = [st_info.header_xxh3_128] + [t.xxh3_128 for t in st_info.tensors]
    else:
        raw = fd.get("chunks")
        if not isinstance(raw, list):
            raise r.fail(where, "missing 'chunks' list")
        chunks = tuple(r.hex(h, f"{where}: chunks[{j}]") for j, h in enumerate(raw))
        if len(chunks) != len(chunk_ranges(size, chunk_size)):
            raise r.fail(where, f"{len(chunks)} chunk hashes for a {size}-byte file in {chunk_size}-byte chunks")
        part_hashes = list(chunks)
    if tree_hash(part_hashes) != fhash:
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
    tensors = []
    cursor = header_size
    for j, t in enumerate(v["tensors"]):
        tw = f"{where}: tensors[{j}]"
        t = r.obj(t, tw, {"name", "dtype", "shape", "begin", "end", "xxh3_128"},
                  {"name", "dtype", "shape", "begin", "end", "xxh3_128"})
        if not isinstance(t["name"], str):
            raise r.fail(tw, "name must be a string")
        if t["dtype"] not in DTYPE_BITS:
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
    return SafetensorsInfo(header_size, r.hex(v["header_xxh3_128"], where), dict(meta), tuple(tensors))


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
    """A manifest from its bytes (read by the caller, e.g. by descriptor inside a tier)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(source, f"larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(source, f"not valid JSON: {str(exc)[:200]}") from None
    return manifest_from_dict(data, source)


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
