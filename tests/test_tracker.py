"""The origin's tracker serves the fleet only (issue #14): published versions, capped per IP and per
swarm, peers expire after two intervals, memory bounded whatever is announced. Unit tests on a clock
the test moves, then a real ``weightd serve --role origin`` taking 10,000 hostile announces over HTTP,
and its HTTPS endpoint with fleet TLS (client certificates from the fleet CA only)."""

from __future__ import annotations

import http.client
import os
import random
import re
import socket
import ssl
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote_from_bytes

import libtorrent as lt
import pytest

from p2p.tracker import INTERVAL_S, MAX_PEERS, PER_IP, Tracker, announced_hash
from tiering.sample import make_checkpoint

from .test_p2p import Node, free_port

KNOWN = bytes(range(20))


def q(info_hash: bytes = KNOWN, port: int = 7000, extra: str = "") -> str:
    return f"info_hash={quote_from_bytes(info_hash)}&peer_id=x&port={port}&left=0&compact=1{extra}"


def peers_of(answer: tuple[bytes, str | None]) -> list[tuple[str, int]]:
    body, refused = answer
    assert refused is None, lt.bdecode(body)
    raw = lt.bdecode(body)[b"peers"]
    return [(socket.inet_ntoa(raw[i:i + 4]), int.from_bytes(raw[i + 4:i + 6], "big")) for i in range(0, len(raw), 6)]


def tracker(clock: list[float] | None = None, **kw) -> Tracker:
    clock = clock if clock is not None else [0.0]
    return Tracker(("127.0.0.0/8",), known=lambda h: h == KNOWN, now=lambda: clock[0], **kw)


def test_announce_and_bad_requests() -> None:
    t = tracker()
    assert peers_of(t.announce("127.0.0.3", q())) == []
    assert peers_of(t.announce("127.0.0.4", q(port=7001))) == [("127.0.0.3", 7000)]
    for ip, query, reason in (("10.1.2.3", q(), "tracker_not_allowed"),        # outside the allowlist
                              ("::1", q(), "tracker_not_allowed"),
                              ("127.0.0.5", "port=1", "tracker_malformed"),     # no info_hash
                              ("127.0.0.5", "info_hash=abc&port=1", "tracker_malformed"),
                              ("127.0.0.5", q(port=0), "tracker_malformed"),
                              ("127.0.0.5", q(extra="&x=" + "a" * 3000), "tracker_malformed"),
                              ("127.0.0.5", q(extra="&x=1" * 40), "tracker_malformed")):
        body, refused = t.announce(ip, query)
        assert refused == reason and b"failure reason" in lt.bdecode(body), (ip, query[:60])


def test_only_published_versions_are_tracked() -> None:
    """1,000 random info-hashes: each refused, none creates a swarm."""
    t = tracker()
    rng = random.Random(1)
    for _ in range(1000):
        body, refused = t.announce("127.0.0.3", q(rng.randbytes(20), rng.randrange(1, 65536)))
        assert refused == "tracker_unknown_torrent" and b"not a version this fleet publishes" in body
    assert t.swarms == {} and t.peers() == 0
    peers_of(t.announce("127.0.0.3", q()))
    assert list(t.swarms) == [KNOWN]


def test_v2_torrents_announce_the_truncated_sha256() -> None:
    """What libtorrent sends for a v2-only torrent, and what the origin's session recognises."""
    h = "10a2e2d3a08f2302a54f5ba42b458cf2a12c6ced" + "ab" * 12
    assert announced_hash(h) == bytes.fromhex(h[:40])


def test_one_address_holds_per_ip_entries() -> None:
    """One IP announcing 300 ports holds PER_IP entries (its newest); a newcomer meets everyone else."""
    t = tracker()
    for i in range(50):
        peers_of(t.announce(f"127.0.1.{i + 1}", q()))
    for port in range(10000, 10300):
        peers_of(t.announce("127.0.0.66", q(port=port)))
    got = peers_of(t.announce("127.0.0.99", q()))
    mine = [p for p in got if p[0] == "127.0.0.66"]
    assert sorted(mine) == [("127.0.0.66", p) for p in range(10300 - PER_IP, 10300)]
    assert len(got) == 50 + PER_IP and t.peers() == 50 + PER_IP + 1


