"""Configuration: TOML at ``--config``, else ``$WEIGHTD_CONFIG``, else ``/etc/weightd/weightd.toml``,
else an embedded default that works for an unprivileged user with no set-up (design §5).

A file only needs the keys it changes; everything else keeps the embedded default. Unknown keys and
bad values are :class:`ConfigError` naming the key. This is the only module that reads the
environment, and it does so when :func:`load_config` is called, never at import time.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections import namedtuple
from pathlib import Path
from typing import Any, Iterator, Mapping

from .model import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from tiering import parse_fraction, parse_size

from ..errors import ConfigError

SYSTEM_CONFIG = Path("/etc/weightd/weightd.toml")
ENV_CONFIG = "WEIGHTD_CONFIG"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _abs_path(v: Any) -> Path:
    if not isinstance(v, (str, Path)) or not str(v):
        raise ValueError("expected a path")
    p = Path(os.path.expanduser(str(v)))
    if not p.is_absolute():
        raise ValueError(f"must be an absolute path, got {str(v)!r}")
    return p


def _cidrs(v: Any) -> tuple[str, ...]:
    import ipaddress
    if not isinstance(v, (list, tuple)):
        raise ValueError("expected a list of CIDRs like '10.0.0.0/8'")
    out = []
    for cidr in v:
        try:
            out.append(str(ipaddress.ip_network(cidr, strict=False)))
        except (ValueError, TypeError):
            raise ValueError(f"{cidr!r} is not a CIDR like '10.0.0.0/8'") from None
    return tuple(out)


def _host_port(v: Any) -> str:
    import ipaddress
    if not isinstance(v, str):
        raise ValueError("expected 'IP:PORT'")
    host, sep, port = v.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        ok = sep and port.isdigit() and 0 <= int(port) <= 65535
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"expected 'IP:PORT' like '127.0.0.1:9464', got {v!r}")
    return v


class Capacity(_Model):
    """A tier budget: absolute bytes, or a fraction of the tier's filesystem."""
    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, fs_total_bytes: int) -> int:
        if self.bytes is not None:
            return self.bytes
        return int(fs_total_bytes * (self.fraction or 0.0))

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction is not None else str(self.bytes)


