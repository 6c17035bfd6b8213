"""``weightd publish hf://ORG/REPO[@REVISION]``: a Hugging Face Hub repository into cold storage.

This process downloads (``tiering.sources.hf``, through ``tiering``'s surface: resolve the revision to
its commit SHA once, list the Hub's hashes, download in parallel and resumably, check every file),
then publishes the verified snapshot exactly as ``weightd publish DIR`` does, through
:class:`~weightd.cli.tiers.Backend` (the daemon when one answers, else in-process). The CLI downloads, not the daemon: the token stays in the
caller's environment (the daemon never holds one), the caller's network and ``HF_ENDPOINT`` apply,
and the daemon's part is the publish it already does (atomic, checked, its read-permission check on
the caller's files).

The download cache is ``STATE_DIR/imports/hf`` (an HF cache: ``models--ORG--REPO/blobs``), or
``~/.cache/weightd/hf`` for a user who may not write the state directory. An interrupted import
leaves it there, and the next one resumes; a published import, or bytes that failed their hash,
are removed from it. Imports of one repository take turns (``repo_lock``), as that removal would
pull the files from under another one.
"""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import output
from .app import AppContext
from .tiers import Backend


def cache_dir(app: AppContext) -> Path:
    """Where the download goes: under the state directory if this user may write it, else ~/.cache."""
    for d in (Path(app.config.settings.state_dir) / "imports" / "hf", Path.home() / ".cache" / "weightd" / "hf"):
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except PermissionError:
            continue
        if os.access(d, os.W_OK | os.X_OK):
            return d
    raise PermissionError(f"cannot write {d} (nor the state directory's imports/hf) for the download")


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


def publish_from_hub(app: AppContext, source: str, name: str | None, version_label: str | None,
                     include: Sequence[str], exclude: Sequence[str], sign_key: str | None,
                     signature: str | None) -> tuple[dict[str, Any], str, str]:
    """Import ``source`` (hf://ORG/REPO[@REVISION]); returns (publish report, name, version)."""
    from tiering import discard_snapshot, fetch_snapshot, parse_hub_ref, validate_name, validate_version
    ref = parse_hub_ref(source)
    name = name or ref.repo_id
    validate_name(name)
    if version_label is not None:
        validate_version(version_label)
    from .progress import quiet
    cache = cache_dir(app)
    with repo_lock(cache, ref.repo_id):
        output.note(f"{ref}: resolving and downloading into {cache}")
        snap = fetch_snapshot(ref, cache, include=include, exclude=exclude,
                              progress_bars=sys.stderr.isatty() and not quiet())
        version = version_label or snap.commit
        output.note(f"{ref}: commit {snap.commit}, {len(snap.files)} file(s) "
                    f"({output.format_bytes(snap.size)}) match the Hub's hashes; publishing {name}@{version}")
        with Backend(app) as b:
            r = b.publish(str(snap.path), name, version, sign_key=sign_key, signature=signature)
        discard_snapshot(snap)
    r["source"] = {"url": str(ref), "repo": ref.repo_id, "revision": ref.revision, "commit": snap.commit,
                   "files": len(snap.files), "bytes": snap.size,
                   "lfs_files": sum(1 for f in snap.files if f.sha256 is not None)}
    return r, name, r.get("version", version)


__all__ = ["cache_dir", "publish_from_hub", "repo_lock"]
