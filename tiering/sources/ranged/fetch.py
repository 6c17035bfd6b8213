"""A version's files downloaded in ranges into a staging directory: the one core of the cold tiers in
an object store and in an OCI registry, each of which gives only its :class:`Transport` (where a
file's bytes are, and one ranged GET of them).

A download is split into ranges along the manifest's parts (:func:`.cut.groups`), ``concurrency``
at a time. Each part is hashed (xxh3-128) from the bytes as they are written, so the copy is verified
without a second read (IntegrityError naming the part). With ``crypto`` every file's whole-file digest
is taken in order as its ranges arrive (:class:`.digest.InOrderDigest`). A range that fails in a way
the transport calls worth asking again (a response that broke midway, throttling) is asked again with
its parts' hashes, and the digest, restored to where it began, with back-off; no range starts after
the deadline (TimedOut), and the transport ends one in flight there.

Resuming is the same path: ``have`` names the parts already in the staging directory and verified
(what an interrupted transfer left, a delta's donor bytes): they are not asked for, and their files
are written in place.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..._syscalls import fallocate, is_tmpfs, start_writeback
from ...content.manifest import FileEntry, Manifest
from ...content.names import validate_relpath
from ...errors import IntegrityError, TieringError, TimedOut
from ...progress import ProgressFn
from ...safefs import Dir, sanitize_mode
from .cut import Group, Span, groups
from .digest import InOrderDigest

Write = Callable[[Any], None]   # a range's next bytes (a bytes-like object), in order


class Transport(Protocol):
    """A cold tier's part of a ranged download: its settings, each file's object in the store, and one
    ranged GET. Thread-safe: ``concurrency`` threads call :meth:`get` at once."""
    range_bytes: int        # at most this many bytes per ranged GET
    concurrency: int        # ranged GETs at a time
    retries: int            # a failed range is asked this many more times (when :meth:`retryable`)
    bucket: Any             # a TokenBucket every range's bytes are taken from first, or None
    thread_name: str        # the worker threads are weightd-<thread_name>

    def open(self, m: Manifest, f: FileEntry) -> Any:
        """``f``'s object in the store, with a ``where`` (how messages name it); checked against the
        manifest as far as the tier can without a request."""

    def get(self, obj: Any, start: int, end: int, write: Write, deadline: float | None) -> None:
        """Bytes ``start``-``end`` of ``obj``, handed to ``write`` in order as they arrive: every one of
        them, never more, or the tier's error; ended at ``deadline`` (TimedOut) even when the store
        stops sending midway."""

    def retryable(self, exc: TieringError) -> bool:
        """Whether a range that failed with ``exc`` is worth asking again."""


@dataclass
class Target:
    """A file being downloaded: open at the manifest's size, its object, its work still to do."""
    file: FileEntry
    fd: int
    obj: Any                       # the transport's (Transport.open)
    groups: list[Group]
    digest: InOrderDigest | None = None


def fetch(t: Transport, m: Manifest, dest: Dir, *, deadline: float | None = None, progress: ProgressFn | None = None,
          skip: set[str] | None = None, have: dict[str, set[str]] | None = None,
          crypto: Callable[[], Any] | None = None, digests: dict[str, str] | None = None) -> int:
    """Download every file of ``m`` (but ``skip``) into ``dest``, hashing each manifest part as its
    bytes arrive (IntegrityError naming the part on a mismatch). ``have``: parts (by label, per
    file) already in ``dest`` and verified (a delta's donor bytes, what an interrupted transfer
    left): only the other parts are asked for, and those files are written in place. With
    ``crypto`` (a hasher factory, e.g. hashlib.sha256) every file's digest is taken on the way
    (:class:`InOrderDigest`) and put in ``digests`` by path. Returns the bytes downloaded."""
    targets: list[Target] = []
    try:
        for f in m.files:
            if skip and f.path in skip:
                continue
            target = open_target(t, m, f, dest, (have or {}).get(f.path, set()))
            if target is not None:
                if crypto is not None:
                    target.digest = InOrderDigest(crypto, target.fd, f.size,
                                                  [(a, b) for g in target.groups for a, b, _ in g.ranges])
                targets.append(target)
            else:
                _kept_whole(dest, f, crypto, digests)
        total = _download(t, targets, deadline, progress)
        for target in targets:
            if target.digest is not None and digests is not None:
                digests[target.file.path] = target.digest.hexdigest()
            os.fsync(target.fd)
    finally:
        for target in targets:
            os.close(target.fd)
    return total


def _kept_whole(dest: Dir, f: FileEntry, crypto: Callable[[], Any] | None, digests: dict[str, str] | None) -> None:
    """A file every part of which is here already: its digest read from it (with ``crypto``), and
    synced (what an interrupted transfer left may be in the page cache only)."""
    fd = dest.open(f.path, os.O_RDONLY)
    try:
        if crypto is not None and digests is not None:
            digests[f.path] = InOrderDigest(crypto, fd, f.size, []).hexdigest()
        os.fsync(fd)
    finally:
        os.close(fd)


