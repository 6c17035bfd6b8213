"""A minimal BitTorrent tracker (BEP 3 announce, BEP 23 compact peers) for the origin daemon.

Why one at all: workers that already hold a version seed it, and two seeds drop their connection to
each other, so the origin never learns of them through peer exchange and a worker joining later only
meets the origin. Every node announces to this endpoint (``[p2p] trackers``), so a late worker is told
about every seed. State is in memory (peers re-announce every ``interval``).

It serves the fleet and nothing else, whoever sends what:

- **only published versions**: ``known(info_hash)`` (the daemon: the 20 bytes a v2 torrent announces,
  the first half of its SHA-256 info-hash, of a version the origin seeds) decides; any other hash is
  refused and creates nothing, so random info-hashes cost no memory;
- **per IP**: at most ``per_ip`` entries of one address in a swarm; a new port of that address replaces
  its oldest (a restarted node keeps one slot; one host announcing 300 ports holds ``per_ip``);
- **per swarm**: at most ``per_swarm`` peers; a newcomer to a full swarm is refused until peers expire;
- **expiry**: a peer that has not announced for two intervals is gone; every swarm is an insertion-
  ordered dict kept in last-seen order, so expiry pops from its front (amortised O(1) per announce);
  an emptied swarm is freed;
- **bounded memory**: ``len(known) x per_swarm`` entries at most, and never more than ``max_swarms``.

With fleet TLS the daemon serves it over HTTPS and requires a client certificate from the fleet CA
(libtorrent presents the torrent's certificate to an https tracker of an SSL torrent), so a host outside
the fleet cannot even ask. ``allow`` applies in every mode.

``announce`` returns the bencoded answer and the reason of a refusal (None when served), which the
daemon counts in ``weightd_trust_refusals_total{reason}``.

Two things for the piece plan (``plan.py``), beyond BEP 3:

- **racks**: a node's tracker URL carries ``rack=NAME`` (``[p2p] rack``); an answer lists peers of the
  asker's rack first, then the others;
- **the list of downloading workers** (``members``, served as ``GET /swarm?info_hash=...&rack=...``):
  a worker asks for it about once a second while it downloads, and each request registers the asker
  (with its rack) for ``MEMBER_TTL_S``; ``done=1`` removes it. The answer is every worker registered,
  with its rack, as JSON. Every worker plans its slices on this one list, so they agree on who owns
  what, and a worker that dies leaves it within seconds. (libtorrent's own announces cannot say this:
  a worker waiting for a slice owner wants nothing for a moment and counts as finished.) Downloading
  peers are also asked to announce every ``LEECH_INTERVAL_S``, so they learn of late joiners.
  A worker fetching a partial copy says which files it wants (``want=TAG``, the same tag for the same
  files): the list it gets has only the workers that want the same, and ``others`` the rest (they
  own no piece of its plan: a worker never takes a slice of pieces it does not want). A worker also
  says which owners its plan dropped (``drop=``), and every answer lists them (``dropped``, once two
  workers say so); and
  which of its rack's gateways its plan skipped (``skip=``: stalled, or never connected), listed as
  ``skipped`` so that other racks serve the worker that takes across in their place;
- **crossing sessions** (``[p2p] crossing``, ``p2p/crossing.py``): an announce with ``crossing=1`` is
  kept in a swarm of its own (the info-hash's crossing swarm, never in the member list), and is
  answered with crossing sessions of other racks only.
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
import socket
import struct
import time
from collections import Counter
from typing import Callable
from urllib.parse import parse_qs

import libtorrent as lt

from .config import RACK, address_allowed, peer_address

INTERVAL_S = 30
PEER_TTL_S = 2 * INTERVAL_S     # two intervals without an announce: gone
MAX_PEERS = 200                 # handed out per answer (libtorrent asks for 200)
PER_IP = 4                      # entries of one address in one swarm
PER_SWARM = 10_000              # peers in one swarm
MAX_SWARMS = 4_096              # swarms at once, whatever ``known`` says
MAX_DROPS = 64                  # owners one request may say it plans without
MAX_QUERY = 2_048               # bytes of query string parsed (an announce is ~300)
LEECH_INTERVAL_S = 5            # re-announce interval asked of peers still downloading
DROP_TTL_S = 10.0               # an owner said to be dropped stays so this long after the last worker said it
MEMBER_TTL_S = 4.0              # a worker that has not asked for the member list this long is not on it
CROSSING = b"x"                 # appended to an info-hash: the swarm of its crossing sessions (crossing=1)
WANT = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")   # what a worker wants of a swarm (a partial copy's tag)

Peer = tuple[str, int]


class _Swarm:
    """The peers of one info-hash: in last-seen order (expiry pops from the front), in a list for O(k)
    random samples, and by address (the per-IP cap without a scan)."""
    __slots__ = ("seen", "slots", "index", "by_ip", "rack", "leeching", "members", "said", "told_at")

    def __init__(self) -> None:
        self.seen: dict[Peer, float] = {}
        self.slots: list[Peer] = []
        self.index: dict[Peer, int] = {}
        self.by_ip: dict[str, list[int]] = {}
        self.rack: dict[Peer, str] = {}       # peers that said which rack they are in
        self.leeching: set[Peer] = set()      # peers whose last announce had left > 0 (not a partial seed's)
        self.members: dict[str, tuple[str, str, float]] = {}   # downloading workers: ip -> (rack, want, last asked)
        # "drop" / "skip": worker -> (the owners its plan dropped / its rack's gateways it skipped, when it said so)
        self.said: dict[str, dict[str, tuple[frozenset[str], float]]] = {"drop": {}, "skip": {}}
        self.told_at: dict[tuple[str, str], tuple[float, list[str]]] = {}   # (kind, want) -> (when, the list): once a second

    def __len__(self) -> int:
        return len(self.slots) + len(self.members)

    def touch(self, peer: Peer, now: float) -> None:
        if peer in self.seen:
            del self.seen[peer]  # (re-inserted at the end: last-seen order)
        else:
            self.index[peer] = len(self.slots)
            self.slots.append(peer)
            self.by_ip.setdefault(peer[0], []).append(peer[1])
        self.seen[peer] = now

    def remove(self, peer: Peer) -> None:
        if self.seen.pop(peer, None) is None:
            return
        self.rack.pop(peer, None)
        self.leeching.discard(peer)
        i, last = self.index.pop(peer), self.slots.pop()
        if last != peer:  # (swap the last one into the hole)
            self.slots[i], self.index[last] = last, i
        ports = self.by_ip[peer[0]]
        ports.remove(peer[1])
        if not ports:
            del self.by_ip[peer[0]]

    def expire(self, now: float, ttl: float) -> None:
        for ip, (_, _, t) in list(self.members.items()):
            if now - t > MEMBER_TTL_S:
                del self.members[ip]
        while self.seen:
            peer, seen = next(iter(self.seen.items()))  # the least recently seen
            if now - seen <= ttl:
                break
            self.remove(peer)

    def dropped_by(self, reporter: str, named: list[str], now: float) -> None:
        """``reporter`` plans without these owners (its plan found them stalled or late, p2p/plan.py):
        what it says replaces what it said before. Only workers wanting what it wants count (a group
        of ``want=`` plans apart), and a worker naming more than a quarter of its group (at least one)
        or more than MAX_DROPS is not heeded: one confused or hostile worker cannot make the others
        plan without everyone (each would pull everything from the origin); ``told`` lists an owner
        only once two of the group say so (one in a group of two): one cannot drop the owners, or the
        gateways, ranked before it."""
        want = self.members[reporter][1]
        group = sum(1 for _, w, _ in self.members.values() if w == want)
        names = frozenset(ip for ip in named if ip != reporter and ip in self.members and self.members[ip][1] == want)
        self._say("drop", reporter, names, len(named) <= MAX_DROPS and len(names) <= max(1, group // 4), now)

    def skipped_by(self, reporter: str, named: list[str], now: float) -> None:
        """``reporter`` plans past these gateways of its own rack (stalled, or listed and never
        connected): what it says replaces what it said before. Only workers of its rack that want
        what it wants count, at most half its rack (the first by address); ``told`` lists a gateway
        only once two of its rack-mates say so (one in a rack of two): one hostile worker cannot
        hand its rack's crossing to itself by skipping the gateways ranked before it."""
        rack, want, _ = self.members[reporter]
        mates = {ip for ip, (r, w, _) in self.members.items() if r == rack and w == want}
        names = sorted(ip for ip in set(named) if ip != reporter and ip in mates)[:max(1, len(mates) // 2)]
        self._say("skip", reporter, frozenset(names), bool(rack) and len(named) <= MAX_DROPS, now)

    def _say(self, kind: str, reporter: str, names: frozenset[str], heeded: bool, now: float) -> None:
        if heeded and names:
            self.said[kind][reporter] = (names, now)
        else:
            self.said[kind].pop(reporter, None)

    def told(self, kind: str, want: str, now: float) -> list[str]:
        """The owners some worker wanting ``want`` dropped (``kind`` "drop"), or the gateways skipped
        ("skip"), said within DROP_TTL_S by two workers still on the list (one where only one other
        could: a group, or for a skip a rack, of two); made at most once a second per group (a
        fleet's requests each second all ask)."""
        made = self.told_at.get((kind, want))
        if made is not None and now - made[0] < 1.0:
            return made[1]
        sayers: dict[str, int] = {}
        said = self.said[kind]
        for who, (names, t) in list(said.items()):
            if now - t > DROP_TTL_S or who not in self.members:
                del said[who]
            elif self.members[who][1] == want:
                for ip in names:
                    sayers[ip] = sayers.get(ip, 0) + 1
        # two must say it (one where only one other could): a drop by two of the group, a skip by two
        # of the gateway's rack-mates; one hostile worker alone cannot make the others plan without
        # the owners (or the gateways) ranked before it
        by = (lambda r: r) if kind == "skip" else (lambda r: "")   # (a skip counts its rack, a drop the group)
        size = Counter(by(r) for r, w, _ in self.members.values() if w == want)
        got = sorted(ip for ip, n in sayers.items()
                     if ip in self.members and n >= min(2, size[by(self.members[ip][0])] - 1))
        self.told_at[(kind, want)] = (now, got)
        if len(self.told_at) > 128:   # (groups come and go)
            self.told_at.pop(next(iter(self.told_at)))
        return got

    def sample(self, want: int, me: Peer, rack: str = "") -> list[Peer]:
        """Up to ``want`` peers other than ``me``: of ``rack`` first (random among them), then random."""
        first: list[Peer] = []
        if rack:
            first = [p for p, r in self.rack.items() if r == rack and p != me]
            random.shuffle(first)
            if len(first) >= want:
                return first[:want]
        n = len(self.slots)
        picks = random.sample(range(n), min(n, want + 1 + len(first)))  # (more: ``me`` and ``first`` are skipped)
        taken = set(first)
        rest = [p for p in (self.slots[i] for i in picks) if p != me and p not in taken]
        return (first + rest)[:want]

    def across(self, want: int, me: Peer, rack: str) -> list[Peer]:
        """Up to ``want`` peers that said they are in a rack other than ``rack`` (random among them):
        what a crossing session is told of (it exchanges pieces with other racks' only; an asker with no
        rack is told of none)."""
        picks = [p for p, r in self.rack.items() if rack and r != rack and p != me]
        random.shuffle(picks)
        return picks[:want]


class Tracker:
    def __init__(self, allow: tuple[str, ...] = ("0.0.0.0/0",), *, known: Callable[[bytes], bool],
                 now: Callable[[], float] = time.monotonic, interval: int = INTERVAL_S, per_ip: int = PER_IP,
                 per_swarm: int = PER_SWARM, max_swarms: int = MAX_SWARMS) -> None:
        self.swarms: dict[bytes, _Swarm] = {}
        self.allow = [ipaddress.ip_network(c, strict=False) for c in allow]
        self.known, self.now = known, now
        self.interval, self.ttl = interval, 2 * interval
        self.per_ip, self.per_swarm, self.max_swarms = per_ip, per_swarm, max_swarms
        self.swept = now()

    def allowed(self, remote_ip: str) -> bool:
        """An IPv4 address (an IPv4-mapped one as its IPv4 address: :func:`.config.peer_address`, as the
        accept guard reads it) inside the allowlist (anything else, an unparsable address included: no)."""
        a = peer_address(remote_ip)
        return a is not None and a.version == 4 and address_allowed(remote_ip, self.allow)

    def peers(self) -> int:
        return sum(len(s.slots) for s in list(self.swarms.values()))  # (a scrape thread may ask)

    def announce(self, remote_ip: str, raw_query: str) -> tuple[bytes, str | None]:
        """The bencoded answer to one announce request, and why it was refused (None: served)."""
        if len(raw_query) > MAX_QUERY:
            return _fail("announce too long"), "tracker_malformed"
        try:
            q = parse_qs(raw_query, encoding="latin-1", keep_blank_values=True, max_num_fields=32)
            info_hash = q["info_hash"][0].encode("latin-1")
            port = int(q["port"][0])
        except (KeyError, IndexError, ValueError):
            return _fail("info_hash and port are required"), "tracker_malformed"
        if len(info_hash) != 20 or not 0 < port < 65536:
            return _fail("malformed info_hash or port"), "tracker_malformed"
        if not self.allowed(remote_ip):
            return _fail("not allowed"), "tracker_not_allowed"
        me = (str(peer_address(remote_ip)), port)   # (::ffff:10.0.0.5 is the peer 10.0.0.5)
        now = self.now()
        known = info_hash
        if q.get("crossing", [""])[0] == "1":   # (a crossing session: a swarm of its own, see the module's doc)
            info_hash += CROSSING
        swarm = self._current(info_hash, now)
        if q.get("event", [""])[0] == "stopped":
            if swarm is not None:
                swarm.remove(me)
                if not swarm:
                    del self.swarms[info_hash]
            return lt.bencode({b"interval": self.interval, b"peers": b""}), None
        if swarm is None:
            if not self.known(known):  # (asked only for hashes without a swarm: a swarm's hash was known)
                return _fail("unknown info_hash: not a version this fleet publishes"), "tracker_unknown_torrent"
            if len(self.swarms) >= self.max_swarms:
                self._expire_all(now)
                if len(self.swarms) >= self.max_swarms:
                    return _fail("too many swarms"), "tracker_full"
            swarm = self.swarms[info_hash] = _Swarm()
        if me not in swarm.seen:
            ports = swarm.by_ip.get(me[0], ())
            if len(ports) >= self.per_ip:  # a new port of the same address replaces its oldest entry
                swarm.remove((me[0], ports[0]))
            elif len(swarm.slots) >= self.per_swarm:
                return _fail("swarm full"), "tracker_full"
        swarm.touch(me, now)
        return self._answer(swarm, me, q, info_hash != known), None

    def _current(self, info_hash: bytes, now: float) -> _Swarm | None:
        """The swarm of ``info_hash`` with its expired peers gone (None: none, or none left); every
        swarm is swept once an interval (swarms nobody announces to any more are freed too)."""
        if now - self.swept > self.interval:
            self._expire_all(now)
        swarm = self.swarms.get(info_hash)
        if swarm is not None:
            swarm.expire(now, self.ttl)
            if not swarm:
                del self.swarms[info_hash]
                swarm = None
        return swarm

    def _answer(self, swarm: _Swarm, me: Peer, q: dict[str, list[str]], crossing: bool = False) -> bytes:
        """Record what ``me`` said of itself (its rack; downloading or not) and answer it: a random
        sample of the swarm (its rack's peers first; a crossing session: other racks' only), compact,
        and the interval to come back at."""
        rack = q.get("rack", [""])[0]
        if rack and RACK.fullmatch(rack):
            swarm.rack[me] = rack
        try:
            left = int(q.get("left", ["0"])[0])
        except ValueError:
            left = 0
        # (event=paused: a partial seed, BEP 21, as a node seeding a partial copy announces: it has
        # ``left`` but downloads nothing, and re-announces at the seeds' interval)
        if left > 0 and q.get("event", [""])[0] not in ("completed", "paused"):
            swarm.leeching.add(me)
        else:
            swarm.leeching.discard(me)
        try:  # numwant (BEP 3 suggests 50 by default; libtorrent asks for 200), capped at MAX_PEERS
            want = max(0, min(MAX_PEERS, int(q.get("numwant", [str(MAX_PEERS)])[0])))
        except ValueError:
            want = MAX_PEERS
        # a random sample: in a large fleet, not everyone meets the same first few
        rack = swarm.rack.get(me, "")
        picks = swarm.sample(want, me, rack) if not crossing else swarm.across(want, me, rack)
        compact = b"".join(socket.inet_aton(h) + struct.pack(">H", pt) for h, pt in picks)
        interval = min(self.interval, LEECH_INTERVAL_S) if me in swarm.leeching else self.interval
        return lt.bencode({b"interval": interval, b"min interval": min(5, interval), b"peers": compact})

    def members(self, remote_ip: str, raw_query: str) -> tuple[bytes, str | None]:
        """``GET /swarm?info_hash=...[&rack=NAME][&want=TAG][&done=1]``: register the asker as a worker
        downloading this swarm (``done=1``: no longer), and answer the registered workers that want
        what it wants (``TAG``: a partial copy's files; none: every file) as JSON
        ``{"interval": s, "downloading": [[ip, rack], ...], "others": [[ip, rack], ...]}``, ``others``
        being the workers that want other files, ``"dropped": [ip, ...]`` the workers of the list some
        worker plans without (``drop=IP,...``: the asker's own plan found them stalled or late; listed
        once two of the group say it, kept DROP_TTL_S after), so every worker moves their slices at once instead of
        each on its own clock; ``"skipped"`` likewise the gateways some worker skipped (``skip=``,
        listed once two rack-mates say it). Same allowlist as announces; only for a version this
        fleet publishes;
        at most ``per_swarm`` workers."""
        if len(raw_query) > MAX_QUERY:
            return _json_fail("query too long"), "tracker_malformed"
        try:
            q = parse_qs(raw_query, encoding="latin-1", keep_blank_values=True, max_num_fields=8)
            info_hash = q["info_hash"][0].encode("latin-1")
        except (KeyError, IndexError, ValueError):
            return _json_fail("info_hash is required"), "tracker_malformed"
        rack = q.get("rack", [""])[0]
        want = q.get("want", [""])[0]
        if len(info_hash) != 20 or (rack and not RACK.fullmatch(rack)) or (want and not WANT.fullmatch(want)):
            return _json_fail("malformed info_hash, rack or want"), "tracker_malformed"
        if not self.allowed(remote_ip):
            return _json_fail("not allowed"), "tracker_not_allowed"
        remote_ip = str(peer_address(remote_ip))
        swarm = self.swarms.get(info_hash)
        if swarm is None:
            if not self.known(info_hash):
                return _json_fail("unknown info_hash: not a version this fleet publishes"), "tracker_unknown_torrent"
            if len(self.swarms) >= self.max_swarms:
                return _json_fail("too many swarms"), "tracker_full"
            swarm = self.swarms[info_hash] = _Swarm()
        now = self.now()
        swarm.expire(now, self.ttl)
        if q.get("done", [""])[0] == "1":
            swarm.members.pop(remote_ip, None)
        elif remote_ip in swarm.members or len(swarm.members) < self.per_swarm:
            swarm.members[remote_ip] = (rack, want, now)
            swarm.dropped_by(remote_ip, [x for x in q.get("drop", [""])[0].split(",", MAX_DROPS + 1) if x], now)
            swarm.skipped_by(remote_ip, [x for x in q.get("skip", [""])[0].split(",", MAX_DROPS + 1) if x], now)
        else:
            return _json_fail("swarm full"), "tracker_full"
        rows = sorted((m, r) for m, (r, w, _) in swarm.members.items() if w == want)
        others = sorted((m, r) for m, (r, w, _) in swarm.members.items() if w != want)
        return json.dumps({"interval": 1, "downloading": rows, "others": others,
                           "dropped": swarm.told("drop", want, now), "skipped": swarm.told("skip", want, now)}).encode(), None

    def _expire_all(self, now: float) -> None:
        self.swept = now
        for h, s in list(self.swarms.items()):
            s.expire(now, self.ttl)
            if not s:
                del self.swarms[h]

    def forget(self, info_hash: bytes) -> None:
        """Drop a swarm and its crossing sessions' (its version is no longer published or seeded)."""
        self.swarms.pop(info_hash, None)
        self.swarms.pop(info_hash + CROSSING, None)


def announced_hash(v2_hex: str) -> bytes:
    """The 20 bytes libtorrent sends as ``info_hash`` for a v2-only torrent: its SHA-256 info-hash
    truncated (BEP 52), given as the 64 hex digits of ``str(info_hashes().v2)``."""
    return bytes.fromhex(v2_hex)[:20]


def _json_fail(reason: str) -> bytes:
    return json.dumps({"failure": reason}).encode()


def _fail(reason: str) -> bytes:
    return lt.bencode({b"failure reason": reason.encode()})
