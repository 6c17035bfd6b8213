"""``[p2p]``: BitTorrent distribution of large checkpoints between nodes (``P2PSettings``), and
``[p2p.tls]``, the fleet CA and this node's certificate, checked when the config is loaded
(``P2PTLSSettings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiering import parse_size

from .model import Field, PrivateAttr, field_validator, model_validator
from .values import FrozenModel, abs_path, cidrs, host_port


class P2PTLSSettings(FrozenModel):
    """Fleet TLS: the fleet CA every torrent carries, and this node's certificate and key (PEM files).
    Checked when the config is loaded (so on SIGHUP too): a file missing or unreadable, a certificate
    expired or not yet valid, not signed by the CA or without DNS:* (what libtorrent matches), a key
    that does not match: an error naming the file."""
    ca: Path = Field(doc="the fleet CA certificate (PEM) every torrent carries: peers must chain to it")
    cert: Path = Field(doc="this node's certificate (PEM), signed by the fleet CA, with subjectAltName DNS:*")
    key: Path = Field(doc="this node's private key (PEM), the one of cert")
    _fleet: Any = PrivateAttr(default=None)   # p2p.FleetTLS: the checked bytes, what libtorrent is given

    _paths = field_validator("ca", "cert", "key", mode="before")(abs_path)

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


class P2PSettings(FrozenModel):
    threshold: int = Field(10 << 30, unit="bytes",
                           doc="checkpoints at or above this size travel over BitTorrent (publish makes their "
                               "torrent); smaller ones are copied from cold")
    listen: str = Field("0.0.0.0:6881", doc="IP:PORT the BitTorrent session listens on (this node's data-centre "
                                            "address)")
    trackers: tuple[str, ...] = Field((), doc="announce URLs (http://, https:// or udp://; only https:// with tls): "
                                              "the origins' trackers (every node announces to all of them)")
    peers: tuple[str, ...] = Field((), doc="IP:PORT of peers every torrent connects to at once: the origins")
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
    choke_other_racks: bool = Field(True, doc="with rack: serve other racks' workers only through their racks' "
                                          "gateways (the others kept choked while this node downloads; a "
                                          "gateway its rack skips is told through the trackers); false: "
                                          "other racks are paced by each receiver alone (slower, docs/p2p.md)")
    gateways: int = Field(2, ge=1, le=64, doc="with rack: the workers of each rack (its gateways) that take pieces "
                                              "from other racks, each its share; set the same on every node "
                                              "(senders serve that many a rack)")
    crossing: bool = Field(False, doc="with rack, plan and an http(s) tracker: every worker takes its share of "
                                      "the pieces that cross into its rack through a second P2P session, which "
                                      "talks to other racks' crossing sessions only, while the main one keeps to "
                                      "the rack (docs/p2p.md); set it on every worker")
    crossing_port: int = Field(0, ge=0, le=65535, doc="with crossing: the port of the crossing session, on the "
                                                      "listen address; 0: the listen port + 1")
    origin_request_queue: int = Field(128, ge=0, le=2000,
                                      doc="origin only (serve --role origin): the 16 KiB blocks one peer may have "
                                          "asked of the origin at once, from 16 (told in each connection's extended "
                                          "handshake; a lone worker then takes at most 2 MiB a round trip at 128): "
                                          "bounds what each worker asks of the origin that other workers already "
                                          "hold; 0: libtorrent's 2,000")

    @model_validator(mode="after")
    def _crossing(self) -> "P2PSettings":
        if self.crossing and not (self.rack and self.plan and any(t.startswith(("http://", "https://"))
                                                                  for t in self.trackers)):
            raise ValueError("crossing: needs p2p.rack, p2p.plan and an http(s) tracker in p2p.trackers "
                             "(crossing sessions find each other there)")
        port = self.listen.rpartition(":")[2]
        lp = int(port) if port.isdigit() else 0
        if self.crossing and lp and (self.crossing_port or lp + 1) in (lp, 65536):
            raise ValueError(f"crossing_port: must differ from the listen port and be at most 65535, got "
                             f"{self.crossing_port or lp + 1}")
        return self

    @field_validator("origin_request_queue")
    @classmethod
    def _request_queue(cls, v: int) -> int:
        if 0 < v < 16:   # (a few blocks in flight hold even one worker to a trickle)
            raise ValueError("expected 0 (libtorrent's 2,000) or from 16 to 2000 blocks of 16 KiB")
        return v

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
    _listen = field_validator("listen", mode="before")(host_port)
    _tracker = field_validator("tracker_listen", mode="before")(lambda v: v if v is None else host_port(v))

    @field_validator("peers", mode="before")
    @classmethod
    def _peers(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)):
            raise ValueError("expected a list of 'IP:PORT'")
        return tuple(host_port(x) for x in v)

    @field_validator("trackers", mode="before")
    @classmethod
    def _trackers(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise ValueError("expected a list of tracker URLs")
        for url in v:
            if not url.startswith(("http://", "https://", "udp://")):
                raise ValueError(f"tracker {url!r} must be an http://, https:// or udp:// URL")
        return tuple(v)

    _allow = field_validator("allow", mode="before")(cidrs)