def _group_id(v: Any) -> int | None:
    """A group by name or gid (the serving engine's, so it can read the tier); None = no group access."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        raise ValueError("expected a group name or gid")
    if isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
        gid = int(v)
        if not 0 <= gid < 2**32 - 1:
            raise ValueError(f"gid {v} is out of range")
        return gid
    if not isinstance(v, str):
        raise ValueError("expected a group name or gid")
    import grp
    try:
        return grp.getgrnam(v).gr_gid
    except KeyError:
        raise ValueError(f"no group named {v!r} on this host") from None


class TierSettings(_Model):
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

    _path = field_validator("path", mode="before")(_abs_path)
    _group = field_validator("group", mode="before")(_group_id)

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


class ColdSettings(_Model):
    """Shared storage (``path``) or object storage (``url = "s3://BUCKET/PREFIX"``), not both."""
    path: Path | None = Field(None, doc="shared storage (NFS, CephFS, Lustre) where weightd publish puts checkpoints "
                                        "and preloads copy from (absolute); give path or url, not both")
    url: str | None = Field(None, doc="object storage instead of path: s3://BUCKET/PREFIX (credentials from where AWS "
                                      "tools look, never from this file)")
    endpoint: str | None = Field(None, doc="with url: an S3-compatible store's address (MinIO, Ceph RGW, R2...); "
                                           "unset: AWS")
    region: str | None = Field(None, doc="with url: the bucket's region; unset: AWS_REGION / AWS_DEFAULT_REGION")
    range_size: int = Field(64 << 20, unit="bytes", doc="with url: bytes per ranged GET, read as a stream (memory "
                                                        "stays small); at least 64 KiB")
    concurrency: int = Field(default=4, ge=1, le=256, doc="with url: ranged GETs (and multipart parts) in flight")
    part_size: int = Field(16 << 20, unit="bytes", doc="with url: multipart upload part size (S3's limits: 5 MiB "
                                                       "to 5 GiB)")
    bandwidth: int = Field(0, unit="bytes/s", doc="downloads from cold storage; 0: unlimited")
    _path = field_validator("path", mode="before")(_abs_path)

    @field_validator("range_size", "part_size", "bandwidth", mode="before")
    @classmethod
    def _size(cls, v: Any) -> int:
        return parse_size(v)

    @model_validator(mode="after")
    def _one(self) -> "ColdSettings":
        if (self.path is None) == (self.url is None):
            raise ValueError("give path (shared storage) or url (s3://BUCKET/PREFIX), not both and not neither")
        if self.url is not None:
            from tiering import ObjectLocation
            ObjectLocation.parse(self.url)  # (BadInput, a ValueError: named with the key)
            if not (5 << 20) <= self.part_size <= (5 << 30):
                raise ValueError("part_size must be from 5MiB to 5GiB (S3's multipart limits)")
            if self.range_size < (64 << 10):
                raise ValueError("range_size must be at least 64KiB")
        return self

    @property
    def where(self) -> str:
        return self.url if self.url is not None else str(self.path)


class Tiers(_Model):
    hot: TierSettings = Field(doc="the hot tier: tmpfs (/dev/shm), what a serving engine loads from")
    warm: TierSettings = Field(doc="the warm tier: local disk (NVMe)")
    cold: ColdSettings = Field(doc="cold storage: shared storage (path) or object storage (url), where versions are "
                                   "published")


class P2PTLSSettings(_Model):
    """Fleet TLS: the fleet CA every torrent carries, and this node's certificate and key (PEM files).
    Checked when the config is loaded (so on SIGHUP too): a file missing or unreadable, a certificate
    expired or not yet valid, not signed by the CA or without DNS:* (what libtorrent matches), a key
    that does not match: an error naming the file."""
    ca: Path = Field(doc="the fleet CA certificate (PEM) every torrent carries: peers must chain to it")
    cert: Path = Field(doc="this node's certificate (PEM), signed by the fleet CA, with subjectAltName DNS:*")
    key: Path = Field(doc="this node's private key (PEM), the one of cert")
    _fleet: Any = PrivateAttr(default=None)   # p2p.FleetTLS: the checked bytes, what libtorrent is given

    _paths = field_validator("ca", "cert", "key", mode="before")(_abs_path)

    @model_validator(mode="after")
    def _check(self) -> "P2PTLSSettings":
        from p2p import BadCertificate, load_fleet_tls  # (cryptography: loaded only with tls configured)
        try:
            self._fleet = load_fleet_tls(self.ca, self.cert, self.key)
        except BadCertificate as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def fleet(self) -> Any:
        return self._fleet


class P2PSettings(_Model):
    threshold: int = Field(10 << 30, unit="bytes",
                           doc="checkpoints at or above this size travel over BitTorrent (publish makes their "
                               "torrent); smaller ones are copied from cold")
    listen: str = Field("0.0.0.0:6881", doc="IP:PORT the BitTorrent session listens on (this node's data-centre "
                                            "address)")
    trackers: tuple[str, ...] = Field((), doc="announce URLs (http://, https:// or udp://; only https:// with tls): "
                                              "the origin's tracker")
    peers: tuple[str, ...] = Field((), doc="IP:PORT of peers every torrent connects to at once: the origin")
    allow: tuple[str, ...] = Field(("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8"),
                                   doc="CIDRs peers must come from (the origin's tracker answers only these); a "
                                       "network filter: tls is the access control")
    upload_limit: int = Field(1_000_000_000, unit="bytes/s", doc="upload cap, held for LAN and loopback peers too; "
                                                                 "0: unlimited")
    download_limit: int = Field(1_000_000_000, unit="bytes/s", doc="download cap; 0: unlimited")
    max_connections: int = Field(default=200, ge=1, doc="the BitTorrent session's peer connections, all torrents "
                                                        "together")
    fallback_after_s: float = Field(default=60.0, gt=0, unit="s",
                                    doc="no bytes from the swarm for this long: copy from cold instead")
    tracker_listen: str | None = Field(None, doc="origin only (serve --role origin): serve a BitTorrent announce "
                                                 "endpoint, and the fleet view, on IP:PORT")
    piece_size: int = Field(0, unit="bytes", doc="torrent piece size at publish, a power of two from 16 KiB to 64 MiB; "
                                                 "0 or \"auto\": 4 MiB under 1 GiB, 8 MiB under 16 GiB, else 16 MiB")
    tls: P2PTLSSettings | None = Field(None, doc="fleet TLS: only peers with a certificate from the fleet CA exchange "
                                                 "bytes; every tracker must then be https://")
    plan: bool = Field(True, doc="the piece plan; false: libtorrent's own piece picking (for comparison)")
    rack: str = Field("", doc="this node's rack (letters, digits, '.', '_', '-'): the tracker and the plan keep "
                              "traffic inside racks first")
    trace: bool = Field(False, doc="attribute every 16 KiB block to its sender in preload --json (costs CPU)")

    @model_validator(mode="after")
    def _tls_trackers(self) -> "P2PSettings":
        if self.tls is not None:
            plain = [t for t in self.trackers if not t.startswith("https://")]
            if plain:  # an announce in the clear hands the swarm's addresses to anyone on the path
                raise ValueError(f"trackers: with p2p.tls every tracker must be an https:// URL, got {plain[0]!r}")
        return self

    @field_validator("rack", mode="before")
    @classmethod
    def _rack(cls, v: Any) -> str:
        from p2p import RACK  # (one rule for config, announces and member lists; no libtorrent)
        if not isinstance(v, str) or (v and not RACK.fullmatch(v)):
            raise ValueError("expected a rack name: letters, digits, '.', '_' and '-', at most 63, "
                             "starting with a letter or digit")
        return v

    @field_validator("piece_size", mode="before")
    @classmethod
    def _piece_size(cls, v: Any) -> int:
        n = 0 if v in (0, "auto") else parse_size(v)
        if n and (n < (16 << 10) or n > (64 << 20) or n & (n - 1)):
            raise ValueError("expected 'auto' or a power of two from 16KiB to 64MiB")
        return n

    _sizes = field_validator("threshold", "upload_limit", "download_limit", mode="before")(
        lambda v: parse_size(v))
    _listen = field_validator("listen", mode="before")(_host_port)
    _tracker = field_validator("tracker_listen", mode="before")(lambda v: v if v is None else _host_port(v))

    @field_validator("peers", mode="before")
    @classmethod
    def _peers(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)):
            raise ValueError("expected a list of 'IP:PORT'")
        return tuple(_host_port(x) for x in v)

    @field_validator("trackers", mode="before")
    @classmethod
    def _trackers(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise ValueError("expected a list of tracker URLs")
        for url in v:
            if not url.startswith(("http://", "https://", "udp://")):
                raise ValueError(f"tracker {url!r} must be an http://, https:// or udp:// URL")
        return tuple(v)

    _allow = field_validator("allow", mode="before")(_cidrs)


class WarmSettings(_Model):
    """Page-cache warming (``weightd warm`` and the daemon's warming after a preload)."""
    concurrency: int = Field(default=2, ge=1, le=64, doc="files in flight")
    bandwidth: int = Field(0, unit="bytes/s", doc="read rate cap; 0: no fixed cap (it still backs off under disk "
                                                  "contention)")
    await_threshold_ms: float = Field(default=5.0, gt=0, unit="ms",
                                      doc="a 4 KiB random read slower than this, with others reading: back off")

    _bw = field_validator("bandwidth", mode="before")(lambda v: parse_size(v))


def _user_id(v: Any) -> int | None:
    """A user as a uid or a name that resolves here."""
    if v is None or isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    if isinstance(v, str) and v:
        import pwd
        try:
            return pwd.getpwnam(v).pw_uid
        except KeyError:
            raise ValueError(f"no user named {v!r} on this host") from None
    raise ValueError("expected a user name or uid")


class ApiSettings(_Model):
    """The admin socket: who may connect (``group``), who may change things (``admin_group``), which
    uid the CLI accepts as its daemon (``daemon_user``), and how long a request may take to arrive."""
    socket: Path = Field(doc="the admin socket's path (absolute); the embedded default is in $XDG_RUNTIME_DIR, "
                             "else in state_dir")
    group: int | None = Field(None, unit="gid", doc="a group name or gid: the socket is chowned to it, mode 0660: "
                                                    "who may connect and read; unset: weightd's user only")
    admin_group: int | None = Field(None, unit="gid", doc="a group name or gid: besides root and the daemon's user, "
                                                          "who may publish, evict, pin, unpin and gc")
    daemon_user: int | None = Field(None, unit="uid", doc="a user name or uid the CLI trusts as its daemon besides "
                                                          "root; unset: the CLI's own user")
    request_timeout_s: float = Field(default=30.0, gt=0, le=3600, unit="s",
                                     doc="idle or half-sent requests on the socket are dropped after this")
    # callers who are not admins (anyone else the socket's group lets in): how long one lease may be,
    # and how much of a tier's capacity one uid's leases may hold (admins and the daemon: no limit)
    max_lease_s_readonly: float = Field(default=3600.0, ge=0, le=7 * 24 * 3600, unit="s",
                                        doc="the longest lease a caller who is not an admin may take (admins and "
                                            "the daemon: not limited by this)")
    lease_share_readonly: float = Field(default=0.25, ge=0, le=1, unit="fraction",
                                        doc="the share of a tier's capacity one such caller's (uid's) leases may hold")

    _path = field_validator("socket", mode="before")(_abs_path)
    _groups = field_validator("group", "admin_group", mode="before")(_group_id)
    _user = field_validator("daemon_user", mode="before")(_user_id)


class MetricsSettings(_Model):
    """The metrics and probes listener. ``allow``: who may connect, everyone by default (Prometheus
    scrapes it from the pod network and the kubelet probes it from the node; it serves nothing secret
    and changes nothing): the connection caps and timeouts of ``[listeners]`` are what protect it."""
    listen: str = Field("127.0.0.1:9464", doc="IP:PORT of /metrics, /healthz and /readyz")
    allow: tuple[str, ...] = Field(("0.0.0.0/0", "::/0"), doc="CIDRs that may connect; everyone by default (it serves "
                                                              "nothing secret and changes nothing)")
    _listen = field_validator("listen", mode="before")(_host_port)
    _allow = field_validator("allow", mode="before")(_cidrs)


class ListenerSettings(_Model):
    """Every TCP listener of the daemon (metrics; the origin's tracker and fleet endpoints): caps on
    open connections, and how long a connection may take to send a request and to finish it."""
    max_connections: int = Field(default=256, ge=1, le=65536,
                                 doc="open connections per listener; more are reset at accept")
    max_connections_per_address: int = Field(default=32, ge=1, le=65536,
                                             doc="open connections per listener from one address (at most "
                                                 "max_connections)")
    idle_timeout_s: float = Field(default=10.0, gt=0, le=3600, unit="s",
                                  doc="a request's headers must arrive within this of connecting or of the last answer")
    request_timeout_s: float = Field(default=30.0, gt=0, le=3600, unit="s",
                                     doc="a request's body and handler (else 408); an answer not read for this long: "
                                         "reset")
    tls_handshake_timeout_s: float = Field(default=10.0, gt=0, le=600, unit="s",
                                           doc="with [p2p] tls: the tracker's TLS handshake")

    @model_validator(mode="after")
    def _per_address(self) -> "ListenerSettings":
        if self.max_connections_per_address > self.max_connections:
            raise ValueError(f"max_connections_per_address ({self.max_connections_per_address}) is more than "
                             f"max_connections ({self.max_connections})")
        return self


def _key_file(v: Any) -> Path:
    """A key or certificate file: an absolute path to a regular file that exists and can be read."""
    p = _abs_path(v)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise ValueError(f"{p}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{p}: not readable by this user")
    return p


class TrustSettings(_Model):
    """Signed checkpoints: with ``require_signature`` every version must carry a model-signing
    signature (``.weightd/model.sig``) by one of ``public_keys`` (PEM public keys or certificates)
    that covers every byte, or it is refused (exit 5)."""
    require_signature: bool = Field(False, doc="every version must carry a signature by one of public_keys that "
                                               "covers every byte, or it is refused (exit 5)")
    public_keys: tuple[Path, ...] = Field((), doc="PEM EC public keys (P-256/384/521) or certificates signatures are "
                                                  "checked against (signed versions are checked even without "
                                                  "require_signature)")

    @field_validator("public_keys", mode="before")
    @classmethod
    def _keys(cls, v: Any) -> tuple[Path, ...]:
        if not isinstance(v, (list, tuple)):
            raise ValueError("expected a list of PEM public key files")
        from tiering import BadInput
        from tiering import load_public_key
        paths = tuple(_key_file(p) for p in v)
        for p in paths:  # a file that is not a usable key is a config error naming it
            try:
                load_public_key(p)
            except BadInput as exc:
                raise ValueError(str(exc).removeprefix("trust.public_keys: ")) from None
        return paths

    @model_validator(mode="after")
    def _usable(self) -> "TrustSettings":
        if self.require_signature and not self.public_keys:
            raise ValueError("require_signature needs at least one file in trust.public_keys")
        return self


class PublishSettings(_Model):
    """Publishing (``weightd publish``)."""
    signing_key: Path | None = Field(None, doc="PEM EC private key every publish signs with when it is not given "
                                               "--sign (weightd keygen makes one)")

    @field_validator("signing_key", mode="before")
    @classmethod
    def _key(cls, v: Any) -> Path | None:
        return None if v is None else _key_file(v)


class PrewarmSettings(_Model):
    """Prediction-driven prewarming (design §15): in ``window``, the top ``top`` models the forecaster
    expects in the next ``horizon_s`` are placed in ``tier`` (or warmed into the page cache when a warm
    copy is there), never evicting what intent wants or what is pinned, leased or in use."""
    window: str = Field("00:00-23:59", doc="when prewarming runs: HH:MM-HH:MM (UTC), or a cron expression with "
                                           "window_minutes")
    window_minutes: int | None = Field(None, unit="minutes", doc="with a cron window: how long each window lasts "
                                                                 "(1 to 10080)")
    tier: str = Field("warm", doc="hot or warm: where prewarmed models are placed")
    top: int = Field(default=3, ge=1, le=64, doc="the most expected models to place")
    min_score: float = Field(default=0.5, ge=0, doc="the least forecast score (expected loads in the horizon) a "
                                                    "model needs")
    horizon_s: float = Field(default=3600.0, ge=60, le=7 * 86400, unit="s",
                             doc="how far ahead the forecaster looks")

    @field_validator("window")
    @classmethod
    def _window(cls, v: Any) -> str:
        from ..intent.spec import parse_window
        parse_window(v)
        return v

    @field_validator("tier")
    @classmethod
    def _tier(cls, v: Any) -> str:
        if v not in ("hot", "warm"):
            raise ValueError("expected hot or warm")
        return v


class IntentSettings(_Model):
    """Fleet intent (design §15): ``dir`` holds ``*.toml`` files of ``[[keep]]`` entries; none: off."""
    dir: Path | None = Field(None, doc="the directory of *.toml files of [[keep]] entries; unset: intent is off")
    labels: dict[str, str] = Field({}, doc="this node's labels, for the entries' node selectors (an inline table, "
                                           "{ pool = \"chat\" })")
    labels_file: Path | None = Field(None, doc="key=value lines overlaid on labels, read every round (a provisioner "
                                               "writes them)")
    node_name: str = Field("", doc="how the origin's fleet view names this node; empty: the host name")
    reconcile_s: float = Field(default=30.0, ge=1, le=3600, unit="s",
                               doc="a full round at least this often (a file change is seen within poll_s)")
    poll_s: float = Field(default=2.0, gt=0, le=60, unit="s", doc="how often dir is checked for changes")
    jitter_s: float = Field(default=30.0, ge=0, le=86400, unit="s",
                            doc="a rollout starts within this long of a new version (per node, stable)")
    max_movers: int = Field(default=0, ge=0, doc="on the origin: nodes rolling forward at once, fleet-wide; 0: no cap")
    origin: str | None = Field(None, doc="the origin's base URL, where holdings are reported; unset: from the first "
                                         "[p2p] trackers URL")
    report_s: float = Field(default=30.0, ge=1, le=3600, unit="s", doc="how often holdings are sent to the origin")
    # origin: bytes of worker reports held for the fleet view, and reports one address may send a second
    fleet_budget: int = Field(64 << 20, unit="bytes", doc="on the origin: worker reports held for the fleet view "
                                                          "(at least 1 MiB)")
    fleet_reports_per_s: float = Field(default=1.0, gt=0, le=1000, unit="1/s",
                                       doc="on the origin: reports one address may send a second (bursts of 16)")
    nfd_dir: Path | None = Field(None, doc="Node Feature Discovery's features.d: weightd writes labels "
                                           "weightd.io/<model>=hot|warm|ready there every round")
    prewarm: PrewarmSettings | None = Field(None, doc="prediction-driven prewarming; unset: off")

    _paths = field_validator("dir", "labels_file", "nfd_dir", mode="before")(
        lambda v: None if v is None else _abs_path(v))

    @field_validator("fleet_budget", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> int:
        n = parse_size(v)
        if n < 1 << 20:
            raise ValueError("expected at least 1MiB (a single report may be that large)")
        return n

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: Any) -> dict[str, str]:
        from ..intent.spec import _check_key, _check_value
        if not isinstance(v, Mapping) or not all(isinstance(x, str) for x in v.values()):
            raise ValueError("expected a table of label = \"value\"")
        return {_check_key(str(k)): _check_value(x) for k, x in v.items()}

    @field_validator("origin", mode="before")
    @classmethod
    def _origin(cls, v: Any) -> str | None:
        if v is not None and (not isinstance(v, str) or not v.startswith(("http://", "https://"))):
            raise ValueError("expected the origin's tracker base URL, like 'https://10.0.0.1:6969'")
        return v.rstrip("/") if v else None

    @field_validator("node_name", mode="before")
    @classmethod
    def _node(cls, v: Any) -> str:
        import re
        if not isinstance(v, str) or (v and not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,252}", v)):
            raise ValueError("expected a host name (letters, digits, '-', '_', '.')")
        return v


class ModelDefaults(_Model):
    """``[models."NAME"]`` (NAME may be a glob, ``"meta-llama/*"``): the files a preload of NAME moves
    when its caller names none (``--all`` moves every file): huggingface_hub's allow/ignore patterns."""
    include: list[str] = Field([], doc="patterns of the files a preload of NAME moves when its caller names none "
                                       "(huggingface_hub's allow_patterns)")
    exclude: list[str] = Field([], doc="patterns of the files it leaves out (ignore_patterns)")

    @model_validator(mode="after")
    def _patterns(self) -> "ModelDefaults":
        from tiering import selection_from
        try:
            selection_from(self.include, self.exclude)
        except Exception as exc:  # BadInput: named by the key it came from
            raise ValueError(str(exc).replace("--", "")) from None
        return self


def _model_key(k: str) -> str:
    import re
    if not re.fullmatch(r"[A-Za-z0-9._*?\[\]-]+(?:/[A-Za-z0-9._*?\[\]-]+)?", k):
        raise ValueError(f"models.{k!r}: expected a checkpoint NAME or a glob of names ('org/*')")
    return k


class Settings(_Model):
    """The whole file. Every key: docs/reference/config.md and weightd.toml(5), made from these fields
    (``doc``, ``unit``, bounds) by scripts/gen_reference.py."""
    state_dir: Path = Field(doc="the daemon's state: the database of copies, pins and leases, and the intent ledgers "
                                "(absolute; SIGHUP never switches it, restart for that)")
    tiers: Tiers = Field(doc="the tiers: [tiers.hot], [tiers.warm] and [tiers.cold]")
    p2p: P2PSettings = Field(P2PSettings(), doc="BitTorrent distribution of large checkpoints between nodes")
    warm: WarmSettings = Field(WarmSettings(), doc="page-cache warming")
    api: ApiSettings = Field(doc="the admin socket")
    metrics: MetricsSettings = Field(MetricsSettings(), doc="the metrics and probes listener")
    listeners: ListenerSettings = Field(ListenerSettings(), doc="every TCP listener's connection caps and timeouts")
    trust: TrustSettings = Field(TrustSettings(), doc="signed checkpoints")
    publish: PublishSettings = Field(PublishSettings(), doc="publishing")
    intent: IntentSettings = Field(IntentSettings(), doc="fleet intent: what this node keeps, and prewarming")
    models: dict[str, ModelDefaults] = Field({}, doc="[models.\"NAME\"] (NAME may be a glob, \"meta-llama/*\"): the "
                                                     "files a preload of NAME moves when its caller names none")

    _path = field_validator("state_dir", mode="before")(_abs_path)

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            for k in v:
                _model_key(str(k))
        return v

    def default_selection(self, name: str) -> Any:
        """The configured default patterns of NAME (a ``tiering.Selection``): its own table, else the
        longest glob that matches it, else none."""
        from fnmatch import fnmatchcase

        from tiering import Selection, selection_from
        d = self.models.get(name)
        if d is None:
            globs = sorted((k for k in self.models if fnmatchcase(name, k)), key=len, reverse=True)
            d = self.models[globs[0]] if globs else None
        return Selection() if d is None else selection_from(d.include, d.exclude)


class Config(namedtuple("Config", ["settings", "source", "chosen_by", "file_keys", "env_keys"],
                        defaults=["", frozenset(), ()])):
    """The effective configuration (a Settings) and where it came from (``source``: a file path, or
    "embedded default"; ``chosen_by``: what named the file, ``--config``, ``$WEIGHTD_CONFIG`` or
    ``SYSTEM_CONFIG`` existing; ``file_keys``: the dotted keys the file sets; ``env_keys``: (key,
    variable) for each default the environment decided). Immutable, a named tuple: dataclasses import
    ``inspect``, ~6 ms of the start of ``weightd path`` and ``status``."""
    __slots__ = ()

    def __getattr__(self, name: str) -> Any:  # config.tiers, config.p2p, ...
        if name.startswith("_"):   # (copy, pickle and the like ask for dunders: never the settings)
            raise AttributeError(name)
        return getattr(self.settings, name)


def embedded_defaults(env: Mapping[str, str]) -> dict[str, Any]:
    """Defaults for an unprivileged user: tiers under /dev/shm/weightd-$USER and the XDG dirs."""
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    user = env.get("USER") or env.get("LOGNAME") or _safe_user()
    cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    data = Path(env.get("XDG_DATA_HOME") or home / ".local/share")
    state = Path(env.get("XDG_STATE_HOME") or home / ".local/state")
    runtime = env.get("XDG_RUNTIME_DIR")
    state_dir = state / "weightd"
    return {
        "state_dir": str(state_dir),
        "tiers": {
            "hot": {"path": f"/dev/shm/weightd-{user}", "capacity": "50%"},
            "warm": {"path": str(cache / "weightd"), "capacity": "80%"},
            "cold": {"path": str(data / "weightd" / "cold")},
        },
        "api": {"socket": str(Path(runtime) / "weightd.sock") if runtime else str(state_dir / "weightd.sock")},
    }


def _safe_user() -> str:
    """``getpass.getuser()`` without importing getpass (and termios: ~1 ms of every start)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, OSError):
        return str(os.getuid())


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _close_key(loc: list[str]) -> str | None:
    """The key of the same table that ``loc``'s last part was probably meant to be (a typo)."""
    import difflib
    import typing
    model: Any = Settings
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        for arg in (ann, *typing.get_args(ann)):  # (X | None: the model inside)
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
                break
        else:
            return None
    names = list(getattr(model, "model_fields", {}))
    got = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return got[0] if got else None


def _first_error(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
        near = _close_key([str(p) for p in err["loc"]])
        if near:
            msg += f" (did you mean {near}?)"
    elif err["type"] == "missing":
        msg = "missing key"
    msg = msg.removeprefix("Value error, ")
    return loc, msg


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Find, read, merge over the embedded default, and validate the configuration."""
    env = os.environ if env is None else env
    chosen: Path | None = None
    if path is not None:
        chosen = Path(path)
    elif env.get(ENV_CONFIG):
        chosen = Path(env[ENV_CONFIG])
    elif SYSTEM_CONFIG.exists():
        chosen = SYSTEM_CONFIG
    data: dict[str, Any] = {}
    source = "embedded default"
    chosen_by = "--config" if path is not None else f"${ENV_CONFIG}" if env.get(ENV_CONFIG) else \
        str(SYSTEM_CONFIG) if chosen is not None else ""
    if chosen is not None:
        source = str(chosen)
        try:
            with open(chosen, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(source, "file not found") from None
        except IsADirectoryError:
            raise ConfigError(source, "is a directory") from None
        except PermissionError:
            raise ConfigError(source, "permission denied") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(source, f"invalid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(source, "not UTF-8 text") from None
    defaults = embedded_defaults(env)
    cold = data.get("tiers", {}).get("cold") if isinstance(data.get("tiers"), Mapping) else None
    if isinstance(cold, Mapping) and "url" in cold:  # an object-store cold tier replaces the default's path
        defaults["tiers"]["cold"].pop("path", None)
    merged = _merge(defaults, data)
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as exc:
        key, msg = _first_error(exc)
        raise ConfigError(source, msg, key) from None
    check_disjoint(settings, source)
    return Config(settings, source, chosen_by, frozenset(_dotted_keys(data)), _env_keys(env))


class _Place(namedtuple("_Place", ["key", "path", "real", "ident", "chain"])):
    """A configured directory as the kernel sees it: ``real`` (symlinks resolved as far as they exist),
    ``ident`` ((device, inode) when it exists), ``chain`` (the identities of it and every existing
    directory above it: a bind mount of another place is caught by identity, not by spelling)."""
    __slots__ = ()


def _place(key: str, path: Path) -> _Place:
    real = os.path.realpath(path)
    chain: list[tuple[int, int]] = []
    ident = None
    p = Path(real)
    for i, q in enumerate((p, *p.parents)):
        try:
            st = os.stat(q)
        except OSError:
            continue
        if i == 0:
            ident = (st.st_dev, st.st_ino)
        chain.append((st.st_dev, st.st_ino))
    return _Place(key, path, real, ident, tuple(chain))


def _within(inner: _Place, outer: _Place) -> bool:
    return inner.real.startswith(outer.real.rstrip("/") + "/") or \
        (outer.ident is not None and outer.ident in inner.chain[1 if inner.ident is not None else 0:])


def check_disjoint(settings: "Settings", source: str) -> None:
    """Hot, warm, cold (a path) and the state directory must be four separate directories, none equal
    to, inside or containing another, as the kernel resolves them (symlinks followed, bind mounts by
    device and inode): else ConfigError (exit 2) naming both keys and paths. A tier over another's
    directory would count, serve and evict the other's files as its own (a warm tier on the cold path
    deleted published checkpoints)."""
    t = settings.tiers
    places = [_place("tiers.hot.path", t.hot.path), _place("tiers.warm.path", t.warm.path)]
    if t.cold.path is not None:
        places.append(_place("tiers.cold.path", t.cold.path))
    places.append(_place("state_dir", settings.state_dir))
    for i, a in enumerate(places):
        for b in places[i + 1:]:
            if a.real == b.real or (a.ident is not None and a.ident == b.ident):
                how = "is the same directory as"
            elif _within(a, b):
                how = "is inside"
            elif _within(b, a):
                how = "contains"
            else:
                continue
            raise ConfigError(source, f"{a.path} {how} {b.key} ({b.path}): hot, warm, cold and state_dir must be "
                                      "separate directories, none inside another", a.key)


def _dotted_keys(d: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key a TOML document sets, dotted (a table's own path too)."""
    for k, v in d.items():
        key = f"{prefix}{k}"
        yield key
        if isinstance(v, Mapping):
            yield from _dotted_keys(v, key + ".")


def _env_keys(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(key, variable) for each embedded default that a set environment variable decided (see
    :func:`embedded_defaults`)."""
    def first(*names: str) -> str | None:
        return next((f"${n}" for n in names if env.get(n)), None)
    state = first("XDG_STATE_HOME", "HOME")
    pairs = {"state_dir": state, "tiers.hot.path": first("USER", "LOGNAME"),
             "tiers.warm.path": first("XDG_CACHE_HOME", "HOME"), "tiers.cold.path": first("XDG_DATA_HOME", "HOME"),
             "api.socket": first("XDG_RUNTIME_DIR") or state}
    return tuple((k, v) for k, v in pairs.items() if v)


def describe_source(cfg: Config) -> str:
    """Where the config came from, for the daemon's start-up line: ``/etc/weightd/weightd.toml``,
    ``/srv/w.toml ($WEIGHTD_CONFIG)``, ``/tmp/w.toml (--config)`` or ``embedded default``."""
    if cfg.chosen_by in ("--config", f"${ENV_CONFIG}"):
        return f"{cfg.source} ({cfg.chosen_by})"
    return cfg.source


class Key(namedtuple("Key", ["name", "model", "field", "info", "table"])):
    """One configuration key: ``name`` dotted (``tiers.hot.capacity``; a table of ``models`` as
    ``models."NAME"``), the model and field that define it, and ``table``: the model of the table it
    opens (None for a value)."""
    __slots__ = ()


def config_keys(model: Any = None, prefix: str = "") -> Iterator[Key]:
    """Every key of the configuration, tables before their keys, in the models' order: what the
    reference pages document and ``config show`` formats (a key whose ``unit`` is bytes is a size)."""
    import typing
    model = Settings if model is None else model
    model._hints()
    for name, info in model.model_fields.items():
        ann, key = info.annotation, f"{prefix}{name}"
        args = typing.get_args(ann)
        if typing.get_origin(ann) is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            yield Key(key, model, name, info, args[1])
            yield from config_keys(args[1], f'{key}."NAME".')
            continue
        sub = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is None or sub is Capacity:
            yield Key(key, model, name, info, None)
        else:
            yield Key(key, model, name, info, sub)
            yield from config_keys(sub, key + ".")


def size_keys() -> frozenset[str]:
    """The keys that hold a size or a rate in bytes (shown in binary units by ``config show``)."""
    return frozenset(k.name for k in config_keys() if k.info.unit.startswith("bytes"))


def config_sources(cfg: Config) -> dict[str, str]:
    """Where each key's value came from: the config file's path, ``environment ($VAR)`` (an embedded
    default the environment decided), or ``default``; by dotted key, as ``config_to_dict`` has them."""
    env = dict(cfg.env_keys)
    out: dict[str, str] = {}

    def walk(d: Mapping[str, Any], prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping) and v:
                walk(v, key + ".")
            elif key in cfg.file_keys:
                out[key] = cfg.source
            else:
                out[key] = f"environment ({env[key]})" if key in env else "default"
    walk(config_to_dict(cfg), "")
    return out


def show_config(cfg: Config) -> str:
    """``weightd config show``: the effective config as TOML, sizes in binary units, and after each
    key where its value came from. It reads back as the same config: a size that is no whole number
    of tenths of a unit stays in bytes, its binary form in the comment."""
    from tiering import format_bytes
    sources = config_sources(cfg)
    d = config_to_dict(cfg)
    notes: dict[str, str] = {}
    sizes = size_keys()

    def human(t: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in t.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping):
                out[k] = human(v, key + ".")
                continue
            note = sources.get(key, "default")
            if key in sizes and isinstance(v, int) and not isinstance(v, bool):
                text = format_bytes(v)
                if parse_size(text) == v:
                    out[k] = text
                else:   # (not a whole number of tenths of a binary unit: exact, so it reads back the same)
                    out[k], note = v, f"{text}; {note}"
            else:
                out[k] = v
            notes[key] = note
        return out
    return to_toml(human(d, ""), notes=notes)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The effective config as plain TOML-able values (sizes in bytes, capacities as written)."""
    d = cfg.settings.model_dump(mode="json")
    for tier in ("hot", "warm"):
        d["tiers"][tier]["capacity"] = str(getattr(cfg.settings.tiers, tier).capacity)
        if d["tiers"][tier]["capacity"].isdigit():
            d["tiers"][tier]["capacity"] = int(d["tiers"][tier]["capacity"])
    return d


def to_toml(d: Mapping[str, Any], *, notes: Mapping[str, str] | None = None) -> str:
    """A small TOML writer for the config's shapes (tables of scalars and lists of scalars);
    ``notes``: a comment after a key's line, by dotted key."""
    import json

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        return json.dumps(str(v))

    lines: list[str] = []

    def table(prefix: str, t: Mapping[str, Any]) -> None:
        scalars = [(k, v) for k, v in t.items() if not isinstance(v, Mapping) and v is not None]  # TOML has no null
        subs = [(k, v) for k, v in t.items() if isinstance(v, Mapping)]
        if prefix and scalars:
            lines.append(f"\n[{prefix}]")
        for k, v in scalars:
            note = (notes or {}).get(f"{prefix}.{k}" if prefix else k)
            lines.append(f"{k} = {scalar(v)}" + (f"  # {note}" if note else ""))
        for k, v in subs:
            table(f"{prefix}.{k}" if prefix else k, v)

    table("", d)
    return "\n".join(lines).lstrip("\n") + "\n"
