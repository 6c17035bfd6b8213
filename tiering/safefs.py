"""Every file-system operation inside a tier, on directory file descriptors, never through a symlink.

A tier is a directory that other hands can reach: ``/dev/shm`` is world-writable, cold storage is
shared, and a planted symlink anywhere under a root would otherwise turn a privileged weightd into a
tool that deletes or overwrites files of the host. So nothing in a tier is reached by a joined path
string. A :class:`Dir` is an open ``O_DIRECTORY`` descriptor; everything beneath it goes through:

- ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` when the kernel has it
  (Linux 5.6+, probed once): one call that refuses any symlink and any escape, on every component;
- otherwise a walk of ``openat(dir_fd, component, O_NOFOLLOW | O_DIRECTORY)`` per component and
  ``O_NOFOLLOW`` on the last one, which refuses the same things component by component;
- ``mkdirat`` then an ``O_NOFOLLOW`` open of what was made (a symlink raced in is refused);
- ``renameat2(RENAME_NOREPLACE)`` between directory descriptors (a commit never replaces a version),
  falling back to ``renameat`` after an ``lstat`` on file systems without it (NFS);
- ``unlinkat`` and a descriptor walk for deletion that opens directories only with ``O_DIRECTORY |
  O_NOFOLLOW | O_NONBLOCK`` (``shutil.rmtree(dir_fd=)`` opens them with plain ``O_RDONLY``, which blocks
  on a FIFO raced into place); a symlink in the way is unlinked itself, never followed;
- reads of files open ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat`` must say a regular file (a FIFO or
  a device never blocks or feeds a read), then ``O_NONBLOCK`` is cleared.

A tier root itself is opened once with ``O_NOFOLLOW | O_DIRECTORY`` and checked: owned by weightd's
user and not writable by group or others (:func:`open_tier_root`), so nobody else can plant anything
inside it at all; the descriptor walk is the second wall, for what slipped past the first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import BadInput, CheckpointNotFound, UnsafePath

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437          # the same number on every architecture (a "new" syscall, 5.6+)
_RENAME_NOREPLACE = 1
MAX_SMALL_FILE = 16 << 20   # JSON side files, manifests, torrents: more is not ours

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2_ok: bool | None = None
_renameat2 = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                   _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(rel)),
                  ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), rel)
    return int(fd)


def openat2_available() -> bool:
    """Probed once: does this kernel (and seccomp policy) let us call openat2?"""
    global _openat2_ok
    if _openat2_ok is None:
        top = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.close(_openat2(top, ".", os.O_RDONLY | os.O_DIRECTORY, 0))
            _openat2_ok = True
        except OSError:  # ENOSYS, a seccomp EPERM, anything: only a call that worked counts
            _openat2_ok = False
        finally:
            os.close(top)
    return _openat2_ok


def split_rel(rel: str) -> list[str]:
    """The components of a path relative to a directory; absolute paths, ``..`` and ``.`` are refused."""
    if not rel or rel.startswith("/") or "\0" in rel:
        raise UnsafePath(rel or "''", "not a relative path inside the tier")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(rel, "path components '', '.' and '..' are not allowed")
    return parts


def _unsafe(where: str, exc: OSError) -> BadInput | OSError:
    """What an errno from a no-follow open means for the operator."""
    if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        # (openat2 says ELOOP for a symlinked directory on the way, the O_NOFOLLOW walk ENOTDIR)
        return UnsafePath(where, "is a symlink (or a file where a directory belongs) or leads outside its "
                                 "tier (refused; weightd never follows one)")
    return exc


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
            return _openat2(self.fd, rel, flags, mode)
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
            raise _unsafe(str(self.path / rel), exc) from None

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
            raise _unsafe(str(self.path / rel), exc) from None
        return Dir(fd, self.path / rel)

    def private(self, name: str) -> "Dir":
        """``.staging``, ``.locks``, ``.trash``: made 0700 if missing, and whatever is there must be a
        real directory of weightd's user that no one else can write (in cold storage others can make
        one first), else UnsafePath (exit 2)."""
        d = self.sub(name, create=True, mode=0o700)
        try:
            st = os.fstat(d.fd)
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
                raise UnsafePath(str(d.path), f"is not weightd's own ({_describe(st)}; expected owner uid "
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
        """A new file (``O_EXCL``: never an existing one, never through a symlink)."""
        parts = split_rel(rel)
        parent: Dir = self
        if parents and len(parts) > 1:
            parent = self.sub("/".join(parts[:-1]), create=True)
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
            data = b""
            while len(data) <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - len(data)))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        if len(data) > limit:
            raise BadInput(f"{self.path / rel}: larger than {limit} bytes")
        return data

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
        tmp = f".{name}.{uuid.uuid4().hex[:12]}.incomplete"
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

    def rename(self, name: str, dst: "Dir", dst_name: str, *, replace: bool = False) -> None:
        """Move one entry between directories by descriptor; refuses to replace unless ``replace``."""
        split_rel(name)
        split_rel(dst_name)
        if replace:
            os.rename(name, dst_name, src_dir_fd=self.fd, dst_dir_fd=dst.fd)
            return
        if _renameat2 is not None:
            rc = _renameat2(self.fd, os.fsencode(name), dst.fd, os.fsencode(dst_name), _RENAME_NOREPLACE)
            if rc == 0:
                return
            e = ctypes.get_errno()
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
        return _remove_at(self.fd, name)
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


def _remove_at(parent_fd: int, name: str, retries: int = 3) -> bool:
    """Delete ``name`` in ``parent_fd`` (a tree, by descriptor). A directory is only ever opened with
    O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK (so a FIFO or a device raced into its place is never opened,
    and a symlink raced into its place is unlinked itself). ``shutil.rmtree(dir_fd=)`` in 3.11 opens
    each directory with plain O_RDONLY, which would block on a FIFO: hence this walk."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:  # not a directory (a file, a symlink): the entry itself goes
            os.unlink(name, dir_fd=parent_fd)
            return True
        except FileNotFoundError:
            return False
        except IsADirectoryError:  # raced back into a directory
            if retries <= 0:
                raise
            return _remove_at(parent_fd, name, retries - 1)
    try:
        with os.scandir(fd) as it:  # (fd is private to this call: no shared offset)
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for child, is_dir in entries:
            if is_dir:
                _remove_at(fd, child)
                continue
            try:
                os.unlink(child, dir_fd=fd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                _remove_at(fd, child)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY and retries > 0:  # something was added meanwhile: once more
            return _remove_at(parent_fd, name, retries - 1)
        raise
    return True


def check_unchangeable(root: Dir, rel: str) -> None:
    """``rel`` beneath ``root``, every directory on the way and every directory inside it, must be
    one whose entries only root or weightd's user can change (owner 0 or us, not writable by group or
    others). Code that must hand a path to a library that follows links (libtorrent) calls this
    first: nobody else can then swap a file for a link between the check and the library's open."""
    me = os.geteuid()

    def check(d: Dir) -> None:
        st = os.fstat(d.fd)
        if st.st_uid not in (0, me) or stat.S_IMODE(st.st_mode) & 0o022:
            raise UnsafePath(str(d.path), f"can be changed by others ({_describe(st)}): weightd hands libtorrent "
                                          "only directories that root or its own user alone can change")

    def inside(d: Dir) -> None:
        check(d)
        for name in d.subdirs():
            with d.sub(name) as sub:
                inside(sub)

    parts = split_rel(rel)
    for i in range(1, len(parts)):
        with root.sub("/".join(parts[:i])) as d:
            check(d)
    with root.sub(rel) as d:
        inside(d)


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


def open_source(src: "str | os.PathLike[str] | FileRef") -> int:
    """Open anything the copy and hash engines read: by descriptor beneath its tier when it is a
    :class:`FileRef`, else as a regular file without following the last component."""
    if isinstance(src, FileRef):
        return src.open_read()
    return open_regular(os.fspath(src))


# -- tier roots ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RootPolicy:
    """How a tier root must look. ``mode``: what weightd creates it with; ``group``: its group (gid)
    or None. A root that exists is accepted if it is a real directory owned by ``uid`` and not
    writable by group or others (whatever its other bits)."""
    mode: int = 0o700
    group: int | None = None
    uid: int | None = None   # default: our effective uid


def _describe(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, group gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}"


def check_root_stat(path: Path, st: os.stat_result, policy: RootPolicy) -> None:
    uid = os.geteuid() if policy.uid is None else policy.uid
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(str(path), "tier root is a symlink; weightd refuses it (point the config at the real "
                                    "directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(str(path), f"tier root is not a directory ({_describe(st)})")
    if st.st_uid != uid:
        raise UnsafePath(str(path), f"tier root is not weightd's ({_describe(st)}; expected owner uid {uid}); "
                                    "someone else created it: remove it or configure another path")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UnsafePath(str(path), f"tier root is writable by group or others ({_describe(st)}); "
                                    f"chmod go-w {path}")


def check_ancestors(path: Path) -> None:
    """Every directory above a tier root must be one that only root or weightd's user can change
    entries of (owned by one of them; writable by others only with the sticky bit, as /dev/shm and
    /tmp are), or someone could swap the root for a directory of their own (sshd's StrictModes)."""
    me = os.geteuid()
    for p in path.parents:
        try:
            st = os.stat(p)  # (following the configured path: the operator's choice)
        except FileNotFoundError:
            continue
        if st.st_uid not in (0, me):
            raise UnsafePath(str(path), f"its parent {p} belongs to uid {st.st_uid}, who could replace the tier "
                                        "root: put the tier under a directory of root or weightd's user")
        if stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePath(str(path), f"its parent {p} is writable by group or others without the sticky bit "
                                        f"(mode {stat.S_IMODE(st.st_mode):04o}): anyone could replace the tier root")


def open_tier_root(path: Path, policy: RootPolicy = RootPolicy(), *, create: bool) -> Dir | None:
    """Open (and with ``create``, make) a hot or warm tier root and check it and its parents.

    Returns None when it does not exist and ``create`` is false (nothing is made for a query)."""
    check_ancestors(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        _make_root(path, policy)
        st = os.lstat(path)
    check_root_stat(path, st, policy)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _unsafe(str(path), exc) from None
    d = Dir(fd, path)
    try:
        check_root_stat(path, os.fstat(fd), policy)  # the same directory we looked at, not a swapped one
    except BaseException:
        d.close()
        raise
    return d


def _make_root(path: Path, policy: RootPolicy) -> None:
    parent = path.parent
    missing = []
    p = parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    for m in reversed(missing):  # parents of a root are ordinary directories (0755), made durable
        try:
            os.mkdir(m, 0o755)
        except FileExistsError:
            pass
        _fsync_path(m.parent)
    try:
        os.mkdir(path, policy.mode)
    except FileExistsError:
        return  # made by someone else meanwhile: the caller checks whose it is
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if policy.group is not None:
            os.fchown(fd, -1, policy.group)
        os.fchmod(fd, policy.mode)  # the umask does not decide a tier's mode
    finally:
        os.close(fd)
    _fsync_path(parent)


def open_cold_root(path: Path, *, create: bool = False) -> Dir | None:
    """Cold storage: the configured path is the operator's (it may be a mount reached through a
    symlink); everything beneath it is opened by descriptor without following anything. Never made
    except for ``publish`` (``create``). None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        os.makedirs(path, exist_ok=True)
        _fsync_path(path.parent)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except NotADirectoryError:
        raise UnsafePath(str(path), "cold tier is not a directory") from None
    return Dir(fd, path)


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sanitize_mode(mode: int) -> int:
    """What a file placed in a tier may be, whatever a manifest says: never group/other-writable,
    setuid, setgid or sticky; readable by its owner."""
    return (stat.S_IMODE(mode) & 0o755) | 0o400
