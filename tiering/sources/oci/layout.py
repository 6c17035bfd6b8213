"""A published version as a CNCF ModelPack artifact: an OCI image manifest with ``artifactType``
``application/vnd.cncf.model.manifest.v1+json``, a ModelPack config blob, and one layer per file with
its path in the annotation ``org.cncf.model.filepath`` (weights ``...weight.v1.raw``, configs and
tokenizers ``...weight.config.v1.raw``, docs, code), uncompressed so a byte range of a layer is a
byte range of the file. weightd's own files (``.weightd/manifest.json``, the signature bundle, the
torrent) are layers of their own media types, with their paths annotated the same way, so a ModelPack
tool that extracts the artifact lays out the path tier's layout.

NAME@VERSION is the repository ``PREFIX/NAME`` and its tag VERSION when both are what a registry
takes; otherwise each is escaped, so the mapping is injective and reversible for every valid weightd
name and label (a companion's ``V~KIND~KEY`` included):

- a NAME component that is not a repository path component (``[a-z0-9]+`` separated by ``.``, ``_``,
  ``__`` or ``-+``: ``Acme``, ``x_``, ``-y``), or that starts with ``w--``, is ``w--`` followed by the
  unpadded lowercase base32 of its bytes (``Acme`` -> ``w--ifrwg3i``);
- a label that is not a tag (``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``: a ``~``, a leading ``.`` or
  ``-``, more than 128 characters), that starts with ``_``, or that looks like a referrers tag
  (``sha256-<hex>...``), is ``_`` followed by the label with ``_`` doubled and ``~`` as ``_-``
  (``v1~compile-cache~k`` -> ``_v1_-compile-cache_-k``); when that is longer than 128 characters,
  the tag is ``__.`` and the sha256 (hex) of the label, and the label is read back from the
  artifact's ``org.opencontainers.image.version`` annotation (and its weightd manifest).

No escaped form is ever a plain one (a plain NAME component never starts with ``w--``, a plain tag
never with ``_``), and ``_.`` occurs in no escaped label, so a hashed tag is never a decoded one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ...content.manifest import MANIFEST_RELPATH, Manifest
from ...content.names import validate_relpath
from ...content.signature import SIGNATURE_RELPATH
from ...errors import BadInput

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# the distribution spec's grammar: a repository path component, a tag
REPO_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# tags the OCI referrers tag schema (and so weightd's torrents) use: never a version
SIDE_TAG_RE = re.compile(r"sha256-[0-9a-f]{64}(?:\..*)?")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
NAME_ESCAPE = "w--"       # a NAME component escaped: w--<base32>
TAG_ESCAPE = "_"          # a label escaped: _<label, '_' doubled, '~' as '_-'>
TAG_HASHED = "__."        # a label too long to escape: __.<sha256 hex of the label>
VERSION_ANNOTATION = "org.opencontainers.image.version"   # the label, on every artifact weightd pushes

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


def repo_component(part: str) -> str:
    """A NAME component's repository path component (itself, or escaped)."""
    if REPO_COMPONENT.fullmatch(part) and not part.startswith(NAME_ESCAPE):
        return part
    return NAME_ESCAPE + base64.b32encode(part.encode()).decode().rstrip("=").lower()


def name_component(comp: str) -> str | None:
    """The NAME component a repository path component stands for, or None (not one weightd makes)."""
    if not comp.startswith(NAME_ESCAPE):
        return comp if REPO_COMPONENT.fullmatch(comp) else None
    body = comp[len(NAME_ESCAPE):]
    try:
        part = base64.b32decode(body + "=" * (-len(body) % 8), casefold=True).decode()
    except (binascii.Error, ValueError):
        return None
    return part if repo_component(part) == comp else None


def tag_of(label: str) -> str:
    """A (valid) label's tag: itself, escaped, or hashed (see the module's docstring)."""
    if TAG_RE.fullmatch(label) and not label.startswith(TAG_ESCAPE) and not SIDE_TAG_RE.fullmatch(label):
        return label
    tag = TAG_ESCAPE + label.replace("_", "__").replace("~", "_-")
    return tag if len(tag) <= 128 else TAG_HASHED + hashlib.sha256(label.encode()).hexdigest()


def label_of(tag: str) -> str | None:
    """The label a tag stands for; None for a hashed tag (its label is in the artifact) and for a tag
    weightd never makes. The caller validates the label."""
    if not tag.startswith(TAG_ESCAPE):
        return tag
    out = []
    i = len(TAG_ESCAPE)
    while i < len(tag):
        ch = tag[i]
        if ch == "_":
            nxt = tag[i + 1:i + 2]
            if nxt not in ("_", "-"):
                return None
            out.append("_" if nxt == "_" else "~")
            i += 2
        else:
            out.append(ch)
            i += 1
    label = "".join(out)
    return label if tag_of(label) == tag else None


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
