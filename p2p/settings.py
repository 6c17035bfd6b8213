"""libtorrent's side of a :class:`~p2p.config.P2PConfig`: the settings pack a node's session starts
with (no DHT, LSD, UPnP, NAT-PMP or uTP; rate limits; the listen and outgoing interface; an SSL port
with fleet TLS) and the filters it applies: the allowlist as an ``ip_filter`` (the origins blocked out
for a while by the piece plan), and the peer classes by network (LAN and loopback peers limited too)
and by rack.
"""

from __future__ import annotations

import ipaddress
import warnings
from collections.abc import Collection

import libtorrent as lt

from .config import P2PConfig


def ip_filter(allow: tuple[str, ...], blocked: "set[str] | frozenset[str]" = frozenset()) -> lt.ip_filter:
    """Every address blocked but the ``allow`` networks, and of those, ``blocked`` blocked again."""
    f = lt.ip_filter()
    f.add_rule("0.0.0.0", "255.255.255.255", 1)        # everything blocked ...
    f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1)
    for cidr in allow:                                   # ... but the allowed networks
        net = ipaddress.ip_network(cidr, strict=False)
        f.add_rule(str(net[0]), str(net[-1]), 0)
    for ip in sorted(blocked):                           # ... but these (the origin, for a while)
        try:
            f.add_rule(ip, ip, 1)
        except (RuntimeError, ValueError):
            continue   # (a host name: not filtered)
    return f


def lower_limit(fixed: int, dynamic: int) -> int:
    """The lower of two rate limits where 0 means none."""
    return min(x for x in (fixed, dynamic) if x) if fixed or dynamic else 0


#: LAN and loopback: libtorrent's local peer class (limited too: the session sets its limits)
LOCAL_NETS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8", "::1/128",
              "fe80::/10", "fc00::/7")


def class_filter(other_rack: "Collection[str]" = frozenset(), rack_class: int = -1,
                 unchoked: "Collection[str]" = frozenset(), open_class: int = -1) -> lt.ip_filter:
    """libtorrent's default peer classes (global for everyone, local for LAN and loopback instead),
    plus the other-rack class for the workers of other racks; with ``open_class`` (racks, see
    ``racks.py``) every peer is in it too but the workers of other racks not in ``unchoked``."""
    f = lt.ip_filter()
    glob, local = 1 << lt.session.global_peer_class_id, 1 << lt.session.local_peer_class_id
    unchoke = 1 << open_class if open_class >= 0 else 0
    f.add_rule("0.0.0.0", "255.255.255.255", glob | unchoke)
    f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", glob | unchoke)
    for cidr in LOCAL_NETS:
        net = ipaddress.ip_network(cidr)
        f.add_rule(str(net[0]), str(net[-1]), local | unchoke)
    for ip in sorted(other_rack):
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            continue
        base = local if any(addr in ipaddress.ip_network(c) for c in LOCAL_NETS if
                            ipaddress.ip_network(c).version == addr.version) else glob
        f.add_rule(str(addr), str(addr), base | (1 << rack_class) | (unchoke if ip in unchoked else 0))
    return f


# libtorrent's tick, the period at which its rate limiter hands out quota: a peer asks for two ticks'
# worth of its current rate at once, so at libtorrent's default (500 ms) a connection held from 25 to
# 5 MB/s sent nothing for seconds, then megabytes at once (0.5 s samples of 0-22 MB/s over a tc-shaped
# veth; 2.7-6.8 at 100 ms), and a request sent to a rate-limited peer waited up to a tick to be read
# or answered (a racks round's gateways: 70 blocks asked of other racks, 1.3 MB/s in, their senders at
# 23% of their cap; issue 38). Limits come and go from many places (the configured ones, the NIC
# controller's, the other racks' pace, a transfer's own cap), so every session ticks at 100 ms: idle,
# a session seeding one torrent costs 0.29% of a core at 100 ms against 0.22% at 500 (20 s, twice each).
TICK_MS = 100

