"""``weightd publish hf://ORG/REPO[@REVISION]``: a Hugging Face Hub repository into cold storage.

This process downloads (``tiering.sources.hf``, through ``tiering``'s surface: resolve the revision to
its commit SHA once, list the Hub's hashes, download in parallel and resumably, check every file),
then publishes the verified snapshot exactly as ``weightd publish DIR`` does, through
:class:`~weightd.cli.tiers.Backend` (the daemon when one answers, else in-process). The CLI downloads, not the daemon: the token stays in the
caller's environment (the daemon never holds one), the caller's network and ``HF_ENDPOINT`` apply,
and the daemon's part is the publish it already does (atomic, checked, its read-permission check on
the caller's files).

The download cache is ``STATE_DIR/imports/hf`` (an HF cache per endpoint:
``endpoint-<hash>/models--ORG--REPO/blobs``), or ``~/.cache/weightd/hf`` for a user who may not write
the state directory (or a read-only one); either must be a real 0700 directory of this user's. An
interrupted import leaves it there, and the next one resumes; a published import is removed from it,
and so are bytes that fail their hash (that file's only). Only the files this import checked are published
(``_publish_checked``). Imports of one repository take turns (``repo_lock``), as that removal would
pull the files from under another one.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import output
from .app import AppContext
from .tiers import Backend


def _ours(d: Path) -> bool:
    """``d`` a real directory of this user's that no one else may enter; False if another user owns it
    (this user then downloads under ~/.cache); UnsafePath for a symlink or a directory open to others."""
    from tiering import UnsafePath
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(str(d), "the download cache is not a directory (a symlink?): remove it")
    if st.st_uid != os.geteuid():
        return False
    if st.st_mode & 0o077:
        raise UnsafePath(str(d), f"the download cache is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
                                 f"chmod 700 it")
    return True


def cache_dir(app: AppContext) -> Path:
    """Where the download goes: under the state directory if this user may write it, else ~/.cache; a
    real 0700 directory owned by this user either way."""
    tried = []
    for d in (Path(app.config.settings.state_dir) / "imports" / "hf", Path.home() / ".cache" / "weightd" / "hf"):
        tried.append(str(d))
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:        # (EACCES, EROFS, ...: the next place)
            continue
        if _ours(d) and os.access(d, os.W_OK | os.X_OK):
            return d
    raise PermissionError(f"cannot write {' nor '.join(tried)} for the download")


@contextmanager
def repo_lock(cache: Path, repo_id: str) -> Iterator[None]:
    """One import of a repository at a time per cache: the next waits (and says so), because an import
    that ends removes the repository's downloads, which another one may be using."""
    fd = os.open(cache / f"models--{repo_id.replace('/', '--')}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            output.note(f"hf://{repo_id}: another import of it is running here; waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _publish_checked(b: Backend, snap: Any, name: str, version: str, sign_key: str | None,
                     signature: str | None) -> dict[str, Any]:
    """Publish exactly the checked files: the snapshot pruned to them and scanned first; in this process
    the publish's scan admits only the inodes hashed (``snap.check``), and after it every file is
    compared again (a daemon's publish gets the checks before and after)."""
    gone = snap.publishable()
    if gone:
        output.note(f"{snap.ref}: {len(gone)} file(s) left in the snapshot by an earlier import removed from it "
                    f"(not selected or not checked now)")
    if b.client is not None:
        r = b.publish(str(snap.path), name, version, sign_key=sign_key, signature=signature)
    else:
        from tiering import plan_size, scan_checkpoint
        with output.progress_bar(f"publishing {name}@{version}", plan_size(scan_checkpoint(snap.path))) as advance:
            r = b.service.publish(snap.path, name, version, progress=advance, check=snap.check,
                                  sign_key=Path(sign_key) if sign_key else None,
                                  signature=Path(signature) if signature else None)
    snap.unchanged()
    return r


def publish_from_hub(app: AppContext, source: str, name: str | None, version_label: str | None,
                     include: Sequence[str], exclude: Sequence[str], sign_key: str | None,
                     signature: str | None) -> tuple[dict[str, Any], str, str]:
    """Import ``source`` (hf://ORG/REPO[@REVISION]); returns (publish report, name, version)."""
    from tiering import (discard_snapshot, fetch_snapshot, parse_hub_ref, resolve_commit, validate_name,
                         validate_version)
    ref = parse_hub_ref(source)
    name = name or ref.repo_id
    validate_name(name)
    if version_label is not None:
        validate_version(version_label)
    from .progress import quiet
    cache = cache_dir(app)
    with repo_lock(cache, ref.repo_id):
        commit = resolve_commit(ref, note=output.note)
        version = version_label or commit
        done = None
        if version_label is None:
            # only under the default label: NAME@<commit> is that commit; a label given with --version may
            # name other content, which the publish itself then refuses (VersionConflict), or finds the same
            with Backend(app, query=True) as b:
                done = _published(b, name, version)
        if done is not None:
            # (run again, from a CronJob say: the commit is published already, nothing is downloaded)
            output.note(f"{ref}: commit {commit} is published as {name}@{version} already: nothing to download")
            done["source"] = {"url": str(ref), "repo": ref.repo_id, "revision": ref.revision, "commit": commit,
                              "downloaded": 0}
            return done, name, version
        snap = fetch_snapshot(ref, cache, include=include, exclude=exclude, note=output.note,
                              progress_bars=sys.stderr.isatty() and not quiet(), commit=commit)
        output.note(f"{ref}: commit {snap.commit}, {len(snap.files)} file(s) "
                    f"({output.format_bytes(snap.size)}) match the Hub's hashes; publishing {name}@{version}")
        with Backend(app) as b:
            r = _publish_checked(b, snap, name, version, sign_key, signature)
        discard_snapshot(snap)
    r["source"] = {"url": str(ref), "repo": ref.repo_id, "revision": ref.revision, "commit": snap.commit,
                   "files": len(snap.files), "bytes": snap.size,
                   "lfs_files": sum(1 for f in snap.files if f.sha256 is not None)}
    return r, name, r.get("version", version)


def _published(b: Backend, name: str, version: str) -> dict[str, Any] | None:
    """NAME@VERSION's publish report if cold storage has it already (as publishing the same content
    again reports it: ``unchanged``), else None."""
    from ..errors import EXIT_NOT_FOUND
    try:
        rows = b.ops.versions(name)["versions"]
    except Exception as exc:   # (in-process CheckpointNotFound, or the daemon's answer with its exit code)
        if getattr(exc, "exit_code", None) == EXIT_NOT_FOUND:
            return None
        raise
    row = next((r for r in rows if r["version"] == version and r.get("published")), None)
    if row is None:
        return None
    cold = b.app.config.settings.tiers.cold
    where = f"{cold.url.rstrip('/')}/{name}/{version}" if cold.url else str(Path(cold.path) / name / version)
    return {"name": name, "version": version, "path": where, "digest": row["digest"], "bytes": row["bytes"],
            "unchanged": True, "seconds": 0.0, "signed_by": None}


__all__ = ["cache_dir", "publish_from_hub", "repo_lock"]
