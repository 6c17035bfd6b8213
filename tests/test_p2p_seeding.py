"""What docs/p2p.md promises of seeds and torrents, with real libtorrent sessions on 127.0.0.x:

- ``piece_size = "auto"`` (the default): a torrent's pieces are 4 MiB under 1 GiB, 8 MiB under 16 GiB,
  16 MiB above; a size set in ``[p2p] piece_size`` is used as it is.
- Seeds run in upload mode: a seed whose copy rotted on disk stops serving the bad pieces and never
  downloads them again, so the tier copy under a server reading it is never rewritten in place.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from p2p import TORRENT_RELPATH, P2PConfig, P2PError, P2PSession, load_torrent, make_torrent
from tiering import piece_size_for
from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

MiB, GiB = 1 << 20, 1 << 30


# -- piece_size -------------------------------------------------------------------------------------------
def test_auto_piece_sizes_follow_the_checkpoint_size() -> None:
    for total, want in ((1, 4 * MiB), (GiB - 1, 4 * MiB), (GiB, 8 * MiB), (16 * GiB - 1, 8 * MiB),
                        (16 * GiB, 16 * MiB), (400 * GiB, 16 * MiB)):
        assert piece_size_for(total) == want, total


def test_a_torrent_of_1_gib_made_without_a_piece_size_takes_8_mib_pieces(tmp_path: Path) -> None:
    """A real torrent of a 1 GiB version (a sparse file: nothing is written to disk) gets the automatic
    piece size above the 1 GiB step (below it: the 6 MiB checkpoints published below)."""
    d = tmp_path / "v1"
    d.mkdir()
    with open(d / "blob.bin", "wb") as fh:
        fh.truncate(GiB)
    m = build_manifest(d)
    ti = load_torrent(make_torrent(d, m), m)
    assert ti.piece_length() == 8 * MiB and ti.total_size() == GiB


@pytest.mark.parametrize("setting, want", [('piece_size = "auto"\n', 4 * MiB), ("", 4 * MiB),
                                           ('piece_size = "1MiB"\n', MiB)], ids=["auto", "unset", "1MiB"])
def test_publish_makes_the_torrent_with_the_configured_piece_size(node_env, wd, tmp_path: Path, setting: str,
                                                                   want: int) -> None:
    text = node_env.config.read_text()
    assert '[p2p]\nlisten = "127.0.0.1:0"\n' in text
    node_env.config.write_text(text.replace('[p2p]\nlisten = "127.0.0.1:0"\n',
                                            '[p2p]\nlisten = "127.0.0.1:0"\nthreshold = "1MiB"\n' + setting))
    src = make_checkpoint(tmp_path / "src", total_bytes=6 * MiB, shards=2, layers=2)
    r = wd("--no-daemon", "publish", src, "--name", "org/p", "--version", "v1")
    assert r.returncode == 0, r.stderr
    m = build_manifest(src)
    ti = load_torrent((node_env.cold / "org/p/v1" / TORRENT_RELPATH).read_bytes(), m)
    assert ti.piece_length() == want


# -- upload mode ------------------------------------------------------------------------------------------
def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_seed_whose_copy_rotted_stops_serving_it_and_never_repairs_it_in_place(tmp_path: Path) -> None:
    """Seed A's copy has a flipped byte in every 1 MiB piece of one shard; seed B's is whole. A leecher
    given both finishes verified: A's pieces fail their hash when it first uploads them (seed mode)
    and A stops serving them. A, dialled to B and to the finished leecher, which hold every piece it
    lost, downloads none of them: its file is byte for byte what it was (upload mode)."""
    import shutil
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=6 * MiB, shards=2, layers=2)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m, piece_size=MiB), m)
    rotted = tmp_path / "a" / "v1"
    shutil.copytree(ckpt, rotted)
    shard = sorted(rotted.glob("*.safetensors"))[0]
    with open(shard, "r+b") as fh:   # one byte of every piece of the shard (v2: pieces start at the file)
        for off in range(0, shard.stat().st_size, MiB):
            fh.seek(off + 100)
            b = fh.read(1)
            fh.seek(off + 100)
            fh.write(bytes([b[0] ^ 0xFF]))
    before, mtime = sha256(shard), shard.stat().st_mtime_ns
    a = P2PSession(P2PConfig(listen="127.0.0.2:0"))
    b = P2PSession(P2PConfig(listen="127.0.0.3:0"))
    c = P2PSession(P2PConfig(listen="127.0.0.4:0"))
    d = P2PSession(P2PConfig(listen="127.0.0.5:0"))
    try:
        assert a.seed(ti, rotted) and b.seed(ti, ckpt)
        # a leecher with A alone asks it for the rotted shard's pieces (with B there too, B may serve
        # them all first on a busy machine): A hashes each on its first upload and drops it, and the
        # leecher is left waiting for them
        with pytest.raises(P2PError):
            d.download(ti, tmp_path / "d" / "v1", peers=(f"127.0.0.2:{a.port}",), stall_s=3, timeout_s=30, plan=False)
        assert a.stats()["hash_failures"] > 0, a.stats()
        r = c.download(ti, tmp_path / "c" / "v1", peers=(f"127.0.0.2:{a.port}", f"127.0.0.3:{b.port}"),
                       stall_s=30, timeout_s=90, plan=False)
        assert verify_checkpoint(tmp_path / "c" / "v1", m).ok
        assert sum(r.bytes_by_peer.values()) >= m.total_bytes
        ha = next(iter(a.seeding.values()))
        # A now lacks pieces that B (and the leecher, seeding what it fetched) hold: dial them, and watch
        # A for as long as a download of 1 MiB pieces over loopback takes many times over
        c.seed(ti, tmp_path / "c" / "v1")
        lost = [i for i, have in enumerate(ha.status().pieces) if not have]
        assert lost, "A still claims every piece"
        met: set[str] = set()
        deadline = time.monotonic() + 15
        while len(met) < 2 or time.monotonic() < deadline - 10:
            assert time.monotonic() < deadline, met
            for port, ip in ((b.port, "127.0.0.3"), (c.port, "127.0.0.4")):
                ha.connect_peer((ip, port))
            met |= {p.ip[0] for p in ha.get_peer_info()} & {"127.0.0.3", "127.0.0.4"}
            time.sleep(0.25)
        time.sleep(1.5)   # (libtorrent's counters tick once a second)
        st = ha.status()
        assert st.all_time_download == 0 and st.total_payload_download == 0, st.all_time_download
        assert [i for i, have in enumerate(st.pieces) if not have] == lost
        assert sha256(shard) == before and shard.stat().st_mtime_ns == mtime
    finally:
        for s in (a, b, c, d):
            s.close()
    assert os.path.getsize(shard) == os.path.getsize(sorted(ckpt.glob("*.safetensors"))[0])
