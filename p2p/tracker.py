"""A minimal BitTorrent tracker (BEP 3 announce, BEP 23 compact peers) for the origin daemon.

Why one at all: workers that already hold a version seed it, and two seeds drop their connection to
each other, so the origin never learns of them through peer exchange and a worker joining later only
meets the origin. Every node announces to this endpoint (``[p2p] trackers``), so a late worker is told
about every seed. State is in memory (peers re-announce every ``interval``); no whitelist is needed
because the origin only ever answers for the swarm it is part of and the allowlist applies to peers.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import struct
import time
from urllib.parse import parse_qs

import libtorrent as lt

INTERVAL_S = 30
PEER_TTL_S = 3 * INTERVAL_S
MAX_PEERS = 200


class Tracker:
    def __init__(self, allow: tuple[str, ...] = ("0.0.0.0/0",), now=time.monotonic) -> None:
        self.swarms: dict[bytes, dict[tuple[str, int], float]] = {}
        self.allow = [ipaddress.ip_network(c, strict=False) for c in allow]
        self.now = now

    def announce(self, remote_ip: str, raw_query: str) -> bytes:
        """The bencoded answer to one announce request."""
        q = parse_qs(raw_query, encoding="latin-1", keep_blank_values=True)
        try:
            info_hash = q["info_hash"][0].encode("latin-1")
            port = int(q["port"][0])
        except (KeyError, IndexError, ValueError):
            return _fail("info_hash and port are required")
        if len(info_hash) != 20 or not 0 < port < 65536:
            return _fail("malformed info_hash or port")
        try:
            ip = ipaddress.ip_address(remote_ip)
        except ValueError:
            return _fail("unknown address")
        if not any(ip in net for net in self.allow) or ip.version != 4:
            return _fail("not allowed")
        now = self.now()
        swarm = self.swarms.setdefault(info_hash, {})
        for peer, seen in list(swarm.items()):
            if now - seen > PEER_TTL_S:
                del swarm[peer]
        me = (remote_ip, port)
        if q.get("event", [""])[0] == "stopped":
            swarm.pop(me, None)
            return lt.bencode({b"interval": INTERVAL_S, b"peers": b""})
        swarm[me] = now
        try:  # numwant (BEP 3 suggests 50 by default; libtorrent asks for 200), capped at MAX_PEERS
            want = max(0, min(MAX_PEERS, int(q.get("numwant", [str(MAX_PEERS)])[0])))
        except ValueError:
            want = MAX_PEERS
        others = [p for p in swarm if p != me]
        if len(others) > want:  # a random sample: in a large fleet, not everyone meets the same first few
            others = random.sample(others, want)
        compact = b"".join(socket.inet_aton(h) + struct.pack(">H", pt) for h, pt in others)
        return lt.bencode({b"interval": INTERVAL_S, b"min interval": 5, b"peers": compact})


def _fail(reason: str) -> bytes:
    return lt.bencode({b"failure reason": reason.encode()})
