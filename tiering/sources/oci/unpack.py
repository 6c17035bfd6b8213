"""A tar layer unpacked into the scratch tree of an import (tiering/sources/oci/importer.py), entry by
entry as the blob streams in, every entry checked (see importer's docstring for what is refused).

tarfile is handed only what it can read in bounded memory: gzip is inflated by ``gzip.GzipFile`` (at
most what is asked for at a time; tarfile's own ``r|gz`` inflates each input chunk unbounded and
copies its buffer on every read), tarfile reads that through a 64 KiB buffer (``r|``), and its
headers are :class:`_Entry`, which refuses a pax or GNU long-name header over 1 MiB before tarfile
reads it whole, and every ``GNU.sparse.*`` key before tarfile parses it. What tarfile or gzip still
raise is one line naming the layer (BadInput, exit 2), after the blob's digest is checked.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import stat
import tarfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...content.names import validate_relpath
from ...errors import BadInput, NoSpace, TieringError, UnsafePath
from .client import STREAM_CHUNK

OWN_PREFIX = ".weightd/"
MAX_META_HEADER = 1 << 20    # the largest pax (x/g) or GNU long name/link (L/K) header body read
NAME_MAX, PATH_MAX = 255, 3072   # bytes of a name, of a path in the tree (Linux's 4095 less the scratch's)


class Blob(Protocol):
    """A layer's bytes read through its digest check (importer._Checked)."""

    def read(self, n: int = -1) -> bytes: ...

    def drain(self) -> None: ...

    def check(self) -> None: ...


@dataclass(slots=True)
class Staging:
    """The scratch directory being filled, shared by the workers: paths claimed (each once), bytes
    written against the free space found at the start, symlinks to make once every layer is in."""
    root: Path
    budget: int
    used: int = 0
    files: dict[str, int] = field(default_factory=dict)     # path -> size
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)      # symlink path -> its target
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, rel: str, size: int, where: str, *, link: str | None = None) -> None:
        """``rel`` is ours to make (UnsafePath when another entry made it, or one of its parents is a
        file or a symlink), ``size`` bytes counted against the budget (NoSpace)."""
        with self.lock:
            if rel in self.files or rel in self.links or rel in self.dirs:
                raise UnsafePath(f"{where}: {rel}", "the artifact holds this path twice: refused")
            parts = rel.split("/")
            for k in range(1, len(parts)):
                parent = "/".join(parts[:k])
                if parent in self.files or parent in self.links:
                    raise UnsafePath(f"{where}: {rel}", f"its directory {parent} is a file or a symlink: refused")
            if self.used + size > self.budget:
                raise NoSpace(f"import staging {self.root.parent}", self.used + size, self.budget,
                              f"unpacking {where} needs more than the free space there: refused")
            self.used += size
            if link is not None:
                self.links[rel] = link
            else:
                self.files[rel] = size
            self.dirs.update("/".join(parts[:k]) for k in range(1, len(parts)))

    def dir(self, rel: str) -> None:
        with self.lock:
            if rel in self.files or rel in self.links:
                raise UnsafePath(f"{self.root}: {rel}", "the artifact holds this path twice: refused")
            self.dirs.add(rel)

    def open_new(self, rel: str) -> int:
        """A new file at ``rel`` (0644), its directories made (0755) without following a symlink (the
        modes set whatever the umask: a daemon of another user publishes from here)."""
        self.parents(rel)
        fd = os.open(self.root / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.fchmod(fd, 0o644)
        return fd

    def parents(self, rel: str) -> None:
        parts = rel.split("/")
        for k in range(1, len(parts)):
            d = self.root.joinpath(*parts[:k])
            try:
                os.mkdir(d, 0o755)
                os.chmod(d, 0o755, follow_symlinks=False)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(d).st_mode):
                    raise UnsafePath(str(d), "not a directory") from None


def copy_to(fd: int, read: Any, size: int | None = None) -> int:
    n = 0
    while size is None or n < size:
        chunk = read(STREAM_CHUNK if size is None else min(STREAM_CHUNK, size - n))
        if not chunk:
            break
        n += len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
    return n


def _entry_path(name: str, where: str) -> str | None:
    """A tar entry's path in the tree (None for the tree's root), or UnsafePath."""
    rel = name.rstrip("/")
    while rel.startswith("./"):
        rel = rel[2:]
    if rel in ("", "."):
        return None
    try:
        validate_relpath(rel, "tar entry")
    except UnsafePath as exc:
        raise UnsafePath(f"{where}: tar entry {name!r}", exc.reason + ": refused, nothing published") from None
    raw = rel.encode("utf-8")
    if len(raw) > PATH_MAX or max(len(p) for p in raw.split(b"/")) > NAME_MAX:
        raise UnsafePath(f"{where}: tar entry {name[:80]!r}" + ("..." if len(name) > 80 else ""),
                         f"a name over {NAME_MAX} bytes or a path over {PATH_MAX}: refused, nothing published")
    if rel == ".weightd" or rel.startswith(OWN_PREFIX):
        raise UnsafePath(f"{where}: tar entry {name!r}", "a path under .weightd/ (weightd's own files): refused")
    return rel


class _Unreadable(Exception):
    """What tarfile or gzip could not read (or what _Entry refused), said in one line by untar."""


