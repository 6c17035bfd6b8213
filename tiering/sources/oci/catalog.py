"""What an OCI cold tier holds: the published names (the registry's catalog, under the prefix) and
versions (a repository's tags that are weightd artifacts), a version's artifact and weightd manifest
(every blob checked against its sha256 digest), and the small blobs beside a version (its signature
in the artifact; its torrent, added after publishing, as an artifact of its own under the tag
``sha256-<hex of the version's OCI manifest>.torrent``, as the OCI referrers tag schema names them).

A version exists when its tag exists: the OCI manifest is pushed last. Names come from the catalog
API (``/v2/_catalog``) rather than an index artifact of weightd's own: the catalog is derived from
what exists, where an index is a read-modify-write two publishers race on (a registry has no
conditional manifest PUT). A registry that does not serve the catalog (some hosted ones) is one
line saying so, never an empty catalog; ``preload NAME@VERSION`` never needs it.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from ...content.manifest import Manifest
from ...content.manifest_parse import parse_manifest
from ...content.names import validate_label, validate_name, validate_version
from ...errors import BadInput, CheckpointNotFound, VersionConflict
from ...layout import VersionDir
from . import layout
from .client import ACCEPT, OCI_MANIFEST_LIMIT, RegistryClient
from .errors import BlobMismatch, RegistryError, RegistrySetupError

if TYPE_CHECKING:
    from .layout import Artifact

LIST_LIMIT = 16 << 20


class Pins:
    """The OCI manifest digest each NAME@VERSION had when this process first read it: a tag moved
    to other content afterwards is refused (versions are immutable), never followed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], tuple[str, str]] = {}   # -> (OCI digest, weightd digest)

    def check(self, name: str, version: str, art: "Artifact", m: Manifest, where: str) -> None:
        with self._lock:
            had = self._seen.setdefault((name, version), (art.digest, m.digest))
        if had[1] != m.digest:
            raise VersionConflict(f"{name}@{version}", had[1], f"{m.digest}: the tag {where} was moved to "
                                  f"other content ({art.digest}), refused")


def get_blob(c: RegistryClient, repo: str, digest: str, limit: int, what: str,
             deadline: float | None = None) -> bytes:
    """A small blob read whole and checked against its digest (BlobMismatch, exit 5)."""
    r = c.request("GET", f"/v2/{repo}/blobs/{digest}", what=what, deadline=deadline, limit=limit)
    c.stats.count("get", len(r.body))
    if "sha256:" + hashlib.sha256(r.body).hexdigest() != digest:
        raise BlobMismatch(f"{c.url}/{repo}@{digest}: {what}: the registry's bytes are not that digest (sha256 "
                           f"{hashlib.sha256(r.body).hexdigest()}): the blob is damaged in the registry's storage")
    return r.body


def resolve(c: RegistryClient, name: str, version: str, *, deadline: float | None = None) -> "Artifact | None":
    """NAME@VERSION's OCI manifest (by its tag), checked against the digest the registry names, or None
    when the tag does not exist."""
    repo, tag = c.location.repo(name), c.location.tag(version)
    return resolve_ref(c, repo, tag, deadline=deadline)


def resolve_ref(c: RegistryClient, repo: str, ref: str, *, deadline: float | None = None) -> "Artifact | None":
    where = f"{c.url.split('://', 1)[0]}://{c.location.host}/{repo}:{ref}"
    try:
        r = c.request("GET", f"/v2/{repo}/manifests/{ref}", what=f"{repo}:{ref}", headers={"Accept": ACCEPT},
                      deadline=deadline, limit=OCI_MANIFEST_LIMIT)
    except CheckpointNotFound:
        return None
    c.stats.count("get", len(r.body))
    got = layout.sha256_digest(r.body)
    named = r.headers.get("Docker-Content-Digest")
    if named and named != got or ref.startswith("sha256:") and ref != got:
        raise BlobMismatch(f"{where}: the OCI manifest's bytes are {got}, the registry names {named or ref}")
    return layout.parse(r.body, where, got)


def read_manifest(c: RegistryClient, name: str, version: str, *, deadline: float | None = None,
                  pins: Pins | None = None) -> tuple[Manifest, "Artifact"] | None:
    """NAME@VERSION's weightd manifest and artifact, or None when it is not published (no tag). An
    artifact without weightd's manifest layer (pushed by another tool) is BadInput, naming the import."""
    validate_name(name)
    validate_label(version)
    art = resolve(c, name, version, deadline=deadline)
    if art is None:
        return None
    where = f"oci://{c.location.host}/{c.location.repo(name)}:{c.location.tag(version)}"
    layer = art.weightd_manifest
    if layer is None:
        raise BadInput(f"{where}: an OCI artifact without weightd's manifest (made by another tool?): not a "
                       f"version weightd published")
    if layer.size > c.max_manifest_bytes:
        raise BadInput(f"{where}: weightd manifest of {layer.size} bytes, more than the {c.max_manifest_bytes} "
                       f"allowed; not read")
    raw = get_blob(c, c.location.repo(name), layer.digest, c.max_manifest_bytes, "weightd manifest",
                   deadline=deadline)
    m = parse_manifest(raw, where)
    if m.name != name or m.version != version:
        raise BadInput(f"{where}: it describes {m.name}@{m.version}, not {name}@{version} (a tag moved or copied "
                       f"onto another version's artifact)")
    layout.check_agrees(art, m, where)
    if pins is not None:
        pins.check(name, version, art, m, where)
    return m, art


