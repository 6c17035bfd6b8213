"""Object storage as the cold tier (design §14): ``s3://BUCKET/PREFIX`` holding the same layout as a
path cold tier (``NAME/VERSION/<files>``, ``NAME/VERSION/.weightd/manifest.json``).

Library: ``obstore`` (the Rust ``object_store`` crate: S3 and S3-compatible stores, GCS and Azure
through the same calls; ranged GETs, multipart puts and conditional puts; its calls release the GIL,
so plain threads give real concurrency). It reads credentials from the environment (``AWS_*``) and
from instance and web-identity roles; the shared credentials file (``~/.aws/credentials``,
``AWS_PROFILE``) is read here, since object_store does not.

Guarantees:

- **Visibility.** A version exists when its manifest object exists; the manifest is written last, so
  a half-uploaded version is never seen.
- **One publisher wins.** Before any byte is uploaded, a publisher claims ``.weightd/publishing`` with
  a conditional put (``If-None-Match: *``); a second publisher of the same NAME@VERSION is refused at
  once instead of overwriting the first one's objects. The manifest is also put conditionally. A claim
  older than ``CLAIM_STALE_S`` (a crashed publisher) is taken over with a conditional put on its ETag.
  On a store without conditional puts these become plain puts: say so (``conditional=False``).
- **Every byte checked as it arrives.** A download is split into ranges along the manifest's parts
  (headers, tensors, chunks); each part is hashed from the bytes as they are written, so the copy is
  verified without a second read; every ranged GET carries ``If-Match`` with the object's ETag, so an
  object replaced mid-download is an error, never a mix of two versions.
"""

from __future__ import annotations

import asyncio
import configparser
import json
import os
import threading
import time
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlparse

from .content.manifest import MANIFEST_RELPATH, FileEntry, Manifest, parse_manifest
from .content.names import validate_label, validate_name, validate_relpath, validate_version

if TYPE_CHECKING:
    from .layout import VersionDir
from .errors import (BadInput, Busy, CheckpointNotFound, FileChanged, IntegrityError, TieringError, TimedOut,
                     VersionConflict)
from ._syscalls import fallocate, start_writeback
from .safefs import Dir
from .sources import ProgressFn

CLAIM_RELPATH = ".weightd/publishing"
CLAIM_STALE_S = 6 * 3600
DEFAULT_RANGE = 64 << 20       # bytes per ranged GET (bench/objstore.py: fewer, larger requests win)
STREAM_CHUNK = 4 << 20         # a range is read in pieces of about this size (memory per worker)
DEFAULT_CONCURRENCY = 4
DEFAULT_PART = 16 << 20        # multipart upload part size
RETRIES = 4
SMALL_LIMIT = 64 << 10         # a claim object: read whole, never larger than this
OBJECT_MANIFEST_LIMIT = 64 << 20   # a manifest read from object storage (the largest real ones, ~90k tensors,
                                   # are ~17 MB): a bucket writer's 100 MB manifest is refused from its length


class ObjectStoreError(TieringError):
    """The object store refused or failed (exit 2 for set-up problems, 1 otherwise); ``kind`` says
    how (not_found, access_denied, no_credentials, exists, precondition, throttled, error)."""
    kind = "error"


class StoreSetupError(ObjectStoreError):
    exit_code = 2


class ShortRead(ObjectStoreError):
    """The store returned fewer (or more) bytes than the range asked for, or the response broke
    midway: asked again (a range at a time), then this error (exit 1; resumable)."""
    kind = "short_read"


class ObjectChanged(IntegrityError):
    """An object was replaced while it was being downloaded (its ETag changed)."""


@dataclass(frozen=True, slots=True)
class ObjectLocation:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> "ObjectLocation":
        u = urlparse(url)
        if u.scheme != "s3" or not u.netloc:
            raise BadInput(f"[tiers.cold] url: expected s3://BUCKET[/PREFIX], got {url!r}")
        prefix = u.path.strip("/")
        for part in prefix.split("/") if prefix else []:
            if part in (".", ".."):
                raise BadInput(f"[tiers.cold] url: {url!r}: '.' and '..' are not prefixes")
        return cls(u.netloc, prefix)


