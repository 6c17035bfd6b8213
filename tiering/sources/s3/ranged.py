"""Ranged reads: a version's files downloaded from an object store into a staging directory.

A download is split into ranges along the manifest's parts (headers, tensors, chunks), ``concurrency``
at a time, the ranges of a run of parts of about equal size (no small tail range: on a store that
reads the whole object for every ranged GET, as moto does, a tail costs as much as a full range);
each part is hashed from the bytes as they are written, so the copy is verified without a second
read. No HEAD is asked: the object's size and ETag come with each ranged GET's response
(:class:`ObjectVersion`): the first response of a file fixes its ETag, every later request carries
it as ``If-Match`` and every response is checked against it, so an object replaced mid-download is
an error (:class:`ObjectChanged`), never a mix of two versions. A range that breaks midway is asked
again with its parts' hashes restored to where it began.

Resuming is the same path: ``have`` names the parts already in the staging directory and verified
(what an interrupted transfer left, a delta's donor bytes); :func:`groups` leaves them out, and their
files are written in place.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from ..._syscalls import fallocate, is_tmpfs, start_writeback
from ...content.manifest import FileEntry, Manifest
from ...content.names import validate_relpath
from ...errors import IntegrityError, TieringError, TimedOut
from ...progress import ProgressFn
from ...safefs import Dir, sanitize_mode
from .client import RETRIES, STREAM_CHUNK, ObjectChanged, ObjectStoreError, S3Client, ShortRead, bounded, \
    classify, deadline_of
from .digest import InOrderDigest

Span = tuple[Any, int, int]   # (a manifest part, the first and the last-plus-one byte of it in a range)


@dataclass
class Group:
    """One worker's share of a file: ranges fetched in order, and the hashes of their parts so far."""
    ranges: list[tuple[int, int, list[Span]]]   # (start, end, [(part, lo, hi)])
    hashers: dict[str, Any] = field(default_factory=dict)


class ObjectVersion:
    """The object a file is read from, as its responses describe it: the size the manifest says, and
    one ETag, fixed by the first response when not known before (no HEAD), then sent as ``If-Match``
    and compared with every other response's (ObjectChanged on a difference). Thread-safe."""

    def __init__(self, where: str, size: int, etag: str | None = None) -> None:
        self.where, self.size, self.etag = where, size, etag
        self._lock = threading.Lock()

    def check(self, meta: dict[str, Any]) -> None:
        """A response's object: the manifest's size (IntegrityError) and the ETag of the others."""
        if meta["size"] != self.size:
            raise IntegrityError(f"{self.where}: {meta['size']} bytes in the store, the manifest says {self.size}")
        tag = meta.get("e_tag")
        with self._lock:
            if self.etag is None:
                self.etag = tag
                return
        if tag != self.etag:
            raise ObjectChanged(f"{self.where}: the object changed during the download (its ETag is no longer "
                                f"{self.etag}): republished under the same name? preload again")


@dataclass
class _Target:
    file: FileEntry
    key: str
    fd: int
    groups: list[Group]
    obj: ObjectVersion
    digest: InOrderDigest | None = None


def fetch(s3: S3Client, m: Manifest, dest: Dir, *, deadline: float | None = None, progress: ProgressFn | None = None,
          skip: set[str] | None = None, have: dict[str, set[str]] | None = None,
          crypto: Callable[[], Any] | None = None, digests: dict[str, str] | None = None) -> int:
    """Download every file of ``m`` (but ``skip``) into ``dest``, hashing each manifest part as its
    bytes arrive (IntegrityError naming the part on a mismatch). ``have``: parts (by label, per
    file) already in ``dest`` and verified (a delta's donor bytes, what an interrupted transfer
    left): only the other parts are asked for, and those files are written in place. With
    ``crypto`` (a hasher factory, e.g. hashlib.sha256) every file's digest is taken on the way
    (:class:`InOrderDigest`) and put in ``digests`` by path. Returns the bytes downloaded."""
    deadline = deadline_of(deadline)
    targets: list[_Target] = []
    try:
        for f in m.files:
            if skip and f.path in skip:
                continue
            target = _open_target(s3, m, f, dest, (have or {}).get(f.path, set()), deadline)
            if target is not None:
                if crypto is not None:
                    target.digest = InOrderDigest(crypto, target.fd, f.size,
                                                  [(a, b) for g in target.groups for a, b, _ in g.ranges])
                targets.append(target)
            elif crypto is not None and digests is not None:   # every part of it here already: read it
                fd = dest.open(f.path, os.O_RDONLY)
                try:
                    digests[f.path] = InOrderDigest(crypto, fd, f.size, []).hexdigest()
                finally:
                    os.close(fd)
        total = _download(s3, targets, deadline, progress)
        for t in targets:
            if t.digest is not None and digests is not None:
                digests[t.file.path] = t.digest.hexdigest()
            os.fsync(t.fd)
    finally:
        for t in targets:
            os.close(t.fd)
    return total


