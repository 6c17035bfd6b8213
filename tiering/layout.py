"""Where things live in a tier (design §3, contract), reached only through :mod:`tiering.safefs`.

``<root>/<NAME>/<VERSION>/`` holds a complete, verified checkpoint and its ``.weightd/manifest.json``;
``<root>/.staging/`` holds work in progress, ``<root>/.trash/`` what is being deleted, and
``<root>/.locks/`` the lock files. A version directory only ever appears by ``rename`` from staging.
Every function here takes an open :class:`~tiering.safefs.Dir` of the root (a ``Path`` is opened
for the call, as cold storage is: the configured path itself, nothing beneath it followed).
"""

from __future__ import annotations

import logging

import os
import re
import stat
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .content.manifest import MANIFEST_RELPATH, MAX_MANIFEST_BYTES, Manifest, parse_manifest
from .content.names import LABEL_SEP, split_label, validate_label, validate_name, validate_version
from .errors import BadInput, CheckpointNotFound, ColdUnreadable, LabelMismatch, ManifestError, UnsafePath
from .safefs import Dir, open_cold_root
from .safefs.dir import read_limited

log = logging.getLogger(__name__)

STAGING = ".staging"
TRASH = ".trash"
LOCKS = ".locks"
TIER_MARKER = ".weightd-tier"   # in a hot or warm root: "weightd made (or adopted) this tier"
HOT, WARM, COLD = "hot", "warm", "cold"
LOCAL_TIERS = (HOT, WARM)
DIR_MODE = 0o755          # NAME/ and version directories: the root's own mode is the gate


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier's place and budget (resolved from the config by the control plane)."""
    name: str
    path: Path
    capacity_bytes: int | None = None        # absolute budget, or ...
    capacity_fraction: float | None = None   # ... a share of the tier's file system
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    group: int | None = None                 # the root's group (readers such as the serving engine)

    def capacity(self) -> int:
        if self.capacity_bytes is not None:
            return self.capacity_bytes
        st = os.statvfs(existing_ancestor(self.path))
        return int(st.f_blocks * st.f_frsize * (self.capacity_fraction if self.capacity_fraction is not None else 1.0))

    @property
    def root_mode(self) -> int:
        return 0o750 if self.group is not None else 0o700


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest existing parent (for statvfs of a tier not created yet)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


@dataclass(frozen=True, slots=True)
class VersionDir:
    name: str
    version: str
    path: Path          # for people and engines; never opened by weightd through this string
    manifest: Manifest
    store: Any = field(default=None, compare=False)  # the ObjectCold holding it (object storage), else None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def rel(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def size(self) -> int:
        return self.manifest.total_bytes


@contextmanager
def as_dir(root: "Dir | Path | None") -> Iterator[Dir | None]:
    """An open Dir for ``root`` for the duration of a call (the caller's own, or opened here)."""
    if root is None or isinstance(root, Dir):
        yield root
        return
    d = open_cold_root(Path(root))
    try:
        yield d
    finally:
        if d is not None:
            d.close()



def version_rel(name: str, version: str) -> str:
    """``NAME/VERSION``; VERSION may be a local object's label (``V~p<hex>``, ``V~<kind>~<key>``)."""
    validate_name(name)
    validate_label(version)
    return f"{name}/{version}"


def is_whole(v: "VersionDir") -> bool:
    """A whole published version (not a partial copy or a companion artefact)."""
    return LABEL_SEP not in v.version


def part_of(v: "VersionDir") -> str | None:
    """The version a partial copy or companion belongs to (None for a whole version)."""
    return split_label(v.version)[0] if LABEL_SEP in v.version else None


def lock_name(name: str, version: str | None = None) -> str:
    base = name.replace("/", "--")
    return f"{base}@{version}.lock" if version else f"{base}.lock"


_PARSED: "OrderedDict[tuple[int, ...], Manifest]" = OrderedDict()
_PARSED_LOCK = threading.Lock()
PARSED_KEPT = 4096
RACY_NS = 20_000_000    # a file or directory changed this close to its reading is read again (racy-git's
                        # rule; file timestamps move in jiffies, at most 10 ms)


def _manifest_at(d: Dir, rel: str, where: str) -> Manifest:
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
    identity, as :func:`_manifest_at` keeps them): a version placed a moment ago is listed right away
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
            m = _manifest_at(d, f"{rel}/{MANIFEST_RELPATH}", where)
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
        m = _manifest_at(d, MANIFEST_RELPATH, str(d.path / MANIFEST_RELPATH))
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
            seen[b] = (ident, v)
            if v is None:
                others.append(b)
            elif v is not _NOT_OURS:
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
            m = _manifest_at(db, MANIFEST_RELPATH, str(db.path / MANIFEST_RELPATH))
        except (BadInput, OSError):  # names outside the patterns are not ours; a damaged one is absent
            return _NOT_OURS
    return VersionDir(name, b, d.path / b, m) if m.name == name and m.version == b else _NOT_OURS


