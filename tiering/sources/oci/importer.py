"""An OCI artifact another tool pushed (a CNCF ModelPack artifact: oras, modctl, skopeo...), pulled into
a scratch directory to be published like any directory (``weightd publish oci://REGISTRY/REPO:TAG``).

Every layer with a path (``org.cncf.model.filepath``, else ``org.opencontainers.image.title``) and a raw
(uncompressed, unarchived) media type becomes that file; each blob is checked against its sha256 as it
is written (BlobMismatch, exit 5), and only then does weightd's manifest get built from the files, by
the publish that follows. Archived layers (``.tar``, ``+gzip``, ``+zstd``: a KitOps ModelKit's, or
ModelPack's archived variants) are refused in one line, not unpacked.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from ...content.names import validate_relpath
from ...errors import BadInput, CheckpointNotFound
from .catalog import resolve_ref
from .client import DIGEST_RE, REPO_COMPONENT, STREAM_CHUNK, TAG_RE, RegistryClient
from .errors import BlobMismatch
from .layout import Layer

_ARCHIVED = re.compile(r".*(\.tar|\+gzip|\+zstd|\.tar\.gz|\.tgz)$")


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    host: str
    repo: str
    ref: str            # a tag, or sha256:<hex>

    @classmethod
    def parse(cls, text: str) -> "ArtifactRef":
        u = urlsplit(text)
        where, _, digest = u.path.lstrip("/").partition("@")
        repo, _, tag = where.rpartition(":") if ":" in where.rsplit("/", 1)[-1] else (where, "", "")
        ref = digest or tag
        if u.scheme != "oci" or not u.netloc or not repo or not ref or u.query or u.fragment or \
                not all(REPO_COMPONENT.fullmatch(p) for p in repo.split("/")) or \
                not (DIGEST_RE.fullmatch(ref) if digest else TAG_RE.fullmatch(ref)) or (digest and tag):
            raise BadInput(f"{text!r}: expected oci://REGISTRY/REPO:TAG or oci://REGISTRY/REPO@sha256:<64 hex>")
        return cls(u.netloc.lower(), repo, ref)

    def default_name(self) -> str:
        """REPO's last two components (``org/model``), or its only one."""
        return "/".join(self.repo.split("/")[-2:])

    def default_version(self) -> str:
        return self.ref if not self.ref.startswith("sha256:") else f"sha256-{self.ref[7:19]}"


@dataclass(frozen=True, slots=True)
class Pulled:
    dir: Path
    files: list[str]
    bytes: int
    digest: str          # the artifact's manifest digest


def file_layers(layers: list[Layer], where: str) -> list[Layer]:
    """The layers that are files: raw, with a path (weightd's own ``.weightd/`` files left out)."""
    out = []
    for layer in layers:
        if not layer.path or layer.path.startswith(".weightd/"):
            continue
        if _ARCHIVED.fullmatch(layer.media_type):
            raise BadInput(f"{where}: layer {layer.path} is archived ({layer.media_type}): only raw layers are "
                           f"imported (a ModelPack artifact with *.raw layers)")
        validate_relpath(layer.path)
        out.append(layer)
    if not out:
        raise BadInput(f"{where}: no file layers (no layer has an org.cncf.model.filepath or title annotation)")
    return out


@contextmanager
def pull_artifact(text: str, *, insecure: bool = False, ca_file: Path | None = None, concurrency: int = 4,
           env: dict[str, str] | None = None, scratch_parent: Path | None = None) -> Iterator[Pulled]:
    """The artifact ``text`` (oci://REGISTRY/REPO:TAG|@sha256:...) pulled into a scratch directory (0755,
    files 0644: a daemon of another user publishes from it), every blob checked; removed afterwards."""
    ref = ArtifactRef.parse(text)
    c = RegistryClient(f"oci://{ref.host}", concurrency=concurrency, insecure=insecure, ca_file=ca_file, env=env)
    scratch = Path(tempfile.mkdtemp(prefix="weightd-oci-import-", dir=scratch_parent))
    try:
        os.chmod(scratch, 0o755)
        art = resolve_ref(c, ref.repo, ref.ref)
        if art is None:
            raise CheckpointNotFound(text, "no such artifact in the registry")
        layers = file_layers(art.layers, text)
        with ThreadPoolExecutor(max_workers=c.concurrency, thread_name_prefix="weightd-oci-import") as pool:
            for fut in [pool.submit(_pull_blob, c, ref.repo, layer, scratch) for layer in layers]:
                fut.result()
        yield Pulled(scratch, [x.path for x in layers], sum(x.size for x in layers), art.digest)
    finally:
        c.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _pull_blob(c: RegistryClient, repo: str, layer: Layer, scratch: Path) -> None:
    dest = scratch / layer.path
    for parent in reversed(dest.relative_to(scratch).parents[:-1]):
        (scratch / parent).mkdir(mode=0o755, exist_ok=True)
    where = f"oci://{c.location.host}/{repo}@{layer.digest} ({layer.path})"
    resp = c.request("GET", f"/v2/{repo}/blobs/{layer.digest}", what=f"{repo}@{layer.digest}", stream=True)
    sha = hashlib.sha256()
    n = 0
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            while True:
                chunk = resp.read(STREAM_CHUNK)
                if not chunk:
                    break
                n += len(chunk)
                if n > layer.size:
                    raise BlobMismatch(f"{where}: more than the layer's {layer.size} bytes")
                sha.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        c.abandon(resp)
        raise
    c.done(resp)
    c.stats.count("get", n)
    if n != layer.size or "sha256:" + sha.hexdigest() != layer.digest:
        raise BlobMismatch(f"{where}: the registry's bytes are not the blob's digest (sha256 of {n} bytes: "
                           f"{sha.hexdigest()}): refused, nothing published")