def test_peers_expire_after_two_intervals_and_swarms_are_freed() -> None:
    clock = [0.0]
    t = tracker(clock)
    peers_of(t.announce("127.0.0.3", q()))
    clock[0] = 2 * INTERVAL_S - 1                       # still there just before two intervals
    assert peers_of(t.announce("127.0.0.4", q())) == [("127.0.0.3", 7000)]
    clock[0] = 2 * INTERVAL_S + 1                       # .3 stopped announcing two intervals ago
    assert peers_of(t.announce("127.0.0.5", q())) == [("127.0.0.4", 7000)]
    clock[0] += 3 * INTERVAL_S                          # nobody announces: the swarm itself is freed
    t.announce("127.0.0.6", q(b"\x01" * 20))            # (any announce sweeps)
    assert t.swarms == {}
    peers_of(t.announce("127.0.0.3", q()))
    peers_of(t.announce("127.0.0.3", q(extra="&event=stopped")))
    assert t.swarms == {}


def test_full_swarm_refuses_newcomers_until_peers_expire() -> None:
    clock = [0.0]
    t = tracker(clock, per_swarm=10)
    for i in range(10):
        peers_of(t.announce(f"127.0.2.{i + 1}", q()))
    assert t.announce("127.0.3.1", q())[1] == "tracker_full"
    assert len(peers_of(t.announce("127.0.2.1", q()))) == 9      # members re-announce as before
    clock[0] = 2 * INTERVAL_S + 1
    assert peers_of(t.announce("127.0.3.1", q())) == []


def test_random_sample_of_a_large_swarm() -> None:
    t = tracker()
    for i in range(300):
        peers_of(t.announce(f"127.0.{i // 250}.{i % 250 + 1}", q()))
    a, b = peers_of(t.announce("127.1.0.1", q())), peers_of(t.announce("127.1.0.2", q()))
    assert len(a) == len(b) == MAX_PEERS and a != b        # not everyone gets the same first 200
    assert ("127.1.0.2", 7000) not in b and len(set(b)) == len(b)
    assert len(peers_of(t.announce("127.1.0.3", q(extra="&numwant=30")))) == 30
    assert len(peers_of(t.announce("127.1.0.4", q(extra="&numwant=lots")))) == MAX_PEERS


def test_a_large_swarm_stays_cheap() -> None:
    """10,000 members re-announcing: every announce is O(answer), not O(swarm)."""
    t = tracker()
    ips = [f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255 or 1}" for i in range(10_000)]
    for ip in ips:
        t.announce(ip, q())
    t0 = time.process_time()
    for ip in ips[:3000]:
        t.announce(ip, q())
    assert time.process_time() - t0 < 3.0  # (~0.2 s here; a scan of the swarm per announce takes > 10 s)


# -- the real daemon -----------------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