def list_versions(root: "Dir | Path | None") -> list[VersionDir]:
    """Every complete version under a tier root (``NAME`` may be ``org/model``); symlinks are skipped.
    Each NAME directory's listing is kept while its mtime stays (see :func:`_children`): a tier of
    hundreds of versions is listed in an ``fstatat`` per directory."""
    out: list[VersionDir] = []
    with as_dir(root) as d:
        if d is None:
            return out
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


# -- what weightd can prove it made -------------------------------------------------------
#: what weightd itself writes in a version's ``.weightd/`` (the manifest; p2p's checkpoint.torrent;
#: the signature and the record that it was checked here, ``tiering.store.trust``)
META_FILES = frozenset({"manifest.json", "checkpoint.torrent", "model.sig", "trust.json"})
_LT_PARTS = re.compile(r"\.[0-9a-f]{40}(?:[0-9a-f]{24})?\.parts")   # libtorrent's part file (a partial swarm copy)


def unlisted_entries(d: Dir, m: Manifest, limit: int = 3) -> list[str]:
    """The entries of the version directory ``d`` that are neither a file its manifest ``m`` lists (a
    regular file, or a link planted in its place), a directory on the way to one, nor weightd's own (``.weightd/`` holding only
    META_FILES and their write_atomic temporaries, libtorrent's part file): at most ``limit``, as
    paths in the version. Empty: everything there is what weightd put there (a file missing is
    fine: removing what is left loses nothing of anyone's)."""
    files = {e.path for e in m.files}
    dirs = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    meta_dir = MANIFEST_RELPATH.split("/", 1)[0]
    out: list[str] = []

    def walk(cur: Dir, prefix: str) -> None:
        for n, st in cur.entries():
            if len(out) >= limit:
                return
            rel = f"{prefix}{n}"
            if stat.S_ISDIR(st.st_mode) and (rel in dirs or rel == meta_dir):
                with cur.sub(n) as sub:
                    if rel == meta_dir:
                        out.extend(f"{rel}/{x}" for x, xst in sub.entries() if not _plain(xst)
                                   or (x not in META_FILES and Dir.atomic_target(x) not in META_FILES))
                        del out[limit:]
                    else:
                        walk(sub, rel + "/")
            elif rel in files and _plain(st):
                continue
            elif not prefix and _LT_PARTS.fullmatch(n) and stat.S_ISREG(st.st_mode):
                continue
            else:
                out.append(rel if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)
                           else f"{rel} (a {_kind(st)})")
    walk(d, "")
    return out


def _plain(st: os.stat_result) -> bool:
    """A regular file, or a symlink planted in its place (removing the link loses nothing of anyone's:
    its target is never followed)."""
    return stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)


def _kind(st: os.stat_result) -> str:
    return "symlink" if stat.S_ISLNK(st.st_mode) else "special file"


_STAGING_NAME = re.compile(r"(?P<name>[^@/]+)@(?P<label>[^@/]+?)(?:\.resumable)?")
LOST_FOUND = "lost+found"   # a file system's own, at a mount root (mkfs makes it; fsck fills it)


def is_staging_name(n: str) -> bool:
    """An entry weightd makes in ``.staging``: ``NAME--X@V[.resumable]`` (a staging area), with its
    ``.json`` side file (and an earlier weightd's ``.lock``), or a write_atomic temporary of one."""
    target = Dir.atomic_target(n) if n.startswith(".") else n
    if target is None:
        return False
    if target.endswith((".json", ".lock")):
        target = target[:-5]
    m = _STAGING_NAME.fullmatch(target)
    if m is None:
        return False
    try:
        validate_name(m.group("name").replace("--", "/", 1))
        validate_label(m.group("label"))
    except BadInput:
        return False
    return True


def _private_unexpected(root: Dir, n: str, st: os.stat_result) -> list[str]:
    """What in ``.trash``, ``.staging`` or ``.locks`` of an unmarked root weightd would not have put
    there: reconciliation empties ``.trash`` and reaps staging areas, so a root is only taken for
    weightd's if those hold nothing but weightd's own names (``.trash``: nothing at all)."""
    if not stat.S_ISDIR(st.st_mode):
        return [n]
    try:
        with root.sub(n) as d:
            inside = d.entries()
    except (BadInput, OSError):
        return [f"{n}/ (weightd's user cannot open it)"]
    if n == TRASH:
        return [f"{n}/{x}" for x, _ in inside]
    if n == STAGING:
        return [f"{n}/{x}" for x, xst in inside if not is_staging_name(x)
                or (x.endswith((".json", ".lock")) and not stat.S_ISREG(xst.st_mode))
                or (not x.startswith(".") and not x.endswith((".json", ".lock")) and not stat.S_ISDIR(xst.st_mode))]
    return [f"{n}/{x}" for x, xst in inside   # .locks: lock files only
            if not (stat.S_ISREG(xst.st_mode) and (x.endswith(".lock") or Dir.atomic_target(x) is not None))]