@dataclass
class Stats:
    """What the store was asked and what it served (metrics and benchmarks)."""
    requests: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    bytes_written: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, nbytes: int = 0, *, write: bool = False) -> None:
        with self.lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1
            if write:
                self.bytes_written += nbytes
            else:
                self.bytes_read += nbytes

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": dict(self.requests), "errors": dict(self.errors), "bytes_read": self.bytes_read,
                    "bytes_written": self.bytes_written}

    def since(self, before: dict[str, Any]) -> dict[str, Any]:
        """What was asked and served since ``before`` (a snapshot): a transfer's own figures (other
        transfers of the same node share the counters, so run alone for exact figures)."""
        now = self.snapshot()
        return {"requests": {k: v - before["requests"].get(k, 0) for k, v in now["requests"].items()
                             if v - before["requests"].get(k, 0)},
                "errors": {k: v - before["errors"].get(k, 0) for k, v in now["errors"].items()
                           if v - before["errors"].get(k, 0)},
                "bytes_read": now["bytes_read"] - before["bytes_read"]}


def shared_credentials(env: dict[str, str] | None = None) -> dict[str, str]:
    """Keys from the shared credentials file (``AWS_SHARED_CREDENTIALS_FILE`` or ~/.aws/credentials,
    profile ``AWS_PROFILE`` or ``default``), unless the environment already has keys."""
    env = dict(os.environ if env is None else env)
    if env.get("AWS_ACCESS_KEY_ID"):
        return {}
    path = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or Path(env.get("HOME", "~")).expanduser() / ".aws/credentials")
    if not path.is_file():
        return {}
    cp = configparser.ConfigParser()
    try:
        cp.read(path)
    except configparser.Error as exc:
        raise StoreSetupError(f"{path}: not a credentials file ({exc.__class__.__name__})") from None
    profile = env.get("AWS_PROFILE", "default")
    if not cp.has_section(profile):
        return {}
    sec = cp[profile]
    out = {}
    for key, arg in (("aws_access_key_id", "access_key_id"), ("aws_secret_access_key", "secret_access_key"),
                     ("aws_session_token", "token")):
        if sec.get(key):
            out[arg] = sec[key]
    return out


def _deadline(explicit: float | None) -> float | None:
    """The earlier of ``explicit`` and the deadline of the run_bounded call this thread works for
    (a preload's --timeout reaching a manifest read deep inside resolve)."""
    from .copy import current_deadline
    inherited = current_deadline()
    return min((d for d in (explicit, inherited) if d is not None), default=None)


def _bounded(make: Callable[[], Any], deadline: float | None, what: str) -> Any:
    """Run the coroutine ``make()`` (obstore's async calls) to its end, or until ``deadline``
    (``time.monotonic``): then it is cancelled, which drops the request and its connection in
    object_store (a response that stalls mid-body ends at the caller's deadline, not at the client's
    120 s timeout), and TimedOut. Called from worker threads, never from a running event loop."""
    async def main() -> Any:
        if deadline is None:
            return await make()
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimedOut(f"{what}: not started before the deadline")
        try:
            return await asyncio.wait_for(make(), left)
        except asyncio.TimeoutError:
            raise TimedOut(f"{what}: the object store did not answer before the deadline") from None
    return asyncio.run(main())


def _classify(exc: BaseException) -> str:
    import obstore.exceptions as oe
    for cls, kind in ((oe.NotFoundError, "not_found"), (FileNotFoundError, "not_found"),
                      (oe.PermissionDeniedError, "access_denied"), (PermissionError, "access_denied"),
                      (oe.UnauthenticatedError, "no_credentials"), (oe.AlreadyExistsError, "exists"),
                      (oe.PreconditionError, "precondition")):
        if isinstance(exc, cls):
            return kind
    text = str(exc)
    if "SlowDown" in text or "503 Service Unavailable" in text:
        return "throttled"
    if "403 Forbidden" in text or "<Code>AccessDenied</Code>" in text:
        return "access_denied"  # (a list request's refusal arrives as a generic error)
    if "169.254.169.254" in text or "/latest/api/token" in text:
        return "no_credentials"  # (no keys anywhere: the instance metadata endpoint was asked, and refused)
    return "error"


