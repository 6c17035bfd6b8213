"""A rack's gateway that is listed but never takes part, with ``[p2p] choke_other_racks``: its rack-mate
skips it and says so through the tracker (``skip=``), and the other rack's worker then serves the
rack-mate in its place. Before, the other racks unchoked a gateway by the member list alone: the
rack-mate that took its place got its share across only from the origin (issue 38's review: 0 bytes
in 75 s from another rack's node with no live origin). Real daemons on 127.0.0.x, a real tracker; the
listed-but-absent gateway is a member-list client (``p2p.members.Membership``) that never dials."""

from __future__ import annotations

from pathlib import Path

import libtorrent as lt
import pytest

from p2p.members import Membership
from p2p.rendezvous import gateway_of
from tiering.sample import make_checkpoint

from .test_p2p import _reports, cluster, started, tracker_of  # noqa: F401 (cluster: the fixture)

MiB = 1 << 20


@pytest.mark.slow
def test_a_listed_gateway_that_never_takes_part_is_told_and_its_replacement_is_served(cluster, tmp_path: Path) -> None:
    origin = cluster("127.0.0.2", role="origin", limit="2MB", p2p_extra='piece_size = "256KiB"\n')
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=2, layers=3)
    assert origin.cli("publish", str(src), "--name", "org/told", "--version", "v1").returncode == 0
    # rack r0: the absent gateway and W; rack r1: S. The absent one must be r0's gateway by the hashing
    w_ip, s_ip = "127.0.0.3", "127.0.0.4"
    absent = next(ip for ip in (f"127.0.0.{i}" for i in range(20, 60)) if gateway_of("r0", sorted([ip, w_ip])) == ip)
    ti = lt.torrent_info(str(tmp_path / "cold" / "org/told/v1/.weightd/checkpoint.torrent"))
    url = f"http://127.0.0.2:{tracker_of[origin.endpoint]}/announce"
    ghost = Membership((url,), bytes.fromhex(str(ti.info_hashes().v2))[:20], rack="r0", source_ip=absent,
                       every_s=0.5).start()
    try:
        choke = "gateways = 1\n"   # (choke_other_racks is on by default; one gateway: the absent one)
        w, s = started([cluster(ip, origin=origin.endpoint, limit="2MB", fallback_s=60, wait=False,
                                p2p_extra=f'rack = "{rack}"\n{choke}') for ip, rack in ((w_ip, "r0"), (s_ip, "r1"))])
        reports = _reports([n.popen("preload", "org/told@v1", "--tier", "warm", "--json") for n in (w, s)], timeout=120)
    finally:
        ghost.stop()
    rw, rs = reports
    for r in reports:
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
    log = (w.dir / "daemon.log").read_text()
    assert f"{absent} is no longer the gateway" in log, log[-3000:]
    # r1's home pieces crossed into r0 from S once S heard of the skip (W: 25.8 s, 12.3 of 16.5 MB from S
    # in a run of 2026-12-06). With S deaf to the skip (the sender's classes hashed over the list
    # alone), W got its pieces from S only after S had finished and W's connection was made again:
    # 73.3 s, the same test otherwise
    from_s = rw["swarm"]["bytes_by_rack"].get("r1", 0) / rw["bytes"]
    assert from_s >= 0.15 and rw["swarm"]["seconds"] < 50, (rw["swarm"], rs["swarm"]["seconds"])