def metric(node: Node, name: str, labels: str) -> float:
    listen = re.search(r'\[metrics\]\nlisten = "([^"]+)"', node.config.read_text()).group(1)
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f"{name}{{{labels}}} " if labels else f"{name} "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_origin_tracker_under_10000_hostile_announces(tmp_path: Path, isolated_env) -> None:
    """A real origin: a published version's hash is tracked; 10,000 announces with random hashes and
    ports are refused, counted, and leave its RSS where it was; one address's 300 ports hold PER_IP."""
    origin = Node(tmp_path, "127.0.0.2", tmp_path / "cold", env=isolated_env, role="origin")
    conn = None
    try:
        src = make_checkpoint(tmp_path / "src", total_bytes=2 * 1024 * 1024, shards=1, layers=2)
        assert origin.cli("publish", str(src), "--name", "org/t", "--version", "v1").returncode == 0
        ti = lt.torrent_info(str(tmp_path / "cold/org/t/v1/.weightd/checkpoint.torrent"))
        known = announced_hash(str(ti.info_hashes().v2))
        conn = http.client.HTTPConnection("127.0.0.2", origin.tracker_port, timeout=10)

        def get(query: str) -> dict:
            conn.request("GET", "/announce?" + query)
            resp = conn.getresponse()
            assert resp.status == 200
            return lt.bdecode(resp.read())
        deadline = time.monotonic() + 30  # (the origin seeds what it published: then its tracker knows it)
        while b"failure reason" in get(q(known, 6000)):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        rng = random.Random(7)
        for _ in range(500):  # warm up: allocator and aiohttp reach their steady state
            get(q(rng.randbytes(20), rng.randrange(1, 65536)))
        before = rss_kib(origin.proc.pid)
        t0 = time.monotonic()
        for _ in range(10_000):
            assert b"failure reason" in get(q(rng.randbytes(20), rng.randrange(1, 65536)))
        took = time.monotonic() - t0
        for port in range(20000, 20300):
            get(q(known, port))
        after = rss_kib(origin.proc.pid)
        # (KiB: 10,000 swarms of one peer each cost ~5 MiB in a tracker that keeps them; measured here: +4 KiB)
        assert after - before < 2 * 1024, (before, after)
        got = get(q(known, 6001))[b"peers"]
        addrs = [(socket.inet_ntoa(got[i:i + 4]), int.from_bytes(got[i + 4:i + 6], "big"))
                 for i in range(0, len(got), 6)]
        # (every request comes from 127.0.0.1: its newest PER_IP ports are kept, 6001 the newest of all)
        assert sorted(p for _, p in addrs) == list(range(20300 - PER_IP + 1, 20300)), addrs
        assert metric(origin, "weightd_trust_refusals_total", 'reason="tracker_unknown_torrent"') >= 10_500
        assert metric(origin, "weightd_tracker_peers", "") == PER_IP
        print(f"10,000 refused announces in {took:.1f} s; RSS {before} -> {after} KiB")
    finally:
        if conn is not None:
            conn.close()
        origin.stop()


@pytest.fixture
def tls_origin(tmp_path: Path, isolated_env):
    from p2p import write_fleet
    f = write_fleet(tmp_path / "pki", ["127.0.0.2", "127.0.0.3"], ips={"127.0.0.2": ["127.0.0.2"]})
    from p2p import issue_cert, make_ca
    other, other_key = make_ca("another fleet")
    c, k = issue_cert(other, other_key, "intruder")
    (tmp_path / "pki/intruder.pem").write_bytes(c)
    (tmp_path / "pki/intruder.key").write_bytes(k)
    os.chmod(tmp_path / "pki/intruder.key", 0o600)
    tls = f'tls = {{ ca = "{f["ca"]}", cert = "{f["127.0.0.2"]}", key = "{f["127.0.0.2.key"]}" }}\n'
    origin = Node(tmp_path, "127.0.0.2", tmp_path / "cold", env=isolated_env, role="origin", p2p_extra=tls)
    try:
        yield origin, f, tmp_path / "pki"
    finally:
        origin.stop()


