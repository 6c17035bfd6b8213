"""The complete versions in a tier root: one read by name (:func:`read_version`), every one listed
(:func:`list_versions`), every one of a NAME (:func:`published_versions`).

A tier of hundreds of versions is listed often (space accounting, delta donors, status), so both
steps are kept by file identity: a manifest is parsed once per file (:func:`cached_manifest`), and a
NAME directory's listing is kept while its mtime stays (:func:`_children`). Racy-git's rule applies
to both: what changed within ``RACY_NS`` of its reading is read again next time.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .content.manifest import MANIFEST_RELPATH, MAX_MANIFEST_BYTES, Manifest
from .content.manifest_parse import parse_manifest
from .content.names import validate_label, validate_name, validate_version
from .errors import BadInput, CheckpointNotFound, ColdUnreadable, LabelMismatch, ManifestError, UnsafePath
from .layout import VersionDir, as_dir, version_rel
from .safefs import Dir
from .safefs.dir import read_limited
from .version_index import DAMAGED, list_indexed

log = logging.getLogger(__name__)

_PARSED: "OrderedDict[tuple[int, ...], Manifest]" = OrderedDict()
_PARSED_LOCK = threading.Lock()
PARSED_KEPT = 4096
RACY_NS = 20_000_000    # a file or directory changed this close to its reading is read again (racy-git's
                        # rule; file timestamps move in jiffies, at most 10 ms)


def cached_manifest(d: Dir, rel: str, where: str) -> Manifest:
    """The manifest file at ``rel`` under ``d``, parsed once per file: a manifest in a tier is written
    once and never changed in place, so its parse is kept by the file's identity (device, inode, size,
    mtime and ctime: a replaced or rewritten file is parsed again; one written within RACY_NS of the
    read is not kept, as timestamps are coarse). Listing a tier of hundreds of
    versions (space accounting, delta donors) then costs an open and an fstat per version."""
    t0 = time.time_ns()
    fd = d.open_read(rel)
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with _PARSED_LOCK:
            m = _PARSED.get(key)
            if m is not None:
                _PARSED.move_to_end(key)
                return m
        if st.st_size > MAX_MANIFEST_BYTES:
            raise BadInput(f"{where}: larger than {MAX_MANIFEST_BYTES} bytes")
        raw = read_limited(fd, MAX_MANIFEST_BYTES, where)
    finally:
        os.close(fd)
    m = parse_manifest(raw, where)
    # (read whole, as fstat saw it, and not written within the racy window: else not kept)
    if len(raw) == st.st_size and t0 - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
        with _PARSED_LOCK:
            _PARSED[key] = m
            while len(_PARSED) > PARSED_KEPT:
                _PARSED.popitem(last=False)
    return m


def remember_manifest(d: Dir, rel: str, m: Manifest) -> None:
    """Keep ``m`` as the parse of the manifest file this process just wrote at ``rel`` (by file
    identity, as :func:`cached_manifest` keeps them): a version placed a moment ago is listed right away
    by the next preload's space accounting and donor search, and parsing it again there is most of
    their cost (a LoRA adapter's manifest lists hundreds of tensors)."""
    try:
        fd = d.open_read(rel)
    except (BadInput, OSError):
        return
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    with _PARSED_LOCK:
        _PARSED[(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)] = m
        while len(_PARSED) > PARSED_KEPT:
            _PARSED.popitem(last=False)


def read_version(root: "Dir | Path | None", name: str, version: str, *, strict: bool = False) -> VersionDir | None:
    """The complete version at ``root/NAME/VERSION``, or None. A symlink anywhere on the way reads as
    absent. A broken manifest reads as absent too, unless ``strict`` (cold storage, asked for by name:
    then it is a ManifestError, so an operator learns that the version is there but damaged)."""
    rel = version_rel(name, version)
    with as_dir(root) as d:
        if d is None:
            return None
        where = str(d.path / rel / MANIFEST_RELPATH)
        try:
            m = cached_manifest(d, f"{rel}/{MANIFEST_RELPATH}", where)
        except ManifestError:
            if strict:
                raise
            return None
        except (CheckpointNotFound, FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as exc:
            if strict:
                raise ColdUnreadable(f"{name}@{version}", str(d.path / rel), exc.strerror or "permission denied") from None
            return None
        except UnsafePath as exc:
            if strict and d.is_dir(rel):
                raise ManifestError(where, exc.reason) from None
            return None
        except (BadInput, OSError) as exc:
            if strict:
                raise ManifestError(where, str(exc)) from None
            return None
        if m.name != name or m.version != version:
            if strict:
                raise LabelMismatch(where, f"it describes {m.name}@{m.version}, not {name}@{version}")
            return None
        return VersionDir(name, version, d.path / name / version, m)


def manifest_of(d: Dir, name: str, version: str) -> Manifest | None:
    """The manifest of NAME@VERSION in the version directory ``d`` (wherever it is now), or None when
    there is none, it is unreadable or damaged, or it describes another version."""
    try:
        validate_name(name)
        validate_label(version)
        m = cached_manifest(d, MANIFEST_RELPATH, str(d.path / MANIFEST_RELPATH))
    except (BadInput, OSError):
        return None
    return m if (m.name, m.version) == (name, version) else None


_LISTED: "OrderedDict[tuple[str, str, int, int], tuple[int, list[VersionDir], list[str], dict[str, Any]]]" = OrderedDict()
LISTED_KEPT = 8192


def _children(parent: Dir, entry: str, parts: list[str]) -> tuple[list[VersionDir], list[str]]:
    """The complete versions directly under ``parent/entry`` (a NAME directory, ``parts`` its path in
    the tier) and its other subdirectories.

    Kept by the directory's identity and mtime: a version appears or goes only by a rename in this
    directory, which changes its mtime, and a listing taken within RACY_NS of the directory's last
    change is not kept (timestamps are coarse). A kept listing costs one ``fstatat``. When the
    directory did change (an ``org/`` directory gains a model with every first preload of one), each
    entry is looked at again only if its identity (inode and ctime, which a rename sets) changed:
    one ``fstatat`` per entry instead of opening it and its manifest."""
    t0 = time.time_ns()   # (racy-git's rule compares with when the listing started, not when it ended)
    try:
        st = os.stat(entry, dir_fd=parent.fd, follow_symlinks=False)
    except OSError:
        return [], []
    if not stat.S_ISDIR(st.st_mode):
        return [], []
    key = (str(parent.path), entry, st.st_dev, st.st_ino)
    with _PARSED_LOCK:
        hit = _LISTED.get(key)
        if hit is not None and hit[0] == st.st_mtime_ns:
            _LISTED.move_to_end(key)
            return list(hit[1]), list(hit[2])
    known: dict[str, tuple[tuple[int, int], VersionDir | None]] = hit[3] if hit is not None else {}
    seen: dict[str, tuple[tuple[int, int], VersionDir | None]] = {}
    versions: list[VersionDir] = []
    others: list[str] = []
    name = "/".join(parts)
    try:
        d = parent.sub(entry)
    except (BadInput, OSError):   # (a symlink or something else put in its place: not ours)
        return [], []
    with d:
        for b in d.subdirs():
            try:
                bst = os.stat(b, dir_fd=d.fd, follow_symlinks=False)
            except OSError:
                continue
            ident = (bst.st_ino, bst.st_ctime_ns)
            old = known.get(b)
            if old is not None and old[0] == ident and t0 - bst.st_ctime_ns > RACY_NS:
                v = old[1]
            else:
                v = _version_in(d, b, name)
            if v is not DAMAGED:     # (never kept: the next listing reads it again)
                seen[b] = (ident, v)
            if v is None:
                others.append(b)
            elif v is not _NOT_OURS and v is not DAMAGED:
                versions.append(v)
        if os.fstat(d.fd).st_mtime_ns == st.st_mtime_ns and t0 - st.st_mtime_ns > RACY_NS:
            with _PARSED_LOCK:
                _LISTED[key] = (st.st_mtime_ns, list(versions), list(others), seen)
                while len(_LISTED) > LISTED_KEPT:
                    _LISTED.popitem(last=False)
    return versions, others


_NOT_OURS: Any = object()   # a directory with a manifest that is not a version of this NAME


def _version_in(d: Dir, b: str, name: str) -> "VersionDir | None":
    """``d/b`` as a version of NAME (``_NOT_OURS`` if it has a manifest but is not one), or None
    when it has no manifest (a model directory under ``org/``)."""
    with d.sub(b) as db:
        if not db.is_file(MANIFEST_RELPATH):
            return None
        try:
            validate_name(name)
            validate_label(b)
        except BadInput:             # names outside the patterns are not ours
            return _NOT_OURS
        try:
            m = cached_manifest(db, MANIFEST_RELPATH, str(db.path / MANIFEST_RELPATH))
        except (BadInput, OSError):  # a damaged manifest, or one still being written: absent, and looked at again
            return DAMAGED
    return VersionDir(name, b, d.path / b, m) if m.name == name and m.version == b else _NOT_OURS


def list_versions(root: "Dir | Path | None") -> list[VersionDir]:
    """Every complete version under a tier root (``NAME`` may be ``org/model``); symlinks are skipped.
    From this process's index of the root (:mod:`tiering.version_index`: one read of the kernel's
    change queue when nothing changed); a root it cannot index (a network file system, no watch left)
    is scanned, each NAME directory's listing kept while its mtime stays (see :func:`_children`)."""
    out: list[VersionDir] = []
    with as_dir(root) as d:
        if d is None:
            return out
        indexed = list_indexed(d, _version_in)
        if indexed is not None:
            return indexed
        for a in d.subdirs():
            if a.startswith("."):
                continue
            found, models = _children(d, a, [a])
            out += found
            if models:
                with d.sub(a) as da:
                    for b in models:
                        out += _children(da, b, [a, b])[0]
    return out


def published_versions(root: "Dir | Path | None", name: str, *, strict: bool = False) -> list[VersionDir]:
    """Every complete version of NAME under ``root``. ``strict`` (resolving the latest): a version
    this process cannot read, or whose manifest is damaged, is an error (ColdUnreadable,
    ManifestError), never skipped: skipping it would silently serve an older version."""
    validate_name(name)
    out = []
    with as_dir(root) as d:
        if d is None:
            return out
        try:
            base = d.sub_if_exists(name) if d.is_dir(name) else None
            if base is None:
                return out
            with base:
                labels = base.subdirs()
        except PermissionError as exc:
            if strict:
                raise ColdUnreadable(name, str(d.path / name), exc.strerror or "permission denied") from None
            return out
        for label in labels:
            try:
                validate_version(label)
            except BadInput:
                continue  # not a version label: not ours
            try:
                v = read_version(d, name, label, strict=strict)
            except LabelMismatch as exc:  # (a copied or renamed directory, "v2-old": not that version)
                log.warning("skipping %s: %s", exc.source, exc.reason)
                continue
            except BadInput:
                if strict:
                    raise
                continue
            if v is not None:
                out.append(v)
    return out
