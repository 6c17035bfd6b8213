"""The files of a Hugging Face Hub import, from the Hub's listing to the publish (``tiering.sources.hf``).

What the Hub lists is checked before anything is downloaded (each path a manifest could carry, an
int size, hex hashes); what is downloaded is hashed against that listing, and the inode each file was
hashed from is recorded (:data:`Identity`, from ``fstat`` of the descriptor read); the publish is then
held to exactly those files and those inodes: :func:`prune_snapshot` removes from the snapshot
directory whatever this import did not check (files left by an earlier import), :func:`check_scanned`
compares the publish's scan with the checked set, :func:`inode_check` is the publish's ``check`` hook,
and :func:`still_checked` compares every file again once it is copied.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..content.names import validate_relpath
from ..content.scan import EXCLUDED_DIRS, CheckFn, ScannedFile
from ..errors import FileChanged, IntegrityError, TieringError, UnsafePath

HASH_BLOCK = 4 << 20
_SHA1_RE = re.compile(r"[0-9a-f]{40}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")

#: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of a file as it was hashed
Identity = tuple[int, int, int, int, int]


class HubError(TieringError):
    """The Hub refused or failed, or answered something unusable; exit 1 unless a subclass says otherwise."""


class HubHashMismatch(IntegrityError):
    """Downloaded bytes that do not hash to what the Hub lists for the file; exit 5, nothing published."""

    def __init__(self, path: str, algorithm: str, expected: str, actual: str) -> None:
        self.path, self.algorithm, self.expected, self.actual = path, algorithm, expected, actual
        super().__init__(f"{path}: the Hub lists {algorithm} {expected}, the downloaded bytes hash to {actual}")


@dataclass(frozen=True, slots=True)
class HubFile:
    path: str
    size: int
    blob_sha1: str                # the git blob id (of the LFS pointer, for an LFS file)
    sha256: str | None            # an LFS file's content hash, else None


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def with_wildcards(patterns: Sequence[str]) -> tuple[str, ...]:
    """``dir/`` means everything beneath it, as huggingface_hub's ``allow_patterns`` read it."""
    return tuple(p + "*" if p.endswith("/") else p for p in patterns)


def selected(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """As snapshot_download's allow/ignore patterns: any include (all if none), and no exclude."""
    include, exclude = with_wildcards(include), with_wildcards(exclude)
    if include and not any(fnmatchcase(path, p) for p in include):
        return False
    return not any(fnmatchcase(path, p) for p in exclude)


def _tool_dir(path: str) -> bool:
    """Under a directory a publish never copies (``.weightd``, ``.git``, ``.cache/huggingface``)."""
    return any(path == d or path.startswith(d + "/") for d in EXCLUDED_DIRS)


def hub_file(entry: Any, where: str) -> HubFile:
    """One ``RepoFile`` of the Hub's listing, checked: a relative path a manifest can carry, a
    non-negative int size, a 40-hex blob id, a 64-hex LFS sha256 (UnsafePath or HubError, one line)."""
    path = validate_relpath(entry.path, f"{where}: the Hub's listing")
    if "\\" in path:
        raise UnsafePath(f"{where}: the Hub's listing: {path!r}", "backslash in a path")
    size = entry.size
    if type(size) is not int or size < 0:
        raise HubError(f"{where}: the Hub lists {path!r} with size {size!r} (not a byte count)")
    blob = entry.blob_id
    if not isinstance(blob, str) or not _SHA1_RE.fullmatch(blob.lower()):
        raise HubError(f"{where}: the Hub lists {path!r} with git blob id {blob!r} (not 40 hex digits)")
    sha256 = None
    if entry.lfs is not None:
        sha256, lfs_size = getattr(entry.lfs, "sha256", None), getattr(entry.lfs, "size", size)
        if not isinstance(sha256, str) or not _SHA256_RE.fullmatch(sha256.lower()):
            raise HubError(f"{where}: the Hub lists {path!r} with LFS sha256 {sha256!r} (not 64 hex digits)")
        if lfs_size != size:
            raise HubError(f"{where}: the Hub lists {path!r} with size {size!r} and LFS size {lfs_size!r}")
        sha256 = sha256.lower()
    return HubFile(path, size, blob.lower(), sha256)


def checked_listing(entries: Iterable[Any], where: str, include: Sequence[str] = (),
                    exclude: Sequence[str] = ()) -> tuple[HubFile, ...]:
    """The files of a ``list_repo_tree`` answer that the globs select, each checked (:func:`hub_file`),
    sorted; a path listed twice is a HubError. Files under a tool's directory are never published."""
    from huggingface_hub.hf_api import RepoFile
    out: dict[str, HubFile] = {}
    for entry in entries:
        if not isinstance(entry, RepoFile):
            continue
        f = hub_file(entry, where)
        if f.path in out:
            raise HubError(f"{where}: the Hub lists {f.path!r} twice")
        if not _tool_dir(f.path) and selected(f.path, include, exclude):
            out[f.path] = f
    return tuple(out[k] for k in sorted(out))


def file_digest(path: Path, f: HubFile) -> tuple[str, str, str, Identity]:
    """(algorithm, expected, actual, identity) for one downloaded file: sha256 for LFS, git's blob sha1
    otherwise; the identity (and the size in the blob header) from ``fstat`` of the descriptor read,
    which must be the same before and after the read."""
    with open(path, "rb") as fh:
        before = identity(os.fstat(fh.fileno()))
        if f.sha256 is not None:
            h, algorithm, expected = hashlib.sha256(), "LFS sha256", f.sha256
        else:
            h, algorithm, expected = hashlib.sha1(usedforsecurity=False), "git blob sha1", f.blob_sha1
            h.update(b"blob %d\0" % before[2])
        while block := fh.read(HASH_BLOCK):
            h.update(block)
        if identity(os.fstat(fh.fileno())) != before:
            raise FileChanged(str(path), "changed while its hash was taken; try again")
    return algorithm, expected, h.hexdigest(), before


def remove_download(snapshot: Path, relpath: str) -> None:
    """One file's download out of the HF cache: the blob its snapshot link leads to, then the link
    (nothing else of the repository's cache: a retry fetches just this file again)."""
    link = snapshot / relpath
    blobs = (snapshot.parent.parent / "blobs").resolve()
    try:
        target = link.resolve(strict=True)
    except OSError:
        target = None
    if target is not None and target.parent == blobs:
        target.unlink(missing_ok=True)
    link.unlink(missing_ok=True)


def verify(snapshot: Path, files: Sequence[HubFile], workers: int = 4) -> dict[str, Identity]:
    """Every file hashed (in parallel: hashlib releases the GIL) against the Hub's hash; returns each
    file's identity as hashed. The first that differs has its download removed and raises
    HubHashMismatch."""
    def check(f: HubFile) -> Identity:
        if not (snapshot / f.path).is_file():
            raise HubError(f"{f.path}: listed by the Hub at this commit, but not downloaded")
        algorithm, expected, actual, ident = file_digest(snapshot / f.path, f)
        if actual != expected:
            remove_download(snapshot, f.path)
            raise HubHashMismatch(f.path, algorithm, expected, actual)
        return ident

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="hf-verify") as pool:
        return dict(zip((f.path for f in files), pool.map(check, files)))


