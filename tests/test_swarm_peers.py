"""bench/swarm_peers.py reads what the daemons log at debug level once a second during a download (the
per-peer line, ``p2p.transfer.peer_rates``): a real seed and a real rate-limited downloader on
loopback, the downloader's log written by the daemon's own formatter."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from p2p import P2PConfig, P2PSession, load_torrent, make_torrent
from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint
from weightd.logs import TextFormatter

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _swarm_peers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "swarm_peers.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_per_peer_line_says_who_a_worker_took_from(tmp_path: Path) -> None:
    """S (rack r1, no worker log of its own: it counts as an origin) seeds 6 MiB; W (rack r0) takes it
    at 2 MB/s with its plan on and its debug log kept as the daemon writes it. swarm_peers finds W's
    rack, its samples and its intake, all of it from S."""
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=6 * MiB, shards=2, layers=2)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m, piece_size=MiB // 4), m)
    logs = tmp_path / "logs"
    logs.mkdir()
    handler = logging.FileHandler(logs / "worker-127.0.0.3-0001.log")
    handler.setFormatter(TextFormatter())
    log = logging.getLogger("p2p.transfer")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r1"))
    w = P2PSession(P2PConfig(listen="127.0.0.3:0", rack="r0", download_limit=2_000_000))
    try:
        assert s.seed(ti, ckpt)
        w.download(ti, tmp_path / "w" / "v1", peers=(f"127.0.0.2:{s.port}",), stall_s=20, timeout_s=40)
        assert verify_checkpoint(tmp_path / "w" / "v1", m).ok
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()
        for x in (s, w):
            x.close()
    text = (logs / "worker-127.0.0.3-0001.log").read_text()
    assert " rack=r0 rates down=" in text and "127.0.0.2:" in text, text[-2000:]
    p = _swarm_peers(str(logs), "--cap", "2MB")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    (row,) = out["workers"]
    assert row["ip"] == "127.0.0.3" and row["rack"] == "r0" and not row["gateway"], row
    assert row["samples"] >= 1 and row["down_kBps"] > 0, row
    assert row["from_origins_kBps"] > 0 and row["from_other_racks_kBps"] == 0 and row["from_own_rack_kBps"] == 0, row
    assert 0 < row["down_of_cap"] <= 1.5, row
    assert out["medians"]["others"]["workers"] == 1 and out["medians"]["gateways"]["workers"] == 0


def test_bad_input_gets_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = [([str(tmp_path / "missing")], "no such directory"),
             ([str(tmp_path)], "no worker log with per-peer rates"),
             ([str(tmp_path), "--cap", "fast"], "--cap")]
    (tmp_path / "worker-127.0.0.9-1.log").write_text("2026-12-06T18:00:00.000Z INFO p2p.transfer: p2p: hello\n")
    two = tmp_path / "two-rounds"
    two.mkdir()
    for suffix in ("aaaaaa", "bbbbbb"):   # (bench/swarm.py names each daemon's log by its work directory)
        (two / f"worker-127.0.0.9-{suffix}.log").write_text("")
    cases.append(([str(two)], "logs of more than one round (127.0.0.9 has 2)"))
    for args, says in cases:
        p = _swarm_peers(*args)
        assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) <= 2, p.stderr   # (argparse: its usage line and the error)