def wait_listening(ip: str, port: int) -> None:
    deadline = time.monotonic() + 20  # (the tracker starts after the API socket appears)
    while True:
        try:
            socket.create_connection((ip, port), timeout=2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {ip}:{port}"
            time.sleep(0.1)


def test_tls_tracker_requires_a_fleet_client_certificate(tls_origin) -> None:
    origin, f, pki = tls_origin
    wait_listening("127.0.0.2", origin.tracker_port)

    def ask(cert: tuple[Path, Path] | None, path: str = "/announce?") -> bytes:
        ctx = ssl.create_default_context(cafile=str(f["ca"]))
        if cert:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        conn = http.client.HTTPSConnection("127.0.0.2", origin.tracker_port, timeout=10, context=ctx)
        try:
            conn.request("GET", path + q())
            return conn.getresponse().read()
        finally:
            conn.close()
    assert b"not a version this fleet publishes" in ask((f["127.0.0.3"], f["127.0.0.3.key"]))  # served
    # the member list (which registers the asker) sits behind the same client certificates
    assert b"not a version this fleet publishes" in ask((f["127.0.0.3"], f["127.0.0.3.key"]), "/swarm?")
    for cert in (None, (pki / "intruder.pem", pki / "intruder.key")):
        for path in ("/announce?", "/swarm?"):
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                ask(cert, path)
    conn = http.client.HTTPConnection("127.0.0.2", origin.tracker_port, timeout=10)  # plain HTTP
    try:
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            conn.request("GET", "/announce?" + q())
            conn.getresponse().read()
    finally:
        conn.close()


def members_of(answer: tuple[bytes, str | None]) -> list[list[str]]:
    import json
    body, refused = answer
    assert refused is None, body
    return json.loads(body)["downloading"]


def test_member_list_registers_askers_with_racks_and_forgets_them() -> None:
    """``GET /swarm``: every worker asking about once a second is on the list (with its rack) for
    MEMBER_TTL_S; ``done=1`` takes it off at once; unknown hashes, outsiders and bad racks are refused
    and create nothing."""
    from p2p.tracker import MEMBER_TTL_S
    clock = [0.0]
    t = tracker(clock)
    h = f"info_hash={quote_from_bytes(KNOWN)}"
    assert members_of(t.members("127.0.0.3", h + "&rack=r1")) == [["127.0.0.3", "r1"]]
    assert members_of(t.members("127.0.0.4", h)) == [["127.0.0.3", "r1"], ["127.0.0.4", ""]]
    clock[0] = MEMBER_TTL_S - 1
    assert members_of(t.members("127.0.0.4", h)) == [["127.0.0.3", "r1"], ["127.0.0.4", ""]]
    clock[0] = MEMBER_TTL_S + 0.5   # 127.0.0.3 stopped asking (died): gone
    assert members_of(t.members("127.0.0.4", h)) == [["127.0.0.4", ""]]
    assert members_of(t.members("127.0.0.4", h + "&done=1")) == []
    for ip, query, reason in (("10.1.2.3", h, "tracker_not_allowed"),
                              ("127.0.0.5", f"info_hash={quote_from_bytes(bytes(20))}", "tracker_unknown_torrent"),
                              ("127.0.0.5", h + "&rack=../x", "tracker_malformed"),
                              ("127.0.0.5", h + "&rack=" + "a" * 80, "tracker_malformed"),
                              ("127.0.0.5", "rack=r1", "tracker_malformed")):
        assert t.members(ip, query)[1] == reason, query
    assert len(t.swarms) == 1


def test_registered_members_do_not_count_against_the_announce_cap() -> None:
    t = tracker(per_swarm=3)
    h = f"info_hash={quote_from_bytes(KNOWN)}"
    for i in range(3):   # (workers are on both lists while they download)
        assert t.members(f"127.0.0.{10 + i}", h)[1] is None
        assert t.announce(f"127.0.0.{10 + i}", q())[1] is None


def test_member_list_is_bounded_per_swarm() -> None:
    t = tracker(per_swarm=3)
    h = f"info_hash={quote_from_bytes(KNOWN)}"
    for i in range(3):
        assert t.members(f"127.0.0.{10 + i}", h)[1] is None
    assert t.members("127.0.0.20", h)[1] == "tracker_full"
    assert t.members("127.0.0.10", h)[1] is None   # (one already on it keeps asking)


def test_announces_hand_out_same_rack_peers_first() -> None:
    t = tracker()
    for i in range(40):
        t.announce(f"127.0.{i % 4}.{10 + i}", q(port=7000, extra=f"&rack=r{i % 4}"))
    got = peers_of(t.announce("127.0.1.200", q(port=7000, extra="&rack=r1&numwant=15")))
    assert len(got) == 15
    assert all(ip.startswith("127.0.1.") for ip, _ in got[:10])   # the ten of rack r1 first
    assert len({ip for ip, _ in got}) == len(got)


def test_downloading_peers_are_asked_to_announce_often() -> None:
    from p2p.tracker import LEECH_INTERVAL_S
    t = tracker()
    body, _ = t.announce("127.0.0.3", q().replace("left=0", "left=100"))
    assert lt.bdecode(body)[b"interval"] == LEECH_INTERVAL_S
    body, _ = t.announce("127.0.0.4", q())
    assert lt.bdecode(body)[b"interval"] == INTERVAL_S


class _Tracker:
    """A local HTTP server answering /swarm with whatever the test sets (a tracker that is not
    weightd's, or a hostile one)."""

    def __init__(self) -> None:
        import http.server
        import threading
        self.status, self.body, self.hits = 200, b"", 0
        self.paths: list[str] = []   # what was asked, in order
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                outer.hits += 1
                outer.paths.append(self.path)
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *a) -> None:
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/announce"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop answering: the port refuses from then on (a second close does nothing)."""
        if self.server.socket.fileno() >= 0:
            self.server.shutdown()
            self.server.server_close()


