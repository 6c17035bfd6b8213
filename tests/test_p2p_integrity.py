"""Swarm bytes that fail the manifest: a cold writer replaces an unsigned version's torrent with one for
other bytes (same files, same sizes) and seeds those bytes from 127.0.0.9, dialing the worker that
fetches it. Real daemons and a real
libtorrent session on 127.0.0.x, loopback only, every wait bounded."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

from p2p import TORRENT_RELPATH, P2PConfig, P2PSession, load_torrent, make_torrent
from tiering import build_manifest
from tiering.sample import make_checkpoint

from .test_p2p import cluster  # noqa: F401 (the fixture)

MiB = 1 << 20


def test_swarm_bytes_that_fail_the_manifest_fall_back_to_cold_and_the_torrent_is_not_used_again(cluster, tmp_path: Path) -> None:
    origin = cluster("127.0.0.2", role="origin")
    src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=2)
    assert origin.cli("publish", str(src), "--name", "org/tamper", "--version", "v1").returncode == 0
    published = tmp_path / "cold/org/tamper/v1"
    # the cold writer's bytes: the same files and sizes, one shard changed, under the version's label
    evil = tmp_path / "evil" / "v1"
    shutil.copytree(src, evil)
    shard = sorted(evil.glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    for off in range(len(data) // 2, len(data), 64 << 10):
        data[off] ^= 0x5A
    shard.write_bytes(bytes(data))
    m_evil = build_manifest(evil)
    ti = load_torrent(make_torrent(evil, m_evil), build_manifest(src))   # (passes the files-and-sizes check)
    tmp = published / (TORRENT_RELPATH + ".new")
    tmp.write_bytes(make_torrent(evil, m_evil))
    os.replace(tmp, published / TORRENT_RELPATH)
    attacker = P2PSession(P2PConfig(listen="127.0.0.9:0"))
    stop = threading.Event()

    def knock(port: int) -> None:   # (a peer inside allow dials the worker for the torrent it is fetching)
        while not stop.wait(0.3):
            for h in list(attacker.seeding.values()):
                h.connect_peer(("127.0.0.3", port))
    dialer = None
    try:
        attacker.seed(ti, evil)
        worker = cluster("127.0.0.3", origin=origin.endpoint)
        dialer = threading.Thread(target=knock, args=(worker.port,), daemon=True)
        dialer.start()
        proc = worker.cli("preload", "org/tamper@v1", "--tier", "warm", "--json", "--timeout", "120")
        assert proc.returncode == 0, proc.stderr
        r = json.loads(proc.stdout.splitlines()[0])
        assert r["bytes_by_source"]["cold"] == r["bytes"], r["bytes_by_source"]
        fb = r["source_fallbacks"]
        assert [(f["from"], f["to"]) for f in fb] == [("p2p", "cold")], fb
        assert "manifest" in fb[0]["reason"] and "not used again" in fb[0]["reason"], fb
        assert worker.cli("verify", str(worker.dir / "warm/org/tamper/v1")).returncode == 0
        assert worker.metric('weightd_fallbacks_total{from="p2p",kind="source",to="cold"}') == 1
        # every block passed the torrent's hashes: the torrent is at fault, not the peers seeding it
        # (honest workers seeding that torrent would be banned too): nobody is banned
        assert worker.metric("weightd_p2p_peer_bans_total") == 0
        # the torrent is not used again: the next preload goes to cold at once, the swarm not asked
        assert worker.cli("evict", "org/tamper@v1", "--tier", "warm", "--force").returncode == 0
        again = worker.cli("preload", "org/tamper@v1", "--tier", "warm", "--json", "--timeout", "120")
        assert again.returncode == 0, again.stderr
        r2 = json.loads(again.stdout.splitlines()[0])
        assert r2["bytes_by_source"]["cold"] == r2["bytes"] and r2["bytes_by_source"].get("origin", 0) == 0, r2
        assert r2["bytes_by_source"].get("peer", 0) == 0 and "before" in r2["source_fallbacks"][0]["reason"], r2
    finally:
        stop.set()
        if dialer is not None:
            dialer.join(10)
        attacker.close()