def _open_target(s3: S3Client, m: Manifest, f: FileEntry, dest: Dir, kept: set[str],
                 deadline: float | None) -> _Target | None:
    """The file in ``dest`` open at the manifest's size, with the ranges still wanted; None when every
    part of it is here already. Nothing is asked of the store here: its object's size and ETag are
    checked from the ranged GETs' responses (:class:`ObjectVersion`)."""
    validate_relpath(f.path)
    wanted = groups(f, m.chunk_size, s3.range_bytes, kept)
    if kept and not wanted:
        return None
    key = f"{m.name}/{m.version}/{f.path}"
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
    return _Target(f, key, fd, wanted, ObjectVersion(f"{s3.url}/{key}", f.size))


def _download(s3: S3Client, targets: list[_Target], deadline: float | None, progress: ProgressFn | None) -> int:
    total = 0
    with ThreadPoolExecutor(max_workers=s3.concurrency, thread_name_prefix="weightd-s3") as pool:
        # preallocation (a full tier fails early) runs beside the first ranges, not before them; never
        # on tmpfs, where it zero-fills every page (0.3 s of CPU a GiB here, taken from a store that
        # shares the machine) for the ranges to write them again: the reservation has checked the room
        on_tmpfs = bool(targets) and is_tmpfs(targets[0].fd)
        futures = [] if on_tmpfs else [pool.submit(preallocate, t.fd, t.file.size) for t in targets]
        # every file's first group, then every file's second...: a file's next range tends to start
        # once the one before it is done, so a whole-file digest is taken as the bytes stream
        futures += [pool.submit(fetch_group, s3, t.file, t.key, t.fd, t.groups[i], t.obj, deadline, progress,
                                t.digest)
                    for i in range(max((len(t.groups) for t in targets), default=0))
                    for t in targets if i < len(t.groups)]
        try:
            for fut in futures:
                total += fut.result()
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return total


def fetch_group(s3: S3Client, f: FileEntry, key: str, fd: int, group: Group, obj: ObjectVersion,
                deadline: float | None, progress: ProgressFn | None, digest: InOrderDigest | None = None) -> int:
    """One worker's share: consecutive whole parts (or one large part in order). Each range is read
    as a stream of STREAM_CHUNK pieces (memory per worker stays at one piece, whatever the range
    size), written at its offset and fed to its parts' hashes; a range that fails midway is asked
    again (the hashes restored to where the range began)."""
    got = 0
    for start, end, parts in group.ranges:
        if deadline is not None and time.monotonic() > deadline:
            raise TimedOut(f"{s3.url}/{key}: download not finished before the timeout")
        saved = {p.label: group.hashers[p.label].copy() for p, _, _ in parts if p.label in group.hashers}
        delay = 0.2
        for attempt in range(RETRIES + 1):
            feed = digest.begin(start) if digest is not None else None
            try:
                fetch_range(s3, key, fd, start, end, parts, group, obj, progress, deadline, feed)
            except ObjectStoreError as exc:
                if digest is not None:
                    digest.abort(feed is not None)
                if exc.kind not in ("throttled", "error", "short_read") or attempt == RETRIES or \
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


class _RangeWriter:
    """A range's bytes as they arrive: written at their offset, sent to disk, fed to their parts'
    hashes (IntegrityError when a part ends and does not match the manifest)."""

    def __init__(self, where: str, fd: int, start: int, end: int, parts: list[Span], group: Group,
                 progress: ProgressFn | None, feed: Callable[[Any], None] | None = None) -> None:
        self.where, self.fd, self.start, self.end = where, fd, start, end
        self.parts, self.group, self.progress, self.feed = parts, group, progress, feed
        self.pos = start

    def __call__(self, chunk: Any) -> None:
        import xxhash
        view = memoryview(chunk)
        n, pos = len(view), self.pos
        if pos + n > self.end:
            raise ShortRead(f"{self.where}: the store sent more than bytes {self.start}-{self.end}")
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