@pytest.mark.parametrize("status, body, gives_up", [
    (200, b"<html>not a tracker</html>", True),          # a tracker that is not weightd's
    (404, b"<html>404</html>", True),
    (200, b'{"downloading": "nope"}', True),
    (200, b'{"downloading": [["127.0.0.9", "../x"], ["127.0.0.8"], [1, 2], "x"]}', False),
    (404, b'{"failure": "no such swarm"}', False),        # not yet: asked again
    (200, b'{"downloading": []}' + b" " * (5 << 20), False),   # too large: a failure, asked again
    (200, b"[" * 100_000, True),                          # nested past the parser's recursion limit
])
def test_member_list_from_a_tracker_that_is_not_weightds_or_lies(status: int, body: bytes, gives_up: bool) -> None:
    """Whatever a tracker answers, the member list is None or only well-formed entries (bad racks
    blanked), no thread dies with a traceback, and a tracker that is not weightd's is asked no more."""
    from p2p.members import Membership
    t = _Tracker()
    t.status, t.body = status, body
    m = Membership((t.url,), KNOWN, every_s=0.1, timeout_s=2).start()
    try:
        deadline = time.monotonic() + 10
        while t.hits < 3 and time.monotonic() < deadline and not (gives_up and m._thread and not m._thread.is_alive()):
            time.sleep(0.05)
        if gives_up:
            m._thread.join(timeout=5)
            hits = t.hits
            time.sleep(0.5)
            assert not m._thread.is_alive() and t.hits == hits and m.members is None
        else:
            assert t.hits >= 3 and m._thread.is_alive()
            if status == 200 and len(body) < 4096:
                assert m.members == {"127.0.0.9": ""}
            else:
                assert m.members is None
    finally:
        m.stop()
        t.close()


def test_the_accept_guard_and_the_tracker_read_addresses_alike() -> None:
    """A tracker listening on ``[::]`` sees IPv4 peers as ``::ffff:a.b.c.d``: the accept guard admitted
    them and the tracker answered 403 (it required version 4). Now one reading for both: a mapped
    address is the IPv4 peer, served and listed as such; the guard and the tracker agree everywhere."""
    from weightd.daemon.listeners import GuardedListener, ListenerLimits
    t = tracker()
    guard = GuardedListener("tracker", "[::]:0", lambda: None,
                            ListenerLimits(("127.0.0.0/8",), 8, 8, 1.0, 1.0, 1.0))
    for ip in ("127.0.0.6", "::ffff:127.0.0.6", "::ffff:10.0.0.5", "10.0.0.5", "::1", "fe80::1%lo", "junk", ""):
        assert guard.allowed(ip) == t.allowed(ip), ip
    assert peers_of(t.announce("::ffff:127.0.0.6", q())) == []
    assert peers_of(t.announce("127.0.0.7", q(port=7001))) == [("127.0.0.6", 7000)]
    assert peers_of(t.announce("127.0.0.6", q())) == [("127.0.0.7", 7001)]   # (the same peer, re-announcing)