class _Entry(tarfile.TarInfo):
    """A tar header refused before tarfile acts on it: a pax (x/g/X) or GNU long name/link (L/K) header
    whose body is over MAX_META_HEADER (tarfile reads it whole into memory), a negative size, an old
    GNU sparse header (S: a chain of blocks read into a list) and any ``GNU.sparse.*`` pax key (their
    maps are parsed without bounds, and raise bare ValueErrors)."""

    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.size < 0:
            raise _Unreadable(f"a header of size {self.size}")
        if self.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                         tarfile.GNUTYPE_LONGLINK) and self.size > MAX_META_HEADER:
            kind = "GNU long name" if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) else "pax"
            raise _Unreadable(f"a {kind} header of {self.size} bytes, over {MAX_META_HEADER >> 20} MiB")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _Unreadable("a GNU sparse file")
        return super()._proc_member(tf)  # type: ignore[misc]

    def _sparse(self, *_: Any) -> None:
        raise _Unreadable("a GNU.sparse pax header (sparse files are not imported)")

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _sparse

    def _apply_pax_info(self, pax_headers: dict[str, str], encoding: str, errors: str) -> None:
        if any(k.startswith("GNU.sparse.") for k in pax_headers):
            self._sparse()
        super()._apply_pax_info(pax_headers, encoding, errors)  # type: ignore[misc]


def _reading(call: Any, *args: Any) -> Any:
    """``call(*args)``, a read of the tar stream: what tarfile or gzip raise is _Unreadable, weightd's
    own errors (a blob that passes its size, a refusal) as they are."""
    try:
        return call(*args)
    except (TieringError, _Unreadable):
        raise
    except (tarfile.TarError, zlib.error, EOFError, ValueError, OSError) as exc:
        raise _Unreadable(f"{type(exc).__name__}: {exc}" if not isinstance(exc, tarfile.TarError) else str(exc)) \
            from None


def untar(blob: Blob, gz: bool, staging: Staging, where: str) -> None:
    """The tar stream's entries into the tree, as they arrive. A stream that is not a tar archive (or
    is one refused by _Entry) is BadInput, unless its bytes are not the blob's digest (then
    BlobMismatch: checked first). Gzip is inflated by GzipFile, at most what is asked for at a time,
    and tarfile reads that as a stream ("r|"), 64 KiB at a time."""
    src: Any = gzip.GzipFile(fileobj=blob, mode="rb") if gz else blob   # type: ignore[arg-type]
    try:
        with _reading(lambda: tarfile.open(fileobj=src, mode="r|", bufsize=64 << 10, tarinfo=_Entry)) as tf:
            mine: set[str] = set()   # (the files of this archive: what a hard link in it may name)
            while (entry := _reading(tf.next)) is not None:
                _one_entry(tf, entry, staging, where, mine)
    except _Unreadable as exc:
        blob.drain()
        blob.check()
        raise BadInput(f"{where}: not a valid {'gzip-compressed ' if gz else ''}tar archive ({exc}): refused, "
                       f"nothing published") from None


def _one_entry(tf: tarfile.TarFile, entry: tarfile.TarInfo, staging: Staging, where: str, mine: set[str]) -> None:
    rel = _entry_path(entry.name, where)
    what = f"{where}: tar entry {entry.name!r}"
    if entry.isdir():
        if rel is not None:
            staging.dir(rel)
        return
    if rel is None:
        raise UnsafePath(what, "not a directory at the tree's root: refused")
    if entry.issym():
        target = entry.linkname
        inside = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if len(target.encode("utf-8", "surrogateescape")) > PATH_MAX:
            raise UnsafePath(what, f"a symlink target over {PATH_MAX} bytes: refused, nothing published")
        if target.startswith("/") or inside == ".." or inside.startswith("../") or "\x00" in target:
            raise UnsafePath(what, f"a symlink to {target!r}, outside the tree: refused, nothing published")
        staging.claim(rel, 0, where, link=target)
        return
    if entry.islnk():
        try:
            src = _entry_path(entry.linkname, where)
        except UnsafePath:
            src = None
        if src is None or src not in mine:
            raise UnsafePath(what, f"a hard link to {entry.linkname!r}, not a file this archive unpacked before "
                                   f"it: refused, nothing published")
        size = staging.files[src]
        staging.claim(rel, size, where)
        mine.add(rel)
        fd = staging.open_new(rel)
        try:
            sfd = os.open(staging.root / src, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                copy_to(fd, lambda n: os.read(sfd, n), size)
            finally:
                os.close(sfd)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    if not entry.isreg() or entry.issparse():
        kind = "a device" if entry.ischr() or entry.isblk() else "a fifo" if entry.isfifo() else \
            "a sparse file" if entry.issparse() else f"of tar type {entry.type!r}"
        raise UnsafePath(what, f"{kind}: only files, directories and links inside the tree are imported: refused")
    staging.claim(rel, entry.size, where)
    mine.add(rel)
    f = tf.extractfile(entry)
    assert f is not None
    fd = staging.open_new(rel)
    try:
        if copy_to(fd, lambda n: _reading(f.read, n), entry.size) != entry.size:
            raise BadInput(f"{what}: the archive ends inside it: refused, nothing published")
        os.fsync(fd)
    finally:
        os.close(fd)


def make_links(staging: Staging, where: str) -> None:
    """The archives' symlinks, made once every file is in, each resolving inside the tree."""
    root = os.path.realpath(staging.root)
    for rel, target in sorted(staging.links.items()):
        staging.parents(rel)
        os.symlink(target, staging.root / rel)
    for rel in staging.links:
        real = os.path.realpath(staging.root / rel)
        if real != root and not real.startswith(root + "/"):
            raise UnsafePath(f"{where}: tar entry {rel!r}", "a symlink that resolves outside the tree (through "
                                                              "another symlink): refused, nothing published")