def open_target(t: Transport, m: Manifest, f: FileEntry, dest: Dir, kept: set[str]) -> Target | None:
    """The file in ``dest`` open at the manifest's size, with the ranges still wanted; None when every
    part of it is here already. Nothing is asked of the store here (:meth:`Transport.open`)."""
    validate_relpath(f.path)
    obj = t.open(m, f)
    wanted = groups(f, m.chunk_size, t.range_bytes, kept)
    if kept and not wanted:
        return None
    if kept and dest.lstat(f.path) is not None:
        fd = dest.open(f.path, os.O_RDWR)
    else:
        fd = dest.create(f.path, 0o600, flags=os.O_RDWR | os.O_TRUNC, exclusive=False)
    try:
        if os.fstat(fd).st_size != f.size:
            os.ftruncate(fd, f.size)  # (never longer than the manifest says: no stale tail)
        os.fchmod(fd, sanitize_mode(f.mode))
    except BaseException:
        os.close(fd)
        raise
    return Target(f, fd, obj, wanted)


def _download(t: Transport, targets: list[Target], deadline: float | None, progress: ProgressFn | None) -> int:
    total = 0
    with ThreadPoolExecutor(max_workers=t.concurrency, thread_name_prefix=f"weightd-{t.thread_name}") as pool:
        # preallocation (a full tier fails early) runs beside the first ranges, not before them; never
        # on tmpfs, where it zero-fills every page (0.3 s of CPU a GiB here, taken from a store that
        # shares the machine) for the ranges to write them again: the reservation has checked the room
        on_tmpfs = bool(targets) and is_tmpfs(targets[0].fd)
        futures = [] if on_tmpfs else [pool.submit(preallocate, target.fd, target.file.size) for target in targets]
        # every file's first group, then every file's second...: a file's next range tends to start
        # once the one before it is done, so a whole-file digest is taken as the bytes stream
        futures += [pool.submit(fetch_group, t, target, target.groups[i], deadline, progress)
                    for i in range(max((len(target.groups) for target in targets), default=0))
                    for target in targets if i < len(target.groups)]
        try:
            for fut in futures:
                total += fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return total


def fetch_group(t: Transport, target: Target, group: Group, deadline: float | None,
                progress: ProgressFn | None) -> int:
    """One worker's share: consecutive whole parts (or one large part in order). Each range is
    streamed to its offset and fed to its parts' hashes (:func:`fetch_range`); a range that fails
    in a way worth asking again is asked again, its hashes restored to where it began."""
    got, digest = 0, target.digest
    for start, end, parts in group.ranges:
        if deadline is not None and time.monotonic() > deadline:
            raise TimedOut(f"{target.obj.where}: download not finished before the timeout")
        saved = {p.label: group.hashers[p.label].copy() for p, _, _ in parts if p.label in group.hashers}
        delay = 0.2
        for attempt in range(t.retries + 1):
            feed = digest.begin(start) if digest is not None else None
            try:
                fetch_range(t, target, start, end, parts, group, progress, deadline, feed)
            except TieringError as exc:
                if digest is not None:
                    digest.abort(feed is not None)
                if not t.retryable(exc) or attempt == t.retries or \
                        (deadline is not None and time.monotonic() + delay > deadline):
                    raise
                for p, _, _ in parts:  # start the range over: its parts' hashes as they were
                    if p.label in saved:
                        group.hashers[p.label] = saved[p.label].copy()
                    else:
                        group.hashers.pop(p.label, None)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if digest is not None:
                digest.finish(start, end, feed is not None)
            break
        got += end - start
    return got


def fetch_range(t: Transport, target: Target, start: int, end: int, parts: list[Span], group: Group,
                progress: ProgressFn | None, deadline: float | None = None, feed: Write | None = None) -> None:
    """One ranged GET (:meth:`Transport.get`), its bytes taken from the tier's bandwidth first, then
    written at their offset and hashed as they arrive (:class:`RangeWriter`)."""
    if t.bucket is not None:
        t.bucket.consume(end - start)
    t.get(target.obj, start, end, RangeWriter(target.obj.where, target.fd, start, parts, group, progress, feed),
          deadline)


class RangeWriter:
    """A range's bytes as they arrive: written at their offset, sent to disk, fed to their parts'
    hashes (IntegrityError when a part ends and does not match the manifest) and to ``feed``."""

    def __init__(self, where: str, fd: int, start: int, parts: list[Span], group: Group,
                 progress: ProgressFn | None, feed: Write | None = None) -> None:
        self.where, self.fd, self.pos = where, fd, start
        self.parts, self.group, self.progress, self.feed = parts, group, progress, feed

    def __call__(self, chunk: Any) -> None:
        import xxhash
        view = memoryview(chunk)
        n, pos = len(view), self.pos
        os.pwrite(self.fd, view, pos)
        start_writeback(self.fd, pos, n)  # to disk as it comes, so the final fsync does not wait for it all
        for part, lo, hi in self.parts:
            a, b = max(lo, pos), min(hi, pos + n)
            if a >= b:
                continue
            h = self.group.hashers.setdefault(part.label, xxhash.xxh3_128())
            h.update(view[a - pos:b - pos])
            if b == part.end and h.hexdigest() != part.xxh3_128:
                raise IntegrityError(f"{self.where}: {part.label} does not match the manifest "
                                     f"(expected {part.xxh3_128}, got {h.hexdigest()})")
        if self.feed is not None:
            self.feed(view)
        self.pos += n
        if self.progress is not None:
            self.progress(n)


def preallocate(fd: int, size: int) -> int:
    """Reserve the file's blocks (a full tier fails early); runs beside the downloads, so only the
    real ``fallocate(2)``, which never touches written data (skipped where unsupported)."""
    if size and os.fstat(fd).st_blocks * 512 < size:
        fallocate(fd, size)
    return 0
