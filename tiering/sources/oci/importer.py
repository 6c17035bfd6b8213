"""An OCI artifact another tool pushed (a CNCF ModelPack artifact: modctl, oras, skopeo...; a KitOps
ModelKit), pulled into a scratch directory to be published like any directory (``weightd publish
oci://REGISTRY/REPO:TAG``).

Layers by media type (anything else is refused in one line, exit 2, before a byte is pulled):

- raw, one file each, its path in ``org.cncf.model.filepath`` (else ``org.opencontainers.image.title``):
  ModelPack's ``application/vnd.cncf.model.{weight,weight.config,doc,code,dataset}.v1.raw``;
- tar archives, ``.tar`` or ``.tar+gzip``, whose entries are the files at their paths: ModelPack's
  ``application/vnd.cncf.model.{...}.v1.tar[+gzip]`` and KitOps's
  ``application/vnd.kitops.modelkit.{model,modelpart,dataset,code,docs,prompts}.v1.tar[+gzip]``
  (``+zstd`` is refused: no zstd module is a dependency);
- weightd's own ``.weightd/`` layers (an artifact weightd published) are left out.

Each blob streams through its sha256 (and a count that may not pass the descriptor's size) as it is
written or unpacked; a blob that is not its digest is refused when it ends (BlobMismatch, exit 5) and
the scratch directory is removed, so nothing unpacked from it is ever published. A tar entry is
refused (UnsafePath, exit 2) when its path is absolute, holds ``..`` or lands under ``.weightd/``,
when it is a device, a fifo or a sparse file, when a path comes twice (across layers too), or when
it is a link that leaves the tree (a hard link must name a file its archive unpacked before it; symlinks are
made after every layer, so nothing is written through one, and each must resolve inside the tree).
A name component over 255 bytes, a path or link target over 4095, a pax or GNU long-name header over
1 MiB (refused before tarfile reads it into memory) and any ``GNU.sparse.*`` pax key are refused in
one line (exit 2), as is anything tarfile cannot read.
What is unpacked is bounded by the scratch file system's free space (NoSpace, exit 6): a gzip
bomb fills at most that, and is removed; it is inflated in bounded pieces (``gzip.GzipFile``), so
memory stays flat whatever the ratio. (The tar layers are unpacked by tiering/sources/oci/unpack.py.)
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from ...content.names import validate_relpath
from ...errors import BadInput, CheckpointNotFound, NoSpace, TieringError, UnsafePath
from .catalog import resolve_ref
from .client import STREAM_CHUNK, RegistryClient
from .errors import BlobMismatch
from .layout import DIGEST_RE, REPO_COMPONENT, TAG_RE, Layer
from .unpack import OWN_PREFIX, Staging, copy_to, make_links, untar

log = logging.getLogger(__name__)
SCRATCH_PREFIX = "weightd-oci-import-"
LOCK_SUFFIX = ".lock"
SWEEP_AFTER_S = 60.0   # a scratch directory younger than this is never swept (made, not yet locked)
_MODELPACK = r"application/vnd\.cncf\.model\.(?:weight|weight\.config|doc|code|dataset)\.v1"
_KITOPS = r"application/vnd\.kitops\.modelkit\.(?:model|modelpart|dataset|code|docs|prompts)\.v1"
RAW_TYPE = re.compile(_MODELPACK + r"\.raw")
TAR_TYPE = re.compile(rf"(?:{_MODELPACK}|{_KITOPS})\.tar(\+gzip|\+zstd)?")


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


@dataclass(frozen=True, slots=True)
class Part:
    """A layer to import: ``kind`` is ``raw`` (the file at ``layer.path``), ``tar`` or ``tar+gzip``."""
    layer: Layer
    kind: str


def import_layers(layers: list[Layer], where: str) -> list[Part]:
    """The layers to import, each with how (BadInput naming the first layer that cannot be: an unknown
    or zstd media type, a raw layer without a path); weightd's own ``.weightd/`` layers left out."""
    out = []
    for i, layer in enumerate(layers):
        if layer.path.startswith(OWN_PREFIX) and layer.media_type.startswith("application/vnd.weightd."):
            continue
        what = f"layer {i}" + (f" ({layer.path})" if layer.path else "")
        if RAW_TYPE.fullmatch(layer.media_type):
            if not layer.path:
                raise BadInput(f"{where}: {what} is a raw {layer.media_type} layer without a path "
                               f"(org.cncf.model.filepath)")
            validate_relpath(layer.path)
            if layer.path.startswith(OWN_PREFIX):
                raise UnsafePath(f"{where}: {what}", "a path under .weightd/ (weightd's own files)")
            out.append(Part(layer, "raw"))
            continue
        m = TAR_TYPE.fullmatch(layer.media_type)
        if m is not None and m.group(1) == "+zstd":
            raise BadInput(f"{where}: {what} is zstd-compressed ({layer.media_type}): not supported (no zstd "
                           f"module); .tar, .tar+gzip and .raw layers are")
        if m is None:
            raise BadInput(f"{where}: {what} has the unknown media type {layer.media_type or '(none)'!r}: "
                           f"imported are ModelPack *.raw, *.tar, *.tar+gzip and KitOps modelkit *.tar[+gzip] layers")
        out.append(Part(layer, "tar" + (m.group(1) or "")))
    if not out:
        raise BadInput(f"{where}: no layers to import (no ModelPack or KitOps file layers)")
    return out