def dropped_of(answer: tuple[bytes, str | None]) -> list[str]:
    import json
    body, refused = answer
    assert refused is None, body
    return json.loads(body)["dropped"]


def test_an_owner_two_workers_dropped_is_listed_to_every_worker_until_they_stop_saying_it() -> None:
    """``drop=IP,...``: the owners the asker's plan planned without (stalled, late), replacing what it
    said before; every answer lists them (of the asker's group only) once two of the group say so,
    made at most once a second, until DROP_TTL_S after it was said, or the sayers leave. One worker
    alone is not heeded (a hostile worker dropping the owners, or the gateways, ranked before it); a
    worker naming over a quarter of its group, or over MAX_DROPS, is not heeded (a confused or hostile
    worker cannot make every plan drop everyone, in one request or in several); a name that is no
    member of its group, or the asker, is ignored."""
    from p2p.tracker import DROP_TTL_S
    clock = [0.0]
    t = tracker(clock)
    h = f"info_hash={quote_from_bytes(KNOWN)}"
    ips = [f"127.0.0.{10 + i}" for i in range(16)]

    def tick(dt: float = 1.1) -> None:
        clock[0] += dt
        for ip in ips[2:]:   # (the members keep asking; ips[0] and ips[1], the reporters, ask on their own)
            t.members(ip, h)

    def say(names: str) -> None:
        for who in ips[:2]:
            t.members(who, h + "&drop=" + names)
    for ip in ips:
        t.members(ip, h)
    assert dropped_of(t.members(ips[0], h)) == []
    # over a quarter of 16 (4): not heeded; the askers themselves, a stranger and garbage: ignored
    for bad in (",".join(ips[2:7]), f"{ips[0]},{ips[1]},10.9.9.9", "x,,", ",".join(["127.0.0.99"] * 65)):
        say(bad)
        tick()
        assert dropped_of(t.members(ips[2], h)) == [], bad
    t.members(ips[0], h + f"&drop={ips[15]}")   # one worker alone: not heeded
    tick()
    assert dropped_of(t.members(ips[2], h)) == []
    # several requests of the two, each a different quarter: each replaces the last
    for k in range(3):
        say(",".join(ips[4 * k + 3:4 * k + 7]))
    tick()
    assert dropped_of(t.members(ips[3], h)) == ips[11:15]
    say(ips[15])
    tick()
    assert dropped_of(t.members(ips[3], h)) == [ips[15]]   # (every worker sees it)
    assert dropped_of(t.members("127.0.0.50", h + "&want=abc")) == []   # (another group does not)
    for _ in range(3):   # still said: still dropped
        tick(2.0)
        say(ips[15])
    tick()
    assert dropped_of(t.members(ips[2], h)) == [ips[15]]
    for _ in range(int(DROP_TTL_S / 2) + 1):   # nobody said it since (the reporters' lists went quiet, not
        tick(2.0)                              # asking): gone, though the owner still asks
    assert dropped_of(t.members(ips[2], h)) == []
    say(ips[14])
    t.members(ips[0], h + "&done=1")   # one of the two who said it left: no longer heeded
    tick()
    assert dropped_of(t.members(ips[2], h)) == []


