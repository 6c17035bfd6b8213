"""``weightd gc``'s part in Hub imports: remove the downloads that imports left behind.

A Hub import (``weightd publish hf://``, intent's ``[[import]]``) downloads into
``STATE_DIR/imports/hf/endpoint-<hash>/models--ORG--REPO`` and removes that once it is published. One that
was interrupted (killed, a network that went away, a full disk) leaves it for the next import of the
repository to resume; one that nobody runs again would keep it for good. ``gc`` removes a repository's
downloads when no import of it is running (its :func:`~weightd.node.hub_import.repo_lock` is free, and
held while they are removed) and nothing in them was written for :data:`IMPORT_IDLE_S`.

Only real directories under the cache are entered; a symlink is left where it is and nothing is followed
out of the cache (``shutil.rmtree`` removes a link, never its target). A user's own cache
(``~/.cache/weightd/hf``, used when the state directory is not theirs) is theirs to remove.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

from .hub_import import open_lock

log = logging.getLogger(__name__)

IMPORT_IDLE_S = 24 * 3600.0   # an interrupted import's download is kept this long for the next to resume


def sweep_imports(root: Path, idle_s: float = IMPORT_IDLE_S) -> tuple[list[dict[str, Any]], list[str]]:
    """Remove the abandoned downloads under ``root`` (``STATE_DIR/imports/hf``). Returns (what was removed:
    ``repo``, ``path``, ``bytes`` on disk, ``idle_s``; what was left alone that should not be, one line
    each). A running import's downloads and a recent interrupted one's stay without a word."""
    removed: list[dict[str, Any]] = []
    refused: list[str] = []
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return removed, refused
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        refused.append(f"{root}: not a directory of this user's: the Hub imports' downloads in it left alone "
                       f"(run gc as its owner, or through the daemon)")
        return removed, refused
    now = time.time()
    for endpoint in _real_dirs(root, "endpoint-", refused):
        for repo in _real_dirs(endpoint, "models--", refused):
            try:
                row = _sweep_repo(root, repo, now, idle_s)
            except OSError as exc:
                refused.append(f"{repo}: cannot remove this abandoned download: {exc.strerror or exc}")
                continue
            if row is not None:
                log.info("gc removed the abandoned download of hf://%s (%d bytes, idle %.0f s): %s",
                         row["repo"], row["bytes"], row["idle_s"], row["path"])
                removed.append(row)
    return removed, refused


def _real_dirs(parent: Path, prefix: str, refused: list[str]) -> list[Path]:
    """``parent``'s entries named ``prefix...`` that are directories themselves (not symlinks to one)."""
    try:
        with os.scandir(parent) as it:
            return sorted(Path(e.path) for e in it if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False))
    except OSError as exc:
        refused.append(f"{parent}: cannot list the Hub imports' downloads: {exc.strerror or exc}")
        return []


def _sweep_repo(root: Path, repo: Path, now: float, idle_s: float) -> dict[str, Any] | None:
    """Remove one repository's downloads if no import holds its lock and it has been idle long enough."""
    fd = open_lock(root, repo.name)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None   # (an import of it is running, or waits its turn)
        newest, size = _newest_and_size(repo)
        if now - newest < idle_s:
            return None
        shutil.rmtree(repo)
        locks = repo.parent / ".locks" / repo.name   # (huggingface_hub's own per-file locks: nobody holds them)
        if locks.is_dir() and not locks.is_symlink():
            shutil.rmtree(locks, ignore_errors=True)
    finally:
        os.close(fd)
    _, org, name = (repo.name.split("--", 2) + ["", ""])[:3]
    return {"repo": f"{org}/{name}", "path": str(repo), "bytes": size, "idle_s": round(now - newest, 1)}


def _newest_and_size(repo: Path) -> tuple[float, int]:
    """The newest mtime of anything in ``repo`` (itself included) and the bytes its files take on disk
    (symlinks are looked at, never followed)."""
    newest, size = os.lstat(repo).st_mtime, 0
    for top, dirs, files in os.walk(repo, followlinks=False):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISREG(st.st_mode):
                size += st.st_blocks * 512
    return newest, size


__all__ = ["IMPORT_IDLE_S", "sweep_imports"]
