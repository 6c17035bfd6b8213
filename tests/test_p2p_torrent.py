"""weightd's own BitTorrent v2 writer (``p2p.torrent.make_torrent``) against libtorrent's.

The torrent is made from the bytes that are checked against the manifest in the same read, so it can
only describe the manifest's bytes. Checked here: for file shapes at every edge of the merkle trees
(empty, under a block, a block, a piece, a piece and a byte, piece counts that are and are not powers
of two, many files in directories), the bytes and the info-hash are exactly what ``lt.create_torrent``
and ``lt.set_piece_hashes`` make of the same files, with and without a fleet CA; a byte that differs
from the manifest fails the torrent; the record that binds it to the manifest says which manifest and
which info dict, and a torrent made any other way carries none.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import libtorrent as lt
import pytest

from p2p import load_torrent, make_torrent
from p2p.torrent import BINDING_KEY, bound_to
from tiering import IntegrityError, build_manifest
from tiering.sample import make_checkpoint

KiB, MiB = 1 << 10, 1 << 20
DATE = 1_700_000_000
CA = b"-----BEGIN CERTIFICATE-----\nMIIBfake0fleet0ca0for0the0info0dict\n-----END CERTIFICATE-----\n"


def libtorrent_made(version_dir: Path, m, piece_size: int, root_cert: bytes | None = None) -> bytes:
    """What weightd made before: libtorrent's own creator over the same files, in a pass of its own."""
    ct = lt.create_torrent([lt.create_file_entry(f"{version_dir.name}/{f.path}", f.size) for f in m.files],
                           piece_size, lt.create_torrent.v2_only)
    if root_cert:
        ct.set_root_cert(root_cert.decode("ascii"))
    ct.set_creator("weightd")
    ct.set_comment(f"{m.name}@{m.version} {m.digest}")
    ct.set_creation_date(DATE)
    lt.set_piece_hashes(ct, str(version_dir.parent))
    return lt.bencode(ct.generate())


def without_binding(data: bytes) -> bytes:
    d = lt.bdecode(data)
    assert BINDING_KEY in d
    del d[BINDING_KEY]
    return lt.bencode(d)


def write_files(d: Path, sizes: dict[str, int], seed: int = 1) -> None:
    rng = random.Random(seed)
    for rel, size in sizes.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size))


