"""Checks every safefs module shares: relative names, what an errno of a no-follow open means, regular
files only, and the modes a file placed in a tier may have."""

from __future__ import annotations

import errno
import os
import stat
from collections import namedtuple
from pathlib import Path
from typing import Any

from ..errors import BadInput, FileChanged, UnsafePath

MAX_SMALL_FILE = 16 << 20   # JSON side files, manifests, torrents: more is not ours


def split_rel(rel: str) -> list[str]:
    """The components of a path relative to a directory; absolute paths, ``..`` and ``.`` are refused."""
    if not rel or rel.startswith("/") or "\0" in rel:
        raise UnsafePath(rel or "''", "not a relative path inside the tier")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(rel, "path components '', '.' and '..' are not allowed")
    return parts


def unsafe(where: str, exc: OSError) -> BadInput | OSError:
    """What an errno from a no-follow open means for the operator."""
    if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        # (openat2 says ELOOP for a symlinked directory on the way, the O_NOFOLLOW walk ENOTDIR)
        return UnsafePath(where, "is a symlink (or a file where a directory belongs) or leads outside its "
                                 "tier (refused; weightd never follows one)")
    return exc


def describe(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, group gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}"


def regular_or_close(fd: int, where: str) -> int:
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(where, "not a regular file (FIFO, socket, device or directory): refused")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(path: str) -> int:
    """A path outside any tier (a directory being published, a user's file): the last component is
    not followed, and only a regular file is returned (never blocks on a FIFO)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_NOATIME)
    except PermissionError:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(path, "is a symlink (refused; weightd never follows one here)") from None
        raise
    return regular_or_close(fd, path)


class PinnedFile(namedtuple("PinnedFile", ["path", "dev", "ino"])):
    """A file outside any tier (in a directory being published) as it was when it was scanned. It is
    opened without following the last component and must still be the same file (device and inode):
    a file swapped for a symlink, a hard link or another file between the scan and the read is never
    read, so a publish cannot be turned into an upload or copy of someone else's file.

    Immutable, compared by value: a named tuple (dataclasses import ``inspect``, ~6 ms of every start
    of the commands that import this module, ``weightd residency`` among them)."""
    __slots__ = ()

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    def open_read(self) -> int:
        fd = open_regular(self.path)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            os.close(fd)
            raise FileChanged(self.path, "was replaced after it was scanned (another writer?): not read; try again")
        return fd


def sanitize_mode(mode: int) -> int:
    """What a file placed in a tier may be, whatever a manifest says: never group/other-writable,
    setuid, setgid or sticky; readable by its owner."""
    return (stat.S_IMODE(mode) & 0o755) | 0o400


def open_for_read(path: "str | os.PathLike[str] | PinnedFile | Any") -> int:
    """Open read-only with O_NOATIME (falls back when we do not own the file). A FileRef (a file in a
    tier) is opened by descriptor beneath its tier, never through a symlink; a PinnedFile (a scanned
    file being published) only if it is still the file that was scanned: both open themselves
    (``open_read``). A path is the caller's (a user's file for ``weightd warm``). Either way only a
    regular file comes back, and opening never blocks (a FIFO is refused, not waited on)."""
    opener = getattr(path, "open_read", None)
    if opener is not None:
        return opener()
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_NOATIME)
    except PermissionError:
        fd = os.open(path, flags)
    return regular_or_close(fd, str(path))


def private_dir(d: Path, what: str = "the download cache") -> Path:
    """``d``, created with mode 0700 if missing (its parents too); UnsafePath, one line saying which and
    what to do, unless it is a real directory (not a symlink) of this user's that no one else may enter."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(str(d), f"{what} is not a directory (a symlink?): remove it")
    if st.st_uid != os.geteuid():
        raise UnsafePath(str(d), f"{what} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): "
                                 f"remove it, or run as its owner")
    if st.st_mode & 0o077:
        raise UnsafePath(str(d), f"{what} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): chmod 700 it")
    return d
