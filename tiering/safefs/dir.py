"""A directory descriptor (:class:`Dir`) and a file beneath one (:class:`FileRef`): every operation inside
a tier goes through these (see the package docstring for why)."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .._syscalls import openat2, openat2_available, renameat2_noreplace
from ..errors import BadInput, CheckpointNotFound, UnsafePath
from .paths import MAX_SMALL_FILE, PinnedFile, describe, open_regular, regular_or_close, split_rel, unsafe
from .remove import remove_at


class Dir:
    """An open directory descriptor; ``path`` is for messages and for code that needs a path string
    (libtorrent, engines), never for opening anything beneath it."""

    __slots__ = ("fd", "path")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Dir":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Dir({str(self.path)!r}, fd={self.fd})"

    # -- opening --------------------------------------------------------------------------------
    def _open(self, rel: str, flags: int, mode: int = 0o600) -> int:
        """``rel`` beneath this directory, refusing every symlink and escape on the way."""
        parts = split_rel(rel)
        flags |= os.O_CLOEXEC | os.O_NOFOLLOW
        if openat2_available():
            return openat2(self.fd, rel, flags, mode)
        cur = self.fd
        try:
            for p in parts[:-1]:
                nxt = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
                if cur != self.fd:
                    os.close(cur)
                cur = nxt
            return os.open(parts[-1], flags, mode, dir_fd=cur)
        finally:
            if cur != self.fd:
                os.close(cur)

    def open(self, rel: str, flags: int, mode: int = 0o600) -> int:
        try:
            return self._open(rel, flags, mode)
        except OSError as exc:
            raise unsafe(str(self.path / rel), exc) from None

    def sub(self, rel: str, *, create: bool = False, mode: int = 0o700) -> "Dir":
        """The directory ``rel`` beneath this one (made, with its parents, when ``create``)."""
        if create:
            cur: Dir = self
            for p in split_rel(rel):
                made = cur.mkdir(p, mode)
                nxt = cur.sub(p)
                if made:
                    cur.fsync()  # the new entry is durable once its parent is
                if cur is not self:
                    cur.close()
                cur = nxt
            return cur
        try:
            fd = self._open(rel, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise CheckpointNotFound(str(self.path / rel), "no such directory") from None
        except OSError as exc:
            raise unsafe(str(self.path / rel), exc) from None
        return Dir(fd, self.path / rel)

    def private(self, name: str) -> "Dir":
        """``.staging``, ``.locks``, ``.trash``: made 0700 if missing, and whatever is there must be a
        real directory of weightd's user that no one else can write (in cold storage others can make
        one first), else UnsafePath (exit 2)."""
        d = self.sub(name, create=True, mode=0o700)
        try:
            st = os.fstat(d.fd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
                raise UnsafePath(str(d.path), f"is not weightd's own ({describe(st)}; expected owner uid "
                                              f"{os.geteuid()}, not writable by group or others): remove it")
        except BaseException:
            d.close()
            raise
        return d

    def sub_if_exists(self, rel: str) -> "Dir | None":
        try:
            return self.sub(rel)
        except CheckpointNotFound:
            return None

    def mkdir(self, name: str, mode: int = 0o700) -> bool:
        """Make one directory entry; True if it was made. Something else in its place is refused."""
        split_rel(name)
        try:
            os.mkdir(name, mode, dir_fd=self.fd)
            return True
        except FileExistsError:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(str(self.path / name), "is not a directory (a file or a symlink is in its place)") \
                    from None
            return False

    def open_read(self, rel: str) -> int:
        """A regular file beneath this directory, read-only, without blocking on a FIFO or device."""
        try:
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOATIME)
        except PermissionError:  # O_NOATIME needs us to own the file
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        return regular_or_close(fd, str(self.path / rel))

    def create(self, rel: str, mode: int = 0o600, *, exclusive: bool = True, parents: bool = True,
               flags: int = os.O_WRONLY) -> int:
        """A new file (``O_EXCL``: never an existing one, never through a symlink). Missing parents are
        made 0755 (less the umask), as a checkpoint's own directories are (``original/``): whoever may
        read the file may reach it; what is private is gated above (a 0700 tier root or ``.staging``)."""
        parts = split_rel(rel)
        parent: Dir = self
        if parents and len(parts) > 1:
            parent = self.sub("/".join(parts[:-1]), create=True, mode=0o755)
        try:
            return parent.open(parts[-1], flags | os.O_CREAT | (os.O_EXCL if exclusive else 0), mode)
        finally:
            if parent is not self:
                parent.close()

    # -- looking --------------------------------------------------------------------------------
    def lstat(self, rel: str) -> os.stat_result | None:
        """What is at ``rel`` (the link itself for a symlink), or None; parents are not followed."""
        parts = split_rel(rel)
        try:
            if len(parts) == 1:
                return os.stat(parts[0], dir_fd=self.fd, follow_symlinks=False)
            with self.sub("/".join(parts[:-1])) as d:
                return os.stat(parts[-1], dir_fd=d.fd, follow_symlinks=False)
        except (FileNotFoundError, CheckpointNotFound, NotADirectoryError):
            return None
        except UnsafePath:
            return None

    def is_dir(self, rel: str) -> bool:
        st = self.lstat(rel)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def is_file(self, rel: str) -> bool:
        st = self.lstat(rel)
        return st is not None and stat.S_ISREG(st.st_mode)

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of every entry, sorted by name; symlinks are reported, never followed."""
        out = []
        # a descriptor of its own: scandir(fd) shares the directory offset with every dup of the fd,
        # and the daemon lists one cached root from several threads at once
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        out.append((e.name, e.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue
        finally:
            os.close(fd)
        return sorted(out, key=lambda x: x[0])

    def subdirs(self) -> list[str]:
        return [n for n, st in self.entries() if stat.S_ISDIR(st.st_mode)]

    def walk_files(self, prefix: str = "") -> Iterator[tuple[str, os.stat_result]]:
        """(relpath, lstat) of every non-directory beneath, depth first; directories by descriptor."""
        for name, st in self.entries():
            rel = f"{prefix}{name}"
            if stat.S_ISDIR(st.st_mode):
                with self.sub(name) as d:
                    yield from d.walk_files(rel + "/")
            else:
                yield rel, st

    def read_bytes(self, rel: str, limit: int = MAX_SMALL_FILE) -> bytes:
        fd = self.open_read(rel)
        try:
            return read_limited(fd, limit, str(self.path / rel))
        finally:
            os.close(fd)

    def read_json(self, rel: str) -> Any:
        """A small JSON side file, or None if missing, unreadable or not JSON (never an exception)."""
        try:
            return json.loads(self.read_bytes(rel))
        except (OSError, ValueError, BadInput, CheckpointNotFound, RecursionError):
            return None

    # -- writing --------------------------------------------------------------------------------
    def write_atomic(self, name: str, data: bytes, mode: int = 0o644) -> None:
        """``name`` replaced as a whole: a unique temporary file here, fsync, rename, fsync of this dir.
        A symlink at ``name`` is replaced (the link), never written through."""
        split_rel(name)
        if "/" in name:
            raise UnsafePath(name, "write_atomic takes a name, not a path")
        tmp = f".{name}.{uuid.uuid4().hex[:12]}{_INCOMPLETE}"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self.unlink(tmp)
            raise
        self.fsync()

    @staticmethod
    def atomic_target(entry: str) -> str | None:
        """The name ``entry`` would have been renamed to if it is a temporary of :meth:`write_atomic`
        (one a crash cut short, or one being written), else None."""
        m = _TEMPORARY.fullmatch(entry)
        return m.group(1) if m else None

    def rename(self, name: str, dst: "Dir", dst_name: str, *, replace: bool = False) -> None:
        """Move one entry between directories by descriptor; refuses to replace unless ``replace``."""
        split_rel(name)
        split_rel(dst_name)
        if replace:
            os.rename(name, dst_name, src_dir_fd=self.fd, dst_dir_fd=dst.fd)
            return
        e = renameat2_noreplace(self.fd, name, dst.fd, dst_name)
        if e == 0:
            return
        if e is not None:
            if e == errno.EEXIST:
                raise FileExistsError(e, os.strerror(e), str(dst.path / dst_name))
            if e not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise OSError(e, os.strerror(e), str(self.path / name))
        if dst.lstat(dst_name) is not None:  # no RENAME_NOREPLACE here (NFS): callers hold the lock
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst.path / dst_name))
        os.rename(name, dst_name, src_dir_fd=self.fd, dst_dir_fd=dst.fd)

    def unlink(self, rel: str) -> bool:
        """Remove a file or a symlink (the link itself) at ``rel``; False if there was none."""
        parts = split_rel(rel)
        parent = self if len(parts) == 1 else self.sub_if_exists("/".join(parts[:-1]))
        if parent is None:
            return False
        try:
            os.unlink(parts[-1], dir_fd=parent.fd)
            return True
        except FileNotFoundError:
            return False
        finally:
            if parent is not self:
                parent.close()

    def remove(self, name: str) -> bool:
        """Remove the entry ``name`` whatever it is: a tree walked by descriptor (never following a
        symlink, never opening anything but a directory), a file, or a symlink (the link, not its
        target). False if there was none."""
        split_rel(name)
        if "/" in name:
            raise UnsafePath(name, "remove takes a name, not a path")
        return remove_at(self.fd, name)

    def clear(self) -> None:
        """Remove everything inside this directory (it stays)."""
        for name, _ in self.entries():
            self.remove(name)

    def chmod(self, rel: str, mode: int) -> None:
        fd = self.open_read(rel)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def fsync_tree(self, *, files: bool = False) -> None:
        """fsync every directory beneath, then this one; with ``files``, every regular file too (for
        what a library wrote without fsync: libtorrent)."""
        for name, st in self.entries():
            if stat.S_ISDIR(st.st_mode):
                with self.sub(name) as d:
                    d.fsync_tree(files=files)
            elif files and stat.S_ISREG(st.st_mode):
                fd = self.open_read(name)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self.fsync()

    def statvfs(self) -> os.statvfs_result:
        return os.fstatvfs(self.fd)


