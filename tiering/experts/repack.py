"""Writing an expert-parallel rank's copy from a directory holding the version's bytes (a cold tier on a
path, a local copy of the whole version, or the sparse files a ranged download left).

Only the kept tensors' byte ranges are read (``pread``; neighbours that follow each other in the source
in one read, at most :data:`CHUNK` at a time), each fed to its xxh3-128 and compared with the version's
manifest when it ends (ChecksumMismatch, exit 5, naming the tensor); headers and index files are made
from the copy's manifest and checked against it. A manifest cannot make it read or write outside its
files: every range read is checked against the shard's header size, its manifest size and the size
of the open file, kept ranges may not overlap, and every file is opened under the source and staging
directories by descriptor (never following a symlink).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import xxhash

from .._syscalls import is_tmpfs, start_writeback
from ..content.manifest import FileEntry, Manifest, chunk_ranges
from ..content.names import validate_relpath
from ..errors import ChecksumMismatch, IntegrityError, TimedOut
from ..progress import ProgressFn
from ..safefs import Dir, sanitize_mode
from .plan import INDEX_SUFFIX, index_json, shard_header

CHUNK = 8 << 20


@dataclass(slots=True)
class Run:
    """Kept tensors that follow each other in the source: one read range, written from ``dest``."""
    begin: int
    end: int
    dest: int
    tensors: list[tuple[str, int, int, str]] = field(default_factory=list)   # (name, src begin, end, xxh3)


@dataclass(slots=True)
class Job:
    """One file of the copy: made from ``data`` (a header, an index json) then ``runs`` of the source's
    ``src``, or the source's file whole (``src``, no runs, no data)."""
    out: FileEntry
    src: FileEntry | None
    data: bytes = b""
    runs: list[Run] = field(default_factory=list)
    chunk_size: int = 0      # the manifest's, for a file copied whole

    @property
    def read_bytes(self) -> int:
        if self.src is not None and not self.runs and not self.data:
            return self.src.size
        return sum(r.end - r.begin for r in self.runs)


def jobs_for(copy: Manifest, version: Manifest) -> list[Job]:
    """What to read and write for each file of ``copy`` (a manifest :func:`.plan.expert_manifest` made
    from ``version``); IntegrityError when the two do not fit together."""
    by_path = {f.path: f for f in version.files}
    shards = [f for f in copy.files if f.safetensors is not None]
    jobs = []
    for f in copy.files:
        validate_relpath(f.path)
        src = by_path.get(f.path)
        if f.path.endswith(INDEX_SUFFIX):
            jobs.append(_generated(f, index_json(shards, f.path)))
        elif src is None:
            raise IntegrityError(f"{f.path}: in the copy's manifest, not in the version's")
        elif f.safetensors is not None:
            jobs.append(_shard(f, src))
        elif (f.size, f.xxh3_128) != (src.size, src.xxh3_128):
            raise IntegrityError(f"{f.path}: the copy's manifest and the version's differ")
        else:
            jobs.append(Job(f, src, chunk_size=version.chunk_size))
    return jobs


def _generated(f: FileEntry, data: bytes) -> Job:
    digests = [xxhash.xxh3_128(data[i:i + CHUNK]).hexdigest() for i in range(0, max(len(data), 1), CHUNK)]
    if len(data) != f.size or (len(f.chunks) == len(digests) == 1 and digests != list(f.chunks)):
        raise IntegrityError(f"{f.path}: the index made for the kept tensors differs from the copy's manifest")
    return Job(f, None, data)


def _shard(f: FileEntry, src: FileEntry) -> Job:
    """A repacked shard: its header, and its tensors as runs of the source's (each checked in bounds)."""
    st, sst = f.safetensors, src.safetensors
    assert st is not None
    if sst is None:
        raise IntegrityError(f"{f.path}: not a safetensors file in the version's manifest")
    header = shard_header(list(st.tensors), st.header_size, st.metadata)
    if xxhash.xxh3_128(header).hexdigest() != st.header_xxh3_128:
        raise IntegrityError(f"{f.path}: the header made for the kept tensors differs from the copy's manifest")
    where = {n: i for i, n in enumerate(sst.tensors.names())}
    spans, digests = sst.tensors.spans(), sst.tensors.hex_digests()
    runs: list[Run] = []
    last = sst.header_size
    for name, (b, e), h in zip(st.tensors.names(), st.tensors.spans(), st.tensors.hex_digests()):
        i = where.get(name)
        if i is None or digests[i] != h or spans[i][1] - spans[i][0] != e - b:
            raise IntegrityError(f"{f.path}: tensor {name!r} is not the version's")
        sb, se = spans[i]
        if not last <= sb <= se <= src.size:
            raise IntegrityError(f"{f.path}: tensor {name!r} at bytes {sb}-{se} overlaps another or lies outside "
                                 f"the file ({src.size} bytes, header {sst.header_size})")
        last = se
        if runs and runs[-1].end == sb:
            runs[-1].end = se
        else:
            runs.append(Run(sb, se, b))
        runs[-1].tensors.append((name, sb, se, h))
    return Job(f, src, header, runs)


