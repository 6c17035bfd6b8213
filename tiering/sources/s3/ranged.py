"""The object store's part of a ranged download (:mod:`tiering.sources.ranged`, which cuts a version's
files into ranges along the manifest's parts, hashes each part as it arrives and asks a broken range
again): :class:`ObjectRanges`, one ranged GET of an object with obstore.

No HEAD is asked: the object's size and ETag come with each ranged GET's response
(:class:`ObjectVersion`): the first response of a file fixes its ETag, every later request carries
it as ``If-Match`` and every response is checked against it, so an object replaced mid-download is
an error (:class:`ObjectChanged`), never a mix of two versions.
"""

from __future__ import annotations

import threading
from typing import Any

from ...content.manifest import FileEntry, Manifest
from ...errors import IntegrityError, TieringError
from ..ranged.fetch import Write
from .client import RETRIES, STREAM_CHUNK, ObjectChanged, ObjectStoreError, S3Client, ShortRead, bounded, classify


class ObjectVersion:
    """The object a file is read from (``key`` in the bucket of ``url``), as its responses describe it:
    the size the manifest says, and one ETag, fixed by the first response when not known before (no
    HEAD), then sent as ``If-Match`` and compared with every other response's (ObjectChanged on a
    difference). Thread-safe."""

    def __init__(self, url: str, key: str, size: int, etag: str | None = None) -> None:
        self.key, self.where, self.size, self.etag = key, f"{url}/{key}", size, etag
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


class ObjectRanges:
    """The :class:`~tiering.sources.ranged.fetch.Transport` of a bucket: NAME@VERSION's file PATH is
    the object ``NAME/VERSION/PATH`` (:class:`ObjectVersion`), a range one GET of it."""
    thread_name = "s3"
    retries = RETRIES

    def __init__(self, s3: S3Client) -> None:
        self.s3, self.range_bytes, self.concurrency, self.bucket = s3, s3.range_bytes, s3.concurrency, s3.bucket

    def open(self, m: Manifest, f: FileEntry) -> ObjectVersion:
        return ObjectVersion(self.s3.url, f"{m.name}/{m.version}/{f.path}", f.size)

    def retryable(self, exc: TieringError) -> bool:
        return isinstance(exc, ObjectStoreError) and exc.kind in ("throttled", "error", "short_read")

    def get(self, obj: ObjectVersion, start: int, end: int, write: Write, deadline: float | None) -> None:
        """One ranged GET, its object checked (:meth:`ObjectVersion.check`) before a byte is written,
        read as a stream of STREAM_CHUNK pieces (memory per worker stays at one piece, whatever the
        range size), ended at ``deadline`` (TimedOut) even when the store stops sending mid-body (the
        request is cancelled, its connection dropped)."""
        import obstore
        s3, key = self.s3, obj.key
        opts: dict[str, Any] = {"range": (start, end)}
        etag = obj.etag
        if etag:
            opts["if_match"] = etag  # replaced mid-download: 412, never a mix of two objects
        what = f"{key} bytes {start}-{end}"
        got = 0

        async def get() -> None:
            nonlocal got
            res = await obstore.get_async(s3.store, key, options=opts)
            obj.check(res.meta)
            async for chunk in res.stream(min_chunk_size=STREAM_CHUNK):
                if got + len(chunk) > end - start:
                    raise ShortRead(f"{obj.where}: the store sent more than bytes {start}-{end}")
                write(chunk)
                got += len(chunk)
        try:
            bounded(get, deadline, f"{s3.url}/{what}")
        except ObjectChanged:
            s3.stats.error("precondition")
            raise
        except (IntegrityError, TieringError):   # (TimedOut at the deadline: the request was cancelled)
            raise
        except Exception as exc:  # noqa: BLE001 (a refusal, or a stream that broke midway: obstore's errors, resets)
            raise self._range_error(obj, what, etag, start, end, got, exc) from None
        s3.stats.count("get", got)
        if got != end - start:
            s3.stats.error("short_read")
            raise ShortRead(f"{obj.where}: asked for bytes {start}-{end}, the store returned {got}")

    def _range_error(self, obj: ObjectVersion, what: str, etag: str | None, start: int, end: int, got: int,
                     exc: Exception) -> TieringError:
        """A ranged GET's failure, counted and named: the object replaced (its ETag no longer matches), a
        response that broke midway (ShortRead: asked again), or the store's refusal."""
        s3, why = self.s3, classify(exc)
        if why == "precondition":
            s3.stats.error(why)
            return ObjectChanged(f"{obj.where}: the object changed during the download (its ETag is "
                                 f"no longer {etag}): republished under the same name? preload again")
        if why == "error" and ("body error" in str(exc) or got > 0):
            s3.stats.error("short_read")
            return ShortRead(f"{obj.where}: asked for bytes {start}-{end}, the response broke after {got} bytes")
        s3.stats.error(why)
        return s3.error_for(why, what, exc)
