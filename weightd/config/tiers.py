"""``[tiers.hot]``, ``[tiers.warm]`` and ``[tiers.cold]``: each local tier's root and budget
(``TierSettings``, ``Capacity``), cold storage as a path, object storage or a registry (``ColdSettings``); and
``[warm]``, page-cache warming of the tiers' files (``WarmSettings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiering import parse_fraction, parse_size

from .model import Field, field_validator, model_validator
from .values import FrozenModel, abs_path, group_id


class Capacity(FrozenModel):
    """A tier budget: absolute bytes, or a fraction of the tier's filesystem."""
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, fs_total_bytes: int) -> int:
        if self.bytes is not None:
            return self.bytes
        return int(fs_total_bytes * (self.fraction or 0.0))

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction is not None else str(self.bytes)


class TierSettings(FrozenModel):
    """A local tier: ``[tiers.hot]`` (tmpfs) or ``[tiers.warm]`` (local NVMe)."""
    path: Path = Field(doc="the tier's root directory (absolute); weightd refuses a root that is a symlink, owned "
                           "by another user, or writable by group or others")
    capacity: Capacity = Field(Capacity(fraction=0.5), unit="bytes or %",
                               doc="the tier's budget: bytes (\"64GiB\") or a share of its file system (\"40%\"); "
                                   "a tmpfs tier's pages count against the node's memory")
    high_watermark: float = Field(0.95, unit="fraction", doc="evict above this share of capacity (\"95%\" or 0.95)")
    low_watermark: float = Field(0.85, unit="fraction", doc="... down to this share (at most high_watermark)")
    group: int | None = Field(None, unit="gid",
                              doc="a group name or gid: a root weightd makes is 0750 with this group, so a serving "
                                  "engine in it can read the copies; unset: 0700, weightd's user only")

    _path = field_validator("path", mode="before")(abs_path)
    _group = field_validator("group", mode="before")(group_id)

    @field_validator("capacity", mode="before")
    @classmethod
    def _capacity(cls, v: Any) -> Any:
        if isinstance(v, Capacity):
            return v
        if isinstance(v, str) and v.strip().endswith("%"):
            frac = parse_fraction(v)
            if frac == 0:
                raise ValueError("must be more than 0%")
            return Capacity(fraction=frac)
        return Capacity(bytes=parse_size(v))

    @field_validator("high_watermark", "low_watermark", mode="before")
    @classmethod
    def _fraction(cls, v: Any) -> float:
        return parse_fraction(v)

    @model_validator(mode="after")
    def _order(self) -> "TierSettings":
        if self.low_watermark > self.high_watermark:
            raise ValueError("low_watermark must not exceed high_watermark")
        return self


class ColdSettings(FrozenModel):
    """Shared storage (``path``), object storage (``url = "s3://BUCKET/PREFIX"``) or an OCI registry
    (``url = "oci://REGISTRY/PREFIX"``), not both."""
    path: Path | None = Field(None, doc="shared storage (NFS, CephFS, Lustre) where weightd publish puts checkpoints "
                                        "and preloads copy from (absolute); give path or url, not both")
    url: str | None = Field(None, doc="object storage instead of path: s3://BUCKET/PREFIX (credentials from where AWS "
                                      "tools look), or an OCI registry: oci://REGISTRY/PREFIX (NAME@VERSION is the "
                                      "ModelPack artifact PREFIX/NAME:VERSION; credentials from docker/podman's auth "
                                      "files); never credentials in this file")
    endpoint: str | None = Field(None, doc="with an s3:// url: an S3-compatible store's address (MinIO, Ceph RGW, "
                                           "R2...); unset: AWS")
    region: str | None = Field(None, doc="with an s3:// url: the bucket's region; unset: AWS_REGION / "
                                         "AWS_DEFAULT_REGION")
    range_size: int = Field(64 << 20, unit="bytes", doc="with url: bytes per ranged GET, read as a stream (memory "
                                                        "stays small); at least 64 KiB")
    concurrency: int = Field(default=4, ge=1, le=256, doc="with url: ranged GETs (and multipart parts, or blob "
                                                          "uploads) in flight")
    part_size: int = Field(16 << 20, unit="bytes", doc="with url: multipart upload part size (S3's limits: 5 MiB "
                                                       "to 5 GiB), or a registry's upload chunk")
    bandwidth: int = Field(0, unit="bytes/s", doc="downloads from cold storage; 0: unlimited")
    insecure: bool = Field(False, doc="with an oci:// url: talk plain HTTP to the registry (a registry on loopback "
                                      "or a trusted network); unset: HTTPS only")
    ca_file: Path | None = Field(None, doc="with an oci:// url: the CA certificate(s) (PEM) to trust for the "
                                           "registry's TLS, besides the system's")
    _path = field_validator("path", "ca_file", mode="before")(abs_path)

    @field_validator("range_size", "part_size", "bandwidth", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        return parse_size(v)

    @model_validator(mode="after")
    def _one(self) -> "ColdSettings":
        if (self.path is None) == (self.url is None):
            raise ValueError("give path (shared storage) or url (s3://BUCKET/PREFIX, oci://REGISTRY/PREFIX), not both "
                             "and not neither")
        if self.url is not None and self.url.startswith("oci://"):
            from tiering import RegistryLocation
            RegistryLocation.parse(self.url)  # (BadInput, a ValueError: named with the key)
            if self.endpoint is not None or self.region is not None:
                raise ValueError("endpoint and region are for an s3:// url; a registry's address is in oci://")
            if self.insecure and self.ca_file is not None:
                raise ValueError("insecure (plain HTTP) and ca_file (TLS) contradict each other")
            if self.part_size < (64 << 10):
                raise ValueError("part_size must be at least 64KiB")
        elif self.url is not None:
            from tiering import ObjectLocation
            ObjectLocation.parse(self.url)  # (BadInput, a ValueError: named with the key)
            if not (5 << 20) <= self.part_size <= (5 << 30):
                raise ValueError("part_size must be from 5MiB to 5GiB (S3's multipart limits)")
            if self.insecure or self.ca_file is not None:
                raise ValueError("insecure and ca_file are for an oci:// url (an S3 endpoint's scheme says http)")
        if self.url is not None and self.range_size < (64 << 10):
            raise ValueError("range_size must be at least 64KiB")
        return self

class Tiers(FrozenModel):
    hot: TierSettings = Field(doc="the hot tier: tmpfs (/dev/shm), what a serving engine loads from")
    warm: TierSettings = Field(doc="the warm tier: local disk (NVMe)")
    cold: ColdSettings = Field(doc="cold storage: shared storage (path), object storage or an OCI registry (url), "
                                   "where versions are published")


class WarmSettings(FrozenModel):
    """Page-cache warming (``weightd warm`` and the daemon's warming after a preload)."""
    concurrency: int = Field(default=2, ge=1, le=64, doc="files in flight")
    bandwidth: int = Field(0, unit="bytes/s", doc="read rate cap; 0: no fixed cap (it still backs off under disk "
                                                  "contention)")
    await_threshold_ms: float = Field(default=5.0, gt=0, unit="ms",
                                      doc="a 4 KiB random read slower than this, with others reading: back off")

    _bw = field_validator("bandwidth", mode="before")(lambda v: parse_size(v))
