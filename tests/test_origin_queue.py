"""What an origin lets one peer ask of it at once (``[p2p] origin_request_queue``; issue 38): read off
the wire, in the extended handshake a real origin daemon sends a BitTorrent peer (``reqq``), the value
every worker's libtorrent keeps to. Workers keep libtorrent's own."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import libtorrent as lt
import pytest

from p2p import TORRENT_RELPATH
from tiering.sample import make_checkpoint

from .test_p2p import MiB, cluster, started  # noqa: F401 (cluster: the fixture)

LIBTORRENT_DEFAULT = 2000   # settings_pack.max_allowed_in_request_queue


def _exact(s: socket.socket, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        chunk = s.recv(n - len(out))
        assert chunk, "the peer closed the connection before its extended handshake"
        out += chunk
    return out


def told_reqq(endpoint: str, info_hash: bytes, timeout: float = 10.0) -> int:
    """Dial ``endpoint`` as a BitTorrent peer would (handshake with the extension bit, then an extended
    handshake), and return the ``reqq`` its extended handshake tells (LIBTORRENT_DEFAULT if it says none)."""
    ip, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + timeout
    with socket.create_connection((ip, int(port)), timeout=timeout) as s:
        reserved = bytearray(8)
        reserved[5] |= 0x10   # BEP 10: the extension protocol
        s.sendall(b"\x13BitTorrent protocol" + bytes(reserved) + info_hash + b"-TQ0001-" + os.urandom(12))
        ext = lt.bencode({b"m": {}, b"reqq": 250})
        s.sendall(struct.pack(">IBB", len(ext) + 2, 20, 0) + ext)
        theirs = _exact(s, 68, deadline)
        assert theirs[28:48] == info_hash, "the origin answered for another torrent"
        while time.monotonic() < deadline:
            (n,) = struct.unpack(">I", _exact(s, 4, deadline))
            body = _exact(s, n, deadline) if n else b""
            if n >= 2 and body[0] == 20 and body[1] == 0:
                return int(lt.bdecode(body[2:]).get(b"reqq", LIBTORRENT_DEFAULT))
    raise AssertionError(f"no extended handshake from {endpoint} in {timeout} s")


def _info_hash(cold: Path, name: str, version: str) -> bytes:
    """What a v2 torrent's handshake carries: the first 20 bytes of its SHA-256 info-hash."""
    ti = lt.torrent_info(str(cold / name / version / TORRENT_RELPATH))
    return ti.info_hashes().v2.to_bytes()[:20]


def test_an_origin_tells_every_peer_its_request_queue_and_a_worker_keeps_libtorrents(cluster, tmp_path: Path) -> None:
    """The shipped origin tells 128 blocks; ``origin_request_queue = 0`` gives libtorrent's 2,000 and 64
    gives 64 (each a daemon of its own: the setting is its session's); a worker seeding the same version
    (the key is an origin's only) tells libtorrent's."""
    shipped = cluster("127.0.0.2", role="origin", limit="40MB")
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2)
    assert shipped.cli("publish", str(src), "--name", "org/queue", "--version", "v1").returncode == 0
    others = started([cluster("127.0.0.3", role="origin", wait=False, p2p_extra="origin_request_queue = 0\n"),
                      cluster("127.0.0.4", role="origin", wait=False, p2p_extra="origin_request_queue = 64\n"),
                      cluster("127.0.0.5", origin=shipped.endpoint, wait=False,
                              p2p_extra="origin_request_queue = 32\n")])
    ih = _info_hash(tmp_path / "cold", "org/queue", "v1")
    worker = others[2]
    assert worker.cli("preload", "org/queue@v1", "--tier", "warm").returncode == 0
    for node in (shipped, *others[:2], worker):   # (each seeds it: origins at once, the worker once it holds it)
        deadline = time.monotonic() + 30
        while node.metric("weightd_p2p_seeding") < 1:
            assert time.monotonic() < deadline, f"{node.ip} does not seed org/queue@v1"
            time.sleep(0.1)
    assert told_reqq(shipped.endpoint, ih) == 128
    assert told_reqq(others[0].endpoint, ih) == LIBTORRENT_DEFAULT
    assert told_reqq(others[1].endpoint, ih) == 64
    assert told_reqq(worker.endpoint, ih) == LIBTORRENT_DEFAULT


@pytest.mark.parametrize("value, says", [
    ("8", "expected 0 (libtorrent's 2,000) or from 16 to 2000 blocks of 16 KiB"),
    ("2001", "less than or equal to 2000"),
    ("-1", "greater than or equal to 0"),
    ('"lots"', "integer"),
])
def test_a_bad_origin_request_queue_is_one_line_naming_the_key(tmp_path: Path, isolated_env, value: str,
                                                                says: str) -> None:
    import subprocess
    import sys
    cfg = tmp_path / "w.toml"
    cfg.write_text(f'state_dir = "{tmp_path}/state"\n[tiers.cold]\npath = "{tmp_path}/cold"\n'
                   f"[p2p]\norigin_request_queue = {value}\n")
    r = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "config", "show"],
                       capture_output=True, text=True, env=isolated_env, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r
    line = r.stderr.strip()
    assert "\n" not in line and "p2p.origin_request_queue" in line and says in line, line
