"""Publishing to an object store: NAME@VERSION's files uploaded, then its extra objects, then its
manifest, last and conditionally, so a half-uploaded version is never seen.

One publisher wins: before any byte is uploaded, a publisher claims ``.weightd/publishing`` with a
conditional put (``If-None-Match: *``); a second publisher of the same NAME@VERSION is refused at once
(Busy) instead of overwriting the first one's objects. A claim older than ``CLAIM_STALE_S`` (a
crashed publisher) is taken over with a conditional put on its ETag. On a store without conditional
puts these become plain puts (``conditional=False``). Every file is read from one descriptor and
each manifest part hashed as its bytes are sent: a file that changed since it was hashed aborts the
upload (FileChanged), and the objects a failed publish uploaded are removed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from ...content.manifest import MANIFEST_RELPATH, FileEntry, Manifest
from ...errors import (BadInput, Busy, CheckpointNotFound, FileChanged, IntegrityError, TieringError,
                       VersionConflict)
from ...progress import ProgressFn
from ...safefs import open_source
from .catalog import read_manifest
from .client import SMALL_LIMIT, ObjectStoreError, S3Client

CLAIM_RELPATH = ".weightd/publishing"
CLAIM_STALE_S = 6 * 3600

log = logging.getLogger(__name__)


def publish(s3: S3Client, src: Path, m: Manifest, files: list[tuple[str, Any]], *, progress: ProgressFn | None = None,
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
    name, version = m.name, m.version
    existing = read_manifest(s3, name, version)
    if existing is not None:
        if existing.digest == m.digest:
            return False
        raise VersionConflict(f"{name}@{version}", existing.digest, m.digest)
    claim_key = f"{name}/{version}/{CLAIM_RELPATH}"
    claim(s3, claim_key, name, version)
    written: list[str] = []
    try:
        digests = _upload_files(s3, m, files, written, progress, crypto)
        if signed is not None:
            extra = {**(extra or {}), **signed(digests)}
        _put_extra(s3, m, extra or {}, written)
        if before_manifest is not None:
            before_manifest()
        _put_manifest(s3, m)
        written.clear()  # (published: what was uploaded is the version now)
        return True
    except BaseException:
        remove_unpublished(s3, name, version, written)
        raise
    finally:
        _release(s3, claim_key)


def _upload_files(s3: S3Client, m: Manifest, files: list[tuple[str, Any]], written: list[str],
                  progress: ProgressFn | None, crypto: Callable[[], Any] | None) -> dict[str, str]:
    """Every file uploaded (its key added to ``written`` first); their crypto digests, by relpath."""
    entries = {f.path: f for f in m.files}
    digests: dict[str, str] = {}
    for rel, source in files:
        written.append(f"{m.name}/{m.version}/{rel}")
        digest = upload(s3, written[-1], entries[rel], source, m.chunk_size, progress, crypto)
        if digest is not None:
            digests[rel] = digest
    return digests


def _put_extra(s3: S3Client, m: Manifest, extra: dict[str, bytes], written: list[str]) -> None:
    import obstore
    for rel, data in extra.items():
        key = f"{m.name}/{m.version}/{rel}"
        written.append(key)
        s3.call("put", lambda k=key, d=data: obstore.put(s3.store, k, d), key)


def _put_manifest(s3: S3Client, m: Manifest) -> None:
    """The manifest, last and conditionally (VersionConflict when another was put meanwhile), then
    read back: what readers will see."""
    import obstore
    raw = m.to_json().encode("utf-8")
    mkey = f"{m.name}/{m.version}/{MANIFEST_RELPATH}"
    try:
        s3.call("put", lambda: obstore.put(s3.store, mkey, raw, mode="create" if s3.conditional else "overwrite"),
                mkey, retry=False)
    except ObjectStoreError as exc:
        if exc.kind in ("exists", "precondition"):
            raise VersionConflict(f"{m.name}@{m.version}", "(published meanwhile)", m.digest) from None
        raise
    back = read_manifest(s3, m.name, m.version)
    if back is None or back.digest != m.digest:
        raise IntegrityError(f"{s3.url}/{mkey}: the manifest read back is not the one written")


def _release(s3: S3Client, claim_key: str) -> None:
    import obstore
    try:
        obstore.delete(s3.store, claim_key)
    except Exception:  # noqa: BLE001 (a claim left behind goes stale; never hide the real error)
        pass


def remove_unpublished(s3: S3Client, name: str, version: str, keys: list[str]) -> None:
    """A publish that failed removes the objects it uploaded (invisible without a manifest, but
    billed), unless a manifest exists by now: then they are someone else's version's."""
    import obstore
    if not keys:
        return
    try:
        if read_manifest(s3, name, version) is not None:
            return
        for key in keys:
            obstore.delete(s3.store, key)
    except Exception as exc:  # noqa: BLE001 (best effort; never hide the real error)
        log.warning("could not remove the objects of a failed publish of %s@%s: %s "
                    "(invisible without a manifest; the next publish replaces them)", name, version,
                    str(exc).splitlines()[0][:200] if str(exc) else exc)


def upload(s3: S3Client, key: str, entry: FileEntry, source: Any, chunk_size: int,
           progress: ProgressFn | None, crypto: Callable[[], Any] | None = None) -> str | None:
    """One file from one descriptor: a single PUT up to ``part_bytes``, else a multipart upload of
    ``part_bytes`` parts (``concurrency`` in flight); its size checked in the store afterwards."""
    import obstore
    where = os.fspath(source) if not hasattr(source, "rel") else f"{source.dir.path}/{source.rel}"
    sent: list[Any] = [None]   # the crypto hasher fed with exactly the bytes sent
    fd = open_source(source)
    try:
        if os.fstat(fd).st_size != entry.size:
            raise FileChanged(where, "changed size after it was hashed; try again")
        parts = [(p, p.begin, p.end) for p in entry.parts(chunk_size)]
        if entry.size <= s3.part_bytes:
            data = pread_all(fd, 0, entry.size)
            _check_sent({}, parts, 0, memoryview(data), where)
            if crypto is not None:
                sent[0] = crypto()
                sent[0].update(data)
            s3.call("put", lambda: obstore.put(s3.store, key, data, use_multipart=False), key)
        else:
            _put_streamed(s3, key, fd, entry, parts, where, crypto, sent)
    finally:
        os.close(fd)
    s3.stats.count("put", entry.size, write=True)
    meta = s3.call("head", lambda: obstore.head(s3.store, key), key)
    if meta["size"] != entry.size:  # (what was written, checked before the manifest makes it visible)
        raise IntegrityError(f"{s3.url}/{key}: {meta['size']} bytes stored, {entry.size} uploaded")
    if progress is not None:
        progress(entry.size)
    if crypto is None:
        return None
    if sent[0] is None:
        raise FileChanged(where, "was not read to its end while it was uploaded; try again")
    return sent[0].hexdigest()


def _put_streamed(s3: S3Client, key: str, fd: int, entry: FileEntry, parts: list[tuple[Any, int, int]], where: str,
                  crypto: Callable[[], Any] | None, sent: list[Any]) -> None:
    """A multipart upload of the file at ``fd``, each part hashed as it goes out (``sent[0]``: the
    crypto hasher over exactly the bytes sent, once the stream reached the end)."""
    import obstore
    refused: list[TieringError] = []   # why the stream stopped, when it was ours

    def stream() -> Any:   # (a retried upload reads the file again: its crypto digest starts over with it)
        h = crypto() if crypto is not None else None
        sent[0] = None
        try:
            for block in _checked_stream(fd, entry, parts, s3.part_bytes, where):
                if h is not None:
                    h.update(block)
                yield block
        except TieringError as exc:
            refused.append(exc)
            raise
        sent[0] = h

    def put() -> Any:
        try:
            return obstore.put(s3.store, key, stream(), chunk_size=s3.part_bytes, max_concurrency=s3.concurrency)
        except Exception:
            # obstore reports a failed abort instead of the stream's error: the file that changed is
            # still the reason, and it is never retried (s3.call retries only the store's own errors)
            if refused:
                raise refused[0] from None
            raise
    s3.call("put", put, key)


def claim(s3: S3Client, key: str, name: str, version: str) -> None:
    """Claim NAME@VERSION's publish with a conditional create of ``key``: Busy when another publisher
    holds it, unless its claim is older than CLAIM_STALE_S (a crashed publisher): then taken over."""
    import obstore
    body = json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "at": time.time()}).encode()
    if not s3.conditional:
        obstore.put(s3.store, key, body)
        return
    try:
        s3.call("put", lambda: obstore.put(s3.store, key, body, mode="create"), key, retry=False)
        return
    except ObjectStoreError as exc:
        if exc.kind not in ("exists", "precondition"):
            raise
    try:   # its ETag, then its body: a claim replaced between the two fails the conditional put below
        meta = s3.head(key)
    except CheckpointNotFound:
        raise Busy(f"{name}@{version}", "another publisher just finished or gave up: publish again") from None
    try:   # (not a claim weightd wrote if over SMALL_LIMIT: refused from its length, never read whole)
        held = s3.get_small(key, SMALL_LIMIT, what="publish claim")
        info = json.loads(held) if held is not None else {}
        since = float(info.get("at", 0))
    except (BadInput, ValueError, TypeError, AttributeError):
        info, since = {}, 0.0
    if time.time() - since < CLAIM_STALE_S:
        raise Busy(f"{name}@{version}", f"being published by {info.get('host', '?')} pid {info.get('pid', '?')} "
                                        f"since {time.strftime('%H:%M:%S UTC', time.gmtime(since))}: wait for it "
                                        f"(preload --wait), or publish another version")
    # a stale claim (a crashed publisher): take it over only if nobody else did meanwhile
    s3.call("put", lambda: obstore.put(s3.store, key, body, mode={"e_tag": meta["e_tag"]}), key, retry=False)


def pread_all(fd: int, offset: int, n: int) -> bytes:
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
        data = pread_all(fd, pos, min(block, entry.size - pos))
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
