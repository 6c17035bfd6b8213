"""What an object-store cold tier holds: the published names and versions (listings, one HEAD per
version's manifest), a version's manifest (size-checked before its body is read), and the small
objects beside a version (its torrent). A version exists when its manifest object exists."""

from __future__ import annotations

from pathlib import Path
from ...content.manifest import MANIFEST_RELPATH, Manifest
from ...content.manifest_parse import parse_manifest
from ...content.names import validate_label, validate_name, validate_version
from ...errors import BadInput, CheckpointNotFound
from ...layout import VersionDir
from .client import OBJECT_MANIFEST_LIMIT, ObjectStoreError, S3Client



def read_manifest(s3: S3Client, name: str, version: str, *, deadline: float | None = None) -> Manifest | None:
    """NAME@VERSION's manifest, or None when it is not published (no manifest object). Its size is
    checked from the response before the body is read, and the read stops at the limit."""
    validate_name(name)
    validate_label(version)  # (a companion's label too)
    key = f"{name}/{version}/{MANIFEST_RELPATH}"
    raw = s3.get_small(key, s3.max_manifest_bytes, deadline=deadline, what="manifest")
    if raw is None:
        return None
    m = parse_manifest(raw, f"{s3.url}/{key}")
    if m.name != name or m.version != version:
        raise BadInput(f"{s3.url}/{key}: it describes {m.name}@{m.version}, not {name}@{version}")
    return m


def as_version_dir(s3: S3Client, m: Manifest) -> VersionDir:
    """``m``'s version as the tier code sees a published one: its ``path`` names the object prefix and
    is never opened (nothing of an object store is on disk); its ``store`` is ``s3``."""
    return VersionDir(m.name, m.version, Path("/nonexistent-object-store") / s3.location.bucket
                      / s3.location.prefix / m.name / m.version, m, store=s3)


def read_meta(s3: S3Client, name: str, version: str, rel: str, limit: int = OBJECT_MANIFEST_LIMIT) -> bytes | None:
    """A small object beside a version (``.weightd/checkpoint.torrent``), or None when absent: one
    GET, its size checked from the response before the body is read (:meth:`get_small`)."""
    validate_name(name)
    validate_label(version)
    return s3.get_small(f"{name}/{version}/{rel}", limit)


def put_meta_if_absent(s3: S3Client, name: str, version: str, rel: str, data: bytes) -> bool:
    """Put a small object beside a published version unless one is there (conditional create);
    False when another writer's is. Never before the manifest: only the version's readers add it."""
    import obstore
    key = f"{name}/{version}/{rel}"
    try:
        s3.call("put", lambda: obstore.put(s3.store, key, data, mode="create" if s3.conditional
                                              else "overwrite"), key, retry=False)
    except ObjectStoreError as exc:
        if exc.kind in ("exists", "precondition"):
            return False
        raise
    s3.stats.count("put", len(data), write=True)
    return True


def names(s3: S3Client) -> list[str]:
    """Every NAME with at least one published version (``NAME`` is ``a`` or ``a/b``)."""
    import obstore
    top = s3.read("list", "/", lambda: obstore.list_with_delimiter_async(s3.store, prefix=""))
    s3.stats.count("list")
    out = []
    for a in (p.rstrip("/").rsplit("/", 1)[-1] for p in top["common_prefixes"]):
        if a.startswith("."):
            continue
        if versions(s3, a):
            out.append(a)
            continue
        sub = s3.read("list", f"{a}/", lambda a=a: obstore.list_with_delimiter_async(s3.store, prefix=f"{a}/"))
        for b in (p.rstrip("/").rsplit("/", 1)[-1] for p in sub["common_prefixes"]):
            try:
                validate_name(f"{a}/{b}")
            except BadInput:
                continue
            if versions(s3, f"{a}/{b}"):
                out.append(f"{a}/{b}")
    return sorted(out)


def versions(s3: S3Client, name: str) -> list[str]:
    """The version labels under NAME/ whose manifest exists (listing, then one HEAD each)."""
    import obstore
    validate_name(name)
    listing = s3.read("list", f"{name}/", lambda: obstore.list_with_delimiter_async(s3.store, prefix=f"{name}/"))
    s3.stats.count("list")
    out = []
    for p in listing["common_prefixes"]:
        label = p.rstrip("/").rsplit("/", 1)[-1]
        try:
            validate_version(label)
        except BadInput:
            continue
        key = f"{name}/{label}/{MANIFEST_RELPATH}"
        try:
            s3.read("head", key, lambda k=key: obstore.head_async(s3.store, k))
            s3.stats.count("head")
            out.append(label)
        except CheckpointNotFound:
            continue  # a version being uploaded (no manifest yet), or leftovers: not published
    return sorted(out)