def test_a_gateway_skipped_by_two_rack_mates_is_listed_to_every_worker() -> None:
    """``skip=IP,...``: the gateways of its own rack the asker's plan skipped (stalled, never
    connected), listed as ``skipped`` to every worker (the other racks' senders serve the replacement)
    once two rack-mates say so (one in a rack of two), until DROP_TTL_S after it was said or the
    sayers leave. Only the sayer's rack-mates count, at most half its rack (the first by address):
    one hostile worker cannot skip the gateways ranked before it to hand its rack's crossing to
    itself, nor skip other racks' gateways; a worker without a rack says nothing."""
    from p2p.tracker import DROP_TTL_S
    clock = [0.0]
    t = tracker(clock)
    h = f"info_hash={quote_from_bytes(KNOWN)}"
    # r0: .10-.13, r1: .14-.17, r2 (a rack of two): .18, .19
    racks = {f"127.0.0.{10 + i}": f"r{i // 4}" for i in range(10)}

    def skipped_of(ip: str, extra: str = "") -> list[str]:
        import json
        body, refused = t.members(ip, h + f"&rack={racks.get(ip, '')}" + extra)
        assert refused is None, body
        return json.loads(body)["skipped"]

    def tick(dt: float = 1.1) -> None:
        clock[0] += dt
        for ip in list(racks)[2:]:   # (.10 and .11 ask on their own below)
            skipped_of(ip)
    for ip in racks:
        assert skipped_of(ip) == []
    for bad in ("127.0.0.14", "127.0.0.10", "10.9.9.9,x", "127.0.0.11,127.0.0.12,127.0.0.13"):
        skipped_of("127.0.0.10", "&skip=" + bad)   # another rack's, itself, strangers; one sayer alone
        tick()
        assert skipped_of("127.0.0.15") == [], bad
    skipped_of("127.0.0.11", "&skip=127.0.0.12")   # a second rack-mate says .12 (.10 still says it)
    tick()
    assert skipped_of("127.0.0.15") == ["127.0.0.12"] == skipped_of("127.0.0.13")
    skipped_of("127.0.0.18", "&skip=127.0.0.19")   # a rack of two: its one rack-mate is enough
    t.members("127.0.0.9", h + "&skip=127.0.0.11")   # (no rack: not heeded)
    tick()
    assert skipped_of("127.0.0.15") == ["127.0.0.12", "127.0.0.19"]
    for _ in range(int(DROP_TTL_S / 2) + 1):          # the sayers keep asking without it: gone
        tick(2.0)
        for ip in ("127.0.0.10", "127.0.0.11"):
            skipped_of(ip)
    assert skipped_of("127.0.0.15") == []
    skipped_of("127.0.0.10", "&skip=127.0.0.12")
    skipped_of("127.0.0.11", "&skip=127.0.0.12")
    t.members("127.0.0.10", h + "&done=1")   # one of the two left: no longer listed
    tick()
    assert "127.0.0.12" not in skipped_of("127.0.0.15")
    # each sayer is heard for at most half its rack, the first by address: .10's third name (.13) is
    # cut, so .13 has one sayer (.11) and is not listed; a sayer naming a worker twice is one sayer
    skipped_of("127.0.0.10", "&skip=127.0.0.11,127.0.0.12,127.0.0.13")
    skipped_of("127.0.0.11", "&skip=127.0.0.12,127.0.0.13")
    skipped_of("127.0.0.14", "&skip=127.0.0.15,127.0.0.15")
    tick()
    assert skipped_of("127.0.0.16") == ["127.0.0.12"]


def test_a_worker_cannot_drop_another_groups_workers() -> None:
    """Expert ranks (``want=`` groups) plan apart: a drop counts in the reporter's group only, and its
    quarter is of that group."""
    clock = [0.0]
    t = tracker(clock)
    h = f"info_hash={quote_from_bytes(KNOWN)}"
    groups = {f"127.0.0.{10 + i}": f"r{i // 2}" for i in range(16)}   # 8 groups of 2
    for ip, g in groups.items():
        t.members(ip, h + f"&want={g}")
    t.members("127.0.0.10", h + "&want=r0&drop=127.0.0.12,127.0.0.13")   # (r1's two)
    clock[0] += 1.1
    assert dropped_of(t.members("127.0.0.12", h + "&want=r1")) == []
    t.members("127.0.0.10", h + "&want=r0&drop=127.0.0.11")   # its own group's other: one of 2 is allowed
    clock[0] += 1.1
    assert dropped_of(t.members("127.0.0.11", h + "&want=r0")) == ["127.0.0.11"]