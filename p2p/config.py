"""What the network data plane needs to know, in one frozen dataclass (validated when built).

The control plane builds it from its own configuration (``weightd/node/swarm.py``: ``p2p_config``); ``p2p``
reads nothing else, no environment and no file.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .certs import FleetTLS


RACK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")   # a rack name ([p2p] rack, announces, member lists)


def peer_address(text: str) -> "ipaddress.IPv4Address | ipaddress.IPv6Address | None":
    """A peer's address as the kernel gave it, normalised: a zone dropped, an IPv4-mapped IPv6 address
    (``::ffff:10.0.0.5``, what a ``[::]`` listener sees) as the IPv4 address it is; None if unparsable.
    The one reading of an address for every allow list (the accept guard, the tracker)."""
    try:
        a = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    return a.ipv4_mapped if a.version == 6 and a.ipv4_mapped is not None else a


def address_allowed(text: str, allow: "Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]") -> bool:
    """``text`` (see :func:`peer_address`) is inside one of ``allow``'s networks."""
    a = peer_address(text)
    return a is not None and any(a.version == n.version and a in n for n in allow)


@dataclass(frozen=True, slots=True)
class P2PConfig:
    listen: str = "0.0.0.0:6881"
    upload_limit: int = 0            # bytes/s, 0 = unlimited
    download_limit: int = 0
    allow: tuple[str, ...] = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8")
    max_connections: int = 200
    peers: tuple[str, ...] = ()      # "IP:PORT" of the origin(s): where every download starts
    trackers: tuple[str, ...] = ()
    threshold: int = 10 << 30        # bytes: smaller versions get no torrent and never use the swarm
    fallback_after_s: float = 60.0   # no bytes from the swarm for this long: give up (copy from cold)
    piece_size: int = 0              # torrent piece size at publish, bytes; 0 = by checkpoint size
    tls: "FleetTLS | None" = None    # fleet TLS: torrents carry the CA, peers must hold a certificate from it
    plan: bool = True                # the piece plan (False: stock libtorrent piece picking, for comparison)
    rack: str = ""                   # this node's rack: the tracker and the plan keep traffic inside racks
    trace: bool = False              # attribute every 16 KiB block to its sender (diagnostics; costs CPU)
    choke_other_racks: bool = True   # with racks: serve other racks only through their gateways (racks.py)
    gateways: int = 2                # with racks: the workers of each rack that take pieces from other racks
    crossing: bool = False           # with racks: a second session takes this node's share across (crossing.py)
    crossing_port: int = 0           # ... listening here (0: the listen port + 1)
    request_queue: int = 0           # blocks of 16 KiB a peer may have asked of this session at once (0: libtorrent's)

    def __post_init__(self) -> None:
        for key in ("upload_limit", "download_limit", "threshold", "piece_size"):
            if getattr(self, key) < 0:
                raise ValueError(f"p2p.{key}: must not be negative, got {getattr(self, key)}")
        if self.max_connections < 1:
            raise ValueError(f"p2p.max_connections: must be at least 1, got {self.max_connections}")
        if not 1 <= self.gateways <= 64:
            raise ValueError(f"p2p.gateways: from 1 to 64, got {self.gateways}")
        if self.crossing and not (self.rack and self.plan and any(t.startswith(("http://", "https://"))
                                                                  for t in self.trackers)):
            raise ValueError("p2p.crossing: needs p2p.rack, p2p.plan and an http(s) tracker in p2p.trackers "
                             "(crossing sessions find each other there)")
        if not 0 <= self.crossing_port <= 65535:
            raise ValueError(f"p2p.crossing_port: from 0 to 65535, got {self.crossing_port}")
        if not (self.request_queue == 0 or 16 <= self.request_queue <= 2000):
            raise ValueError(f"p2p.request_queue: 0 or from 16 to 2000, got {self.request_queue}")
        if not self.fallback_after_s > 0:
            raise ValueError(f"p2p.fallback_after_s: must be positive, got {self.fallback_after_s}")
        if self.rack and not RACK.fullmatch(self.rack):
            raise ValueError(f"p2p.rack: letters, digits, '.', '_' and '-' (at most 63), got {self.rack!r}")
        for key, value in (("listen", self.listen), *(("peers", p) for p in self.peers)):
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise ValueError(f"p2p.{key}: expected 'IP:PORT', got {value!r}")
        listen_port = int(self.listen.rpartition(":")[2])
        if self.crossing and listen_port and self.crossing_listen[1] in (listen_port, 65536):
            raise ValueError(f"p2p.crossing_port: must differ from the listen port and be at most 65535, got "
                             f"{self.crossing_listen[1]}")

    @property
    def crossing_listen(self) -> tuple[str, int]:
        """(host, port) of the crossing session: the listen host, ``crossing_port`` or the listen port + 1."""
        host, port = endpoint(self.listen)
        return host, self.crossing_port or (port + 1 if port else 0)


def tracker_urls(cfg: P2PConfig) -> list[str]:
    """The trackers libtorrent announces to: with ``rack``, each URL carries ``rack=NAME``."""
    if not cfg.rack:
        return list(cfg.trackers)
    return [t + ("&" if "?" in t else "?") + "rack=" + cfg.rack if t.startswith(("http://", "https://")) else t
            for t in cfg.trackers]


def crossing_urls(cfg: P2PConfig) -> list[str]:
    """The trackers a crossing session announces to: the node's http(s) ones, with ``crossing=1`` (a
    UDP announce cannot say it: it would land among the main sessions)."""
    return [t + ("&" if "?" in t else "?") + "crossing=1" for t in tracker_urls(cfg)
            if t.startswith(("http://", "https://"))]


def endpoint(s: str) -> tuple[str, int]:
    """``"IP:PORT"`` (or ``"[v6]:PORT"``) as libtorrent's (host, port)."""
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)
