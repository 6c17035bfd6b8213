"""The registry's part of a ranged download (:mod:`tiering.sources.ranged`, which cuts a version's
files into ranges along the manifest's parts, hashes each part as it arrives and asks a broken range
again): :class:`BlobRanges`, one ranged GET of a file's blob, each worker thread on its own keep-alive
connection.

Blobs are addressed by digest, so a tag moved during a download changes nothing read. And each file's
sha256 is taken in order as its ranges land (:class:`~tiering.sources.ranged.digest.InOrderDigest`),
so the registry's own digest is checked too: a blob whose bytes are not its digest is refused
(BlobMismatch), a cryptographic check of every file (the parts already here enter it from disk).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from ...content.manifest import FileEntry, Manifest
from ...errors import IntegrityError, TieringError, TimedOut
from ...progress import ProgressFn
from ...safefs import Dir
from ..ranged.fetch import Write
from ..ranged.fetch import fetch as ranged_fetch
from .client import RETRIES, STREAM_CHUNK, RegistryClient, Transient
from .errors import BlobMismatch, RegistryError, ShortRead
from .layout import Artifact, Layer


@dataclass(frozen=True, slots=True)
class Blob:
    """The blob a file is read from."""
    where: str          # oci://REGISTRY/REPO@DIGEST (PATH), as messages name it
    layer: Layer
    path: str


class BlobRanges:
    """The :class:`~tiering.sources.ranged.fetch.Transport` of an artifact in repository ``repo``: a
    file is its layer's blob (:class:`Blob`), a range one GET of it with ``Range``."""
    thread_name = "oci"
    retries = RETRIES

    def __init__(self, c: RegistryClient, repo: str, art: Artifact) -> None:
        self.c, self.repo, self.art = c, repo, art
        self.range_bytes, self.concurrency, self.bucket = c.range_bytes, c.concurrency, c.bucket

    def where(self, path: str) -> str:
        layer = self.art.by_path.get(path)
        return f"oci://{self.c.location.host}/{self.repo}@{layer.digest if layer else '?'} ({path})"

    def open(self, m: Manifest, f: FileEntry) -> Blob:
        layer = self.art.by_path.get(f.path)
        if layer is None or layer.size != f.size:
            raise IntegrityError(f"{self.where(f.path)}: the artifact's layer does not match the manifest's "
                                 f"{f.size} bytes")
        return Blob(self.where(f.path), layer, f.path)

    def retryable(self, exc: TieringError) -> bool:
        return isinstance(exc, RegistryError) and exc.kind in ("throttled", "error", "short_read", "timeout")

    def get(self, blob: Blob, start: int, end: int, write: Write, deadline: float | None) -> None:
        """One ranged GET of the blob, read in STREAM_CHUNK pieces; a response that stalls ends at
        ``deadline`` (TimedOut), one that breaks midway is ShortRead (asked again)."""
        c = self.c
        what = f"{self.repo}@{blob.layer.digest} ({blob.path}) bytes {start}-{end}"
        resp = c.request("GET", f"/v2/{self.repo}/blobs/{blob.layer.digest}", what=what, deadline=deadline,
                         stream=True, headers={"Range": f"bytes={start}-{end - 1}"}, expect=(206, 200))
        if resp.status == 200 and (start, end) != (0, blob.layer.size):
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
                write(chunk)
                pos += len(chunk)
            if resp.read(1):
                raise ShortRead(f"{c.url}: {what}: the registry sent more than the range")
        except BaseException:
            c.abandon(resp)
            raise
        c.done(resp)
        c.stats.count("get", pos - start)


def fetch(c: RegistryClient, repo: str, art: Artifact, m: Manifest, dest: Dir, *, deadline: float | None = None,
          progress: ProgressFn | None = None, skip: set[str] | None = None,
          have: dict[str, set[str]] | None = None, only_wanted: bool = False) -> int:
    """Download every file of ``m`` (but ``skip``) from the blobs of ``art`` into ``dest``, hashing
    each manifest part as its bytes arrive (IntegrityError naming the part) and each blob's sha256 in
    order (BlobMismatch). ``have``: parts already in ``dest`` and verified; with ``only_wanted``, parts
    not wanted at all (an expert-parallel copy's ranges: the files stay sparse, so no blob's sha256
    can be taken; each part's xxh3-128 still is). Returns the bytes downloaded."""
    ranges = BlobRanges(c, repo, art)
    sha256: dict[str, str] = {}
    total = ranged_fetch(ranges, m, dest, deadline=deadline, progress=progress, skip=skip, have=have,
                         **({} if only_wanted else {"crypto": hashlib.sha256, "digests": sha256}))
    for path, hexdigest in sha256.items():
        layer = art.by_path[path]
        if f"sha256:{hexdigest}" != layer.digest:
            raise BlobMismatch(f"{ranges.where(path)}: the registry's bytes are not the blob's digest {layer.digest} "
                               f"(sha256 of {layer.size} bytes: sha256:{hexdigest}): the blob is damaged in the "
                               f"registry's storage")
    return total
