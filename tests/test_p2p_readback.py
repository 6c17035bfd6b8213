"""When a worker reads a P2P download back (docs/p2p.md, "What is checked"): real libtorrent sessions on
127.0.0.x seed what a test chooses, and a node preloads through the real CLI (``--no-daemon``).

- A torrent that weightd made at publish is bound to the manifest (hashed from the bytes checked against
  it, in one read): for an unsigned version, libtorrent's SHA-256 piece checks are the check, nothing is
  read back (``swarm.read_back`` false).
- A cold writer replaces the torrent with one libtorrent made from altered files (same names and sizes),
  and seeds those bytes: the torrent is not bound, the node reads back, the bytes fail the manifest, the
  node copies from cold. Signed or not, no copy with wrong bytes is committed.
- The same writer also forges the binding record: for a signed version the node still reads back (the
  signature covers each file's SHA-256, not the torrent) and copies from cold; for an unsigned version
  the forged torrent is trusted as the manifest is, and the committed copy holds the torrent's bytes
  (whoever can write the torrent beside the manifest can write the manifest: documented, pinned here).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import libtorrent as lt

from p2p import TORRENT_RELPATH, P2PConfig, P2PSession, load_torrent
from p2p.torrent import BINDING_KEY, bound_to
from tiering import build_manifest, make_checkpoint, read_version

from .test_p2p import free_port
from .test_p2p_torrent import libtorrent_made
from .test_signing import keys  # noqa: F401 (fixture)

MiB = 1 << 20
NAME = "org/rb"


def use_peer(node_env, port: int) -> None:
    """The node's [p2p]: 127.0.0.3, P2P above 1 MiB, ``port`` on 127.0.0.2 its only peer."""
    text = node_env.config.read_text()
    assert '[p2p]\nlisten = "127.0.0.1:0"\n' in text
    node_env.config.write_text(text.replace(
        '[p2p]\nlisten = "127.0.0.1:0"\n',
        f'[p2p]\nlisten = "127.0.0.3:{free_port("127.0.0.3")}"\nthreshold = "1MiB"\n'
        f'peers = ["127.0.0.2:{port}"]\nfallback_after_s = 30\n'))


def altered(src: Path, dst: Path) -> Path:
    """A copy of ``src`` with bytes flipped in the second half of its last shard (same names, same sizes)."""
    shutil.copytree(src, dst)
    shard = sorted(dst.glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    for off in range(len(data) // 2, len(data), 64 << 10):
        data[off] ^= 0x5A
    shard.write_bytes(bytes(data))
    return dst


def forge_record(torrent: bytes, manifest_digest: str) -> bytes:
    """The binding record a cold writer who read ``make_torrent`` would add: this manifest, this info dict."""
    d = lt.bdecode(torrent)
    ti = lt.torrent_info(d)
    d[BINDING_KEY] = {b"manifest": manifest_digest.encode(), b"info hash": ti.info_hashes().v2.to_bytes()}
    return lt.bencode(d)


def preload(wd, ref: str) -> dict:
    r = wd("--no-daemon", "preload", ref, "--tier", "warm", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_bound_torrent_of_an_unsigned_version_is_not_read_back(node_env, wd, tmp_path: Path) -> None:
    seed = P2PSession(P2PConfig(listen="127.0.0.2:0"))
    try:
        use_peer(node_env, seed.port)
        src = make_checkpoint(tmp_path / "src", total_bytes=6 * MiB, shards=2, layers=2)
        (src / "sub").mkdir()
        (src / "sub" / "empty.txt").write_bytes(b"")   # (an empty file: libtorrent writes no piece of it)
        assert wd("--no-daemon", "publish", src, "--name", NAME, "--version", "v1").returncode == 0
        v = read_version(node_env.cold, NAME, "v1")
        data = (v.path / TORRENT_RELPATH).read_bytes()
        ti = load_torrent(data, v.manifest)
        assert bound_to(data, ti, v.manifest)
        assert seed.seed(ti, v.path)
        rep = preload(wd, f"{NAME}@v1")
        by = rep["bytes_by_source"]
        assert by["origin"] + by["peer"] == rep["bytes"] and by.get("cold", 0) == 0, rep
        assert rep["source_fallbacks"] == [] and rep["swarm"]["read_back"] is False, rep
        assert wd("verify", node_env.warm / NAME / "v1").returncode == 0
    finally:
        seed.close()


def test_a_torrent_of_other_bytes_never_commits_them_unless_its_record_is_forged_for_an_unsigned_version(
        node_env, wd, keys, tmp_path: Path) -> None:  # noqa: F811
    attacker = P2PSession(P2PConfig(listen="127.0.0.2:0"))
    try:
        use_peer(node_env, attacker.port)
        src = make_checkpoint(tmp_path / "src", total_bytes=6 * MiB, shards=2, layers=2)
        for version, sign in (("v1", False), ("v2", True)):
            r = wd("--no-daemon", "publish", src, "--name", NAME, "--version", version,
                   *(("--sign", keys["fleet"]) if sign else ()))
            assert r.returncode == 0, r.stderr
        with open(node_env.config, "a") as f:
            f.write(f'[trust]\nrequire_signature = false\npublic_keys = ["{keys["fleet.pub"]}"]\n')
        evil = {}
        for version in ("v1", "v2"):   # (the cold writer's bytes under each label, and libtorrent's torrent of them)
            d = altered(src, tmp_path / f"evil-{version}" / version)
            evil[version] = (d, libtorrent_made(d, build_manifest(d), 4 * MiB))
            v = read_version(node_env.cold, NAME, version)
            assert attacker.seed(load_torrent(evil[version][1], v.manifest), d)

        def put(version: str, torrent: bytes) -> None:
            (node_env.cold / NAME / version / TORRENT_RELPATH).write_bytes(torrent)

        def from_cold_and_right(version: str) -> dict:
            rep = preload(wd, f"{NAME}@{version}")
            assert rep["bytes_by_source"]["cold"] == rep["bytes"], rep
            fb = rep["source_fallbacks"]
            assert [(f["from"], f["to"]) for f in fb] == [("p2p", "cold")] and "manifest" in fb[0]["reason"], fb
            assert wd("verify", node_env.warm / NAME / version).returncode == 0
            assert wd("--no-daemon", "evict", f"{NAME}@{version}", "--tier", "warm", "--force").returncode == 0
            return rep

        for version in ("v1", "v2"):   # libtorrent's torrent of other bytes: not bound, read back, caught
            put(version, evil[version][1])
            from_cold_and_right(version)
        # the record forged too: signed, still read back (the signature is not the torrent's), caught
        digest = {ver: read_version(node_env.cold, NAME, ver).manifest.digest for ver in ("v1", "v2")}
        put("v2", forge_record(evil["v2"][1], digest["v2"]))
        rep = from_cold_and_right("v2")
        assert rep["signature"]["checked"] is True, rep
        # unsigned: the forged torrent is taken as the manifest's own; the copy holds the torrent's bytes
        put("v1", forge_record(evil["v1"][1], digest["v1"]))
        rep = preload(wd, f"{NAME}@v1")
        assert rep["bytes_by_source"].get("cold", 0) == 0 and rep["swarm"]["read_back"] is False, rep
        bad = wd("verify", node_env.warm / NAME / "v1")
        assert bad.returncode != 0 and "safetensors" in bad.stdout + bad.stderr, bad
    finally:
        attacker.close()