class ObjectCold:
    """A cold tier in object storage. Thread-safe; one per node."""

    def __init__(self, url: str, *, endpoint: str | None = None, region: str | None = None,
                 range_bytes: int = DEFAULT_RANGE, concurrency: int = DEFAULT_CONCURRENCY,
                 part_bytes: int = DEFAULT_PART, bandwidth: int = 0, conditional: bool = True,
                 allow_http: bool | None = None) -> None:
        from obstore.store import S3Store
        self.url, self.location = url, ObjectLocation.parse(url)
        self.range_bytes, self.concurrency, self.part_bytes = range_bytes, max(1, concurrency), part_bytes
        self.bandwidth, self.conditional = bandwidth, conditional
        self.max_manifest_bytes = OBJECT_MANIFEST_LIMIT
        self.stats = Stats()
        kw: dict[str, Any] = shared_credentials()
        if endpoint:
            kw["endpoint"] = endpoint
        if region:
            kw["region"] = region
        http = allow_http if allow_http is not None else bool(endpoint and endpoint.startswith("http://"))
        try:
            self.store = S3Store(self.location.bucket, prefix=self.location.prefix or None,
                                 client_options={"allow_http": http, "timeout": "120s", "connect_timeout": "10s"},
                                 retry_config={"max_retries": 0, "backoff": {"init_backoff": timedelta(milliseconds=100),
                                                                               "max_backoff": timedelta(seconds=1),
                                                                               "base": 2},
                                               "retry_timeout": timedelta(seconds=60)}, **kw)
        except Exception as exc:  # (obstore's configuration errors)
            raise StoreSetupError(f"[tiers.cold] url {url}: {exc}") from None
        from .pagecache.throttle import TokenBucket
        self.bucket = TokenBucket(bandwidth) if bandwidth else None

    def __repr__(self) -> str:
        return f"ObjectCold({self.url!r})"

    # -- calls, each counted, classified and retried ------------------------------------------------
    def _call(self, kind: str, fn: Callable[[], Any], what: str, *, deadline: float | None = None,
              retry: bool = True) -> Any:
        delay = 0.2
        for attempt in range(RETRIES + 1):
            try:
                return fn()
            except TieringError:
                raise  # ours (a file that changed under an upload, a short read): never retried blindly
            except Exception as exc:  # noqa: BLE001 (classified below)
                why = _classify(exc)
                self.stats.error(why)
                transient = why in ("throttled", "error") and retry
                late = deadline is not None and time.monotonic() + delay > deadline
                if not transient or attempt == RETRIES or late:
                    raise self._error(why, what, exc) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _error(self, why: str, what: str, exc: BaseException) -> TieringError:
        where = f"{self.url}: {what}"
        if "NoSuchBucket" in str(exc):
            return StoreSetupError(f"{self.url}: the bucket {self.location.bucket} does not exist (check [tiers.cold] "
                                   f"url and endpoint)")
        if why == "not_found":
            return CheckpointNotFound(where, "not found (or the bucket does not exist)")
        if why == "access_denied":
            if any(code in str(exc) for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch")):
                return StoreSetupError(f"{where}: the store refused the credentials (unknown access key or wrong "
                                       f"secret): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile")
            return StoreSetupError(f"{where}: access denied: give the daemon's credentials s3:GetObject, "
                                   f"s3:ListBucket (and s3:PutObject to publish) on this bucket")
        if why == "no_credentials":
            return StoreSetupError(f"{where}: no usable credentials: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                                   f"AWS_PROFILE with ~/.aws/credentials, or an instance/web-identity role")
        if why == "throttled":
            return ObjectStoreError(f"{where}: the store kept throttling (503 SlowDown) after {RETRIES} retries: "
                                    f"lower [tiers.cold] concurrency or bandwidth")
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        err = ObjectStoreError(f"{where}: {first[:300]}")
        err.kind = why
        return err

    # -- reading ------------------------------------------------------------------------------------
    def read_manifest(self, name: str, version: str, *, deadline: float | None = None) -> Manifest | None:
        """NAME@VERSION's manifest, or None when it is not published (no manifest object). Its size is
        checked from the response before the body is read, and the read stops at the limit."""
        validate_name(name)
        validate_label(version)  # (a companion's label too)
        key = f"{name}/{version}/{MANIFEST_RELPATH}"
        raw = self.get_small(key, self.max_manifest_bytes, deadline=deadline, what="manifest")
        if raw is None:
            return None
        m = parse_manifest(raw, f"{self.url}/{key}")
        if m.name != name or m.version != version:
            raise BadInput(f"{self.url}/{key}: it describes {m.name}@{m.version}, not {name}@{version}")
        return m

    def version_dir(self, name: str, version: str) -> "VersionDir | None":
        """NAME@VERSION as the tier code sees a published version; its ``path`` names the object
        prefix and is never opened (nothing of an object store is on disk); ``store`` is this."""
        m = self.read_manifest(name, version)
        if m is None:
            return None
        return self.as_version_dir(m)

    def as_version_dir(self, m: Manifest) -> "VersionDir":
        from .layout import VersionDir
        return VersionDir(m.name, m.version, Path("/nonexistent-object-store") / self.location.bucket
                          / self.location.prefix / m.name / m.version, m, store=self)

    def read_meta(self, name: str, version: str, rel: str, limit: int = OBJECT_MANIFEST_LIMIT) -> bytes | None:
        """A small object beside a version (``.weightd/checkpoint.torrent``), or None when absent: one
        GET, its size checked from the response before the body is read (:meth:`get_small`)."""
        validate_name(name)
        validate_label(version)
        return self.get_small(f"{name}/{version}/{rel}", limit)

    def get_small(self, key: str, limit: int, *, deadline: float | None = None, what: str = "object") -> bytes | None:
        """An object read whole (a manifest, a torrent, a claim), or None when absent: refused (BadInput,
        exit 2) from the response's length alone when it is over ``limit``, before a byte of its body is
        read; the body read stops at ``limit`` whatever the length said; all of it within ``deadline``
        (and the deadline this thread works for)."""
        import obstore

        async def get() -> bytes:
            res = await obstore.get_async(self.store, key)
            size = res.meta["size"]
            if size > limit:   # (the response dropped unread, here: its connection is closed, nothing downloaded)
                del res
                raise BadInput(f"{self.url}/{key}: {what} of {size} bytes, more than the {limit} allowed; not read")
            chunks, got = [], 0   # (joined once at the end: the body is never held twice)
            async for chunk in res.stream(min_chunk_size=min(STREAM_CHUNK, max(limit, 1))):
                got += len(chunk)
                if got > limit:
                    raise BadInput(f"{self.url}/{key}: {what} larger than the {limit} bytes allowed; not read further")
                chunks.append(chunk)
            return b"".join(chunks)
        try:
            raw = self._call("get", lambda: _bounded(get, _deadline(deadline), f"{self.url}/{key}"), key,
                             deadline=_deadline(deadline))
        except CheckpointNotFound:
            return None
        self.stats.count("get", len(raw))
        return raw

    def put_meta_if_absent(self, name: str, version: str, rel: str, data: bytes) -> bool:
        """Put a small object beside a published version unless one is there (conditional create);
        False when another writer's is. Never before the manifest: only the version's readers add it."""
        import obstore
        key = f"{name}/{version}/{rel}"
        try:
            self._call("put", lambda: obstore.put(self.store, key, data, mode="create" if self.conditional
                                                  else "overwrite"), key, retry=False)
        except ObjectStoreError as exc:
            if exc.kind in ("exists", "precondition"):
                return False
            raise
        self.stats.count("put", len(data), write=True)
        return True

    def head(self, key: str) -> dict[str, Any]:
        import obstore
        meta = self._read("head", key, lambda: obstore.head_async(self.store, key))
        self.stats.count("head")
        return meta

    def _read(self, kind: str, key: str, make: Callable[[], Any]) -> Any:
        """One read request (obstore's async call ``make``) within the deadline this thread works for
        (a preload's --timeout, a daemon route's bound): a store that stalls ends there, not at the
        client's 120 s timeout."""
        deadline = _deadline(None)
        return self._call(kind, lambda: _bounded(make, deadline, f"{self.url}/{key}"), key, deadline=deadline)

    def names(self) -> list[str]:
        """Every NAME with at least one published version (``NAME`` is ``a`` or ``a/b``)."""
        import obstore
        top = self._read("list", "/", lambda: obstore.list_with_delimiter_async(self.store, prefix=""))
        self.stats.count("list")
        out = []
        for a in (p.rstrip("/").rsplit("/", 1)[-1] for p in top["common_prefixes"]):
            if a.startswith("."):
                continue
            if self.versions(a):
                out.append(a)
                continue
            sub = self._read("list", f"{a}/", lambda a=a: obstore.list_with_delimiter_async(self.store, prefix=f"{a}/"))
            for b in (p.rstrip("/").rsplit("/", 1)[-1] for p in sub["common_prefixes"]):
                try:
                    validate_name(f"{a}/{b}")
                except BadInput:
                    continue
                if self.versions(f"{a}/{b}"):
                    out.append(f"{a}/{b}")
        return sorted(out)

    def versions(self, name: str) -> list[str]:
        """The version labels under NAME/ whose manifest exists (listing, then one HEAD each)."""
        import obstore
        validate_name(name)
        listing = self._read("list", f"{name}/", lambda: obstore.list_with_delimiter_async(self.store, prefix=f"{name}/"))
        self.stats.count("list")
        out = []
        for p in listing["common_prefixes"]:
            label = p.rstrip("/").rsplit("/", 1)[-1]
            try:
                validate_version(label)
            except BadInput:
                continue
            key = f"{name}/{label}/{MANIFEST_RELPATH}"
            try:
                self._read("head", key, lambda k=key: obstore.head_async(self.store, k))
                self.stats.count("head")
                out.append(label)
            except CheckpointNotFound:
                continue  # a version being uploaded (no manifest yet), or leftovers: not published
        return sorted(out)

    def fetch(self, m: Manifest, dest: Dir, *, deadline: float | None = None, progress: ProgressFn | None = None,
              skip: set[str] | None = None, have: dict[str, set[str]] | None = None) -> int:
        """Download every file of ``m`` (but ``skip``) into ``dest``, hashing each manifest part as its
        bytes arrive (IntegrityError naming the part on a mismatch). ``have``: parts (by label, per
        file) already in ``dest`` and verified (a delta's donor bytes, what an interrupted transfer
        left): only the other parts are asked for, and those files are written in place. Returns the
        bytes downloaded."""
        import obstore
        from .safefs import sanitize_mode
        name, version = m.name, m.version
        deadline = _deadline(deadline)
        have = have or {}
        jobs: list[tuple[FileEntry, str, int, list[Any], str | None]] = []
        try:
            for f in m.files:
                if skip and f.path in skip:
                    continue
                validate_relpath(f.path)
                kept = have.get(f.path, set())
                groups = _groups(f, m.chunk_size, self.range_bytes, kept)
                if kept and not groups:
                    continue  # every part of it is here already
                key = f"{name}/{version}/{f.path}"
                meta = self._call("head", lambda k=key: _bounded(lambda: obstore.head_async(self.store, k), deadline,
                                                                 f"{self.url}/{k}"), key, deadline=deadline)
                self.stats.count("head")
                if meta["size"] != f.size:
                    raise IntegrityError(f"{self.url}/{key}: {meta['size']} bytes in the store, the manifest says "
                                         f"{f.size}")
                if kept and dest.lstat(f.path) is not None:
                    fd = dest.open(f.path, os.O_RDWR)
                else:
                    fd = dest.create(f.path, 0o600, flags=os.O_RDWR | os.O_TRUNC, exclusive=False)
                if os.fstat(fd).st_size != f.size:
                    os.ftruncate(fd, f.size)  # (never longer than the manifest says: no stale tail)
                jobs.append((f, key, fd, groups, meta["e_tag"]))
                os.fchmod(fd, sanitize_mode(f.mode))
            total = 0
            work = [(f, key, fd, g, tag) for f, key, fd, groups, tag in jobs for g in groups]
            with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="weightd-s3") as pool:
                # preallocation (a full tier fails early) runs beside the first ranges, not before them:
                # on tmpfs it zero-fills every page (0.3 s a GiB here), and a range written first is kept
                futures = [pool.submit(_preallocate, fd, f.size) for f, _, fd, _, _ in jobs]
                futures += [pool.submit(self._fetch_group, f, key, fd, g, tag, deadline, progress)
                            for f, key, fd, g, tag in work]
                try:
                    for fut in futures:
                        total += fut.result()
                except BaseException:
                    for fut in futures:
                        fut.cancel()
                    raise
            for job in jobs:
                os.fsync(job[2])
        finally:
            for job in jobs:
                os.close(job[2])
        return total

    def _fetch_group(self, f: FileEntry, key: str, fd: int, group: "_Group", etag: str | None,
                     deadline: float | None, progress: ProgressFn | None) -> int:
        """One worker's share: consecutive whole parts (or one large part in order). Each range is read
        as a stream of STREAM_CHUNK pieces (memory per worker stays at one piece, whatever the range
        size), written at its offset and fed to its parts' hashes; a range that fails midway is asked
        again (the hashes restored to where the range began)."""
        got = 0
        for start, end, parts in group.ranges:
            if deadline is not None and time.monotonic() > deadline:
                raise TimedOut(f"{self.url}/{key}: download not finished before the timeout")
            saved = {p.label: group.hashers[p.label].copy() for p, _, _ in parts if p.label in group.hashers}
            delay = 0.2
            for attempt in range(RETRIES + 1):
                try:
                    self._fetch_range(key, fd, start, end, parts, group, etag, progress, deadline)
                    break
                except ObjectStoreError as exc:
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
            got += end - start
        return got

    def _fetch_range(self, key: str, fd: int, start: int, end: int, parts: list[tuple[Any, int, int]],
                     group: "_Group", etag: str | None, progress: ProgressFn | None,
                     deadline: float | None = None) -> None:
        """One ranged GET, streamed to ``fd`` and hashed as it arrives, ended at ``deadline`` (TimedOut)
        even when the store stops sending mid-body (the request is cancelled, its connection dropped)."""
        import obstore
        import xxhash
        if self.bucket is not None:
            self.bucket.consume(end - start)
        opts: dict[str, Any] = {"range": (start, end)}
        if etag:
            opts["if_match"] = etag  # replaced mid-download: 412, never a mix of two objects
        what = f"{key} bytes {start}-{end}"
        pos = start

        async def get() -> None:
            nonlocal pos
            res = await obstore.get_async(self.store, key, options=opts)
            async for chunk in res.stream(min_chunk_size=STREAM_CHUNK):
                put(chunk)

        def put(chunk: Any) -> None:
            nonlocal pos
            view = memoryview(chunk)
            n = len(view)
            if pos + n > end:
                raise ShortRead(f"{self.url}/{key}: the store sent more than bytes {start}-{end}")
            os.pwrite(fd, view, pos)
            start_writeback(fd, pos, n)  # to disk as it comes, so the final fsync does not wait for it all
            for part, lo, hi in parts:
                a, b = max(lo, pos), min(hi, pos + n)
                if a >= b:
                    continue
                h = group.hashers.setdefault(part.label, xxhash.xxh3_128())
                h.update(view[a - pos:b - pos])
                if b == part.end and h.hexdigest() != part.xxh3_128:
                    raise IntegrityError(f"{self.url}/{key}: {part.label} does not match the manifest "
                                         f"(expected {part.xxh3_128}, got {h.hexdigest()})")
            pos += n
            if progress is not None:
                progress(n)
        try:
            _bounded(get, deadline, f"{self.url}/{what}")
        except (IntegrityError, TieringError):   # (TimedOut at the deadline: the request was cancelled)
            raise
        except Exception as exc:  # noqa: BLE001 (a refusal, or a stream that broke midway: obstore's errors, resets)
            why = _classify(exc)
            if why == "precondition":
                self.stats.error(why)
                raise ObjectChanged(f"{self.url}/{key}: the object changed during the download (its ETag is "
                                    f"no longer {etag}): republished under the same name? preload again") from None
            if why == "error" and ("body error" in str(exc) or pos > start):
                self.stats.error("short_read")
                raise ShortRead(f"{self.url}/{key}: asked for bytes {start}-{end}, the response broke after "
                                f"{pos - start} bytes") from None
            self.stats.error(why)
            raise self._error(why, what, exc) from None
        self.stats.count("get", pos - start)
        if pos != end:
            self.stats.error("short_read")
            raise ShortRead(f"{self.url}/{key}: asked for bytes {start}-{end}, the store returned {pos - start}")

    # -- writing ------------------------------------------------------------------------------------
    def publish(self, src: Path, m: Manifest, files: list[tuple[str, Any]], *, progress: ProgressFn | None = None,
                extra: dict[str, bytes] | None = None, before_manifest: Callable[[], None] | None = None,
                crypto: Callable[[], Any] | None = None,
                signed: "Callable[[dict[str, str]], dict[str, bytes]] | None" = None) -> bool:
        """Upload ``files`` (relpath, what to open: a scanned :class:`~tiering.safefs.PinnedFile`, a
        FileRef or a path) of NAME@VERSION, then ``extra`` objects, then the manifest, last and
        conditionally. Each file is read from one descriptor (never reopened by path: a file swapped
        for a symlink after the scan is not read) and every manifest part is hashed as its bytes are
        sent: bytes that differ from what the manifest was built from abort the upload (FileChanged).
        False when the same content is already published (nothing uploaded); VersionConflict when
        other content is; a concurrent publisher of the same version is refused before any byte is
        uploaded. A failed multipart upload is aborted (obstore does, and a test lists the bucket's
        uploads to prove it).

        ``crypto`` (a hasher factory, e.g. hashlib.sha256) digests every file in the same read as the
        upload; ``signed(digests)`` then returns more objects to put before the manifest (a signature
        bundle over exactly the bytes sent), or raises to abort the publish."""
        import obstore
        name, version = m.name, m.version
        existing = self.read_manifest(name, version)
        if existing is not None:
            if existing.digest == m.digest:
                return False
            raise VersionConflict(f"{name}@{version}", existing.digest, m.digest)
        entries = {f.path: f for f in m.files}
        claim = f"{name}/{version}/{CLAIM_RELPATH}"
        self._claim(claim, name, version)
        written: list[str] = []
        digests: dict[str, str] = {}
        try:
            for rel, source in files:
                written.append(f"{name}/{version}/{rel}")
                digest = self._upload(written[-1], entries[rel], source, m.chunk_size, progress, crypto)
                if digest is not None:
                    digests[rel] = digest
            if signed is not None:
                extra = {**(extra or {}), **signed(digests)}
            for rel, data in (extra or {}).items():
                key = f"{name}/{version}/{rel}"
                written.append(key)
                self._call("put", lambda k=key, d=data: obstore.put(self.store, k, d), key)
            if before_manifest is not None:
                before_manifest()
            raw = m.to_json().encode("utf-8")
            mkey = f"{name}/{version}/{MANIFEST_RELPATH}"
            try:
                self._call("put", lambda: obstore.put(self.store, mkey, raw,
                                                      mode="create" if self.conditional else "overwrite"),
                           mkey, retry=False)
            except ObjectStoreError as exc:
                if exc.kind in ("exists", "precondition"):
                    raise VersionConflict(f"{name}@{version}", "(published meanwhile)", m.digest) from None
                raise
            written.clear()  # (published: what was uploaded is the version now)
            back = self.read_manifest(name, version)  # re-read: what readers will see
            if back is None or back.digest != m.digest:
                raise IntegrityError(f"{self.url}/{mkey}: the manifest read back is not the one written")
            return True
        except BaseException:
            self._remove_unpublished(name, version, written)
            raise
        finally:
            try:
                obstore.delete(self.store, claim)
            except Exception:  # noqa: BLE001 (a claim left behind goes stale; never hide the real error)
                pass

    def _remove_unpublished(self, name: str, version: str, keys: list[str]) -> None:
        """A publish that failed removes the objects it uploaded (invisible without a manifest, but
        billed), unless a manifest exists by now: then they are someone else's version's."""
        import obstore
        if not keys:
            return
        try:
            if self.read_manifest(name, version) is not None:
                return
            for key in keys:
                obstore.delete(self.store, key)
        except Exception as exc:  # noqa: BLE001 (best effort; never hide the real error)
            import logging
            logging.getLogger(__name__).warning("could not remove the objects of a failed publish of %s@%s: %s "
                                                "(invisible without a manifest; the next publish replaces them)",
                                                name, version, str(exc).splitlines()[0][:200] if str(exc) else exc)

    def _upload(self, key: str, entry: FileEntry, source: Any, chunk_size: int,
                progress: ProgressFn | None, crypto: Callable[[], Any] | None = None) -> str | None:
        """One file from one descriptor: a single PUT up to ``part_bytes``, else a multipart upload of
        ``part_bytes`` parts (``concurrency`` in flight); its size checked in the store afterwards."""
        import obstore
        from .safefs import open_source
        where = os.fspath(source) if not hasattr(source, "rel") else f"{source.dir.path}/{source.rel}"
        sent: list[Any] = [None]   # the crypto hasher fed with exactly the bytes sent
        fd = open_source(source)
        try:
            if os.fstat(fd).st_size != entry.size:
                raise FileChanged(where, "changed size after it was hashed; try again")
            parts = [(p, p.begin, p.end) for p in entry.parts(chunk_size)]
            if entry.size <= self.part_bytes:
                data = _pread_all(fd, 0, entry.size)
                _check_sent({}, parts, 0, memoryview(data), where)
                if crypto is not None:
                    sent[0] = crypto()
                    sent[0].update(data)
                self._call("put", lambda: obstore.put(self.store, key, data, use_multipart=False), key)
            else:
                # (a retried upload reads the file again: its crypto digest starts over with it)
                def stream() -> Any:
                    h = crypto() if crypto is not None else None
                    sent[0] = None
                    for block in _checked_stream(fd, entry, parts, self.part_bytes, where):
                        if h is not None:
                            h.update(block)
                        yield block
                    sent[0] = h
                self._call("put", lambda: obstore.put(self.store, key, stream(), chunk_size=self.part_bytes,
                                                      max_concurrency=self.concurrency), key)
        finally:
            os.close(fd)
        self.stats.count("put", entry.size, write=True)
        meta = self._call("head", lambda: obstore.head(self.store, key), key)
        if meta["size"] != entry.size:  # (what was written, checked before the manifest makes it visible)
            raise IntegrityError(f"{self.url}/{key}: {meta['size']} bytes stored, {entry.size} uploaded")
        if progress is not None:
            progress(entry.size)
        if crypto is None:
            return None
        if sent[0] is None:
            raise FileChanged(where, "was not read to its end while it was uploaded; try again")
        return sent[0].hexdigest()

    def _claim(self, key: str, name: str, version: str) -> None:
        import obstore
        body = json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "at": time.time()}).encode()
        if not self.conditional:
            obstore.put(self.store, key, body)
            return
        try:
            self._call("put", lambda: obstore.put(self.store, key, body, mode="create"), key, retry=False)
            return
        except ObjectStoreError as exc:
            if exc.kind not in ("exists", "precondition"):
                raise
        try:   # (not a claim weightd wrote if over SMALL_LIMIT: refused from its length, never read whole)
            held = self.get_small(key, SMALL_LIMIT, what="publish claim")
            info = json.loads(held) if held is not None else {}
            since = float(info.get("at", 0))
        except (BadInput, ValueError, TypeError, AttributeError):
            info, since = {}, 0.0
        if time.time() - since < CLAIM_STALE_S:
            raise Busy(f"{name}@{version}", f"being published by {info.get('host', '?')} pid {info.get('pid', '?')} "
                                            f"since {time.strftime('%H:%M:%S UTC', time.gmtime(since))}: wait for it "
                                            f"(preload --wait), or publish another version")
        # a stale claim (a crashed publisher): take it over only if nobody else did meanwhile
        self._call("put", lambda: obstore.put(self.store, key, body, mode={"e_tag": meta["e_tag"]}), key, retry=False)