def fetch_range(s3: S3Client, key: str, fd: int, start: int, end: int, parts: list[Span], group: Group,
                obj: ObjectVersion, progress: ProgressFn | None, deadline: float | None = None,
                feed: Callable[[Any], None] | None = None) -> None:
    """One ranged GET, its object checked (:meth:`ObjectVersion.check`) before a byte is written,
    streamed to ``fd`` and hashed as it arrives, ended at ``deadline`` (TimedOut) even when the store
    stops sending mid-body (the request is cancelled, its connection dropped)."""
    import obstore
    if s3.bucket is not None:
        s3.bucket.consume(end - start)
    opts: dict[str, Any] = {"range": (start, end)}
    etag = obj.etag
    if etag:
        opts["if_match"] = etag  # replaced mid-download: 412, never a mix of two objects
    what = f"{key} bytes {start}-{end}"
    write = _RangeWriter(f"{s3.url}/{key}", fd, start, end, parts, group, progress, feed)

    async def get() -> None:
        res = await obstore.get_async(s3.store, key, options=opts)
        obj.check(res.meta)
        async for chunk in res.stream(min_chunk_size=STREAM_CHUNK):
            write(chunk)
    try:
        bounded(get, deadline, f"{s3.url}/{what}")
    except ObjectChanged:
        s3.stats.error("precondition")
        raise
    except (IntegrityError, TieringError):   # (TimedOut at the deadline: the request was cancelled)
        raise
    except Exception as exc:  # noqa: BLE001 (a refusal, or a stream that broke midway: obstore's errors, resets)
        raise _range_error(s3, key, what, etag, write, exc) from None
    s3.stats.count("get", write.pos - start)
    if write.pos != end:
        s3.stats.error("short_read")
        raise ShortRead(f"{s3.url}/{key}: asked for bytes {start}-{end}, the store returned {write.pos - start}")


def _range_error(s3: S3Client, key: str, what: str, etag: str | None, write: _RangeWriter,
                 exc: Exception) -> TieringError:
    """A ranged GET's failure, counted and named: the object replaced (its ETag no longer matches), a
    response that broke midway (ShortRead: asked again), or the store's refusal."""
    why = classify(exc)
    if why == "precondition":
        s3.stats.error(why)
        return ObjectChanged(f"{s3.url}/{key}: the object changed during the download (its ETag is "
                             f"no longer {etag}): republished under the same name? preload again")
    if why == "error" and ("body error" in str(exc) or write.pos > write.start):
        s3.stats.error("short_read")
        return ShortRead(f"{s3.url}/{key}: asked for bytes {write.start}-{write.end}, the response broke after "
                         f"{write.pos - write.start} bytes")
    s3.stats.error(why)
    return s3.error_for(why, what, exc)


def groups(f: FileEntry, chunk_size: int, range_bytes: int, have: set[str] | frozenset[str] = frozenset()
           ) -> list[Group]:
    """The file's parts still wanted (all but the labels in ``have``) as work: small consecutive parts
    packed into ranges of about equal size, none over ``range_bytes``; a part larger than that is one group of several ranges
    (fetched in order, so its hash is fed in order). Bytes no part covers (padding, a trailer) are
    fetched too, unhashed, as a verify ignores them."""
    parts = f.parts(chunk_size)
    out: list[Group] = []
    run: list[Any] = []   # consecutive parts still wanted, each no larger than a range

    def emit(cur: list[Any]) -> None:
        out.append(Group([(cur[0].begin, cur[-1].end, [(q, q.begin, q.end) for q in cur])]))

    def flush() -> None:
        """The run cut into as few ranges as fit ``range_bytes``, each ended at the part boundary nearest
        an equal share of what is left (about equal ranges: no small tail range)."""
        if not run:
            return
        last, cur = run[-1].end, []
        for q in run:
            if cur:
                begin = cur[0].begin
                share = begin + (last - begin) // -(-(last - begin) // range_bytes)
                if q.end - begin > range_bytes or (q.end > share and share - cur[-1].end < q.end - share):
                    emit(cur)
                    cur = []
            cur.append(q)
        emit(cur)
        run.clear()

    for p in parts:
        if p.label in have or p.length == 0:
            flush()
            continue
        if p.length > range_bytes:
            flush()
            out.append(Group([(s, min(p.end, s + range_bytes), [(p, s, min(p.end, s + range_bytes))])
                               for s in range(p.begin, p.end, range_bytes)]))
            continue
        if run and p.begin != run[-1].end:
            flush()
        run.append(p)
    flush()
    pos = 0
    for s, e in sorted((p.begin, p.end) for p in parts) + [(f.size, f.size)]:
        if s > pos:
            for g0 in range(pos, s, range_bytes):
                out.append(Group([(g0, min(s, g0 + range_bytes), [])]))
        pos = max(pos, e)
    return [g for g in out if any(e > s for s, e, _ in g.ranges)]


def preallocate(fd: int, size: int) -> int:
    """Reserve the file's blocks (a full tier fails early); runs beside the downloads, so only the
    real ``fallocate(2)``, which never touches written data (skipped where unsupported)."""
    if size and os.fstat(fd).st_blocks * 512 < size:
        fallocate(fd, size)
    return 0
