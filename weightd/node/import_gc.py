"""``weightd gc``'s part in Hub imports: remove the downloads that imports left behind.

A Hub import (``weightd publish hf://``, intent's ``[[import]]``) downloads into
``STATE_DIR/imports/hf/endpoint-<hash>/models--ORG--REPO`` and removes that once it is published. One that
was interrupted (killed, a network that went away, a full disk) leaves it for the next import of the
repository to resume; one that nobody runs again would keep it for good. gc (``weightd gc``, and the
daemon's own every 30 s) removes a repository's downloads when no import of it is running (its
:func:`~weightd.node.hub_import.repo_lock` is free, and held while they are removed) and nothing in them
was written for :data:`IMPORT_IDLE_S`.

The cache, its endpoint directories and each download are walked and removed by descriptor
(:class:`tiering.Dir`: never following a link, never opening anything but a directory), from a cache
that must be this user's and private, as imports require (:func:`tiering.private_dir`): an endpoint, a
download or ``.locks`` that is a symlink is left with what it leads to, a link inside an idle download
is removed and its target kept, and a fifo put in the way is never opened to block. A user's own cache (``~/.cache/weightd/hf``, used when
the state directory is not theirs) is theirs to remove.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from tiering import CheckpointNotFound, Dir, TieringError

from .hub_import import open_lock

log = logging.getLogger(__name__)

IMPORT_IDLE_S = 24 * 3600.0   # an interrupted import's download is kept this long for the next to resume
_LEFT_ALONE = "the Hub imports' downloads in it left alone"


def sweep_imports(root: Path, idle_s: float = IMPORT_IDLE_S) -> tuple[list[dict[str, Any]], list[str]]:
    """Remove the abandoned downloads under ``root`` (``STATE_DIR/imports/hf``). Returns (what was removed:
    ``repo``, ``path``, ``bytes`` on disk, ``idle_s``; what was left alone that should not be, one line
    each). A running import's downloads and a recent interrupted one's stay without a word."""
    removed: list[dict[str, Any]] = []
    refused: list[str] = []
    try:
        cache = Dir(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), root)
    except FileNotFoundError:
        return removed, refused
    except OSError as exc:
        return removed, [f"{root}: cannot open it ({exc.strerror or exc}): {_LEFT_ALONE}"]
    with cache:
        if not _private(cache, refused):
            return removed, refused
        now = time.time()
        for ep_name in _subdirs(cache, "endpoint-", refused):
            try:
                endpoint = cache.sub(ep_name)
            except (OSError, TieringError):   # (gone, or swapped for a link since the listing)
                continue
            with endpoint:
                if not _private(endpoint, refused):
                    continue
                for repo in _subdirs(endpoint, "models--", refused):
                    row = _sweep_repo(cache, endpoint, repo, now, idle_s, refused)
                    if row is not None:
                        log.info("gc removed the abandoned download of hf://%s (%d bytes, idle %.0f s): %s",
                                 row["repo"], row["bytes"], row["idle_s"], row["path"])
                        removed.append(row)
    return removed, refused


def _private(d: Dir, refused: list[str]) -> bool:
    """Whether ``d`` is this user's and nobody else may enter it (as imports require); else one line."""
    st = os.fstat(d.fd)
    if st.st_uid != os.geteuid():
        refused.append(f"{d.path}: not this user's: {_LEFT_ALONE} (run gc as its owner, or through the daemon)")
    elif st.st_mode & 0o077:
        refused.append(f"{d.path}: open to other users: {_LEFT_ALONE} (imports refuse it too: chmod 700 it)")
    else:
        return True
    return False


def _subdirs(d: Dir, prefix: str, refused: list[str]) -> list[str]:
    """``d``'s entries named ``prefix...`` that are directories themselves (not links to one)."""
    try:
        return [n for n, st in d.entries() if n.startswith(prefix) and stat.S_ISDIR(st.st_mode)]
    except OSError as exc:
        refused.append(f"{d.path}: cannot list it ({exc.strerror or exc}): {_LEFT_ALONE}")
        return []


def _sweep_repo(cache: Dir, endpoint: Dir, name: str, now: float, idle_s: float,
                refused: list[str]) -> dict[str, Any] | None:
    """Remove one repository's downloads if no import holds its lock and it has been idle long enough."""
    shown = endpoint.path / name
    try:
        lock = open_lock(None, name, dir_fd=cache.fd)
    except OSError as exc:
        refused.append(f"{shown}: cannot take its lock ({exc.strerror or exc}): this download left alone")
        return None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None   # (an import of it is running, or waits its turn)
        try:
            with endpoint.sub(name) as download:
                newest, size = os.fstat(download.fd).st_mtime, 0
                for _, st in download.walk_files():
                    newest = max(newest, st.st_mtime)
                    size += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
            if now - newest < idle_s:
                return None
            endpoint.remove(name)
        except (FileNotFoundError, CheckpointNotFound):
            return None   # (gone meanwhile: an import that ended removed it)
        except (OSError, TieringError, RecursionError) as exc:   # (RecursionError: a tree ~1,000 directories deep)
            why = "too deep a tree" if isinstance(exc, RecursionError) else \
                exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            refused.append(f"{shown}: cannot remove this abandoned download: {why}")
            return None
        try:   # (huggingface_hub's own per-file locks of it: nobody holds them now)
            with endpoint.sub(".locks") as hf_locks:
                hf_locks.remove(name)
        except (OSError, TieringError, RecursionError):
            pass
    finally:
        os.close(lock)
    return {"repo": name.removeprefix("models--").replace("--", "/"), "path": str(shown), "bytes": size,
            "idle_s": round(now - newest, 1)}


__all__ = ["IMPORT_IDLE_S", "sweep_imports"]
