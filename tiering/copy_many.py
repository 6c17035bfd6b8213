"""Many files copied at once (publish's copy into cold storage): largest first, a few threads at a
time; a compile cache's thousands of small files each opened by name in its directory (opened once),
hashed from the bytes written where the caller asks (its manifest is then built without reading the
copies back), and made durable by one ``syncfs``. One file's copy is :func:`tiering.copy.copy_file`."""

from __future__ import annotations

import errno
import os
import stat
import time
from typing import Callable, Sequence

import xxhash

from ._syscalls import syncfs
from .content.scan import Parents, create_file_at
from .copy import SMALL_FILE_BYTES, SMALL_FILES, CopyJob, _create_dst, _open_src, copy_file, run_all, where
from .errors import FileChanged, TimedOut, UnsafePath
from .safefs import Dir, FileRef, PinnedFile, sanitize_mode, split_rel

#: threads copying many small files at once (at most the caller's ``threads``): each file is a few
#: system calls around a little Python, and on a disk the kernel's time in each ``open(O_CREAT)`` is
#: most of it, which a second thread overlaps (a publish of 10,000 files of 10 KB into cold storage on
#: ext4, 2 cores: median 0.92 s on two threads against 0.98 s on one, 6 interleaved rounds). Into
#: tmpfs two are slower than one (verified_copy keeps one there); publish never writes to tmpfs.
SMALL_FILE_THREADS = 2
# a copy's (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, xxh3-128 of its bytes)
Hashed = tuple[int, int, int, int, int, str]


_PINNED_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW


def _open_pinned(src: PinnedFile, size: int) -> int:
    """A scanned file of a directory being published, as ``PinnedFile.open_read`` opens it (the last
    component never followed, never blocking on a FIFO, only the very inode that was scanned) with one
    ``fstat`` instead of two and no ``ioctl`` to clear ``O_NONBLOCK`` (a regular file's reads ignore it,
    as :func:`tiering.content.scan.open_file_at`'s do); its size must still be the scanned one."""
    try:
        fd = os.open(src.path, _PINNED_FLAGS | os.O_NOATIME)
    except PermissionError:   # (O_NOATIME needs us to own the file)
        fd = os.open(src.path, _PINNED_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(src.path, "is a symlink (refused; weightd never follows one here)") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(src.path, "not a regular file (FIFO, socket, device or directory): refused")
        if (st.st_dev, st.st_ino) != (src.dev, src.ino):
            raise FileChanged(src.path, "was replaced after it was scanned (another writer?): not read; try again")
        if st.st_size != size:
            raise FileChanged(src.path, f"source has {st.st_size} bytes, expected {size} (changed since it was "
                                        f"scanned)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _create(dst: "str | FileRef", mode: int) -> int:
    """A new destination file as :func:`tiering.copy._create_dst` makes it, directly in its (made,
    opened once) directory with its final ``mode`` (else 0600, set right after)."""
    if isinstance(dst, FileRef) and "/" not in dst.rel:
        return create_file_at(dst.dir, dst.rel, mode)
    return _create_dst(dst)


def _copy_hashed(job: CopyJob, key: str, hashed: dict[str, Hashed], progress: Callable[[int], None] | None) -> None:
    """A small file read whole into memory, written, and its xxh3-128 taken from the bytes written (a
    manifest's one part of it: build_manifest need not read the copy back), kept as ``hashed[key]``
    with the identity of the copy; a source shorter or longer than ``job.size`` is FileChanged.

    Nine system calls a file: open, fstat, one read (a read short of the ``size + 1`` bytes asked ends
    at the end of a regular file: no second read to see it; a longer file is caught by the one byte
    more, a later change by the publisher's check of every source after the copy), the new file made
    with its final mode (an ``fchmod`` only where the umask took bits away), write, its ``fstat`` (the
    identity the manifest's builder checks) and two closes."""
    sfd = _open_pinned(job.src, job.size) if isinstance(job.src, PinnedFile) else _open_src(job.src)
    try:
        data = os.read(sfd, job.size + 1)
        while len(data) < job.size and (more := os.read(sfd, job.size + 1 - len(data))):
            data += more
        if len(data) != job.size:
            raise FileChanged(where(job.src), f"source has {'more' if len(data) > job.size else len(data)} bytes, "
                                              f"expected {job.size} (changed since it was scanned)")
        mode = sanitize_mode(job.mode)
        dfd = _create(job.dst, mode)
        try:
            view, w = memoryview(data), 0
            while w < len(data):
                w += os.write(dfd, view[w:])
            st = os.fstat(dfd)
            if stat.S_IMODE(st.st_mode) != mode:   # (a umask that takes away bits the file should have)
                os.fchmod(dfd, mode)
                st = os.fstat(dfd)   # (the change time the manifest's builder checks is the fchmod's)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    hashed[key] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, xxhash.xxh3_128_hexdigest(data))
    if progress is not None:
        progress(len(data))


def copy_files(jobs: Sequence[CopyJob], *, threads: int = 2, preallocate: bool = True,
               progress: Callable[[int], None] | None = None, deadline: float | None = None,
               clock: Callable[[], float] = time.monotonic, hashed: "dict[str, Hashed] | None" = None) -> None:
    """Copy many files (largest first, ``threads`` at a time); the first error cancels the rest.
    With a ``deadline`` even a read that never returns (a hung NFS server) cannot hold the caller.

    Many small files (a compile cache: thousands of a few KB) are copied as such: every destination
    directory is made and opened once (:class:`MadeDirs`), not walked again for each file, and the
    files and directories are made durable by one ``syncfs`` of their file system at the end instead of
    an ``fsync`` each (on a disk, those cost more than the copies). With ``hashed``, each of them is
    hashed from the bytes it is written from (:func:`_copy_hashed`), by its path beneath the
    destination's directory."""
    order = sorted(jobs, key=lambda j: -j.size)
    small = len(order) > SMALL_FILES and sum(j.size for j in order) < SMALL_FILE_BYTES * len(order)
    made = MadeDirs()

    def one(item: tuple[str | None, CopyJob]) -> None:
        key, j = item
        if hashed is None or key is None or j.size > SMALL_FILE_BYTES:
            copy_file(j, preallocate=preallocate, progress=progress, deadline=deadline, clock=clock, fsync=not small)
        elif deadline is not None and clock() > deadline:
            raise TimedOut(f"timed out copying {where(j.src)}")
        else:
            _copy_hashed(j, key, hashed, progress)
    try:
        keyed = [(j.dst.rel if small and isinstance(j.dst, FileRef) else None, in_parents(j, made) if small else j)
                 for j in order]
        run_all(one, keyed, threads=min(threads, SMALL_FILE_THREADS) if small else threads,
                name="weightd-copy", deadline=deadline, clock=clock)
        if small:
            roots = {id(j.dst.dir): j.dst.dir for j in order if isinstance(j.dst, FileRef)}
            for d in roots.values():
                syncfs(d.fd)   # (the files, and the directories MadeDirs made without an fsync each)
                break   # (one file system: the staging area's)
            for j in order:
                if not isinstance(j.dst, FileRef):
                    os.sync()   # (paths outside any tier: tools and tests)
                    break
    finally:
        made.close()


class MadeDirs(Parents):
    """The destination directories of many small files, each made (0755) and opened once, beneath its
    own parent's descriptor (one component each, never through a symlink: :meth:`Dir.mkdir` refuses
    anything else in a directory's place, :meth:`Dir.sub` opens ``O_NOFOLLOW | O_DIRECTORY``), kept
    until :meth:`close`. Unlike ``Parents(create=True)``, a new directory's parent is not fsynced:
    whoever copies into them ends with one ``syncfs`` of their file system (:func:`copy_files`)."""

    def __init__(self) -> None:
        super().__init__(create=True)

    def _open(self, top: Dir, rel: str) -> Dir:
        """``top/rel`` made and opened; the directories on the way are made and closed again (one
        descriptor a directory that holds files: a cache of a directory per kernel under prefix
        directories kept twice that many open, past a shell's 1024)."""
        cur, at, passed = top, "", []
        try:
            for p in split_rel(rel):
                at = f"{at}/{p}" if at else p
                nxt = self.dirs.get((id(top), at))
                if nxt is None:
                    cur.mkdir(p, 0o755)
                    nxt = cur.sub(p)
                    if at != rel:
                        passed.append(nxt)
                cur = nxt
        finally:
            for d in passed:
                d.close()
        return cur


def in_parents(job: CopyJob, made: Parents) -> CopyJob:
    """The job with its destination as a name in its (made, opened once) parent directory: each new
    file is then one ``openat`` of one component, not a walk from the top (many small files)."""
    if not isinstance(job.dst, FileRef) or "/" not in job.dst.rel:
        return job
    return CopyJob(job.src, FileRef(*made.split(job.dst)), job.size, job.mode)
