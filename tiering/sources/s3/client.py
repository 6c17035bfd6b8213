"""The S3 client under the object-store cold tier: one bucket and prefix (:class:`ObjectLocation`),
credentials (the environment, roles, and the shared credentials file, which object_store does not
read), and every request counted (:class:`Stats`), classified, retried when transient and ended at
the caller's deadline. The catalog, ranged reads and publishing (the modules beside this one) make
their requests through :class:`S3Client` and nothing else.

Library: ``obstore`` (the Rust ``object_store`` crate: S3 and S3-compatible stores; its calls
release the GIL, so plain threads give real concurrency).
"""

from __future__ import annotations

import asyncio
import configparser
import os
import threading
import time
from datetime import timedelta
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from ...copy import current_deadline
from ...errors import BadInput, CheckpointNotFound, IntegrityError, TieringError, TimedOut

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


def deadline_of(explicit: float | None) -> float | None:
    """The earlier of ``explicit`` and the deadline of the run_bounded call this thread works for
    (a preload's --timeout reaching a manifest read deep inside resolve)."""
    inherited = current_deadline()
    return min((d for d in (explicit, inherited) if d is not None), default=None)


def bounded(make: Callable[[], Any], deadline: float | None, what: str) -> Any:
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


def classify(exc: BaseException) -> str:
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



class S3Client:
    """One bucket (and prefix) of an S3-compatible store, with the tier's settings; thread-safe.
    ``store`` is obstore's handle, ``stats`` what was asked and served."""

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
        from ...pagecache.throttle import TokenBucket
        self.bucket = TokenBucket(bandwidth) if bandwidth else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- calls, each counted, classified and retried ------------------------------------------------
    def call(self, kind: str, fn: Callable[[], Any], what: str, *, deadline: float | None = None,
              retry: bool = True) -> Any:
        delay = 0.2
        for attempt in range(RETRIES + 1):
            try:
                return fn()
            except TieringError:
                raise  # ours (a file that changed under an upload, a short read): never retried blindly
            except Exception as exc:  # noqa: BLE001 (classified below)
                why = classify(exc)
                self.stats.error(why)
                transient = why in ("throttled", "error") and retry
                late = deadline is not None and time.monotonic() + delay > deadline
                if not transient or attempt == RETRIES or late:
                    raise self.error_for(why, what, exc) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def error_for(self, why: str, what: str, exc: BaseException) -> TieringError:
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

    # -- reads of small objects -----------------------------------------------------------------------
    def get_small(self, key: str, limit: int, *, deadline: float | None = None, what: str = "object") -> bytes | None:
        """An object read whole (a manifest, a torrent, a claim), or None when absent: refused (BadInput,
        exit 2) from the response's length alone when it is over ``limit``, before a byte of its body is
        read; the body read stops at ``limit`` whatever the length said; all of it within ``deadline``
        (and the deadline this thread works for)."""
        import obstore

        async def get() -> bytes:
            res = await obstore.get_async(self.store, key)
            size = res.meta["size"]
            # The body is taken out of the response at once and dropped here on a refusal, which closes its
            # connection: the response itself stays referenced by obstore's finished future until PyO3 next
            # runs in this process (pyo3-async-runtimes drops that reference on a tokio thread, without the
            # GIL), so a body left in it kept a hostile store's connection open for as long as that took.
            body = res.stream(min_chunk_size=min(STREAM_CHUNK, max(limit, 1)))
            chunks: list[bytes] = []   # (joined once at the end: the body is never held twice)
            try:
                if size > limit:
                    raise BadInput(f"{self.url}/{key}: {what} of {size} bytes, more than the {limit} allowed; not read")
                got = 0
                async for chunk in body:
                    got += len(chunk)
                    if got > limit:
                        chunks.clear()
                        raise BadInput(f"{self.url}/{key}: {what} larger than the {limit} bytes allowed; not read "
                                       f"further")
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                del body   # (not kept alive by the traceback of the error raised here)
        try:
            raw = self.call("get", lambda: bounded(get, deadline_of(deadline), f"{self.url}/{key}"), key,
                             deadline=deadline_of(deadline))
        except CheckpointNotFound:
            return None
        self.stats.count("get", len(raw))
        return raw

    def head(self, key: str) -> dict[str, Any]:
        import obstore
        meta = self.read("head", key, lambda: obstore.head_async(self.store, key))
        self.stats.count("head")
        return meta

    def read(self, kind: str, key: str, make: Callable[[], Any]) -> Any:
        """One read request (obstore's async call ``make``) within the deadline this thread works for
        (a preload's --timeout, a daemon route's bound): a store that stalls ends there, not at the
        client's 120 s timeout."""
        deadline = deadline_of(None)
        return self.call(kind, lambda: bounded(make, deadline, f"{self.url}/{key}"), key, deadline=deadline)
