"""A companion artefact into the directory its engine reads (``preload --with KIND --key K --companion-dir DIR``).

Run by the CLI as its caller, never by the daemon: the daemon places the companion, verified, in a
tier; the caller's own process copies it to a directory the caller names, with the caller's rights
(a privileged daemon never writes where a caller points it). Each file is written to a temporary
name beside its target and renamed, so an engine starting meanwhile never reads half a file; what is
already there with the same size and content is left alone; other files in DIR are not touched
(a compile cache is shared by every model the engine compiles).
"""

from __future__ import annotations

import os
import stat
import uuid
from typing import Any

from .errors import InvalidRequest

META = ".weightd"


def install(src: str, dest: str) -> dict[str, Any]:
    """Copy the tree at ``src`` (a tier copy) into ``dest``; returns {dir, files, copied, unchanged}."""
    dest = os.path.abspath(os.path.expanduser(dest))
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest("companion_dir", f"--companion-dir {dest}: {exc.strerror}") from None
    counts = {"files": 0, "copied": 0, "unchanged": 0}
    try:
        _tree(src, dest, counts, top=True)
    except OSError as exc:
        raise InvalidRequest("companion_dir", f"--companion-dir {dest}: {exc.filename or ''}: "
                             f"{exc.strerror or exc}") from None
    return {"dir": dest, **counts}


def _tree(src: str, out: str, counts: dict[str, int], *, top: bool = False) -> None:
    with os.scandir(src) as it:
        entries = list(it)
    for e in entries:
        if top and e.name == META:
            continue
        if e.is_dir(follow_symlinks=False):
            d = os.path.join(out, e.name)
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(d).st_mode):   # (a symlink planted in DIR is never followed)
                    raise OSError(0, "is not a directory (a symlink or a file is in its place)", d) from None
            _tree(e.path, d, counts)
        elif e.is_file(follow_symlinks=False):
            counts["files"] += 1
            _file(e, os.path.join(out, e.name), counts)


def _file(e: os.DirEntry, d: str, counts: dict[str, int]) -> None:
    st = e.stat(follow_symlinks=False)
    try:
        dt = os.lstat(d)
    except FileNotFoundError:
        dt = None
    if dt is not None and stat.S_ISREG(dt.st_mode) and dt.st_size == st.st_size and _same(e.path, d):
        counts["unchanged"] += 1
        return
    # a new file under a temporary name, renamed over the target: a reader never sees half a file
    tmp = os.path.join(os.path.dirname(d), f".{e.name}.{uuid.uuid4().hex[:8]}.weightd-tmp")
    sfd = os.open(e.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(st.st_mode) | 0o600)
        try:
            left = st.st_size
            while left > 0:
                n = os.sendfile(dfd, sfd, None, left)
                if n <= 0:
                    raise OSError(f"{e.path}: shorter than {st.st_size} bytes")
                left -= n
        except BaseException:
            os.close(dfd)
            os.unlink(tmp)
            raise
        os.close(dfd)
        os.replace(tmp, d)
    finally:
        os.close(sfd)
    counts["copied"] += 1


def _same(a: str, b: str, block: int = 1 << 20) -> bool:
    fd = os.open(b, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)   # (never a FIFO's wait)
    with open(a, "rb") as fa, os.fdopen(fd, "rb") as fb:
        if not stat.S_ISREG(os.fstat(fb.fileno()).st_mode):
            return False
        while True:
            x, y = fa.read(block), fb.read(block)
            if x != y:
                return False
            if not x:
                return True