def _is_mount_root(root: Dir) -> bool:
    try:
        return os.fstat(root.fd).st_dev != os.stat("..", dir_fd=root.fd).st_dev
    except OSError:
        return False


def unexpected_in_root(root: Dir, limit: int = 3) -> list[str]:
    """What in a tier root is not weightd's layout (at most ``limit``, as paths in the tier): anything
    but TIER_MARKER, ``.staging``/``.trash``/``.locks`` holding only what weightd puts there
    (:func:`_private_unexpected`), ``NAME/`` (and ``org/model/``) directories holding version
    directories whose every entry is their manifest's (:func:`unlisted_entries`), libtorrent's part
    files beside them, and ``lost+found`` when the root is a mount point (the file system's own).
    An entry weightd's user cannot open is reported too (it cannot be weightd's). Empty: the root is
    shaped as weightd makes one (whether weightd made it is for the caller: see TierRoots.foreign)."""
    out: list[str] = []

    def names(d: Dir, parts: list[str]) -> None:
        for n, st in d.entries():
            if len(out) >= limit:
                return
            rel = "/".join([*parts, n])
            if stat.S_ISREG(st.st_mode) and _LT_PARTS.fullmatch(n):
                continue
            if not stat.S_ISDIR(st.st_mode):
                out.append(rel)
                continue
            try:
                sub = d.sub(n)
            except (BadInput, OSError):
                out.append(f"{rel} (weightd's user cannot open it)")
                continue
            with sub:
                try:
                    if sub.is_file(MANIFEST_RELPATH):
                        try:
                            validate_name("/".join(parts))
                            validate_label(n)
                            m = _manifest_at(sub, MANIFEST_RELPATH, str(sub.path / MANIFEST_RELPATH))
                        except (BadInput, OSError):
                            out.append(rel)
                            continue
                        if (m.name, m.version) != ("/".join(parts), n):
                            out.append(rel)
                            continue
                        out.extend(f"{rel}/{x}" for x in unlisted_entries(sub, m, limit - len(out)))
                    elif len(parts) == 1:
                        names(sub, [*parts, n])   # org/model/
                    else:
                        out.append(rel)
                except (BadInput, OSError):
                    out.append(f"{rel} (weightd's user cannot read all of it)")

    for n, st in root.entries():
        if len(out) >= limit:
            break
        if n == TIER_MARKER or Dir.atomic_target(n) == TIER_MARKER:
            continue
        if n in (STAGING, TRASH, LOCKS):
            out.extend(_private_unexpected(root, n, st))
            continue
        if n == LOST_FOUND and stat.S_ISDIR(st.st_mode) and _is_mount_root(root):
            continue
        try:
            validate_name(n)
        except BadInput:
            out.append(n)
            continue
        if not stat.S_ISDIR(st.st_mode) or n.startswith("."):
            out.append(n)
            continue
        try:
            d = root.sub(n)
        except (BadInput, OSError):
            out.append(f"{n} (weightd's user cannot open it)")
            continue
        with d:
            try:
                names(d, [n])
            except (BadInput, OSError):
                out.append(f"{n} (weightd's user cannot read all of it)")
    return out[:limit]


# -- removal -----------------------------------------------------------------------------
def remove_tree(root: Dir, rel: str) -> bool:
    """Make ``root/rel`` disappear at once (rename into ``.trash`` by descriptor), then delete it by
    descriptor. A symlink in the way is removed itself; nothing is followed."""
    parent_rel, _, last = rel.rpartition("/")
    parent = root.sub_if_exists(parent_rel) if parent_rel else root
    if parent is None or parent.lstat(last) is None:
        if parent is not None and parent is not root:
            parent.close()
        return False
    trash = root.private(TRASH)
    target = f"{last}.{uuid.uuid4().hex[:12]}"
    try:
        parent.rename(last, trash, target)
        parent.fsync()
        trash.remove(target)
        return True
    except FileNotFoundError:
        return False
    finally:
        trash.close()
        if parent is not root:
            parent.close()


def prune_empty_parents(root: Dir, rel: str) -> None:
    """Remove an empty ``org/`` left after a version is gone (never ``root`` itself)."""
    parts = rel.split("/")[:-1]
    while parts:
        parent_rel, last = "/".join(parts[:-1]), parts[-1]
        parent = root.sub_if_exists(parent_rel) if parent_rel else root
        if parent is None:
            return
        try:
            os.rmdir(last, dir_fd=parent.fd)
        except OSError:
            return
        finally:
            if parent is not root:
                parent.close()
        parts = parts[:-1]