def repack(jobs: list[Job], src: Dir, dest: Dir, *, progress: ProgressFn | None = None,
           deadline: float | None = None, clock: Callable[[], float] = time.monotonic) -> int:
    """Write every job's file into ``dest`` from ``src``; returns the bytes read from ``src``."""
    buf = bytearray(CHUNK)
    durable = not is_tmpfs(dest.fd)
    total = 0

    def check_time() -> None:   # (between files, and every CHUNK of one: a shard can be 5 GB)
        if deadline is not None and clock() > deadline:
            raise TimedOut("expert-parallel copy not finished before the timeout")
    for job in jobs:
        check_time()
        fd = dest.create(job.out.path, 0o600, flags=os.O_WRONLY)
        try:
            if job.data:
                _write(fd, job.data, 0)
            if job.src is not None:
                total += _copy_from(src, job, fd, buf, progress, check_time)
            os.fchmod(fd, sanitize_mode(job.out.mode))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    return total


def _copy_from(src: Dir, job: Job, out: int, buf: bytearray, progress: ProgressFn | None,
               check_time: Callable[[], None]) -> int:
    assert job.src is not None
    fd = src.open_read(job.src.path)
    try:
        if os.fstat(fd).st_size != job.src.size:
            raise IntegrityError(f"{job.src.path}: {os.fstat(fd).st_size} bytes in the source, the manifest says "
                                 f"{job.src.size}")
        if not job.runs and not job.data:
            return _copy_whole(fd, job, out, buf, progress, check_time)
        for run in job.runs:
            _copy_run(fd, job.out.path, run, out, buf, progress, check_time)
        return sum(r.end - r.begin for r in job.runs)
    finally:
        os.close(fd)


def _copy_run(fd: int, path: str, run: Run, out: int, buf: bytearray, progress: ProgressFn | None,
              check_time: Callable[[], None]) -> None:
    """One run, :data:`CHUNK` at a time, each tensor hashed and checked when its last byte is read."""
    view = memoryview(buf)
    tensors = iter(run.tensors)
    name, tb, te, want = next(tensors)
    h = xxhash.xxh3_128()
    pos = run.begin
    while pos < run.end:
        check_time()
        n = _read_at(fd, view[:min(CHUNK, run.end - pos)], pos, path)
        chunk = view[:n]
        while True:
            a, b = max(tb, pos), min(te, pos + n)
            if a < b:
                h.update(chunk[a - pos:b - pos])
            if te > pos + n:
                break
            if h.hexdigest() != want:
                raise ChecksumMismatch(path, f"tensor {name!r}", want, h.hexdigest())
            nxt = next(tensors, None)
            if nxt is None:
                break
            (name, tb, te, want), h = nxt, xxhash.xxh3_128()
        _write(out, chunk, run.dest + pos - run.begin)
        if progress is not None:
            progress(n)
        pos += n


def _copy_whole(fd: int, job: Job, out: int, buf: bytearray, progress: ProgressFn | None,
                check_time: Callable[[], None]) -> int:
    """A file copied as it is, :data:`CHUNK` at a time, each of the manifest's chunks checked."""
    f, view = job.out, memoryview(buf)
    for i, (a, b) in enumerate(chunk_ranges(f.size, job.chunk_size)):
        h, pos = xxhash.xxh3_128(), a
        while pos < b:
            check_time()
            n = _read_at(fd, view[:min(CHUNK, b - pos)], pos, f.path)
            h.update(view[:n])
            _write(out, view[:n], pos)
            if progress is not None:
                progress(n)
            pos += n
        if i >= len(f.chunks) or h.hexdigest() != f.chunks[i]:
            raise ChecksumMismatch(f.path, f"chunk {i}", f.chunks[i] if i < len(f.chunks) else "none", h.hexdigest())
    return f.size


def _read_at(fd: int, view: memoryview, pos: int, path: str) -> int:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], pos + got)
        if n == 0:
            raise IntegrityError(f"{path}: the source ended at byte {pos + got}, before the manifest says")
        got += n
    return got


def _write(fd: int, data: "bytes | memoryview", pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n
    start_writeback(fd, pos - len(data), len(data))
