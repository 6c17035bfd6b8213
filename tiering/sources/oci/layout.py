"""A published version as a CNCF ModelPack artifact: an OCI image manifest with ``artifactType``
``application/vnd.cncf.model.manifest.v1+json``, a ModelPack config blob, and one layer per file with
its path in the annotation ``org.cncf.model.filepath`` (weights ``...weight.v1.raw``, configs and
tokenizers ``...weight.config.v1.raw``, docs, code), uncompressed so a byte range of a layer is a
byte range of the file. weightd's own files (``.weightd/manifest.json``, the signature bundle, the
torrent) are layers of their own media types, with their paths annotated the same way, so a ModelPack
tool that extracts the artifact lays out the path tier's layout."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ...content.manifest import MANIFEST_RELPATH, Manifest
from ...content.names import validate_relpath
from ...content.signature import SIGNATURE_RELPATH
from ...errors import BadInput
from .client import DIGEST_RE, OCI_MANIFEST

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
WEIGHTD_MANIFEST = "application/vnd.weightd.manifest.v1+json"
WEIGHTD_SIGNATURE = "application/vnd.weightd.signature.v1+json"
WEIGHTD_TORRENT = "application/x-bittorrent"
TORRENT_ARTIFACT = "application/vnd.weightd.torrent.v1"
FILEPATH = "org.cncf.model.filepath"
DIGEST_ANNOTATION = "io.weightd.manifest.digest"   # weightd's manifest digest, on the OCI manifest
TORRENT_RELPATH = ".weightd/checkpoint.torrent"     # (p2p.torrent's; tiering does not import p2p)
EMPTY_JSON = b"{}"

_WEIGHT_EXT = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".ggml", ".onnx", ".h5", ".msgpack",
               ".npz", ".npy", ".pb", ".tflite", ".mlmodel", ".engine", ".plan")
_DOC_EXT = (".md", ".rst", ".txt", ".pdf", ".html")
_CODE_EXT = (".py", ".sh", ".ipynb", ".c", ".cc", ".cpp", ".cu", ".h", ".js", ".go", ".rs")
_OWN = {MANIFEST_RELPATH: WEIGHTD_MANIFEST, SIGNATURE_RELPATH: WEIGHTD_SIGNATURE, TORRENT_RELPATH: WEIGHTD_TORRENT}


def media_type_for(path: str) -> str:
    """A file's layer media type, from its path."""
    if path in _OWN:
        return _OWN[path]
    low = path.lower()
    base = low.rsplit("/", 1)[-1]
    if low.endswith(_WEIGHT_EXT):
        return WEIGHT
    if base.startswith(("readme", "license", "licence", "notice")) or low.endswith(_DOC_EXT):
        return DOC
    if low.endswith(_CODE_EXT):
        return CODE
    return WEIGHT_CONFIG


@dataclass(frozen=True, slots=True)
class Layer:
    media_type: str
    digest: str
    size: int
    path: str

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                "annotations": {FILEPATH: self.path}}


@dataclass(slots=True)
class Artifact:
    """An OCI manifest as weightd reads it: its digest, its config and its layers by path."""
    digest: str
    raw: bytes
    artifact_type: str | None
    config: Layer
    layers: list[Layer]
    annotations: dict[str, str] = field(default_factory=dict)
    by_path: dict[str, Layer] = field(default_factory=dict)

    @property
    def weightd_manifest(self) -> Layer | None:
        layer = self.by_path.get(MANIFEST_RELPATH)
        return layer if layer is not None and layer.media_type == WEIGHTD_MANIFEST else None


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_blob(m: Manifest, layers: list[Layer]) -> bytes:
    """The ModelPack config: the model's name, version and creation time, and its layers' diffIds
    (the layers are uncompressed: a diffId is the layer's digest)."""
    doc = {"descriptor": {"name": m.name, "version": m.version, "createdAt": m.published_at},
           "config": {}, "modelfs": {"type": "layers", "diffIds": [x.digest for x in layers]}}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def manifest_bytes(config: Layer, layers: list[Layer], annotations: dict[str, str],
                   artifact_type: str = ARTIFACT_TYPE, subject: dict[str, Any] | None = None) -> bytes:
    doc: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                           "config": {"mediaType": config.media_type, "digest": config.digest, "size": config.size},
                           "layers": [x.descriptor() for x in layers], "annotations": annotations}
    if subject is not None:
        doc["subject"] = subject
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def parse(raw: bytes, where: str, digest: str | None = None) -> Artifact:
    """An OCI image manifest (BadInput naming what is wrong): descriptors with sha256 digests and
    sizes, each layer's path a safe relative path, no path twice."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise BadInput(f"{where}: the OCI manifest is not JSON") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: the OCI manifest is not an object")
    mt = doc.get("mediaType")
    if mt is not None and mt != OCI_MANIFEST:
        raise BadInput(f"{where}: {mt} is not an OCI image manifest (an index? name a single platform's manifest)")
    layers_doc = doc.get("layers")
    if not isinstance(layers_doc, list):
        raise BadInput(f"{where}: the OCI manifest has no layers list")
    config = _descriptor(doc.get("config"), where, "config")
    layers: list[Layer] = []
    by_path: dict[str, Layer] = {}
    for i, d in enumerate(layers_doc):
        layer = _descriptor(d, where, f"layer {i}")
        if layer.path:
            try:
                validate_relpath(layer.path)
            except BadInput as exc:
                raise BadInput(f"{where}: layer {i}'s {FILEPATH}: {exc}") from None
            if layer.path in by_path:
                raise BadInput(f"{where}: two layers for {layer.path}")
            by_path[layer.path] = layer
        layers.append(layer)
    ann = doc.get("annotations") if isinstance(doc.get("annotations"), dict) else {}
    at = doc.get("artifactType")
    return Artifact(digest or sha256_digest(raw), raw, at if isinstance(at, str) else None, config, layers,
                    {str(k): str(v) for k, v in ann.items()}, by_path)


def _descriptor(d: Any, where: str, what: str) -> Layer:
    if not isinstance(d, dict):
        raise BadInput(f"{where}: {what} is not a descriptor")
    digest, size, mt = d.get("digest"), d.get("size"), d.get("mediaType")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise BadInput(f"{where}: {what}: digest {str(digest)[:80]!r} is not sha256:<64 hex>")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise BadInput(f"{where}: {what}: size {size!r} is not a byte count")
    ann = d.get("annotations") if isinstance(d.get("annotations"), dict) else {}
    path = ann.get(FILEPATH) or ann.get("org.opencontainers.image.title") or ""
    return Layer(mt if isinstance(mt, str) else "", digest, size, path if isinstance(path, str) else "")


def check_agrees(art: Artifact, m: Manifest, where: str) -> None:
    """Every file of weightd's manifest is a layer of the artifact of the same size (BadInput)."""
    for f in m.files:
        layer = art.by_path.get(f.path)
        if layer is None:
            raise BadInput(f"{where}: no layer for {f.path}, which its weightd manifest lists")
        if layer.size != f.size:
            raise BadInput(f"{where}: the layer for {f.path} is {layer.size} bytes, its weightd manifest says "
                           f"{f.size}")