@contextmanager
def pull_artifact(text: str, *, insecure: bool = False, ca_file: Path | None = None, concurrency: int = 4,
                  env: dict[str, str] | None = None, scratch_parent: Path | None = None) -> Iterator[Pulled]:
    """The artifact ``text`` (oci://REGISTRY/REPO:TAG|@sha256:...) pulled into a scratch directory (0755,
    files 0644: a daemon of another user publishes from it), every blob checked; removed afterwards."""
    ref = ArtifactRef.parse(text)
    parent = Path(scratch_parent or tempfile.gettempdir())
    sweep_dead_scratch(parent)
    c = RegistryClient(f"oci://{ref.host}", concurrency=concurrency, insecure=insecure, ca_file=ca_file, env=env)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
    held = -1
    try:
        # (while its lock file is locked, no sweep takes it: :func:`sweep_dead_scratch`; 0600, so no other
        # user can hold it for us)
        held = os.open(f"{scratch}{LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600)
        fcntl.flock(held, fcntl.LOCK_EX)
        os.chmod(scratch, 0o755)
        art = resolve_ref(c, ref.repo, ref.ref)
        if art is None:
            raise CheckpointNotFound(text, "no such artifact in the registry")
        parts = import_layers(art.layers, text)
        st = os.statvfs(scratch)
        staging = Staging(scratch, st.f_bavail * st.f_frsize)
        declared = sum(p.layer.size for p in parts)
        if declared > staging.budget:
            raise NoSpace(f"import staging {scratch.parent}", declared, staging.budget,
                          f"{text}'s layers do not fit there: refused before a byte was pulled")
        _pull_parts(c, ref.repo, parts, staging)
        make_links(staging, text)
        files = sorted(staging.files) + sorted(staging.links)
        yield Pulled(scratch, files, sum(staging.files.values()), art.digest)
    finally:
        c.close()
        shutil.rmtree(scratch, ignore_errors=True)
        if held >= 0:
            _unlink(f"{scratch}{LOCK_SUFFIX}")
            os.close(held)


def sweep_dead_scratch(parent: Path, *, now: float | None = None) -> int:
    """Remove the scratch directories of imports that died before removing them (SIGKILL, the OOM
    killer, a reboot: up to a checkpoint's size each): this user's own ``weightd-oci-import-*``
    directories in ``parent`` whose lock file (``<dir>.lock``, 0600) no import holds, and that were
    made over SWEEP_AFTER_S ago (an import takes its lock just after making its directory). Another
    user's directory, a symbolic link and anything else there are left alone; a lock file whose
    directory is gone goes too. Returns how many directories were removed."""
    now = time.time() if now is None else now
    removed = 0
    try:
        names = {e.name for e in os.scandir(parent) if e.name.startswith(SCRATCH_PREFIX)}
    except OSError:
        return 0
    for name in sorted(names):
        if name.endswith(LOCK_SUFFIX):
            if name[:-len(LOCK_SUFFIX)] not in names:
                _sweep_one(parent, None, name, now)
            continue
        removed += _sweep_one(parent, name, name + LOCK_SUFFIX if name + LOCK_SUFFIX in names else None, now)
    return removed


def _sweep_one(parent: Path, name: str | None, lock: str | None, now: float) -> int:
    """One dead import's scratch directory ``name`` and its ``lock`` file (either may be None)."""
    fd = -1
    try:
        if lock is not None:
            fd = os.open(parent / lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return 0
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # (OSError: an import running now)
        if name is not None:
            st = os.lstat(parent / name)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or now - st.st_mtime < SWEEP_AFTER_S:
                return 0
            shutil.rmtree(parent / name, ignore_errors=True)
            log.info("removed %s: the scratch directory of an OCI import that did not finish", parent / name)
        if lock is not None:
            _unlink(str(parent / lock))
        return int(name is not None)
    except OSError:
        return 0
    finally:
        if fd >= 0:
            os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _pull_parts(c: RegistryClient, repo: str, parts: list[Part], staging: Staging) -> None:
    """Every part, ``c.concurrency`` at a time. The first to fail stops the others at their next read
    (and those not started), and its error is raised once they have (nothing is left writing)."""
    stop = threading.Event()
    with ThreadPoolExecutor(max_workers=c.concurrency, thread_name_prefix="weightd-oci-import") as pool:
        futures = [pool.submit(_pull_part, c, repo, p, staging, stop) for p in parts]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:
            stop.set()
            for fut in futures:
                fut.cancel()
            raise
        failed = [fut for fut in futures if fut in done and fut.exception() is not None]
        if failed:
            stop.set()
            for fut in futures:
                fut.cancel()
    if failed:
        raise failed[0].exception()   # type: ignore[misc]


class _Stopped(TieringError):
    """A part stopped because another failed (never the error reported)."""


class _Checked:
    """A blob's response read through its sha256 and a count that may not pass the descriptor's size."""

    def __init__(self, c: RegistryClient, resp: Any, layer: Layer, where: str,
                 stop: threading.Event | None = None) -> None:
        self.c, self.resp, self.layer, self.where, self.stop = c, resp, layer, where, stop
        self.sha = hashlib.sha256()
        self.n = 0

    def read(self, n: int = -1) -> bytes:
        if self.stop is not None and self.stop.is_set():
            raise _Stopped(f"{self.where}: stopped (another layer failed)")
        chunk = self.resp.read(STREAM_CHUNK if n is None or n < 0 else min(n, STREAM_CHUNK))
        self.n += len(chunk)
        if self.n > self.layer.size:
            raise BlobMismatch(f"{self.where}: more than the layer's {self.layer.size} bytes: refused, nothing "
                               f"published")
        self.sha.update(chunk)
        return chunk

    def drain(self) -> None:
        while self.read(STREAM_CHUNK):
            pass

    def check(self) -> None:
        """BlobMismatch unless the bytes read are the blob's size and digest (call after the end)."""
        if self.n != self.layer.size or "sha256:" + self.sha.hexdigest() != self.layer.digest:
            raise BlobMismatch(f"{self.where}: the registry's bytes are not the blob's digest (sha256 of {self.n} "
                               f"bytes: {self.sha.hexdigest()}): refused, nothing published")


def _pull_part(c: RegistryClient, repo: str, part: Part, staging: Staging, stop: threading.Event) -> None:
    layer = part.layer
    where = f"oci://{c.location.host}/{repo}@{layer.digest}" + (f" ({layer.path})" if layer.path else "")
    resp = c.request("GET", f"/v2/{repo}/blobs/{layer.digest}", what=f"{repo}@{layer.digest}", stream=True)
    blob = _Checked(c, resp, layer, where, stop)
    try:
        if part.kind == "raw":
            staging.claim(layer.path, layer.size, where)
            fd = staging.open_new(layer.path)
            try:
                copy_to(fd, blob.read)
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            untar(blob, part.kind == "tar+gzip", staging, where)
        blob.drain()
    except BaseException:
        c.abandon(resp)
        raise
    c.done(resp)
    c.stats.count("get", blob.n)
    blob.check()