@dataclass
class _Group:
    ranges: list[tuple[int, int, list[tuple[Any, int, int]]]]   # (start, end, [(part, lo, hi)])
    hashers: dict[str, Any] = field(default_factory=dict)


def _groups(f: FileEntry, chunk_size: int, range_bytes: int, have: set[str] | frozenset[str] = frozenset()
            ) -> list[_Group]:
    """The file's parts still wanted (all but the labels in ``have``) as work: small consecutive parts
    packed into one range up to ``range_bytes``; a part larger than that is one group of several ranges
    (fetched in order, so its hash is fed in order). Bytes no part covers (padding, a trailer) are
    fetched too, unhashed, as a verify ignores them."""
    parts = f.parts(chunk_size)
    out: list[_Group] = []
    cur: list[Any] = []
    cur_start = cur_end = 0

    def flush() -> None:
        if cur:
            out.append(_Group([(cur_start, cur_end, [(q, q.begin, q.end) for q in cur])]))
            cur.clear()

    for p in parts:
        if p.label in have or p.length == 0:
            flush()
            continue
        if p.length > range_bytes:
            flush()
            out.append(_Group([(s, min(p.end, s + range_bytes), [(p, s, min(p.end, s + range_bytes))])
                               for s in range(p.begin, p.end, range_bytes)]))
            continue
        if cur and (p.begin != cur_end or p.end - cur_start > range_bytes):
            flush()
        if not cur:
            cur_start = p.begin
        cur.append(p)
        cur_end = p.end
    flush()
    pos = 0
    for s, e in sorted((p.begin, p.end) for p in parts) + [(f.size, f.size)]:
        if s > pos:
            for g0 in range(pos, s, range_bytes):
                out.append(_Group([(g0, min(s, g0 + range_bytes), [])]))
        pos = max(pos, e)
    return [g for g in out if any(e > s for s, e, _ in g.ranges)]


