"""A transfer on disk as an object, on the model of containerd's content writer.

:func:`open_staging` makes (or, for a P2P transfer, takes over) ``.staging/<id>/`` and its side file
``.staging/<id>.json`` (expected size, owner, whether it can resume); the caller writes beneath
``StagingArea.dir`` by descriptor; :meth:`StagingArea.commit` writes the manifest, checks every
file's size and digest against it (unless the filler already did), fsyncs, and renames the tree to
``NAME/VERSION`` refusing to overwrite anything there; :meth:`StagingArea.abort` removes it. Used as a
context manager, a staging area is aborted on any exception and its side file removed either way.
Callers hold the version's lock throughout.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..content.build import verify_checkpoint
from ..content.manifest import MANIFEST_RELPATH, Manifest
from ..layout import DIR_MODE, STAGING, fitted
from ..progress import ProgressFn, set_phase
from ..safefs import Dir
from ..versions import remember_manifest
from .trust import Signed, check_bytes, check_digests, write_record

RESUMABLE_MAX_AGE_S = 24 * 3600


def staging_id(name: str, version: str) -> str:
    """One staging area per NAME@VERSION and tier (callers hold the version's lock): what a crashed
    transfer left is found again, and it never counts against a retry of its own version."""
    return fitted(f"{name.replace('/', '--')}@{version}", ".resumable")


@dataclass(slots=True)
class StagingArea:
    """A transfer in progress: ``.staging/<id>/`` (what will be renamed into place) and
    ``.staging/<id>.json`` beside it (expected size, owner, whether it can resume)."""
    area: Dir              # <root>/.staging
    sid: str
    dir: Dir               # <root>/.staging/<sid>
    info: dict = field(default_factory=dict)
    keep_on_error: bool = False   # a resumable filler (every part is checked again on the next try)

    @property
    def path(self) -> Path:
        return self.area.path / self.sid

    def mark_resumable(self) -> None:
        """Only a transfer that can really resume (libtorrent re-checks what is there) keeps its bytes
        across a crash; a plain copy's leftovers are removed at once."""
        self.info["resumable"] = True
        self.area.write_atomic(f"{self.sid}.json", json.dumps(self.info).encode(), 0o600)

    def write_manifest(self, m: Manifest) -> None:
        meta, _, fname = MANIFEST_RELPATH.rpartition("/")
        with self.dir.sub(meta, create=True, mode=DIR_MODE) as d:
            d.write_atomic(fname, m.to_json().encode("utf-8"), 0o644)
            remember_manifest(d, fname, m)   # (ours, in our private staging area: no need to parse it back)

    def commit(self, root: Dir, name: str, version: str, m: Manifest, *, verified: bool,
               signed: "Signed | None" = None, checked_at: float = 0.0, progress: "ProgressFn | None" = None,
               crypto_digests: "dict[str, str] | None" = None) -> None:
        """Write ``m``, check the staged files against it (sizes and digests; skipped when the filler
        already ``verified`` them), fsync the tree, rename it to ``NAME/VERSION`` (never over an
        existing entry) and fsync the parent: when this returns the version is durable.

        ``signed``: the bytes must also be what was signed; checked in the same read as the manifest's
        parts (even when the filler verified them: its check was not a cryptographic one), then the
        signature and its trust record are written beside the manifest. ``crypto_digests``: every
        file's signed digest as the filler took it from the bytes it wrote and verified (one pass, no
        read here)."""
        self.write_manifest(m)
        taken = crypto_digests if verified and crypto_digests is not None \
            and {f.path for f in m.files} <= crypto_digests.keys() else None   # (in the filler's one pass)
        if (signed is not None and taken is None) or not verified:
            set_phase(progress, "verify", total=m.total_bytes)
        if signed is not None:
            if taken is not None:
                check_digests(m, signed, f"{name}@{version}", taken)
            else:
                check_bytes(self.dir, m, signed, f"{name}@{version}", progress=progress)
            write_record(self.dir, signed, checked_at)
        elif not verified:
            verify_checkpoint(self.dir, m, progress=progress).raise_for_problems()
        set_phase(progress, "fsync", total=0)
        fsync_dirs(self.dir)
        with root.sub(name, create=True, mode=DIR_MODE) as parent:
            self.area.rename(self.sid, parent, version)
            parent.fsync()
        self.area.fsync()

    def abort(self) -> None:
        """Remove what was staged (nothing is left to resume)."""
        self.area.remove(self.sid)

    def close(self) -> None:
        self.dir.close()

    def __enter__(self) -> "StagingArea":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        keep = exc_type is not None and self.keep_on_error and self.info.get("resumable") \
            and _worth_keeping(exc[0] if exc else None)
        try:
            if exc_type is not None and not keep:
                self.abort()
        finally:
            if not keep:
                self.area.unlink(f"{self.sid}.json")
            self.close()


def fsync_dirs(d: Dir) -> None:
    """fsync every directory beneath ``d``, then ``d`` (what :meth:`Dir.fsync_tree` does), telling
    directories from files by the type the listing gives (``d_type``) instead of an ``lstat`` of every
    entry: a compile cache's 10,000 files cost no system call here. Each directory is opened
    ``O_NOFOLLOW | O_DIRECTORY`` beneath its parent's descriptor (a symlink is never entered)."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=d.fd)   # (its own offset)
    try:
        with os.scandir(fd) as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    finally:
        os.close(fd)
    for name in sorted(names):
        with d.sub(name) as sub:
            fsync_dirs(sub)
    d.fsync()


def _worth_keeping(exc: object) -> bool:
    """A failure a later try can build on (a timeout, the store giving up, an interruption); not a
    full tier (the space is wanted back) nor bytes that failed their check (a hostile or rotten
    object: nothing of it is kept)."""
    from ..errors import IntegrityError, NoSpace
    if isinstance(exc, (NoSpace, IntegrityError)) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC,
                                                                                                  errno.EDQUOT)):
        return False
    return True


def open_staging(root: Dir, name: str, version: str, expected_bytes: int, *, resume: bool = True,
                 now: Callable[[], float] = time.time) -> StagingArea:
    """Create (or take over) the staging area of NAME@VERSION; call with the version's lock held.
    ``resume``: keep what a P2P transfer left (libtorrent re-checks every piece); publish never resumes
    (whatever is there is removed: in cold storage others may have put it there)."""
    area = root.private(STAGING)
    sid = staging_id(name, version)
    old = area.read_json(f"{sid}.json")
    st = area.lstat(sid)
    keep = resume and st is not None and stat.S_ISDIR(st.st_mode) and isinstance(old, dict) \
        and bool(old.get("resumable")) and staging_fresh(old, now())
    if st is not None and not keep:
        area.remove(sid)  # a plain copy's leftovers, a stale resume, or something planted: never reused
    created = float(old["created"]) if keep else now()
    area.mkdir(sid, DIR_MODE)
    d = area.sub(sid)
    info = {"name": name, "version": version, "bytes": expected_bytes, "pid": os.getpid(),
            "resumable": keep, "created": created,
            "digest": old.get("digest") if keep else None}  # (what a kept area was filled for)
    area.write_atomic(f"{sid}.json", json.dumps(info).encode(), 0o600)
    return StagingArea(area, sid, d, info)


def staging_fresh(meta: dict, now: float | None = None) -> bool:
    try:
        return (time.time() if now is None else now) - float(meta.get("created", 0)) < RESUMABLE_MAX_AGE_S
    except (TypeError, ValueError):
        return False


def staging_keep(area: Dir, sid: str, now: float | None = None) -> bool:
    """Should a stale (unlocked) staging area be kept for a later resume?"""
    meta = area.read_json(f"{sid}.json")
    return isinstance(meta, dict) and bool(meta.get("resumable")) and staging_fresh(meta, now) \
        and area.is_dir(sid)


def staging_ids(root: Dir | None) -> tuple[Dir | None, list[str]]:
    """The staging directory (if any) and the id of every staging area in it."""
    if root is None or not root.is_dir(STAGING):
        return None, []
    area = root.sub(STAGING)
    ids = set()
    for n, _ in area.entries():
        if n.startswith("."):
            sid = _temporary_of(n)
            if sid is not None:  # a side file being written, or one a crash cut short: its id's owner decides
                ids.add(sid)
            continue
        ids.add(n.rsplit(".", 1)[0] if n.endswith((".json", ".lock")) else n)
    return area, sorted(ids)


def _temporary_of(n: str) -> str | None:
    """The staging id whose side file ``n`` is a ``Dir.write_atomic`` temporary of, or None."""
    target = Dir.atomic_target(n)
    return target[:-len(".json")] if target is not None and target.endswith(".json") else None


def staging_temporaries(area: Dir) -> dict[str, list[str]]:
    """Temporaries of side files, by staging id: only ever live while the version's lock is held, so
    one found by a holder of that lock (or of no lock, for an id without one) is what a crash left."""
    out: dict[str, list[str]] = {}
    for n, _ in area.entries():
        sid = _temporary_of(n) if n.startswith(".") else None
        if sid is not None:
            out.setdefault(sid, []).append(n)
    return out


def staging_expected_bytes(area: Dir, sid: str) -> int:
    meta = area.read_json(f"{sid}.json")
    try:
        return max(0, int(meta["bytes"])) if area.is_dir(sid) else 0
    except (KeyError, TypeError, ValueError):
        return 0
