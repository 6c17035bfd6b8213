"""``[trust]`` on the swarm path (docs/security.md: P2P downloads are checked against the signature like
copies from cold). A real libtorrent seed on 127.0.0.2 serves what cold storage holds; a node with
``require_signature`` preloads over P2P through the real CLI: a signed version arrives from the peer,
checked; one whose bytes a cold writer changed (tensor, manifest and torrent made to match) is
downloaded from the peer and refused at commit; an unsigned one is refused before a byte moves."""

from __future__ import annotations

import json
import time
from pathlib import Path

from p2p import TORRENT_RELPATH, P2PConfig, P2PSession, load_torrent, make_torrent
from tiering import make_checkpoint, read_version

from .conftest import assert_one_line_error
from .test_p2p import free_port
from .test_signing import _republish_tampered, _tier_snapshot, keys  # noqa: F401 (fixture)

MiB = 1 << 20


def seed_cold(seed: P2PSession, cold: Path, name: str, version: str) -> None:
    """Seed NAME@VERSION as cold storage holds it, with cold's torrent."""
    v = read_version(cold, name, version)
    ti = load_torrent((v.path / TORRENT_RELPATH).read_bytes(), v.manifest)
    assert seed.seed(ti, v.path)


def uploaded(seed: P2PSession, at_least: int = 0) -> int:
    """The seed's payload uploaded, once it is at least ``at_least`` (libtorrent's counters tick once a
    second: without a floor, read after a tick)."""
    if not at_least:
        time.sleep(1.5)
    deadline = time.monotonic() + 10
    while (n := seed.stats()["upload_bytes"]) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return n


def test_trust_holds_on_a_p2p_download(node_env, wd, keys, tmp_path: Path) -> None:  # noqa: F811
    cold = node_env.cold
    seed = P2PSession(P2PConfig(listen="127.0.0.2:0"))
    try:
        text = node_env.config.read_text()
        assert '[p2p]\nlisten = "127.0.0.1:0"\n' in text
        node_env.config.write_text(text.replace(   # (publish makes the torrent of a version over threshold)
            '[p2p]\nlisten = "127.0.0.1:0"\n',
            f'[p2p]\nlisten = "127.0.0.3:{free_port("127.0.0.3")}"\nthreshold = "1MiB"\n'
            f'peers = ["127.0.0.2:{seed.port}"]\nfallback_after_s = 30\n'))
        for version, sign in (("v1", True), ("v2", True), ("v3", False)):
            src = make_checkpoint(tmp_path / f"src-{version}", total_bytes=4 * MiB, shards=2, layers=2, seed=version)
            r = wd("--no-daemon", "publish", src, "--name", "org/t", "--version", version,
                   *(("--sign", keys["fleet"]) if sign else ()))
            assert r.returncode == 0, r.stderr
        # a writer of cold storage changes v2's bytes and makes its manifest and torrent match them
        _republish_tampered(cold / "org/t/v2")
        v2 = read_version(cold, "org/t", "v2")
        (v2.path / TORRENT_RELPATH).write_bytes(make_torrent(v2.path, v2.manifest))
        for version in ("v1", "v2", "v3"):
            seed_cold(seed, cold, "org/t", version)
        with open(node_env.config, "a") as f:
            f.write(f'[trust]\nrequire_signature = true\npublic_keys = ["{keys["fleet.pub"]}"]\n')

        # signed and whole: every byte over P2P, its signature checked
        r = wd("--no-daemon", "preload", "org/t@v1", "--tier", "warm", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        by = rep["bytes_by_source"]   # (a configured peer counts as the origin)
        assert by["origin"] + by["peer"] == rep["bytes"] and by["cold"] == 0 and rep["source_fallbacks"] == [], rep
        assert rep["signature"]["checked"] is True and rep["signature"]["key_id"], rep["signature"]
        up = uploaded(seed, rep["bytes"])
        assert up >= rep["bytes"]

        # tampered: downloaded from the peer (its pieces match the torrent cold now holds), refused at
        # commit as not what was signed; nothing placed, nothing staged, not fetched again from cold
        r = wd("--no-daemon", "preload", "org/t@v2", "--tier", "warm", "--json", timeout=120)
        assert_one_line_error(r, 5, "org/t@v2")
        assert "differs from the signed" in r.stderr, r.stderr
        up2 = uploaded(seed, up + v2.manifest.total_bytes // 2)
        assert up2 - up >= v2.manifest.total_bytes // 2, (up, up2)   # the swarm path ran
        assert [p for p in _tier_snapshot(node_env.warm) if "org/t/v2" in p or "org--t@v2" in p] == []

        # unsigned where signatures are required: refused before any byte moves
        before = uploaded(seed)   # (v2's last bytes counted)
        r = wd("--no-daemon", "preload", "org/t@v3", "--tier", "warm", "--json", timeout=120)
        assert_one_line_error(r, 5, "org/t@v3")
        assert "not signed" in r.stderr, r.stderr
        assert uploaded(seed) == before
        assert [p for p in _tier_snapshot(node_env.warm) if "org/t/v3" in p or "org--t@v3" in p] == []
    finally:
        seed.close()
