"""Crossing sessions (``[p2p] crossing``, p2p/crossing.py): every worker takes its share of what crosses
into its rack through a second libtorrent session that talks to other racks' crossing sessions only.
Real daemons on 127.0.0.x with a real tracker; real libtorrent sessions for the parts."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import libtorrent as lt
import pytest

from p2p import P2PConfig, P2PSession
from p2p.crossing import CrossingSession
from p2p.settings import split
from p2p.errors import CrossingPortError
from tiering.sample import make_checkpoint

from .test_p2p import _preload_one_killed, _reports, cluster, free_port, started  # noqa: F401 (cluster: the fixture)
from .test_p2p_tls import fleet, tls_cluster  # noqa: F401 (fixtures)

MiB = 1 << 20


def _crossing(ip: str) -> str:
    return f'crossing = true\ncrossing_port = {free_port(ip)}\npiece_size = "256KiB"\n'


def _racked(cluster, tmp_path: Path, racks: dict[str, str], name: str, *, limit: str, mib: int,
            fallback_s: float = 60) -> tuple:
    """An origin on 127.0.0.2 publishing ``org/NAME@v1`` (``mib`` MiB in 256 KiB pieces) and a worker with a
    crossing session on each of ``racks`` (ip -> rack), started together: (origin, workers, bytes)."""
    origin = cluster("127.0.0.2", role="origin", limit=limit, p2p_extra='piece_size = "256KiB"\n')
    src = make_checkpoint(tmp_path / "src", total_bytes=mib * MiB, shards=2, layers=3)
    assert origin.cli("publish", str(src), "--name", f"org/{name}", "--version", "v1").returncode == 0
    workers = started([cluster(ip, origin=origin.endpoint, limit=limit, fallback_s=fallback_s, wait=False,
                               p2p_extra=f'rack = "{r}"\n' + _crossing(ip)) for ip, r in racks.items()])
    return origin, workers, sum(f.stat().st_size for f in src.rglob("*") if f.is_file())


@pytest.mark.slow
def test_two_racks_take_each_piece_across_about_once_through_every_workers_share(cluster, tmp_path: Path) -> None:
    racks = {"127.0.0.3": "r0", "127.0.0.4": "r0", "127.0.0.5": "r1", "127.0.0.6": "r1"}
    origin, workers, total = _racked(cluster, tmp_path, racks, "x", limit="4MB", mib=16)
    reports = _reports([w.popen("preload", "org/x@v1", "--tier", "warm", "--json") for w in workers], timeout=150)
    intake: dict[str, int] = {}
    crossed: dict[str, int] = {}
    for w, r in zip(workers, reports):
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
        rack = racks[w.ip]
        outside = sum(n for k, n in r["swarm"]["bytes_by_rack"].items() if k not in (rack, "origin", ""))
        intake[rack] = intake.get(rack, 0) + outside
        crossed[rack] = crossed.get(rack, 0) + r["swarm"]["crossing_bytes_in"]
        assert r["swarm"]["crossing_bytes_in"] > 0 and r["swarm"]["crossing_bytes_out"] > 0, r["swarm"]
        assert 0 < r["swarm"]["crossing_peak"] <= 1.5, r["swarm"]
        assert "no crossing session of another rack answered" not in (w.dir / "daemon.log").read_text()
        assert not list((w.dir / "warm").rglob("*.crossing")), "a staging directory was left behind"
    for rack, n in intake.items():   # (each piece homed in the other rack crosses about once, ...
        assert 0.3 * total < n <= 1.25 * total, (rack, n / total, [r["swarm"] for r in reports])
        assert crossed[rack] >= 0.9 * n, (rack, crossed, intake)   # (... through the crossing sessions)


def _iptables_works() -> bool:
    """Whether this machine can take a firewall rule (root, iptables, the kernel's netfilter)."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        return False
    return subprocess.run(["iptables", "-w", "5", "-L", "INPUT", "-n"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _iptables_works(), reason="a firewall rule on lo (root, iptables, netfilter)")
def test_crossing_ports_closed_by_a_firewall_cost_seconds_not_minutes(cluster, tmp_path: Path) -> None:
    """crossing = true on every worker, but every crossing port dropped by the firewall (an operator who
    did not open it): each worker's crossing session reaches no other rack's, says so in one warning
    naming the key, and the download goes on as racks without crossing do. Without that, the rules of
    a crossing session kept every share waiting (4 racks of 4 at 10 MB/s: 104-112 s against 13.3 s,
    the origin 2.8-3.0x; bench/swarm.py with the ports dropped, 2026-12-07)."""
    racks = {"127.0.0.3": "r0", "127.0.0.4": "r0", "127.0.0.5": "r1", "127.0.0.6": "r1"}
    ports = {ip: free_port(ip) for ip in racks}
    rules = [["INPUT", "-i", "lo", "-p", "tcp", "-d", ip, "--dport", str(port), "-j", "DROP"]
             for ip, port in ports.items()]
    inserted = []
    try:
        for rule in rules:
            if subprocess.run(["iptables", "-w", "5", "-I", *rule], capture_output=True, timeout=30).returncode:
                pytest.skip("iptables cannot insert a rule here")
            inserted.append(rule)
        origin = cluster("127.0.0.2", role="origin", limit="4MB", p2p_extra='piece_size = "256KiB"\n')
        src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=2, layers=3)
        assert origin.cli("publish", str(src), "--name", "org/fw", "--version", "v1").returncode == 0
        workers = started([cluster(ip, origin=origin.endpoint, limit="4MB", fallback_s=60, wait=False,
                                   p2p_extra=f'rack = "{r}"\ncrossing = true\ncrossing_port = {ports[ip]}\n'
                                             'piece_size = "256KiB"\n') for ip, r in racks.items()])
        t0 = time.monotonic()
        reports = _reports([w.popen("preload", "org/fw@v1", "--tier", "warm", "--json") for w in workers],
                           timeout=150)
        took = time.monotonic() - t0
    finally:
        for rule in inserted:
            subprocess.run(["iptables", "-w", "5", "-D", *rule], capture_output=True, timeout=30)
    said = 0
    for w, r in zip(workers, reports):
        assert r["bytes_by_source"]["cold"] == 0 and r["swarm"]["crossing_bytes_in"] == 0, r["swarm"]
        log = (w.dir / "daemon.log").read_text()
        said += "no crossing session of another rack answered" in log and "p2p.crossing_port" in log
    # (a worker whose share came in another way first, once the others fell back, has nothing to say:
    # seen in a loaded CI run of 2026-12-07; without the fallback none says it)
    assert said >= 1, [(w.dir / "daemon.log").read_text()[-2000:] for w in workers]
    # (25.4-26.7 s here: the crossing's UNREACHED_S (15 s), then the racks' own ways; 48-52 s before it)
    assert took < 45, (took, [r["swarm"] for r in reports])


@pytest.mark.slow
def test_a_worker_that_dies_mid_download_holds_no_rack_mate_up(cluster, tmp_path: Path) -> None:
    """Racks r0 = .3, .4, .5 and r1 = .6, .7; .3 is killed (-9) once the origin has sent 2 MiB more.
    Every survivor finishes from the swarm, in time, by the plan's rules (not the last resort), its
    crossing session taking its share across. Its rack-mates take the dead one's share across once it
    leaves the member list (the shares hashed again over the ones left: tests/test_racks.py pins that):
    here the two took 6,291,691 bytes across in 6 of 7 runs and 6,029,547 in one (2026-12-07, under a
    CPU load and beside other tests), 4,718,827 (their first shares only) in 2 runs with the shares
    frozen; one clean-clone CI run had the latter too (the rack got the dead one's share some other way
    before the survivors' shares moved: under load, or a member list slow to drop it; not reproduced),
    so the bytes are not pinned to the move, and this test does not check it end to end."""
    racks = {"127.0.0.3": "r0", "127.0.0.4": "r0", "127.0.0.5": "r0", "127.0.0.6": "r1", "127.0.0.7": "r1"}
    origin, nodes, total = _racked(cluster, tmp_path, racks, "xd", limit="3MB", mib=12)
    reports, took = _preload_one_killed(origin, nodes[1:], nodes[0], "org/xd@v1")
    for r in reports:
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
    assert took < 45, (took, [r["swarm"] for r in reports])
    # most of r1's half came into r0 through the survivors' crossing sessions (their first shares: 0.386)
    assert sum(r["swarm"]["crossing_bytes_in"] for r in reports[:2]) >= 0.3 * total, [r["swarm"] for r in reports]
    assert all(r["swarm"]["crossing_bytes_in"] > 0 for r in reports), [r["swarm"] for r in reports]
    assert all(r["swarm"]["open_all_after_s"] is None for r in reports), [r["swarm"] for r in reports]


@pytest.mark.slow
def test_crossing_sessions_of_a_tls_fleet_talk_tls(tls_cluster, tmp_path: Path) -> None:
    """With fleet TLS the crossing session listens on an SSL port and presents the node's certificate:
    two racks of two take their shares across through it (bytes in every worker's crossing session)."""
    racks = {"127.0.0.3": "r0", "127.0.0.4": "r0", "127.0.0.5": "r1", "127.0.0.6": "r1"}
    origin, nodes, total = _racked(tls_cluster, tmp_path, racks, "xt", limit="4MB", mib=12, fallback_s=30)
    reports = _reports([n.popen("preload", "org/xt@v1", "--tier", "warm", "--json") for n in nodes], timeout=150)
    for r in reports:
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
        assert r["swarm"]["crossing_bytes_in"] > 0, r["swarm"]


def _config(ip: str, port: int, xport: int, **kw) -> P2PConfig:
    kw.setdefault("trackers", ("http://127.0.0.1:9/announce",))
    return P2PConfig(listen=f"{ip}:{port}", rack="r0", crossing=True, crossing_port=xport, **kw)


def test_each_session_takes_what_the_other_leaves_of_the_node_limits() -> None:
    ip = "127.0.0.7"
    s = P2PSession(_config(ip, free_port(ip), free_port(ip), download_limit=10_000_000, upload_limit=8_000_000))
    try:
        def limits() -> tuple[int, int, int, int]:
            m, x = s.ses.get_settings(), s.cross.ses.get_settings()
            return m["download_rate_limit"], x["download_rate_limit"], m["upload_rate_limit"], x["upload_rate_limit"]
        assert limits() == (10_000_000, 10_000_000, 8_000_000, 8_000_000)   # (nobody took anything yet)
        s.taken = ((3_000_000, 7_900_000), (6_000_000, 0))   # (as share() records them)
        s.set_yield_limits(0, 0)
        assert limits() == (7_000_000, 4_000_000, 800_000, 8_000_000)   # (never under a tenth)
        s.set_yield_limits(5_000_000, 0)   # the NIC controller lowers the node's download: both within it
        assert limits()[:2] == (2_000_000, 500_000)
        assert s.share((0.0, 0.0)) == (0.0, 0.0)   # (an idle main session: the crossing one may take it all)
        assert limits() == (5_000_000, 5_000_000, 8_000_000, 8_000_000)
    finally:
        s.close()


def test_the_split_gives_each_what_the_other_leaves() -> None:
    assert split(0, 5, 5) == (0, 0)                    # no limit: none for either
    assert split(1000, 0, 0) == (1000, 1000)           # nobody took anything: both may take it all
    assert split(1000, 300, 600) == (700, 400)         # each the rest of what the other took
    assert split(1000, 990, 2000) == (100, 100)        # never under a tenth
    assert split(5, 5, 5) == (1, 1)                    # (a limit too small for a tenth: one byte, not "none")


def test_a_crossing_port_in_use_fails_the_session_at_start() -> None:
    ip = "127.0.0.7"
    with socket.socket() as taken:
        taken.bind((ip, 0))
        taken.listen()
        with pytest.raises(CrossingPortError, match="crossing session"):
            P2PSession(_config(ip, free_port(ip), taken.getsockname()[1]))


def _answered(ip: str, port: int, src: str, ih: bytes) -> bool:
    """A plain BitTorrent handshake for info-hash ``ih`` from ``src`` to ``ip:port`` gets one back (a TLS
    port sends a 7-byte alert instead: not a handshake)."""
    with socket.create_connection((ip, port), timeout=5, source_address=(src, 0)) as c:
        c.settimeout(3)
        c.sendall(b"\x13BitTorrent protocol" + b"\0" * 8 + ih + b"-XX0000-" + b"0" * 12)
        try:
            return c.recv(68).startswith(b"\x13BitTorrent protocol")
        except (ConnectionResetError, TimeoutError, socket.timeout):
            return False


def _one_piece_torrent(x: CrossingSession, save: Path) -> bytes:
    """A one-piece torrent added to ``x`` (its v1 info-hash returned)."""
    ti = lt.torrent_info(lt.bencode({b"info": {b"name": b"f", b"piece length": 16384, b"length": 16384,
                                                b"pieces": b"\0" * 20}}))
    atp = lt.add_torrent_params()
    atp.ti, atp.save_path = ti, str(save)
    x.ses.add_torrent(atp)
    return ti.info_hashes().v1.to_bytes()


def test_the_crossing_session_talks_only_to_listed_workers_of_other_racks(tmp_path: Path) -> None:
    """Its IP filter: a peer not let in (same rack, not listed, outside the allowlist) is cut before the
    BitTorrent handshake is answered; one let in gets an answer."""
    ip, friend, stranger = "127.0.0.7", "127.0.0.8", "127.0.0.9"
    x = CrossingSession(_config(ip, free_port(ip), free_port(ip), allow=("127.0.0.0/24",)))
    try:
        ih = _one_piece_torrent(x, tmp_path)
        x.allow(frozenset({friend, "10.1.2.3"}))
        deadline = time.monotonic() + 10   # (once the torrent is checked it answers handshakes)
        while not _answered(ip, x.port, friend, ih):
            assert time.monotonic() < deadline, "a worker let in got no answer"
            time.sleep(0.1)
        assert not _answered(ip, x.port, stranger, ih)
        x.allow(frozenset())   # (a worker no longer listed is cut too)
        assert not _answered(ip, x.port, friend, ih)
    finally:
        x.close()


def test_a_tls_crossing_session_answers_no_peer_without_a_certificate(fleet, tmp_path: Path) -> None:
    """With fleet TLS its port is an SSL one: a listed worker of another rack speaking plain BitTorrent
    (no certificate) is accepted by TCP and gets a TLS alert, no handshake, where the same session without
    TLS answers it."""
    from p2p import load_fleet_tls
    ip, friend = "127.0.0.7", "127.0.0.8"
    tls = load_fleet_tls(fleet["ca"], fleet[ip], fleet[f"{ip}.key"])
    x = CrossingSession(_config(ip, free_port(ip), free_port(ip), allow=("127.0.0.0/24",), tls=tls,
                                trackers=("https://127.0.0.1:9/announce",)))
    try:
        ih = _one_piece_torrent(x, tmp_path)
        x.allow(frozenset({friend}))
        assert x.port and not any(_answered(ip, x.port, friend, ih) for _ in range(3))
    finally:
        x.close()


def test_crossing_announces_are_a_swarm_of_their_own_answered_with_other_racks_only() -> None:
    """A crossing session is told of other racks' crossing sessions only: never of its rack-mates', of main
    sessions, or of itself; main sessions are never told of crossing sessions; the member list is untouched;
    an unknown info-hash is refused as ever, and a crossing session that says no rack is told of no one."""
    from p2p.tracker import Tracker

    from .test_tracker import KNOWN, peers_of, q
    t = Tracker(("127.0.0.0/8",), known=lambda h: h == KNOWN, now=lambda: 0.0)
    for ip, rack in (("127.0.0.3", "r0"), ("127.0.0.4", "r0"), ("127.0.0.5", "r1")):   # main sessions
        t.announce(ip, q(port=7000, extra=f"&rack={rack}&left=1"))
    t.members("127.0.0.3", q(extra="&rack=r0"))
    x = {ip: t.announce(ip, q(port=7001, extra=f"&rack={rack}&left=1&crossing=1"))
         for ip, rack in (("127.0.0.3", "r0"), ("127.0.0.4", "r0"), ("127.0.0.5", "r1"), ("127.0.0.6", "r2"))}
    assert peers_of(x["127.0.0.3"]) == []   # (first in: nobody else yet)
    again = sorted(peers_of(t.announce("127.0.0.3", q(port=7001, extra="&rack=r0&left=1&crossing=1"))))
    assert again == [("127.0.0.5", 7001), ("127.0.0.6", 7001)]
    assert sorted(peers_of(t.announce("127.0.0.5", q(port=7001, extra="&rack=r1&crossing=1")))) == [
        ("127.0.0.3", 7001), ("127.0.0.4", 7001), ("127.0.0.6", 7001)]
    main = peers_of(t.announce("127.0.0.6", q(port=7000, extra="&rack=r2&left=1")))
    assert sorted(main) == [("127.0.0.3", 7000), ("127.0.0.4", 7000), ("127.0.0.5", 7000)]
    assert peers_of(t.announce("127.0.0.9", q(port=7001, extra="&crossing=1"))) == []   # (no rack: no one)
    listed = json.loads(t.members("127.0.0.4", q(extra="&rack=r0"))[0])["downloading"]
    assert sorted(map(tuple, listed)) == [("127.0.0.3", "r0"), ("127.0.0.4", "r0")]   # (no crossing session there)
    t.announce("127.0.0.6", q(port=7001, extra="&rack=r2&crossing=1&event=stopped"))   # a crossing session leaves
    assert sorted(peers_of(t.announce("127.0.0.3", q(port=7001, extra="&rack=r0&crossing=1")))) == [("127.0.0.5", 7001)]
    body, refused = t.announce("127.0.0.3", q(info_hash=bytes(20), extra="&rack=r0&crossing=1"))
    assert refused == "tracker_unknown_torrent"
    t.forget(KNOWN)
    assert t.swarms == {}


class _Node:
    """The node's session as a crossing torrent sees it (``crossing.Lender``), with no limits to share."""
    node_limits = (0, 0)

    def share(self, crossing: tuple[float, float]) -> tuple[float, float]:
        return (0.0, 0.0)


def test_the_staging_directory_is_made_afresh_or_not_at_all_and_pieces_are_read_unpadded(tmp_path: Path) -> None:
    """A crash's staging directory is replaced; a symlink or a file in its place, or a file system without
    room for what it will stage, means no crossing session (said once), nothing touched; every piece is
    read as ``add_piece`` takes it: the files' bytes in order, a file's last piece without its padding."""
    import os
    import shutil

    from p2p import load_torrent, make_torrent
    from p2p.crossing import Crossing
    from p2p.torrent import save_path_for
    from tiering import build_manifest
    src = make_checkpoint(tmp_path / "src", total_bytes=3 * MiB + 12345, shards=2, layers=2)
    m = build_manifest(src)
    ti = load_torrent(make_torrent(src, m, piece_size=1 << 20), m)
    data = tmp_path / "staging" / ti.name()
    shutil.copytree(src, data)
    ip = "127.0.0.7"
    x = CrossingSession(_config(ip, free_port(ip), free_port(ip)))
    try:
        def crossing() -> Crossing:
            return Crossing(x, _Node(), ti, None, save_path_for(ti, data), data, lambda: None, 2)
        stage = data.parent / f".{data.name}.crossing"
        (stage / "left-by-a-crash").mkdir(parents=True)
        c = crossing()
        assert c.start(1) and c.active and list(stage.iterdir()) == [] and stage.stat().st_mode & 0o777 == 0o700
        fs, out = ti.layout(), bytearray()
        for p in range(ti.num_pieces()):
            out += c._read(c.data, p)
        assert bytes(out) == b"".join((data.parent / fs.file_path(i)).read_bytes() for i in range(fs.num_files())
                                      if not fs.file_flags(i) & lt.file_storage.flag_pad_file)
        assert ti.num_pieces() > len(m.files) and len(out) < ti.num_pieces() * ti.piece_length()   # (padded tails)
        c.close()
        assert not stage.exists()
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        os.symlink(elsewhere, stage)
        c = crossing()
        assert not c.start(1) and not c.active and "in the way" in c.failed and stage.is_symlink()
        os.unlink(stage)
        c = crossing()
        assert not c.start(1 << 60) and "bytes free" in c.failed and not stage.exists()
        c = crossing()   # the node's session closed under a download: the crossing's close still cleans up
        assert c.start(1)
        x.close()
        c.close()
        assert not stage.exists()
    finally:
        x.close()


@pytest.mark.slow
def test_a_rack_that_starts_after_the_others_finished_takes_its_share_from_their_seeds(cluster, tmp_path: Path) -> None:
    """Rack r1 downloads and finishes; then rack r0 starts. No crossing session of r1 is left (they end
    with their downloads), but r1 has left the member list too: r0 plans alone (one rack listed, nothing
    to take across), from the origin, its rack and r1's seeds, in about the time one rack takes alone
    (5.4-5.7 s here; a review feared its shares would wait on crossing sessions that are gone)."""
    racks = {"127.0.0.5": "r1", "127.0.0.6": "r1", "127.0.0.3": "r0", "127.0.0.4": "r0"}
    origin, nodes, total = _racked(cluster, tmp_path, racks, "xs", limit="4MB", mib=12)
    first = _reports([n.popen("preload", "org/xs@v1", "--tier", "warm", "--json") for n in nodes[:2]], timeout=120)
    t0 = time.monotonic()
    late = _reports([n.popen("preload", "org/xs@v1", "--tier", "warm", "--json") for n in nodes[2:]], timeout=120)
    took = time.monotonic() - t0
    for r in first + late:
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
    assert took < 25 and all(r["bytes_by_source"]["peer"] > 0 for r in late), (took, [r["swarm"] for r in late])
    assert all(r["swarm"]["crossing_bytes_in"] == 0 for r in late), [r["swarm"] for r in late]


def test_a_taken_crossing_port_stops_the_daemon_with_one_line_naming_the_key(cluster, tmp_path: Path) -> None:
    ip = "127.0.0.3"
    with socket.socket() as taken:
        taken.bind((ip, 0))
        taken.listen()
        port = taken.getsockname()[1]
        n = cluster(ip, wait=False, p2p_extra=f'rack = "r0"\ntrackers = ["http://127.0.0.2:9/announce"]\n'
                                              f'crossing = true\ncrossing_port = {port}\n')
        rc = n.proc.wait(timeout=60)
    log = (n.dir / "daemon.log").read_text()
    lines = [ln for ln in log.splitlines() if "crossing" in ln]
    assert rc != 0 and "Traceback" not in log, log
    assert len(lines) == 1 and f"p2p.crossing_port: cannot start the crossing session on {ip}:{port}" in lines[0], log


def test_the_crossing_ends_only_after_unreached_s_with_other_racks_crossing_sessions_known() -> None:
    """``Crossing._unreached`` on a clock of its own: no clock while no other rack's crossing session is
    known (a rack not started yet, partial copies, racks without crossing); UNREACHED_S from the first
    one the trackers name, whatever libtorrent's list does since; never once one was connected, nor
    while this node's share is in; ending pauses the torrent and gives the limits back."""
    import types

    import numpy as np

    from p2p.crossing import UNREACHED_S, Crossing

    class Lender:
        node_limits = (0, 0)

        def __init__(self) -> None:
            self.given: list = []

        def share(self, took):
            self.given.append(took)
            return 0.0, 0.0

    class Handle:
        paused = False

        def pause(self):
            self.paused = True

    def crossing() -> Crossing:
        c = Crossing.__new__(Crossing)
        c.reached, c.listed_since, c.failed = False, None, ""
        c.want, c.other = np.ones(4, dtype=bool), frozenset({"127.0.0.9"})
        c.xh, c.lender, c.ti = Handle(), Lender(), types.SimpleNamespace(name=lambda: "v1")
        return c
    c = crossing()
    assert not c._unreached(0, 0, 100.0) and c.listed_since is None   # (none known: no clock)
    assert not c._unreached(0, 3, 200.0)
    assert not c._unreached(0, 0, 200.0 + UNREACHED_S - 0.1)          # (libtorrent's list emptied: the clock runs on)
    assert c._unreached(0, 0, 200.0 + UNREACHED_S) and "p2p.crossing_port" in c.failed
    assert c.xh.paused and c.lender.given == [(0.0, 0.0)]
    c = crossing()
    assert not c._unreached(1, 3, 0.0) and c.reached                  # (connected once: never again asked)
    c = crossing()
    c.want[:] = False                                                 # (its share in: nothing to wait for)
    assert not c._unreached(0, 3, 0.0) and not c._unreached(0, 3, 10 * UNREACHED_S) and not c.failed
