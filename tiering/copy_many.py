"""Many files copied at once (publish's copy into cold storage): largest first, a few threads at a
time; a compile cache's thousands of small files each opened by name in its directory (opened once),
hashed from the bytes written where the caller asks (its manifest is then built without reading the
copies back), and made durable by one ``syncfs``. One file's copy is :func:`tiering.copy.copy_file`."""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import xxhash

from ._syscalls import syncfs
from .content.scan import Parents
from .copy import SMALL_FILE_BYTES, SMALL_FILES, CopyJob, _create_dst, _open_src, copy_file, run_all, where
from .errors import FileChanged, TimedOut
from .safefs import FileRef, sanitize_mode

# a copy's (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, xxh3-128 of its bytes)
Hashed = tuple[int, int, int, int, int, str]


def _copy_hashed(job: CopyJob, key: str, hashed: dict[str, Hashed], progress: Callable[[int], None] | None) -> None:
    """A small file read whole into memory, written, and its xxh3-128 taken from the bytes written (a
    manifest's one part of it: build_manifest need not read the copy back), kept as ``hashed[key]``
    with the identity of the copy; a source shorter or longer than ``job.size`` is FileChanged."""
    sfd = _open_src(job.src)
    try:
        data = os.read(sfd, job.size + 1)
        while len(data) <= job.size and (more := os.read(sfd, job.size + 1 - len(data))):
            data += more
        if len(data) != job.size:
            raise FileChanged(where(job.src), f"source has {'more' if len(data) > job.size else len(data)} bytes, "
                                              f"expected {job.size} (changed since it was scanned)")
        dfd = _create_dst(job.dst)
        try:
            view, w = memoryview(data), 0
            while w < len(data):
                w += os.write(dfd, view[w:])
            os.fchmod(dfd, sanitize_mode(job.mode))
            st = os.fstat(dfd)
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
    directory is made and opened once, not walked again for each file, and the files are made durable
    by one ``syncfs`` of their file system at the end instead of an ``fsync`` each (on a disk, those
    cost more than the copies). With ``hashed``, each of them is hashed from the bytes it is written
    from (:func:`_copy_hashed`), by its path beneath the destination's directory."""
    order = sorted(jobs, key=lambda j: -j.size)
    small = len(order) > SMALL_FILES and sum(j.size for j in order) < SMALL_FILE_BYTES * len(order)
    made = Parents(create=True)

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
        run_all(one, keyed, threads=1 if small else threads,   # (see verified_copy: one thread for many small files)
                name="weightd-copy", deadline=deadline, clock=clock)
        if small:
            roots = {id(j.dst.dir): j.dst.dir for j in order if isinstance(j.dst, FileRef)}
            for d in roots.values():
                syncfs(d.fd)
                break   # (one file system: the staging area's)
            for j in order:
                if not isinstance(j.dst, FileRef):
                    os.sync()   # (paths outside any tier: tools and tests)
                    break
    finally:
        made.close()


def in_parents(job: CopyJob, made: Parents) -> CopyJob:
    """The job with its destination as a name in its (made, opened once) parent directory: each new
    file is then one ``openat`` of one component, not a walk from the top (many small files)."""
    if not isinstance(job.dst, FileRef) or "/" not in job.dst.rel:
        return job
    return CopyJob(job.src, FileRef(*made.split(job.dst)), job.size, job.mode)