def prune_snapshot(snapshot: Path, keep: Iterable[str]) -> list[str]:
    """Remove from the snapshot directory every file or link this import did not check (left there by
    an earlier import of other files of that commit), and directories left empty; returns what went."""
    keep = set(keep)
    gone: list[str] = []
    for dirpath, dirnames, filenames in os.walk(snapshot, topdown=False):
        here = Path(dirpath)
        for name in filenames + [d for d in dirnames if (here / d).is_symlink()]:
            rel = (here / name).relative_to(snapshot).as_posix()
            if rel not in keep and not _tool_dir(rel):
                (here / name).unlink()
                gone.append(rel)
        if here != snapshot and not any(here.iterdir()):
            here.rmdir()
    return sorted(gone)


def check_scanned(files: Sequence[ScannedFile], checked: Mapping[str, Identity], where: str) -> None:
    """The publish's scan holds exactly the checked files, each the inode that was hashed, unchanged."""
    scanned = {f.relpath: f for f in files}
    extra, missing = sorted(set(scanned) - set(checked)), sorted(set(checked) - set(scanned))
    if extra or missing:
        what = f"not checked: {', '.join(extra[:3])}" if extra else f"missing: {', '.join(missing[:3])}"
        raise FileChanged(where, f"the snapshot does not hold exactly the checked files ({what}); try again")
    for rel, f in scanned.items():
        if (f.dev, f.ino, f.size, f.mtime_ns) != checked[rel][:4]:
            raise FileChanged(f"{where}/{rel}", "changed after its hash was checked; try again")


def inode_check(snapshot: Path, checked: Mapping[str, Identity]) -> CheckFn:
    """The publish's ``check(path, st)``: every file it pins must be an inode that was hashed, with the
    size, mtime and ctime it had then (FileChanged otherwise: exit 5, nothing published)."""
    by_inode = {ident[:2]: ident for ident in checked.values()}
    names = {os.path.realpath(snapshot / rel): rel for rel in checked}   # (a blob's name: its file's)

    def check(path: str, st: os.stat_result) -> None:
        if stat.S_ISREG(st.st_mode) and by_inode.get((st.st_dev, st.st_ino)) != identity(st):
            shown = f"{names[path]} ({path})" if path in names else path
            raise FileChanged(shown, "not the file whose hash was checked, or changed since; try again")
    return check


def still_checked(snapshot: Path, checked: Mapping[str, Identity]) -> None:
    """Every checked file again, after the copy: the same inode, size, mtime and ctime."""
    for rel, ident in checked.items():
        try:
            st = os.stat(snapshot / rel)
        except OSError:
            st = None
        if st is None or identity(st) != ident:
            raise FileChanged(str(snapshot / rel), "changed while it was being published; try again")


__all__ = ["HubError", "HubFile", "HubHashMismatch", "Identity", "check_scanned", "checked_listing", "file_digest",
           "identity", "inode_check", "prune_snapshot", "remove_download", "selected", "still_checked", "verify",
           "with_wildcards"]