# A peer keeps at most what the sender allows asked of it (``reqq`` in the extended handshake: the
# sender's ``max_allowed_in_request_queue``, libtorrent's 2,000 blocks; it replaces the peer's own
# ``max_out_request_queue``, 500, for that connection: bt_peer_connection::on_extended_handshake). What a
# worker has asked of the origin while the last pieces of its own slice are on the way is mostly pieces
# other workers already hold: the origin's upload past one checkpoint (issue 38). An origin tells each
# peer ``request_queue`` (``[p2p] origin_request_queue``, 128 blocks: 2 MiB): in the fleet model at 1,000
# nodes the origin sends 1.01x the checkpoint on every seed instead of 1.20-1.21x (with crossing sessions)
# (each worker takes ~10 MB/s of the origin there, 2 MiB is ~0.2 s of it); one worker alone with the
# origin moves 2 MiB a round trip, 10 GB/s at 0.2 ms. Told once per connection, in its handshake.


def session_settings(cfg: P2PConfig, host: str, port: int) -> dict[str, object]:
    """The settings pack of a session listening on ``host:port``."""
    settings: dict[str, object] = {
        # with fleet TLS the one port is an SSL port ("s"): SSL torrents accept only SSL connections, and
        # a TLS node adds no other kind; libtorrent announces that port (announce ``port=``) and dials
        # peers' ports over SSL, so ``peers`` keeps naming the configured port
        "listen_interfaces": f"{host}:{port}s" if cfg.tls is not None else f"{host}:{port}",
        "enable_dht": False, "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False,
        "enable_incoming_utp": False, "enable_outgoing_utp": False,
        "upload_rate_limit": cfg.upload_limit, "download_rate_limit": cfg.download_limit,
        "tick_interval": TICK_MS,
        "connections_limit": cfg.max_connections,
        "active_downloads": -1, "active_seeds": -1, "active_limit": -1, "active_checking": 4,
        "alert_mask": int(lt.alert_category.error | lt.alert_category.peer | lt.alert_category.status
                          | lt.alert_category.storage | (lt.alert_category.block_progress if cfg.trace else 0)),
        "alert_queue_size": 100_000 if cfg.trace else 10_000,
        "user_agent": "weightd/0.1", "peer_fingerprint": "-WD0100-",
        "aio_threads": 4, "hashing_threads": 2,
        # a worker waiting for a slice owner is briefly "finished" (upload only): keep its
        # connections to seeds, the plan will want pieces from them again in a moment
        "close_redundant_connections": False,
        # a fleet, not the internet: honour the tracker's short interval for downloading peers (the
        # default floor is 300 s), and dial a peer that dropped a first attempt again after 2 s, not 60
        # (at a restart storm many first handshakes fail while every node is busy)
        "min_announce_interval": 5, "min_reconnect_time": 2,
        # the filter is for peers (the origin is filtered for a while, see apply_plan); trackers are
        # configured explicitly
        "apply_ip_filter_to_trackers": False,
        # several origins, one tracker each (all in tier 0): announce to every one of them, not only
        # the first that answers, so each tracker knows every peer and any one of them is enough
        "announce_to_all_trackers": True, "announce_to_all_tiers": True,
    }
    if host not in ("0.0.0.0", "::"):
        settings["outgoing_interfaces"] = host
    if cfg.request_queue:   # (an origin's: see above)
        settings["max_allowed_in_request_queue"] = cfg.request_queue
    return settings


def session_status(ses: lt.session) -> "lt.session_status":
    """``session.status()``: deprecated, still kept by libtorrent 2.x, and the one call that gives a
    session's totals and payload rates without a session-stats alert through the pump."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return ses.status()


def split(limit: int, crossing: float, main: float) -> tuple[int, int]:
    """(the main session's limit, the crossing session's) out of one node limit (bytes/s; 0: none, for
    both), the sessions having taken ``crossing`` and ``main`` lately: each may take what the other
    leaves, never less than a tenth of it. Work-conserving: a limit split into fixed parts that add up
    to it (the crossing part following what it took) was slower than the daemon without crossing
    sessions, though neither session took its part (4 racks x 4 workers at 10 MB/s: 12.5-16.0 s, one
    round each, against 10.9 s so; docs/p2p.md). Both start at the whole limit; together they are
    within it once their rates are seen (libtorrent's rates lag about a second; ``peak`` in the
    download's trace is the most they took together, over the limit)."""
    if not limit:
        return 0, 0
    floor = max(1, limit // 10)
    return max(floor, limit - int(crossing)), max(floor, limit - int(main))
