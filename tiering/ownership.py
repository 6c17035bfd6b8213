"""What weightd can prove it made, in a tier root or a version directory: weightd removes, adopts or
places into only what passes these checks (``tiering.store.roots``: a root without weightd's marker
is adopted only if :func:`unexpected_in_root` finds nothing; a version directory is removed only if
:func:`unlisted_entries` finds nothing).
"""

from __future__ import annotations

import os
import re
import stat

from .content.manifest import MANIFEST_RELPATH, Manifest
from .content.names import validate_label, validate_name
from .errors import BadInput
from .layout import LOCKS, STAGING, TIER_MARKER, TRASH
from .safefs import Dir
from .versions import cached_manifest

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
_SHORTENED = re.compile(r"[A-Za-z0-9._~@-]+#[0-9a-f]{32}(?:\.ranges)?(?:\.resumable)?")
LOST_FOUND = "lost+found"   # a file system's own, at a mount root (mkfs makes it; fsck fills it)


def is_staging_name(n: str) -> bool:
    """An entry weightd makes in ``.staging``: ``NAME--X@V[.resumable]`` (a staging area), with its
    ``.json`` side file (and an earlier weightd's ``.lock``), or a write_atomic temporary of one."""
    target = Dir.atomic_target(n) if n.startswith(".") else n
    if target is None:
        return False
    if target.endswith((".json", ".lock")):
        target = target[:-5]
    if _SHORTENED.fullmatch(target):   # (NAME@VERSION too long for a file name: tiering.layout.fitted)
        return True
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
                _unexpected_under(d, [n], out, limit)
            except (BadInput, OSError):
                out.append(f"{n} (weightd's user cannot read all of it)")
    return out[:limit]


def _unexpected_under(d: Dir, parts: list[str], out: list[str], limit: int) -> None:
    """Into ``out``, up to ``limit``: what in the NAME (or ``org/``) directory ``d``, at ``parts`` in
    the tier, is not a version of it (or, under ``org/``, a model directory holding versions)."""
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
                    out.extend(_unexpected_in_version(sub, "/".join(parts), n, rel, limit - len(out)))
                elif len(parts) == 1:
                    _unexpected_under(sub, [*parts, n], out, limit)   # org/model/
                else:
                    out.append(rel)
            except (BadInput, OSError):
                out.append(f"{rel} (weightd's user cannot read all of it)")


def _unexpected_in_version(sub: Dir, name: str, label: str, rel: str, limit: int) -> list[str]:
    """The directory ``sub`` (at ``rel`` in the tier) holds a manifest: itself, when that is not the
    manifest of NAME@LABEL (or the names are not ours), else its entries the manifest does not list."""
    try:
        validate_name(name)
        validate_label(label)
        m = cached_manifest(sub, MANIFEST_RELPATH, str(sub.path / MANIFEST_RELPATH))
    except (BadInput, OSError):
        return [rel]
    if (m.name, m.version) != (name, label):
        return [rel]
    return [f"{rel}/{x}" for x in unlisted_entries(sub, m, limit)]