P = 64 * KiB   # 4 blocks a piece: every level of the tree is reached with small files
SHAPES = {
    "an empty file beside one byte": {"e.bin": 0, "f.bin": 1},
    "one byte": {"a.bin": 1},
    "under a block": {"a.bin": 5000},
    "exactly one block": {"a.bin": 16 * KiB},
    "a block and a byte": {"a.bin": 16 * KiB + 1},
    "three blocks": {"a.bin": 48 * KiB},
    "one piece": {"a.bin": P},
    "a piece and a byte": {"a.bin": P + 1},
    "two pieces": {"a.bin": 2 * P},
    "three pieces and a bit": {"a.bin": 3 * P + 777},
    "five pieces (layer padded to 8)": {"a.bin": 5 * P - 3},
    "nine pieces": {"a.bin": 9 * P},
    "files of every shape in directories": {
        "e.bin": 0, "a/b/one.bin": 1, "a/block.bin": 16 * KiB, "a/piece.bin": P, "b/more.bin": P + 1,
        "b/c/d/big.bin": 7 * P + 100, "z.bin": 3 * KiB, "a/empty": 0},
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("ca", [None, CA], ids=["plain", "fleet-ca"])
def test_the_torrent_is_libtorrents_byte_for_byte(tmp_path: Path, shape: str, ca: bytes | None) -> None:
    d = tmp_path / "v1"
    write_files(d, SHAPES[shape])
    m = build_manifest(d)
    ours = make_torrent(d, m, piece_size=P, root_cert=ca, creation_date=DATE)
    theirs = libtorrent_made(d, m, P, ca)
    assert without_binding(ours) == theirs
    ti = load_torrent(ours, m)
    assert ti.info_hashes() == lt.torrent_info(lt.bdecode(theirs)).info_hashes()
    assert bound_to(ours, ti, m) and not bound_to(theirs, ti, m)


def test_many_files_of_random_sizes_and_the_automatic_piece_size(tmp_path: Path) -> None:
    """60 files of random sizes around the block and piece edges, and a sample checkpoint (safetensors:
    the manifest's parts are tensors, not chunks) with the automatic 4 MiB pieces."""
    rng = random.Random(7)
    d = tmp_path / "many" / "v2"
    sizes = {f"d{i % 4}/f{i:02d}.bin": rng.choice([0, 1, 16 * KiB - 1, 16 * KiB, 16 * KiB + 1, P - 1, P, P + 1,
                                                 rng.randrange(0, 12 * P)]) for i in range(60)}
    write_files(d, sizes, seed=3)
    m = build_manifest(d)
    assert without_binding(make_torrent(d, m, piece_size=P, creation_date=DATE)) == libtorrent_made(d, m, P)
    ckpt = make_checkpoint(tmp_path / "ck" / "v1", total_bytes=9 * MiB, shards=2, layers=2)
    mc = build_manifest(ckpt)
    ours = make_torrent(ckpt, mc, creation_date=DATE)
    assert load_torrent(ours, mc).piece_length() == 4 * MiB
    assert without_binding(ours) == libtorrent_made(ckpt, mc, 4 * MiB)


def test_a_byte_that_differs_from_the_manifest_fails_the_torrent(tmp_path: Path) -> None:
    """The file changed between the manifest and the torrent (same size, one byte): no torrent, an
    IntegrityError naming the file; libtorrent's creator would have hashed the new bytes."""
    d = tmp_path / "v1"
    write_files(d, {"a.bin": 3 * P + 5, "b/c.bin": P})
    m = build_manifest(d)
    with open(d / "b/c.bin", "r+b") as fh:
        fh.seek(P // 2)
        b = fh.read(1)
        fh.seek(P // 2)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(IntegrityError, match="b/c.bin"):
        make_torrent(d, m, piece_size=P)
    libtorrent_made(d, m, P)   # (what used to happen: a torrent of other bytes than the manifest's)
    os.truncate(d / "b/c.bin", P - 1)
    with pytest.raises(IntegrityError, match="b/c.bin"):
        make_torrent(d, m, piece_size=P)


def test_the_record_names_the_manifest_and_the_info_dict_it_was_made_with(tmp_path: Path) -> None:
    d = tmp_path / "v1"
    write_files(d, {"a.bin": 2 * P + 1})
    m = build_manifest(d)
    data = make_torrent(d, m, piece_size=P)
    ti = load_torrent(data, m)
    assert bound_to(data, ti, m)
    # another manifest (the same files published again with other bytes elsewhere): not bound to it
    other = tmp_path / "o" / "v1"
    write_files(other, {"a.bin": 2 * P + 1}, seed=9)
    m2 = build_manifest(other)
    assert not bound_to(data, load_torrent(data, m2), m2)
    # the record kept under another info dict (a tool that rehashes and keeps unknown keys): not bound
    grafted = lt.bdecode(libtorrent_made(other, m2, P))
    grafted[BINDING_KEY] = lt.bdecode(data)[BINDING_KEY]
    grafted[BINDING_KEY][b"manifest"] = m2.digest.encode()
    g = lt.bencode(grafted)
    assert not bound_to(g, load_torrent(g, m2), m2)
    assert not bound_to(b"not bencode", ti, m)


def test_a_piece_size_libtorrent_cannot_take_is_refused_in_one_line(tmp_path: Path) -> None:
    from p2p import TorrentRejected
    d = tmp_path / "v1"
    write_files(d, {"a.bin": 10})
    m = build_manifest(d)
    for bad in (8 * KiB, 48 * KiB):
        with pytest.raises(TorrentRejected, match="power of two"):
            make_torrent(d, m, piece_size=bad)
    empty = tmp_path / "e" / "v1"
    write_files(empty, {"e.bin": 0, "f/g": 0})
    me = build_manifest(empty)
    with pytest.raises(TorrentRejected, match="no bytes"):   # (libtorrent: "invalid length of torrent")
        make_torrent(empty, me)
