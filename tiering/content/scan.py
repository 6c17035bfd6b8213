"""Walk a checkpoint directory safely: what files it holds, and nothing that could escape it."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput, CheckpointNotFound, UnsafePath
from ..safefs import Dir, FileRef, PinnedFile

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


def _allowed_roots(root: Path) -> list[Path]:
    """The checkpoint itself, plus ``blobs/`` when ``root`` is an HF hub cache snapshot."""
    allowed = [root]
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        allowed.append((root.parent.parent / "blobs").resolve())
    return allowed


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _check_name(where: Path, name: str) -> None:
    """A name a manifest can carry: valid UTF-8 and no control character (an escape sequence in a file
    name would otherwise reach an operator's terminal through every listing and error)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(str(where / name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")),
                         "file name is not valid UTF-8") from None
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise UnsafePath(f"{where}/{name!r}", "control character in a file name")


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
                                       st.st_mtime_ns, st.st_dev, st.st_ino))
            elif stat.S_ISLNK(st.st_mode):
                raise UnsafePath(str(d.path / name), "symlink inside a checkpoint in a tier (refused; weightd "
                                                     "never follows one there)")
            else:
                raise UnsafePath(str(d.path / name), "special file (FIFO, socket or device) in a checkpoint")

    walk(top, "")
    return out


def scan_checkpoint(root: "str | os.PathLike[str] | Dir") -> list[ScannedFile]:
    """Every regular file under ``root``, sorted by relative path.

    Symlinks are followed only when they resolve inside the checkpoint (or, for a Hugging Face cache
    snapshot, inside its ``blobs/``); FIFOs, sockets, devices, symlinked directories and non-UTF-8 names
    are errors, so nothing outside the checkpoint is ever read or published. A :class:`Dir` (a
    checkpoint inside a tier) is scanned by descriptor with :func:`scan_dir`: no symlinks at all.
    """
    if isinstance(root, Dir):
        return scan_dir(root)
    top = Path(root)
    try:
        st = top.stat()
    except FileNotFoundError:
        raise CheckpointNotFound(str(top), "no such directory") from None
    except OSError as exc:
        raise BadInput(f"{top}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{top}: not a directory")
    real_root = top.resolve()
    allowed = _allowed_roots(real_root)
    out: list[ScannedFile] = []

    def walk(dirpath: Path, rel: str) -> None:
        try:
            entries = sorted(os.scandir(dirpath), key=lambda e: e.name)
        except PermissionError:
            raise BadInput(f"{dirpath}: permission denied") from None
        for entry in entries:
            name = entry.name
            relpath = f"{rel}{name}"
            _check_name(dirpath, name)
            if relpath in EXCLUDED_DIRS:
                continue
            lst = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(lst.st_mode):
                out.append(_followed_symlink(dirpath / name, entry.path, relpath, allowed))
            elif stat.S_ISDIR(lst.st_mode):
                walk(Path(entry.path), relpath + "/")
            elif stat.S_ISREG(lst.st_mode):
                out.append(ScannedFile(relpath, PinnedFile(entry.path, lst.st_dev, lst.st_ino), lst.st_size, stat.S_IMODE(lst.st_mode),
                                       lst.st_mtime_ns, lst.st_dev, lst.st_ino))
            else:
                raise UnsafePath(str(dirpath / name), "special file (FIFO, socket or device) in a checkpoint")

    walk(top, "")
    return out


def _followed_symlink(where: Path, link: str, relpath: str, allowed: list[Path]) -> ScannedFile:
    """A symlink in a checkpoint: only to a regular file inside the checkpoint (or its HF ``blobs/``)."""
    target = Path(os.path.realpath(link))
    if not _inside(target, allowed):
        raise UnsafePath(str(where), f"symlink escapes the checkpoint (-> {target})")
    try:
        tst = target.stat()
    except FileNotFoundError:
        raise UnsafePath(str(where), "dangling symlink") from None
    if stat.S_ISDIR(tst.st_mode):
        raise UnsafePath(str(where), "symlinked directories are not supported")
    if not stat.S_ISREG(tst.st_mode):
        raise UnsafePath(str(where), "symlink to a special file (FIFO, socket or device)")
    return ScannedFile(relpath, PinnedFile(str(target), tst.st_dev, tst.st_ino), tst.st_size, stat.S_IMODE(tst.st_mode),
                       tst.st_mtime_ns, tst.st_dev, tst.st_ino)
