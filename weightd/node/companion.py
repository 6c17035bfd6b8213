"""A companion artefact into the directory its engine reads (``preload --with KIND --key K --companion-dir DIR``).

Run by the CLI as its caller, never by the daemon: the daemon places the companion, verified, in a
tier; the caller's own process copies it to a directory the caller names, with the caller's rights
(a privileged daemon never writes where a caller points it). Each file is written to a temporary
name beside its target and renamed, so an engine starting meanwhile never reads half a file; what is
already there with the same size and content is left alone; other files in DIR are not touched
(a compile cache is shared by every model the engine compiles).

DIR is often under a shared directory (TorchInductor's default is ``/tmp/torchinductor_$USER``), so
it is reached as a tier root is: by directory descriptor from ``/``, never through a symlink, and
only if no other uid could change it or a directory on its way
(:func:`tiering.safefs.open_unchangeable_dir`); every directory entered inside it is checked the
same way, and every file is written and renamed beneath a descriptor. A refusal names the path
(exit 2) and writes nothing there.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from typing import Any

from tiering import Dir, UnsafePath, describe, open_unchangeable_dir

from ..errors import InvalidRequest

META = ".weightd"


def open_dest(dest: str) -> Dir:
    """``--companion-dir DIR`` opened (missing directories made) as :func:`install` needs it, or
    InvalidRequest (exit 2) naming why not: called before anything is fetched, so a refused DIR costs
    nothing and receives nothing."""
    path = os.path.abspath(os.path.expanduser(dest))
    try:
        return open_unchangeable_dir(path, _uids(), "--companion-dir", create=True)
    except UnsafePath as exc:
        raise InvalidRequest("companion_dir", str(exc)) from None
    except OSError as exc:
        raise InvalidRequest("companion_dir", f"--companion-dir {path}: {exc.strerror or exc}") from None


def install(src: str, dest: "str | Dir") -> dict[str, Any]:
    """Copy the tree at ``src`` (a tier copy) into ``dest`` (a path, or a Dir from :func:`open_dest`);
    returns {dir, files, copied, unchanged}."""
    out = open_dest(dest) if isinstance(dest, str) else dest
    counts = {"files": 0, "copied": 0, "unchanged": 0}
    try:
        _tree(src, out, counts, top=True)
    except UnsafePath as exc:
        raise InvalidRequest("companion_dir", str(exc)) from None
    except OSError as exc:
        raise InvalidRequest("companion_dir", f"--companion-dir {out.path}: {exc.filename or ''}: "
                             f"{exc.strerror or exc}") from None
    finally:
        if isinstance(dest, str):
            out.close()
    return {"dir": str(out.path), **counts}


def _uids() -> tuple[int, ...]:
    return tuple({0, os.geteuid()})


def _tree(src: str, out: Dir, counts: dict[str, int], *, top: bool = False) -> None:
    with os.scandir(src) as it:
        entries = list(it)
    for e in entries:
        if top and e.name == META:
            continue
        if e.is_dir(follow_symlinks=False):
            try:
                os.mkdir(e.name, 0o755, dir_fd=out.fd)
            except FileExistsError:
                pass
            try:   # (a symlink planted in DIR is never followed)
                fd = os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=out.fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(0, "is not a directory (a symlink or a file is in its place)",
                                  str(out.path / e.name)) from None
                raise
            with Dir(fd, out.path / e.name) as sub:
                st = os.fstat(fd)
                if st.st_uid not in _uids() or stat.S_IMODE(st.st_mode) & 0o022:
                    raise UnsafePath(str(sub.path), f"is not yours alone ({describe(st)}): another uid could change "
                                                    "what is in it; refused")
                _tree(e.path, sub, counts)
        elif e.is_file(follow_symlinks=False):
            counts["files"] += 1
            _file(e, out, counts)


def _file(e: os.DirEntry, out: Dir, counts: dict[str, int]) -> None:
    st = e.stat(follow_symlinks=False)
    try:
        dt = os.stat(e.name, dir_fd=out.fd, follow_symlinks=False)
    except FileNotFoundError:
        dt = None
    if dt is not None and stat.S_ISREG(dt.st_mode) and dt.st_size == st.st_size and _same(e.path, out, e.name):
        counts["unchanged"] += 1
        return
    # a new file under a temporary name, renamed over the target: a reader never sees half a file
    tmp = f".{e.name}.{uuid.uuid4().hex[:8]}.weightd-tmp"
    sfd = os.open(e.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(st.st_mode) | 0o600, dir_fd=out.fd)
        try:
            left = st.st_size
            while left > 0:
                n = os.sendfile(dfd, sfd, None, left)
                if n <= 0:
                    raise OSError(f"{e.path}: shorter than {st.st_size} bytes")
                left -= n
        except BaseException:
            os.close(dfd)
            os.unlink(tmp, dir_fd=out.fd)
            raise
        os.close(dfd)
        os.replace(tmp, e.name, src_dir_fd=out.fd, dst_dir_fd=out.fd)
    finally:
        os.close(sfd)
    counts["copied"] += 1


def _same(a: str, out: Dir, name: str, block: int = 1 << 20) -> bool:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out.fd)   # (never a FIFO's wait)
    with open(a, "rb") as fa, os.fdopen(fd, "rb") as fb:
        if not stat.S_ISREG(os.fstat(fb.fileno()).st_mode):
            return False
        while True:
            x, y = fa.read(block), fb.read(block)
            if x != y:
                return False
            if not x:
                return True
