"""Ranged reads: a version's files downloaded from their blobs into a staging directory.

As from an object store (:mod:`tiering.sources.ranged`, whose cut :func:`groups` this uses): a
download is split into ranges along the manifest's parts, ``concurrency`` at a time, each worker
thread on its own keep-alive connection; each part is hashed (xxh3-128) as its bytes arrive. Blobs
are addressed by digest, so a tag moved during a download changes nothing read. And each file's
sha256 is taken in order as its ranges land (a range is read back from the page cache once every
byte before it is there), so the registry's own digest is checked too: a blob whose bytes are not
its digest is refused (BlobMismatch), a cryptographic check of every file.

Resuming is the same path: ``have`` names the parts already in the staging directory and verified;
they are not asked for again, and enter the file's sha256 from disk.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..._syscalls import start_writeback
from ...content.manifest import FileEntry, Manifest
from ...content.names import validate_relpath
from ...errors import IntegrityError, TimedOut
from ...progress import ProgressFn
from ...safefs import Dir, sanitize_mode
from ..ranged.cut import Group, Span, groups
from ..ranged.fetch import preallocate
from .client import RETRIES, STREAM_CHUNK, RegistryClient, Transient
from .errors import BlobMismatch, RegistryError, ShortRead
from .layout import Artifact, Layer

HASH_BLOCK = 4 << 20


class BlobCheck:
    """A file's sha256, taken in order while its ranges land in any order: each finished range is
    marked, and whoever finds the next bytes there hashes them (read back from the page cache)."""

    def __init__(self, fd: int, layer: Layer, where: str) -> None:
        self.fd, self.layer, self.where = fd, layer, where
        self.sha = hashlib.sha256()
        self.pos = 0
        self.done: dict[int, int] = {}
        self.lock = threading.Lock()
        self.busy = False

    def mark(self, start: int, end: int) -> None:
        with self.lock:
            if end > start:
                self.done[start] = end
            if self.busy:
                return
            self.busy = True
        while True:
            with self.lock:
                end = self.done.pop(self.pos, None)
                if end is None:
                    self.busy = False
                    return
            try:
                self._hash(self.pos, end)
            except BaseException:
                with self.lock:
                    self.busy = False
                raise
            self.pos = end

    def _hash(self, start: int, end: int) -> None:
        pos = start
        while pos < end:
            data = os.pread(self.fd, min(HASH_BLOCK, end - pos), pos)
            if not data:
                raise IntegrityError(f"{self.where}: shorter than its ranges on disk")
            self.sha.update(data)
            pos += len(data)

    def finish(self) -> None:
        self.mark(0, 0)
        got = "sha256:" + self.sha.hexdigest()
        if self.pos != self.layer.size or got != self.layer.digest:
            raise BlobMismatch(f"{self.where}: the registry's bytes are not the blob's digest {self.layer.digest} "
                               f"(sha256 of {self.pos} bytes: {got}): the blob is damaged in the registry's storage")


@dataclass
class _Target:
    file: FileEntry
    layer: Layer
    fd: int
    groups: list[Group]
    check: BlobCheck


def fetch(c: RegistryClient, repo: str, art: Artifact, m: Manifest, dest: Dir, *, deadline: float | None = None,
          progress: ProgressFn | None = None, skip: set[str] | None = None,
          have: dict[str, set[str]] | None = None) -> int:
    """Download every file of ``m`` (but ``skip``) from the blobs of ``art`` into ``dest``, hashing
    each manifest part as its bytes arrive (IntegrityError naming the part) and each blob's sha256 in
    order (BlobMismatch). ``have``: parts already in ``dest`` and verified. Returns the bytes
    downloaded."""
    targets: list[_Target] = []
    try:
        for f in m.files:
            if skip and f.path in skip:
                continue
            targets.append(_open_target(c, repo, art, m, f, dest, (have or {}).get(f.path, set())))
        total = _download(c, repo, targets, deadline, progress)
        for t in targets:
            os.fsync(t.fd)
    finally:
        for t in targets:
            os.close(t.fd)
    return total


def _open_target(c: RegistryClient, repo: str, art: Artifact, m: Manifest, f: FileEntry, dest: Dir,
                 kept: set[str]) -> _Target:
    validate_relpath(f.path)
    layer = art.by_path.get(f.path)
    where = f"oci://{c.location.host}/{repo}@{layer.digest if layer else '?'} ({f.path})"
    if layer is None or layer.size != f.size:
        raise IntegrityError(f"{where}: the artifact's layer does not match the manifest's {f.size} bytes")
    wanted = groups(f, m.chunk_size, c.range_bytes, kept)
    if kept and dest.lstat(f.path) is not None:
        fd = dest.open(f.path, os.O_RDWR)
    else:
        fd = dest.create(f.path, 0o600, flags=os.O_RDWR | os.O_TRUNC, exclusive=False)
    try:
        if os.fstat(fd).st_size != f.size:
            os.ftruncate(fd, f.size)
        os.fchmod(fd, sanitize_mode(f.mode))
    except BaseException:
        os.close(fd)
        raise
    check = BlobCheck(fd, layer, where)
    pos = 0   # what no range asks for is here already (kept parts): it enters the sha256 from disk
    for s, e in sorted((s, e) for g in wanted for s, e, _ in g.ranges):
        if s > pos:
            check.done[pos] = s
        pos = max(pos, e)
    if pos < f.size:
        check.done[pos] = f.size
    return _Target(f, layer, fd, wanted, check)


def _download(c: RegistryClient, repo: str, targets: list[_Target], deadline: float | None,
              progress: ProgressFn | None) -> int:
    total = 0
    with ThreadPoolExecutor(max_workers=c.concurrency, thread_name_prefix="weightd-oci") as pool:
        futures = [pool.submit(preallocate, t.fd, t.file.size) for t in targets]
        futures += [pool.submit(fetch_group, c, repo, t, g, deadline, progress) for t in targets for g in t.groups]
        try:
            for fut in futures:
                total += fut.result()
            # the files no range was wanted from (all kept), and the tails of the others
            for fut in [pool.submit(t.check.finish) for t in targets]:
                fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return total


def fetch_group(c: RegistryClient, repo: str, t: _Target, group: Group, deadline: float | None,
                progress: ProgressFn | None) -> int:
    """One worker's share: its ranges in order, each asked again from its start (its parts' hashes
    restored) when it breaks midway."""
    got = 0
    for start, end, parts in group.ranges:
        if deadline is not None and time.monotonic() > deadline:
            raise TimedOut(f"{c.url}/{repo}: {t.file.path}: download not finished before the timeout")
        saved = {p.label: group.hashers[p.label].copy() for p, _, _ in parts if p.label in group.hashers}
        delay = 0.2
        for attempt in range(RETRIES + 1):
            try:
                fetch_range(c, repo, t, start, end, parts, group, progress, deadline)
                break
            except RegistryError as exc:
                if exc.kind not in ("throttled", "error", "short_read", "timeout") or attempt == RETRIES or \
                        (deadline is not None and time.monotonic() + delay > deadline):
                    raise
                for p, _, _ in parts:
                    if p.label in saved:
                        group.hashers[p.label] = saved[p.label].copy()
                    else:
                        group.hashers.pop(p.label, None)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        t.check.mark(start, end)
        got += end - start
    return got


def fetch_range(c: RegistryClient, repo: str, t: _Target, start: int, end: int, parts: list[Span], group: Group,
                progress: ProgressFn | None, deadline: float | None) -> None:
    """One ranged GET of the blob, streamed to the file and hashed as it arrives; a response that
    stalls ends at ``deadline`` (TimedOut), one that breaks midway is ShortRead (asked again)."""
    import xxhash
    if c.bucket is not None:
        c.bucket.consume(end - start)
    what = f"{repo}@{t.layer.digest} ({t.file.path}) bytes {start}-{end}"
    resp = c.request("GET", f"/v2/{repo}/blobs/{t.layer.digest}", what=what, deadline=deadline, stream=True,
                     headers={"Range": f"bytes={start}-{end - 1}"}, expect=(206, 200))
    whole = resp.status == 200
    if whole and (start, end) != (0, t.file.size):
        c.abandon(resp)
        raise RegistryError(f"{c.url}: {what}: the registry ignores Range (200 with the whole blob)")
    pos = start
    try:
        while pos < end:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimedOut(f"{c.url}: {what}: not finished before the timeout")
                c.read_timeout(resp, left)
            try:
                chunk = resp.read(min(STREAM_CHUNK, end - pos))
            except (TimeoutError, OSError) as exc:
                if deadline is not None and time.monotonic() >= deadline - 0.05:
                    raise TimedOut(f"{c.url}: {what}: the registry stopped sending before the timeout") from None
                raise Transient("short_read", f"the response broke after {pos - start} bytes "
                                              f"({type(exc).__name__})").final(c, what) from None
            if not chunk:
                raise Transient("short_read", f"asked for {end - start} bytes, the registry sent {pos - start}"
                                ).final(c, what)
            view, n = memoryview(chunk), len(chunk)
            os.pwrite(t.fd, view, pos)
            start_writeback(t.fd, pos, n)
            for part, lo, hi in parts:
                a, b = max(lo, pos), min(hi, pos + n)
                if a >= b:
                    continue
                h = group.hashers.setdefault(part.label, xxhash.xxh3_128())
                h.update(view[a - pos:b - pos])
                if b == part.end and h.hexdigest() != part.xxh3_128:
                    raise IntegrityError(f"oci://{c.location.host}/{repo}@{t.layer.digest} ({t.file.path}): "
                                         f"{part.label} does not match the manifest (expected {part.xxh3_128}, got "
                                         f"{h.hexdigest()})")
            pos += n
            if progress is not None:
                progress(n)
        if resp.read(1):
            raise ShortRead(f"{c.url}: {what}: the registry sent more than the range")
    except BaseException:
        c.abandon(resp)
        raise
    c.done(resp)
    c.stats.count("get", pos - start)

