"""A checked manifest parse kept on disk, by the SHA-256 of the manifest's bytes (issue 40).

Reading a 90,000-tensor manifest (16.5 MB of JSON) costs ~0.5 s: the JSON parse, the column checks
and the digest. Every process that touched such a version (an in-process ``path``, ``status``, a
``preload`` of a copy already there) paid it again. A node keeps each successful read of a large
manifest (at least :data:`MIN_BYTES`) in ``<state_dir>/manifests/<sha256 hex>``: the manifest's
fields and each safetensors file's tensor columns as raw arrays (:meth:`TensorTable.columns`), with
an xxh3-128 over the whole entry. A later process hashes the manifest's bytes (~10 ms for 16 MB),
finds the entry and makes the same :class:`Manifest` in a few tens of milliseconds, without parsing.

What is trusted, and why that is enough:
- an entry is only ever the result of a parse that passed every check, written by this user into a
  0700 directory of this user's (:func:`private_dir`; a directory anyone else could write makes the
  node run without the cache, said once in the debug log);
- the key is the SHA-256 of the exact bytes the manifest holds now: an edited or replaced manifest
  never meets the entry of the old one, so an entry cannot vouch for other bytes;
- an entry that does not read back whole (truncated, bit rot, another format, columns that do not fit
  together) is removed and the manifest parsed as if there were none.
At most :data:`KEEP` entries are kept (the least recently used go first); each is ~0.7x its
manifest's size.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import tempfile
import threading
from itertools import islice
from pathlib import Path
from typing import Any

import xxhash

from ..errors import TieringError
from ..safefs.paths import private_dir
from .manifest import FileEntry, Manifest, SafetensorsInfo
from .tensor_table import TensorTable

log = logging.getLogger(__name__)

MAGIC = b"WDMPC01\n"   # (a new layout gets a new magic: an old entry then reads as damaged and goes)
MIN_BYTES = 1 << 20    # smaller manifests parse in a few milliseconds
KEEP = 8
_LEN = struct.Struct("<Q")

_dir: Path | None = None
_lock = threading.Lock()


def use(d: Path | None) -> None:
    """Keep entries in ``d`` (made 0700 if missing), or in no directory (None, or ``d`` not private)."""
    global _dir
    try:
        # (not made in another user's state directory: root running a command there would leave a
        # directory the daemon's user could never use)
        if d is not None and os.stat(d.parent).st_uid != os.geteuid():
            raise TieringError(f"{d.parent} belongs to another user")
        _dir = private_dir(d, "the manifest parse cache") if d is not None else None
    except (TieringError, OSError) as exc:
        log.debug("manifest parse cache off: %s", exc)
        _dir = None


def load(key: bytes) -> Manifest | None:
    """The manifest kept under ``key`` (the SHA-256 of its bytes), or None."""
    d = _dir
    if d is None:
        return None
    path = d / key.hex()
    try:
        with open(path, "rb") as fh:
            blob = fh.read()
    except OSError:
        return None
    try:
        m = _decode(blob)
    except (ValueError, KeyError, TypeError, IndexError, struct.error, UnicodeDecodeError) as exc:
        log.debug("manifest parse cache: %s: dropped (%s)", path, exc)
        _remove(path)
        return None
    try:
        os.utime(path)  # (least recently used go first)
    except OSError:
        pass
    return m


def store(key: bytes, m: Manifest) -> None:
    """Keep ``m`` (a manifest that passed every check) under ``key``; any failure leaves no entry."""
    d = _dir
    if d is None:
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=".incomplete.", dir=d)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(_encode(m))
            os.replace(tmp, d / key.hex())
        except BaseException:
            _remove(Path(tmp))
            raise
        _trim(d)
    except OSError as exc:
        log.debug("manifest parse cache: cannot keep %s: %s", key.hex(), exc)


def _encode(m: Manifest) -> bytes:
    head = {"chunk_size": m.chunk_size, "format": m.format, "name": m.name, "version": m.version,
            "published_at": m.published_at, "piece_size": m.piece_size, "of": m.of, "digest": m.digest,
            "files": [_file_head(f) for f in m.files]}
    blobs = [json.dumps(head, ensure_ascii=False).encode()]
    for f in m.files:
        if f.safetensors is not None:
            blobs += f.safetensors.tensors.columns()
    body = b"".join(_LEN.pack(len(b)) + b for b in blobs)
    return MAGIC + xxhash.xxh3_128_digest(body) + body


def _file_head(f: FileEntry) -> dict[str, Any]:
    d: dict[str, Any] = {"path": f.path, "size": f.size, "mode": f.mode, "xxh3_128": f.xxh3_128, "chunks": f.chunks}
    if f.safetensors is not None:
        st = f.safetensors
        d["st"] = [st.header_size, st.header_xxh3_128, st.metadata]
    return d


def _decode(blob: bytes) -> Manifest:
    if blob[:8] != MAGIC or xxhash.xxh3_128_digest(memoryview(blob)[24:]) != blob[8:24]:
        raise ValueError("not an entry of this layout, or damaged")
    blobs, at = [], 24
    while at < len(blob):
        (n,) = _LEN.unpack_from(blob, at)
        if at + 8 + n > len(blob):
            raise ValueError("truncated")
        blobs.append(blob[at + 8:at + 8 + n])
        at += 8 + n
    head = json.loads(blobs[0])
    cols = iter(blobs[1:])
    files = tuple(_file(f, cols) for f in head["files"])
    if next(cols, None) is not None:
        raise ValueError("columns left over")
    return Manifest(files, head["chunk_size"], head["format"], head["name"], head["version"], head["published_at"],
                    head["piece_size"], head["of"], head["digest"])


def _file(f: dict[str, Any], cols: Any) -> FileEntry:
    st = None
    if "st" in f:
        size, digest, metadata = f["st"]
        table = TensorTable.from_columns(list(islice(cols, 8)))
        st = SafetensorsInfo(size, digest, metadata, table)
    return FileEntry(f["path"], f["size"], f["mode"], f["xxh3_128"], tuple(f["chunks"]), st)


def _trim(d: Path) -> None:
    with _lock:
        try:
            entries = sorted((e.stat().st_mtime_ns, e.path) for e in os.scandir(d) if e.is_file(follow_symlinks=False))
        except OSError:
            return
        for _, path in entries[:max(0, len(entries) - KEEP)]:
            _remove(Path(path))


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
