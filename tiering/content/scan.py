"""Walk a checkpoint directory safely: what files it holds, and nothing that could escape it."""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BadInput, CheckpointNotFound, UnsafePath
from ..safefs import Dir, FileRef, PinnedFile
from ..safefs.paths import unsafe
from .names import CONTROL_RE

#: directories that belong to tools, not to the checkpoint (relative to the checkpoint root)
EXCLUDED_DIRS = (".weightd", ".git", ".cache/huggingface")
METADATA_DIR = ".weightd"


@dataclass(frozen=True, slots=True)
class ScannedFile:
    relpath: str       # POSIX path relative to the checkpoint root
    path: "PinnedFile | FileRef"  # what to open: the file as scanned (for a symlink in an HF cache
                                  # snapshot, its resolved target), or a FileRef beneath the directory
                                  # for a checkpoint inside a tier
    size: int
    mode: int          # permission bits
    mtime_ns: int
    dev: int
    ino: int
    ctime_ns: int = 0  # (changed by any write or chmod; unlike mtime, no one can set it back)


def _allowed_roots(root: Path) -> list[Path]:
    """The checkpoint itself, plus ``blobs/`` when ``root`` is an HF hub cache snapshot (a real
    directory beside ``snapshots/``: a ``blobs`` symlink would let a snapshot's links lead anywhere)."""
    allowed = [root]
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and not blobs.is_symlink() and blobs.is_dir():
        allowed.append(blobs)
    return allowed


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _check_name(where: Path, name: str) -> None:
    """A name a manifest can carry: valid UTF-8 and no control character (an escape sequence in a file
    name would otherwise reach an operator's terminal through every listing and error)."""
    if name.isascii() and name.isprintable():   # (the common case, in C: a compile cache has 10,000 names)
        return
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(str(where / name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")),
                         "file name is not valid UTF-8") from None
    if CONTROL_RE.search(name):
        raise UnsafePath(f"{where}/{name!r}", "control character in a file name")


# -- a file directly in an open directory, by name (the many-small-files paths) -----------------------

def _one_component(d: Dir, name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise UnsafePath(f"{d.path}/{name!r}", "not one component of a path beneath its directory")


def open_file_at(d: Dir, name: str) -> tuple[int, os.stat_result]:
    """The regular file ``name`` directly in ``d`` (a directory descriptor opened beneath its tier),
    read-only, and its ``fstat``: opened ``O_NOFOLLOW | O_NONBLOCK`` (``O_NOATIME`` where we own it),
    and only a regular file is kept (a FIFO or device planted there is never read).

    One component beneath a descriptor has nothing on the way to resolve: ``O_NOFOLLOW`` refuses the
    one symlink there could be and ``..`` is refused by name, which is what ``openat2``'s
    ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` guarantees for a longer path (:meth:`Dir.open_read`), at
    a plain ``openat``'s cost (through ctypes ``openat2`` costs ~10 us more a call: a tenth of a second
    for a compile cache's 10,000 files). ``O_NONBLOCK`` is left set: a regular file's reads ignore it."""
    _one_component(d, name)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(name, flags | os.O_NOATIME, dir_fd=d.fd)
        except PermissionError:   # (O_NOATIME needs us to own the file)
            fd = os.open(name, flags, dir_fd=d.fd)
    except OSError as exc:
        raise unsafe(f"{d.path}/{name}", exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{d.path}/{name}", "not a regular file (FIFO, socket, device or directory): refused")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def create_file_at(d: Dir, name: str, mode: int = 0o600) -> int:
    """A new file ``name`` directly in ``d``, write-only: ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an
    existing file, never through a symlink; see :func:`open_file_at` for why one component needs no
    ``openat2``)."""
    _one_component(d, name)
    try:
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=d.fd)
    except OSError as exc:
        raise unsafe(f"{d.path}/{name}", exc) from None


class Parents:
    """The parent directory of each of many files beneath a :class:`Dir`, opened once (made first,
    0755, with ``create``) and kept until :meth:`close`: ``split(FileRef(top, "a/b/c"))`` is
    ``(the Dir of top/a/b, "c")``, so each file is then one component beneath its directory."""

    def __init__(self, *, create: bool = False) -> None:
        self.create = create
        self.dirs: dict[tuple[int, str], Dir] = {}
        self.lock = threading.Lock()   # (copy threads share one)

    def split(self, ref: FileRef) -> tuple[Dir, str]:
        parent, _, name = ref.rel.rpartition("/")
        if not parent:
            return ref.dir, name
        key = (id(ref.dir), parent)
        d = self.dirs.get(key)
        if d is None:
            with self.lock:
                d = self.dirs.get(key)
                if d is None:
                    d = self.dirs[key] = self._open(ref.dir, parent)
        return d, name

    def _open(self, top: Dir, rel: str) -> Dir:
        """``top/rel`` opened (made first with ``create``), with the lock held."""
        return top.sub(rel, create=True, mode=0o755) if self.create else top.sub(rel)

    def close(self) -> None:
        with self.lock:
            for d in self.dirs.values():
                d.close()
            self.dirs.clear()

    def __enter__(self) -> "Parents":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan_dir(top: Dir) -> list[ScannedFile]:
    """Every regular file of a checkpoint inside a tier (a version in cold storage, a staging area),
    walked by descriptor. Nothing there may be a symlink or a special file: each is refused naming it
    (a published version is files, and weightd never follows a link planted in one)."""
    out: list[ScannedFile] = []

    def walk(d: Dir, rel: str) -> None:
        for name, st in d.entries():
            relpath = f"{rel}{name}"
            _check_name(d.path, name)
            if relpath in EXCLUDED_DIRS:
                continue
            if stat.S_ISDIR(st.st_mode):
                with d.sub(name) as sub:
                    walk(sub, relpath + "/")
            elif stat.S_ISREG(st.st_mode):
                out.append(ScannedFile(relpath, FileRef(top, relpath), st.st_size, stat.S_IMODE(st.st_mode),
                                       st.st_mtime_ns, st.st_dev, st.st_ino, st.st_ctime_ns))
            elif stat.S_ISLNK(st.st_mode):
                raise UnsafePath(str(d.path / name), "symlink inside a checkpoint in a tier (refused; weightd "
                                                     "never follows one there)")
            else:
                raise UnsafePath(str(d.path / name), "special file (FIFO, socket or device) in a checkpoint")

    walk(top, "")
    return out


#: ``check(path, st)``: called with the very inode the scan pinned (each directory, each file, each
#: symlink's target); raises to refuse it (the daemon checks its caller's permissions here)
CheckFn = Callable[[str, os.stat_result], None]


def scan_checkpoint(root: "str | os.PathLike[str] | Dir", *, check: "CheckFn | None" = None) -> list[ScannedFile]:
    """Every regular file under ``root``, sorted by relative path.

    Walked by directory descriptor (a directory is opened ``O_NOFOLLOW`` beneath its parent's
    descriptor and must be the one listed), so a component swapped for a symlink mid-walk is refused,
    never entered. Symlinks to files are followed only when they resolve inside the checkpoint (or,
    for a Hugging Face cache snapshot, inside its ``blobs/``), judged by where the opened file really
    is; FIFOs, sockets, devices, symlinked directories and non-UTF-8 names are errors, so nothing
    outside the checkpoint is ever read or published. Each file is pinned (device, inode) for the
    readers (:class:`~tiering.safefs.PinnedFile`). A :class:`Dir` (a checkpoint inside a tier) is
    scanned by descriptor with :func:`scan_dir`: no symlinks at all.
    """
    if isinstance(root, Dir):
        return scan_dir(root)
    top = Path(root)
    try:
        top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CheckpointNotFound(str(top), "no such directory") from None
    except NotADirectoryError:
        raise BadInput(f"{top}: not a directory") from None
    except OSError as exc:
        raise BadInput(f"{top}: {exc.strerror}") from None
    out: list[ScannedFile] = []
    try:
        real_root = Path(os.readlink(f"/proc/self/fd/{top_fd}"))  # where the opened directory really is
        walk = _Walk(_allowed_roots(real_root), check, out)
        if check is not None:
            check(str(top), os.fstat(top_fd))
        walk.dir(top_fd, top, "")
    finally:
        os.close(top_fd)
    return out


class _Walk:
    """One walk of :func:`scan_checkpoint`: each directory by descriptor, its files into ``out``."""

    def __init__(self, allowed: list[Path], check: "CheckFn | None", out: list[ScannedFile]) -> None:
        self.allowed, self.check, self.out = allowed, check, out

    def dir(self, dfd: int, dirpath: Path, rel: str) -> None:
        """The entries of the directory open at ``dfd`` (``dirpath``, ``rel`` in the checkpoint)."""
        try:
            entries = sorted(os.scandir(dfd), key=lambda e: e.name)
        except PermissionError:
            raise BadInput(f"{dirpath}: permission denied") from None
        for entry in entries:
            name = entry.name
            relpath = f"{rel}{name}"
            _check_name(dirpath, name)
            if relpath in EXCLUDED_DIRS:
                continue
            lst = entry.stat(follow_symlinks=False)
            path = str(dirpath / name)
            if stat.S_ISLNK(lst.st_mode):
                self.out.append(_followed_symlink(dirpath / name, path, relpath, self.allowed, self.check))
            elif stat.S_ISDIR(lst.st_mode):
                self.subdir(dfd, name, lst, dirpath, relpath)
            elif stat.S_ISREG(lst.st_mode):
                if self.check is not None:
                    self.check(path, lst)
                self.out.append(ScannedFile(relpath, PinnedFile(path, lst.st_dev, lst.st_ino), lst.st_size,
                                            stat.S_IMODE(lst.st_mode), lst.st_mtime_ns, lst.st_dev, lst.st_ino,
                                            lst.st_ctime_ns))
            else:
                raise UnsafePath(path, "special file (FIFO, socket or device) in a checkpoint")

    def subdir(self, dfd: int, name: str, lst: os.stat_result, dirpath: Path, relpath: str) -> None:
        """The directory ``name`` listed in ``dfd`` as ``lst``: opened beneath it, never through a
        symlink, and only if it is still the directory listed."""
        path = str(dirpath / name)
        try:
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                          dir_fd=dfd)
        except OSError as exc:
            raise UnsafePath(path, f"changed while it was scanned ({exc.strerror}): refused") from None
        try:
            st = os.fstat(sub)
            if (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino):
                raise UnsafePath(path, "was replaced while it was scanned: refused")
            if self.check is not None:
                self.check(path, st)
            self.dir(sub, dirpath / name, relpath + "/")
        finally:
            os.close(sub)


def _followed_symlink(where: Path, link: str, relpath: str, allowed: list[Path],
                      check: "CheckFn | None" = None) -> ScannedFile:
    """A symlink in a checkpoint: only to a regular file inside the checkpoint (or its HF ``blobs/``),
    judged by where the file it leads to really is once opened (``O_PATH``, then its
    ``/proc/self/fd`` name), so a component swapped between the judgement and the open cannot make
    it pin a file elsewhere."""
    try:
        fd = os.open(link, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafePath(str(where), "dangling symlink") from None
    except OSError as exc:
        raise UnsafePath(str(where), f"cannot follow it ({exc.strerror})") from None
    try:
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        tst = os.fstat(fd)
    finally:
        os.close(fd)
    if not _inside(target, allowed):
        raise UnsafePath(str(where), f"symlink escapes the checkpoint (-> {target})")
    if stat.S_ISDIR(tst.st_mode):
        raise UnsafePath(str(where), "symlinked directories are not supported")
    if not stat.S_ISREG(tst.st_mode):
        raise UnsafePath(str(where), "symlink to a special file (FIFO, socket or device)")
    if check is not None:
        check(str(target), tst)
    return ScannedFile(relpath, PinnedFile(str(target), tst.st_dev, tst.st_ino), tst.st_size, stat.S_IMODE(tst.st_mode),
                       tst.st_mtime_ns, tst.st_dev, tst.st_ino, tst.st_ctime_ns)
