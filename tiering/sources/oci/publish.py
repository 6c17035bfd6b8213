"""Publishing to a registry: NAME@VERSION's files pushed as blobs, then its extra files, weightd's
manifest and the ModelPack config, then the OCI manifest under the tag VERSION, last, so a
half-pushed version is never visible (a blob no manifest names is invisible, and the registry's
garbage collection removes it).

Each file is read from one descriptor twice at most: once to take its sha256 (the blob's digest)
while every manifest part is hashed again (a file that changed since it was hashed is FileChanged),
and, only when the registry does not have that blob already (a HEAD by digest), once more to send it
in chunks (``PATCH``, each retried from where the registry says the upload is). The registry checks
the digest of what it received when the upload is closed: what is published is exactly what was
hashed. Versions are immutable: a tag that exists with other content is refused (VersionConflict),
checked before the first blob and again just before the manifest is pushed. A registry has no
conditional manifest PUT, so two publishers of the same version in that last instant both put
their tag, and the last PUT wins: each reads the tag back at once and again ``SETTLE_S`` later,
and the one whose manifest is not there gets VersionConflict. Both are told they won only if one's
last check and its PUT were more than ``SETTLE_S`` apart (docs/sources.md).
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urljoin

from ...content.manifest import MANIFEST_RELPATH, FileEntry, Manifest
from ...errors import BadInput, CheckpointNotFound, FileChanged, IntegrityError, TieringError, VersionConflict
from ...progress import ProgressFn
from ...safefs import open_source
from . import layout
from .catalog import read_manifest, resolve_ref, torrent_tag
from .client import RETRIES, RegistryClient
from .errors import RegistryError, RegistrySetupError
from .layout import OCI_MANIFEST, Artifact

READ_BLOCK = 4 << 20


def publish(c: RegistryClient, src: Path, m: Manifest, files: list[tuple[str, Any]], *,
            progress: ProgressFn | None = None, extra: dict[str, bytes] | None = None,
            before_manifest: Callable[[], None] | None = None, crypto: Callable[[], Any] | None = None,
            signed: "Callable[[dict[str, str]], dict[str, bytes]] | None" = None) -> bool:
    """Push ``files`` (relpath, what to open) of NAME@VERSION, then ``extra`` files, weightd's
    manifest, the config, and the OCI manifest last. False when the same content is already
    published (nothing pushed); VersionConflict when other content is under the tag. ``crypto``
    digests every file in the read that takes its sha256; ``signed(digests)`` returns more files
    (a signature bundle) to push before the manifest, or raises to abort."""
    name, version = m.name, m.version
    repo = c.location.repo(name)
    tag = c.location.tag(version)
    if _existing(c, m) is not None:
        return False
    entries = {f.path: f for f in m.files}
    with ThreadPoolExecutor(max_workers=c.concurrency, thread_name_prefix="weightd-oci-push") as pool:
        futures = [pool.submit(push_file, c, repo, rel, entries[rel], source, m.chunk_size, progress, crypto)
                   for rel, source in files]
        try:
            pushed = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    file_layers = [layer for layer, _ in pushed]
    digests = {layer.path: d for layer, d in pushed if d is not None}
    if signed is not None:
        extra = {**(extra or {}), **signed(digests)}
    extra_layers = [push_bytes(c, repo, data, rel) for rel, data in (extra or {}).items()]
    own = push_bytes(c, repo, m.to_json().encode("utf-8"), MANIFEST_RELPATH)
    config = push_bytes(c, repo, layout.config_blob(m, file_layers), "", media_type=layout.CONFIG_TYPE)
    if before_manifest is not None:
        before_manifest()
    annotations = {layout.DIGEST_ANNOTATION: m.digest, layout.VERSION_ANNOTATION: version}
    if m.published_at:
        annotations["org.opencontainers.image.created"] = m.published_at
    raw = layout.manifest_bytes(config, file_layers + extra_layers + [own], annotations)
    if _existing(c, m) is not None:   # (published meanwhile, with the same content)
        return False
    r = c.request("PUT", f"/v2/{repo}/manifests/{tag}", what=f"{repo}:{tag} manifest", body=raw, push=True,
                  headers={"Content-Type": OCI_MANIFEST}, expect=(201,))
    c.stats.count("put", len(raw), write=True)
    ours = layout.sha256_digest(raw)
    named = r.headers.get("Docker-Content-Digest")
    if named and named != ours:
        raise IntegrityError(f"{c.url}/{repo}:{tag}: the registry stored the manifest as {named}, not {ours}")
    _still_ours(c, m, ours)
    time.sleep(SETTLE_S)   # (a racing publisher whose last check came before our PUT has put its tag by now)
    _still_ours(c, m, ours)
    return True


SETTLE_S = 0.5   # how long after its tag PUT a publisher reads the tag back a second time


def _still_ours(c: RegistryClient, m: Manifest, ours: str) -> None:
    """The tag holds the OCI manifest ``ours`` (VersionConflict: another publisher's PUT came after ours)."""
    try:
        back = read_manifest(c, m.name, m.version)
    except (BadInput, IntegrityError) as exc:
        if isinstance(exc, VersionConflict):
            raise
        back, detail = None, f"(something else: {exc})"
    else:
        detail = back[0].digest if back is not None else "(removed meanwhile)"
    if back is None or (back[1].digest != ours and back[0].digest != m.digest):   # (the same content: fine)
        raise VersionConflict(f"{m.name}@{m.version}", detail, f"{m.digest}: another publisher pushed the tag at "
                              f"the same time, after this one")


def _existing(c: RegistryClient, m: Manifest) -> Manifest | None:
    """What is under the tag already: None (nothing), the same content (returned), or VersionConflict."""
    try:
        got = read_manifest(c, m.name, m.version)
    except (BadInput, IntegrityError) as exc:
        if isinstance(exc, VersionConflict):
            raise
        raise VersionConflict(f"{m.name}@{m.version}", f"(the tag holds something else: {exc})", m.digest) from None
    if got is None:
        return None
    if got[0].digest != m.digest:
        raise VersionConflict(f"{m.name}@{m.version}", got[0].digest, m.digest)
    return got[0]


def push_file(c: RegistryClient, repo: str, rel: str, entry: FileEntry, source: Any, chunk_size: int,
              progress: ProgressFn | None, crypto: Callable[[], Any] | None) -> tuple[layout.Layer, str | None]:
    """One file as a blob: its sha256 taken (and its parts checked) from one descriptor, then sent in
    chunks from the same descriptor unless the registry has it. Returns its layer and crypto digest."""
    where = os.fspath(source) if not hasattr(source, "rel") else f"{source.dir.path}/{source.rel}"
    fd = open_source(source)
    try:
        if os.fstat(fd).st_size != entry.size:
            raise FileChanged(where, "changed size after it was hashed; try again")
        digest, cdigest = _hash_file(fd, entry, chunk_size, where, crypto)
        if not has_blob(c, repo, digest):
            upload(c, repo, digest, entry.size, lambda pos, n: _pread_exact(fd, pos, n, where), where)
            c.stats.count("put", entry.size, write=True)
    finally:
        os.close(fd)
    if progress is not None:
        progress(entry.size)
    return layout.Layer(layout.media_type_for(rel), digest, entry.size, rel), cdigest


def _hash_file(fd: int, entry: FileEntry, chunk_size: int, where: str,
               crypto: Callable[[], Any] | None) -> tuple[str, str | None]:
    """The file's sha256 (and crypto digest), every manifest part hashed again on the way (FileChanged)."""
    import xxhash
    sha = hashlib.sha256()
    ch = crypto() if crypto is not None else None
    parts = entry.parts(chunk_size)
    hashers: dict[str, Any] = {}
    pos = i = 0
    while pos < entry.size:
        data = os.pread(fd, min(READ_BLOCK, entry.size - pos), pos)
        if not data:
            raise FileChanged(where, f"shrank to {pos} bytes while it was being published; try again")
        view, n = memoryview(data), len(data)
        sha.update(view)
        if ch is not None:
            ch.update(view)
        while i < len(parts) and parts[i].end <= pos:
            i += 1
        j = i
        while j < len(parts) and parts[j].begin < pos + n:
            p = parts[j]
            a, b = max(p.begin, pos), min(p.end, pos + n)
            if a < b:
                h = hashers.setdefault(p.label, xxhash.xxh3_128())
                h.update(view[a - pos:b - pos])
                if b == p.end and h.hexdigest() != p.xxh3_128:
                    raise FileChanged(where, f"changed after it was hashed ({p.label} is not what the manifest says): "
                                             f"nothing was published; try again")
            j += 1
        pos += n
    return "sha256:" + sha.hexdigest(), (ch.hexdigest() if ch is not None else None)


def _pread_exact(fd: int, pos: int, n: int, where: str) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = os.pread(fd, n - len(out), pos + len(out))
        if not got:
            raise FileChanged(where, "shrank while it was being published; try again")
        out += got
    return bytes(out)


def has_blob(c: RegistryClient, repo: str, digest: str) -> bool:
    try:
        c.request("HEAD", f"/v2/{repo}/blobs/{digest}", what=f"{repo}@{digest}")
    except CheckpointNotFound:
        return False
    c.stats.count("head")
    return True


def push_bytes(c: RegistryClient, repo: str, data: bytes, path: str, *, media_type: str | None = None) -> layout.Layer:
    """A small blob (weightd's manifest, a signature, the config), unless the registry has it."""
    digest = layout.sha256_digest(data)
    if not has_blob(c, repo, digest):
        upload(c, repo, digest, len(data), lambda pos, n: data[pos:pos + n], f"{repo} {path or 'config'}")
        c.stats.count("put", len(data), write=True)
    return layout.Layer(media_type or layout.media_type_for(path), digest, len(data), path)


def upload(c: RegistryClient, repo: str, digest: str, size: int, read: Callable[[int, int], bytes], where: str) -> None:
    """A blob upload session: ``POST``, chunks of ``chunk_bytes`` by ``PATCH`` (a chunk that fails is
    sent again from where the registry says the upload is), ``PUT ?digest=`` to close it. The
    registry computes the digest of what it received: another is DIGEST_INVALID (FileChanged)."""
    what = f"{repo} blob upload ({where})"
    r = c.request("POST", f"/v2/{repo}/blobs/uploads/", what=what, body=b"", headers={"Content-Length": "0"},
                  expect=(202,), push=True)
    loc = _location(c, r, what)
    pos = 0
    failures = 0
    while pos < size:
        n = min(c.chunk_bytes, size - pos)
        data = read(pos, n)
        try:
            r = c.request("PATCH", loc, what=what, body=data, push=True, expect=(202,), retry=False,
                          headers={"Content-Type": "application/octet-stream", "Content-Length": str(n),
                                   "Content-Range": f"{pos}-{pos + n - 1}"})
            loc = _location(c, r, what)
            pos += n
        except RegistrySetupError:
            raise
        except (RegistryError, TimeoutError) as exc:
            failures += 1
            if failures > RETRIES:
                raise
            time.sleep(min(0.2 * 2 ** failures, 5.0))
            pos, loc = _upload_status(c, loc, what, exc)
    close = loc + ("&" if "?" in loc else "?") + f"digest={digest}"
    try:
        c.request("PUT", close, what=what, body=b"", headers={"Content-Length": "0"}, expect=(201,), push=True)
    except RegistryError as exc:
        if "DIGEST_INVALID" in getattr(exc, "codes", ()) or "BLOB_UPLOAD_INVALID" in getattr(exc, "codes", ()):
            raise FileChanged(where, "the registry received other bytes than were hashed (changed while it was "
                                     "sent?): nothing was published; try again") from None
        raise


def _upload_status(c: RegistryClient, loc: str, what: str, cause: Exception) -> tuple[int, str]:
    """Where an upload session is (``GET`` its location: ``Range: 0-LAST``), to resume after a failed chunk."""
    try:
        r = c.request("GET", loc, what=what, expect=(204,), push=True, limit=64 << 10)
    except TieringError:
        raise cause from None
    rng = r.headers.get("Range", "")
    start, _, last = rng.partition("-")
    if start != "0" or not last.isdigit():
        return 0, _location(c, r, what) if r.headers.get("Location") else loc
    return int(last) + 1, (_location(c, r, what) if r.headers.get("Location") else loc)


def _location(c: RegistryClient, r: Any, what: str) -> str:
    loc = r.headers.get("Location")
    if not loc:
        raise RegistryError(f"{c.url}: {what}: the registry sent no upload location")
    return urljoin(f"{c.scheme}://{c.location.host}/", loc)


def put_torrent_if_absent(c: RegistryClient, name: str, version: str, data: bytes, art: Artifact) -> bool:
    """The torrent of a published version, pushed as an artifact of its own whose subject is the
    version's manifest (tag ``sha256-<hex>.torrent``); False when one is there already."""
    repo = c.location.repo(name)
    tag = torrent_tag(art)
    if resolve_ref(c, repo, tag) is not None:
        return False
    layer = push_bytes(c, repo, data, layout.TORRENT_RELPATH)
    config = push_bytes(c, repo, layout.EMPTY_JSON, "", media_type="application/vnd.oci.empty.v1+json")
    raw = layout.manifest_bytes(config, [layer], {}, layout.TORRENT_ARTIFACT,
                                subject={"mediaType": OCI_MANIFEST, "digest": art.digest, "size": len(art.raw)})
    c.request("PUT", f"/v2/{repo}/manifests/{tag}", what=f"{repo}:{tag}", headers={"Content-Type": OCI_MANIFEST},
              body=raw, expect=(201,), push=True)
    c.stats.count("put", len(raw), write=True)
    return True

