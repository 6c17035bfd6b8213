"""``weightd gc``'s part in Hub imports: remove the downloads that imports left behind.

A Hub import (``weightd publish hf://``, intent's ``[[import]]``) downloads into
``STATE_DIR/imports/hf/endpoint-<hash>/models--ORG--REPO`` and removes that once it is published. One that
was interrupted (killed, a network that went away, a full disk) leaves it for the next import of the
repository to resume; one that nobody runs again would keep it for good. gc (``weightd gc``, and the
daemon's own every 30 s) removes a repository's downloads when no import of it is running (its
:func:`~weightd.node.hub_import.repo_lock` is free, and held while they are removed) and nothing in them
was written for :data:`IMPORT_IDLE_S`.

The cache, its endpoint directories and each download are opened as directory descriptors without
following links, from a cache that must be this user's and private, as imports require
(:func:`tiering.private_dir`): an endpoint, a download or ``.locks`` that is a symlink is left with what
it leads to, a link inside an idle download is removed and its target kept (``shutil.rmtree``), and a
fifo put in the way is never opened to block. A user's own cache (``~/.cache/weightd/hf``, used when
the state directory is not theirs) is theirs to remove.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Iterator

from .hub_import import open_lock

log = logging.getLogger(__name__)

IMPORT_IDLE_S = 24 * 3600.0   # an interrupted import's download is kept this long for the next to resume
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def sweep_imports(root: Path, idle_s: float = IMPORT_IDLE_S) -> tuple[list[dict[str, Any]], list[str]]:
    """Remove the abandoned downloads under ``root`` (``STATE_DIR/imports/hf``). Returns (what was removed:
    ``repo``, ``path``, ``bytes`` on disk, ``idle_s``; what was left alone that should not be, one line
    each). A running import's downloads and a recent interrupted one's stay without a word."""
    removed: list[dict[str, Any]] = []
    refused: list[str] = []
    with _private(root, None, str(root), refused) as root_fd:
        if root_fd is None:
            return removed, refused
        now = time.time()
        for ep_name in _dirs(root_fd, "endpoint-", root, refused):
            where = root / ep_name
            with _private(ep_name, root_fd, str(where), refused) as ep_fd:
                for repo in _dirs(ep_fd, "models--", where, refused) if ep_fd is not None else ():
                    row = _sweep_repo(root_fd, ep_fd, where / repo, now, idle_s, refused)
                    if row is not None:
                        log.info("gc removed the abandoned download of hf://%s (%d bytes, idle %.0f s): %s",
                                 row["repo"], row["bytes"], row["idle_s"], row["path"])
                        removed.append(row)
    return removed, refused


@contextlib.contextmanager
def _private(name: Path | str, dir_fd: int | None, shown: str, refused: list[str],
             private: bool = True) -> Iterator[int | None]:
    """A directory descriptor of ``name`` (relative to ``dir_fd``) if it is a real directory of this
    user's that nobody else may enter (``private``; else one inside such a directory: only its owner is
    checked); None when it is not there, or (with a line in ``refused``) when it is not such a directory."""
    fd, why = None, ""
    try:   # (O_DIRECTORY: a fifo put there is ENOTDIR at once, never opened to block)
        fd = os.open(name, _DIR_FLAGS | os.O_NONBLOCK, dir_fd=dir_fd)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            why = f"{shown}: not this user's: the Hub imports' downloads in it left alone (run gc as its owner, or " \
                  f"through the daemon)"
        elif private and st.st_mode & 0o077:
            why = f"{shown}: open to other users: the Hub imports' downloads in it left alone (imports refuse it " \
                  f"too: chmod 700 it)"
    except FileNotFoundError:
        pass
    except OSError as exc:
        why = f"{shown}: cannot open it ({exc.strerror or exc}): the Hub imports' downloads in it left alone"
    if why:
        refused.append(why)
    try:
        yield fd if not why else None
    finally:
        if fd is not None:
            os.close(fd)


def _dirs(dir_fd: int, prefix: str, shown: Path, refused: list[str]) -> list[str]:
    """The entries of ``dir_fd`` named ``prefix...`` that are directories themselves (not links to one)."""
    try:
        with os.scandir(dir_fd) as it:
            return sorted(e.name for e in it if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False))
    except OSError as exc:
        refused.append(f"{shown}: cannot list it ({exc.strerror or exc}): the Hub imports' downloads in it "
                       f"left alone")
        return []


def _sweep_repo(root_fd: int, ep_fd: int, shown: Path, now: float, idle_s: float,
                refused: list[str]) -> dict[str, Any] | None:
    """Remove one repository's downloads if no import holds its lock and it has been idle long enough."""
    name = shown.name
    try:
        lock = open_lock(None, name, dir_fd=root_fd)
    except OSError as exc:
        refused.append(f"{shown}: cannot take its lock ({exc.strerror or exc}): this download left alone")
        return None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None   # (an import of it is running, or waits its turn)
        try:
            newest, size = _newest_and_size(ep_fd, name)
            if now - newest < idle_s:
                return None
            _rmtree_dir(name, ep_fd)
        except FileNotFoundError:
            return None   # (gone meanwhile: an import that ended removed it)
        except (OSError, RecursionError) as exc:   # (a tree ~1,000 directories deep: the walks recurse)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else \
                "too deep a tree" if isinstance(exc, RecursionError) else str(exc)
            refused.append(f"{shown}: cannot remove this abandoned download: {why}")
            return None
        # (huggingface_hub's own per-file locks of it: nobody holds them now)
        with _private(".locks", ep_fd, str(shown.parent / ".locks"), [], private=False) as locks_fd:
            if locks_fd is not None:
                with contextlib.suppress(OSError, RecursionError):
                    _rmtree_dir(name, locks_fd)
    finally:
        os.close(lock)
    return {"repo": name.removeprefix("models--").replace("--", "/"), "path": str(shown), "bytes": size,
            "idle_s": round(now - newest, 1)}


def _rmtree_dir(name: str, dir_fd: int) -> None:
    """``shutil.rmtree`` of ``name`` in ``dir_fd`` if it is a directory (rmtree opens its top without
    O_NONBLOCK: a fifo there would hang gc, and the lock it holds, for good); FileNotFoundError if not."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
        raise FileNotFoundError(errno.ENOENT, "not a directory", name)
    shutil.rmtree(name, dir_fd=dir_fd)


def _newest_and_size(ep_fd: int, name: str) -> tuple[float, int]:
    """The newest mtime of anything in the download (itself included) and the bytes its files take on
    disk; links are looked at, never followed."""
    newest, size = os.stat(name, dir_fd=ep_fd, follow_symlinks=False).st_mtime, 0
    for _, dirs, files, fd in os.fwalk(name, dir_fd=ep_fd, follow_symlinks=False):
        for entry in dirs + files:
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISREG(st.st_mode):
                size += st.st_blocks * 512
    return newest, size


__all__ = ["IMPORT_IDLE_S", "sweep_imports"]
