"""p2p's edges: libtorrent errors translated at one boundary, its own config, weightd's adapter."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import libtorrent as lt
import pytest

from p2p import LibtorrentError, P2PConfig, P2PError, TransferFailed, make_torrent, map_libtorrent_errors
from tiering import IntegrityError, build_manifest, make_checkpoint

MiB = 1 << 20


def test_a_real_libtorrent_error_becomes_a_p2p_error_with_fields(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=2 * MiB, shards=2, layers=2)
    m = build_manifest(ckpt)
    (ckpt / m.files[-1].path).unlink()  # a file vanished before it was hashed
    with pytest.raises(LibtorrentError) as info:
        with map_libtorrent_errors("org/x@v1: cannot make its torrent"):
            ct = lt.create_torrent([lt.create_file_entry(f"v1/{f.path}", f.size) for f in m.files], 4 * MiB,
                                   lt.create_torrent.v2_only)
            lt.set_piece_hashes(ct, str(tmp_path))
    err = info.value
    assert isinstance(err, P2PError) and err.what == "org/x@v1: cannot make its torrent" and err.reason
    assert str(err) == f"{err.what}: {err.reason}" and err.__cause__ is None and err.exit_code == 1
    # weightd's own torrent writer checks the files against the manifest as it hashes: ours, not libtorrent's
    with pytest.raises(IntegrityError, match=m.files[-1].path):
        with map_libtorrent_errors("org/x@v1: cannot make its torrent"):
            make_torrent(ckpt, m)


def test_the_boundary_passes_our_errors_and_others_unchanged() -> None:
    ours = TransferFailed("ab" * 32, "Is a directory")
    with pytest.raises(TransferFailed) as info, map_libtorrent_errors("download"):
        raise ours
    assert info.value is ours and info.value.info_hash == "ab" * 32 and info.value.reason == "Is a directory"
    with pytest.raises(KeyError), map_libtorrent_errors("download"):
        raise KeyError("not libtorrent's")


@pytest.mark.parametrize("change,key", [
    ({"threshold": -1}, "p2p.threshold"), ({"upload_limit": -5}, "p2p.upload_limit"),
    ({"max_connections": 0}, "p2p.max_connections"), ({"fallback_after_s": 0}, "p2p.fallback_after_s"),
    ({"listen": "nowhere"}, "p2p.listen"), ({"peers": ("127.0.0.2:6881", "127.0.0.3")}, "p2p.peers"),
    ({"peers": ("127.0.0.2:99999",)}, "p2p.peers"), ({"gateways": 0}, "p2p.gateways"),
    ({"gateways": 65}, "p2p.gateways"),
])
def test_config_is_validated_when_built_and_names_the_key(change: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        P2PConfig(**change)


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        P2PConfig().threshold = 1  # type: ignore[misc]


def test_weightd_builds_p2p_config_from_every_p2p_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from weightd.config import load as config_mod
    from weightd.node.swarm import P2PFetcher, p2p_config
    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", tmp_path / "none.toml")
    path = tmp_path / "w.toml"
    path.write_text('[p2p]\nthreshold = "2MiB"\nlisten = "127.0.0.9:7000"\npeers = ["127.0.0.2:6881"]\n'
                    'trackers = ["http://127.0.0.2:7070/announce"]\nallow = ["127.0.0.0/8"]\n'
                    'upload_limit = "3MB"\ndownload_limit = "4MB"\nmax_connections = 7\nfallback_after_s = 9\n'
                    'piece_size = "1MiB"\ngateways = 3\norigin_request_queue = 64\n')
    cfg = config_mod.load_config(path, env={"HOME": str(tmp_path), "USER": "wdtest"})
    assert p2p_config(cfg) == P2PConfig(
        listen="127.0.0.9:7000", upload_limit=3_000_000, download_limit=4_000_000, allow=("127.0.0.0/8",),
        max_connections=7, peers=("127.0.0.2:6881",), trackers=("http://127.0.0.2:7070/announce",),
        threshold=2 * MiB, fallback_after_s=9.0, piece_size=MiB, gateways=3)
    # (what an origin lets a peer ask of it at once: an origin's session only)
    assert p2p_config(cfg, "origin") == dataclasses.replace(p2p_config(cfg), request_queue=64)
    fetcher = P2PFetcher(cfg)  # (no session until a download needs one)
    assert fetcher.config == p2p_config(cfg) and fetcher._session is None
    fetcher.close()