def as_version_dir(c: RegistryClient, m: Manifest) -> VersionDir:
    """``m``'s version as the tier code sees a published one: its ``path`` names the repository and
    tag and is never opened; its ``store`` is the registry."""
    return VersionDir(m.name, m.version, Path("/nonexistent-oci-registry") / c.location.host / c.location.prefix
                      / m.name / m.version, m, store=c)


def _paged(c: RegistryClient, path: str, key: str, what: str, *, missing_ok: bool) -> list[str] | None:
    """Every entry of a paged list (``_catalog``'s repositories, a repository's tags), following
    ``Link: <...>; rel="next"``; None when it is absent (404) and ``missing_ok``."""
    out: list[str] = []
    url: str | None = path
    pages = 0
    while url is not None:
        pages += 1
        if pages > 1000:
            raise RegistryError(f"{c.url}: {what}: more than 1000 pages")
        try:
            doc, r = c.get_json(url, what, LIST_LIMIT)
        except CheckpointNotFound:
            if missing_ok:
                return None
            raise
        items = doc.get(key) if isinstance(doc, dict) else None
        if items is None:
            items = []
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise RegistryError(f"{c.url}: {what}: '{key}' is not a list of strings")
        out += items
        url = _next_link(r.headers.get("Link"), url)
    return out


def _next_link(link: str | None, current: str) -> str | None:
    if not link or 'rel="next"' not in link:
        return None
    target = link.split(";", 1)[0].strip().strip("<>")
    if "://" in target:
        target = urlsplit(target)._replace(scheme="", netloc="").geturl()
    return urljoin(current, target)


def names(c: RegistryClient) -> list[str]:
    """Every NAME with at least one published version: the catalog's repositories under the prefix
    (``PREFIX/a`` or ``PREFIX/a/b``) that have one."""
    c.ping()
    try:
        repos = _paged(c, "/v2/_catalog?n=1000", "repositories", "the registry's catalog (/v2/_catalog)",
                       missing_ok=False)
    except CheckpointNotFound:
        raise RegistrySetupError(f"{c.url}: the registry does not list its repositories (no /v2/_catalog): listing "
                                 f"names needs it; preload NAME@VERSION does not") from None
    out = []
    for repo in repos or []:
        name = c.location.name_of(repo)
        if name is None:
            continue
        try:
            c.location.repo(name)
        except BadInput:
            continue
        if versions(c, name):
            out.append(name)
    return sorted(out)


def versions(c: RegistryClient, name: str) -> list[str]:
    """The versions of NAME: its repository's tags that stand for version labels (decoded: see
    :mod:`.layout`; a companion's label is not a version) and are weightd artifacts (their OCI
    manifest carries weightd's manifest layer); a tag another tool pushed is not one."""
    repo = c.location.repo(name)
    tags = _paged(c, f"/v2/{repo}/tags/list?n=1000", "tags", f"{repo} tags", missing_ok=True)
    out = []
    for tag in tags or []:
        if layout.SIDE_TAG_RE.fullmatch(tag):
            continue
        label = layout.label_of(tag)
        if label is None and not tag.startswith(layout.TAG_HASHED):
            continue
        if label is not None and not _is_version(label, tag):
            continue
        try:
            art = resolve_ref(c, repo, tag)
        except BadInput:
            continue   # (not an OCI image manifest: an index, another tool's)
        if art is None or art.weightd_manifest is None:
            continue
        if label is None:   # (a hashed tag: the label is the artifact's annotation)
            label = art.annotations.get(layout.VERSION_ANNOTATION, "")
            if not _is_version(label, tag):
                continue
        out.append(label)
    return sorted(out)


def _is_version(label: str, tag: str) -> bool:
    """``label`` is a whole version's (not a companion's) and ``tag`` is its tag."""
    try:
        validate_version(label)
    except BadInput:
        return False
    return layout.tag_of(label) == tag


def torrent_tag(art: "Artifact") -> str:
    return f"{art.digest.replace(':', '-')}.torrent"


def read_meta(c: RegistryClient, name: str, version: str, rel: str, limit: int, art: "Artifact") -> bytes | None:
    """A small file beside a version: a layer of its artifact (its signature), else for its torrent the
    torrent artifact pushed for it afterwards; None when there is neither."""
    repo = c.location.repo(name)
    layer = art.by_path.get(rel)
    if layer is None and rel == layout.TORRENT_RELPATH:
        side = resolve_ref(c, repo, torrent_tag(art))
        layer = side.by_path.get(rel) if side is not None else None
    if layer is None:
        return None
    if layer.size > limit:
        raise BadInput(f"oci://{c.location.host}/{repo}:{c.location.tag(version)}: {rel} of {layer.size} bytes, more than the "
                       f"{limit} allowed; not read")
    return get_blob(c, repo, layer.digest, limit, rel)