def _preallocate(fd: int, size: int) -> int:
    """Reserve the file's blocks (a full tier fails early); runs beside the downloads, so only the
    real ``fallocate(2)``, which never touches written data (skipped where unsupported)."""
    if size and os.fstat(fd).st_blocks * 512 < size:
        fallocate(fd, size)
    return 0


def _pread_all(fd: int, offset: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = os.pread(fd, n - len(out), offset + len(out))
        if not got:
            break
        out += got
    return bytes(out)


def _check_sent(hashers: dict[str, Any], parts: list[tuple[Any, int, int]], pos: int, view: memoryview,
                where: str) -> None:
    """Feed the bytes at ``pos`` to the hashes of the parts they fall in; a part whose last byte went
    by and does not match the manifest means the file changed after it was hashed (FileChanged)."""
    import xxhash
    n = len(view)
    for part, lo, hi in parts:
        a, b = max(lo, pos), min(hi, pos + n)
        if a >= b:
            continue
        h = hashers.setdefault(part.label, xxhash.xxh3_128())
        h.update(view[a - pos:b - pos])
        if b == part.end and h.hexdigest() != part.xxh3_128:
            raise FileChanged(where, f"changed after it was hashed ({part.label} is not what the manifest "
                                     f"says): nothing was published; try again")


def _checked_stream(fd: int, entry: FileEntry, parts: list[tuple[Any, int, int]], block: int,
                    where: str) -> Any:
    """The file's bytes in ``block`` pieces, each hashed on the way out (see :func:`_check_sent`); a
    file shorter than its entry ends the stream with FileChanged (the upload is aborted)."""
    hashers: dict[str, Any] = {}
    pos, i = 0, 0
    while pos < entry.size:
        data = _pread_all(fd, pos, min(block, entry.size - pos))
        if not data:
            raise FileChanged(where, f"shrank to {pos} bytes while it was being published; try again")
        while i < len(parts) and parts[i][2] <= pos:
            i += 1  # parts already finished
        j = i
        while j < len(parts) and parts[j][1] < pos + len(data):
            j += 1
        _check_sent(hashers, parts[i:j], pos, memoryview(data), where)
        pos += len(data)
        yield data