def read_limited(fd: int, limit: int, where: str) -> bytes:
    """All of an open file, at most ``limit`` bytes (BadInput naming ``where`` when it is longer)."""
    chunks, n = [], 0
    while n <= limit:
        c = os.read(fd, min(1 << 20, limit + 1 - n))
        if not c:
            break
        chunks.append(c)
        n += len(c)
    if n > limit:
        raise BadInput(f"{where}: larger than {limit} bytes")
    return b"".join(chunks)


_INCOMPLETE = ".incomplete"
_TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{12}" + re.escape(_INCOMPLETE))   # write_atomic's temporaries

@dataclass(frozen=True, slots=True)
class FileRef:
    """A file beneath an open directory: what copy, hash and verify code opens instead of a path."""
    dir: Dir
    rel: str

    def __str__(self) -> str:
        return str(self.dir.path / self.rel)

    def __fspath__(self) -> str:  # for messages and stat-free consumers only
        return str(self)

    def open_read(self) -> int:
        return self.dir.open_read(self.rel)


def open_source(src: "str | os.PathLike[str] | FileRef | PinnedFile") -> int:
    """Open anything the copy and hash engines read: by descriptor beneath its tier when it is a
    :class:`FileRef`, the very file that was scanned when it is a :class:`PinnedFile`, else as a
    regular file without following the last component."""
    if isinstance(src, (FileRef, PinnedFile)):
        return src.open_read()
    return open_regular(os.fspath(src))
