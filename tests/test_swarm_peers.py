"""bench/swarm_peers.py reads what the daemons log at debug level once a second during a download (the
per-peer line, ``p2p.transfer.peer_rates``): a real seed and a real rate-limited downloader on
loopback, the downloader's log written by the daemon's own formatter."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from p2p import P2PConfig, P2PSession, load_torrent, make_torrent
from p2p.transfer import peer_rates
from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint
from weightd.logs import TextFormatter

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _swarm_peers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "swarm_peers.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_per_peer_line_says_who_a_worker_took_from(tmp_path: Path) -> None:
    """S (rack r1, an origin's log and no worker log: it counts as an origin) seeds 6 MiB; W (rack r0) takes it
    at 1 MB/s with its plan on and its debug log kept as the daemon writes it. swarm_peers finds W's
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
    w = P2PSession(P2PConfig(listen="127.0.0.3:0", rack="r0", download_limit=1_000_000))
    parts: list[list[str]] = []
    t = threading.Thread(target=w.download, args=(ti, tmp_path / "w" / "v1"),
                         kwargs={"peers": (f"127.0.0.2:{s.port}",), "stall_s": 20, "timeout_s": 40})
    try:
        assert s.seed(ti, ckpt)
        t.start()
        deadline = time.monotonic() + 40
        while t.is_alive() and time.monotonic() < deadline:   # (a record keeps 512 characters an argument:
            for h in w.ses.get_torrents():                    # the line is split to fit, here at 20)
                if any(p.ip[0] == "127.0.0.2" for p in h.get_peer_info()):
                    parts.append(peer_rates(h, budget=20))
            time.sleep(0.2)
        t.join(5)
        assert verify_checkpoint(tmp_path / "w" / "v1", m).ok
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        handler.close()
        for x in (s, w):
            x.close()
    assert parts and all(len(x) == 2 and x[0].startswith("down=") and x[1].startswith("127.0.0.2:")
                         and " " not in x[1] for x in parts), parts   # (an entry longer than the budget: alone)
    text = (logs / "worker-127.0.0.3-0001.log").read_text()
    assert " rack=r0 rates down=" in text and "127.0.0.2:" in text, text[-2000:]
    (logs / "origin-127.0.0.2-0001.log").write_text("")   # (S's address is an origin's: bench/swarm.py keeps its log)
    p = _swarm_peers(str(logs), "--cap", "1MB")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    (row,) = out["workers"]
    assert row["ip"] == "127.0.0.3" and row["rack"] == "r0" and not row["gateway"], row
    assert row["samples"] >= 1 and row["down_kBps"] > 0, row
    assert row["from_origins_kBps"] > 0 and row["from_unknown_kBps"] == 0, row
    assert row["from_other_racks_kBps"] == 0 and row["from_own_rack_kBps"] == 0, row
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


def _line(ts: str, level: str, logger: str, msg: str) -> str:
    return f"2026-12-06T18:00:{ts}Z {level} {logger}: {msg}\n"


def test_intake_is_told_apart_by_where_it_came_from(tmp_path: Path) -> None:
    """Three workers in two racks and an origin, in the daemon's text and JSON formats: the gateway's
    intake from other racks, its rack and the origin, its senders' upload at the same moment, the
    crossing backlog, a line split in two and a line cut at 512 characters."""
    g, mate, far, origin = "127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.2"
    (tmp_path / f"origin-{origin}-aaaaaa.log").write_text("")
    (tmp_path / f"worker-{g}-aaaaaa.log").write_text("".join([
        _line("01.000", "INFO", "p2p.transfer", "p2p: v1: this node is rack r0's gateway: it takes pieces across racks for it"),
        _line("02.000", "DEBUG", "p2p.transfer", "p2p: v1 t=2.0 workers=3 own=4 origin_left=4 gateway=127.0.0.10 crossing=6 blocked=- open_all=False"),
        _line("02.000", "DEBUG", "p2p.transfer", f"p2p: v1 t=2.0 rack=r0 rates down=900 up=10 have=3 {far}:600/0/40"),
        _line("02.000", "DEBUG", "p2p.transfer", f"p2p: v1 t=2.0 rack=r0 rates+ {mate}:200/5/3 {origin}:100/0/2"),
        _line("03.000", "DEBUG", "p2p.transfer", "p2p: v1 t=3.0 workers=3 own=4 origin_left=0 gateway=127.0.0.10 crossing=8 blocked=- open_all=False"),
        _line("03.000", "DEBUG", "p2p.transfer", f"p2p: v1 t=3.0 rack=r0 rates down=1100 up=10 have=9 {far}:800/0/60 "
              f"{mate}:300/0/1 {origin}:0/0/0 127.0.0.99:4...[12 more characters]"),
        _line("04.000", "INFO", "p2p.transfer", "p2p: v1: this gateway's share is in: the rest from rack r0 (other racks' workers filtered out)"),
        _line("05.000", "DEBUG", "p2p.transfer", f"p2p: v1 t=5.0 rack=r0 rates down=5000 up=10 have=20 {mate}:5000/0/9"),
        _line("06.000", "INFO", "weightd.node.service", "preloaded name=m version=v1 tier=warm bytes=1 seconds=6.0"),
    ]))
    (tmp_path / f"worker-{mate}-aaaaaa.log").write_text(_line(
        "02.100", "DEBUG", "p2p.transfer", f"p2p: v1 t=2.0 rack=r0 rates down=500 up=300 have=2 {g}:5/200/1"))
    (tmp_path / f"worker-{far}-aaaaaa.log").write_text(json.dumps({
        "ts": "2026-12-06T18:00:02.200Z", "level": "debug", "logger": "p2p.transfer",
        "msg": f"p2p: v1 t=2.1 rack=r1 rates down=0 up=700 have=30 {g}:0/600/0"}) + "\n" + _line(
        "03.100", "DEBUG", "p2p.transfer", f"p2p: v1 t=3.1 rack=r1 rates down=0 up=900 have=30 {g}:0/800/0"))
    p = _swarm_peers(str(tmp_path), "--cap", "10MB")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    gw = next(r for r in out["workers"] if r["ip"] == g)
    assert gw["gateway"] and gw["rack"] == "r0" and gw["samples"] == 2 and gw["done_s"] == 6.0, gw
    assert gw["from_other_racks_kBps"] == 700 and gw["from_own_rack_kBps"] == 250, gw   # (medians of two seconds)
    assert gw["from_origins_kBps"] == 50 and gw["from_unknown_kBps"] == 0, gw           # (the cut entry dropped)
    assert gw["outside_blocks_queued"] == 50 and gw["crossing_backlog_pieces"] == 7, gw
    assert gw["outside_senders_upload_kBps"] == 800 and gw["outside_senders_upload_of_cap"] == 0.08, gw
    assert gw["down_kBps"] == 1000 and gw["down_of_cap"] == 0.1 and gw["cut_lines"] == 1 and gw["share_in_t"] == 4.0, gw
    assert out["medians"]["gateways"]["workers"] == 1 and out["cut_lines"] == 1


def test_a_line_it_cannot_read_is_named(tmp_path: Path) -> None:
    (tmp_path / "worker-127.0.0.10-aaaaaa.log").write_text(
        _line("02.000", "DEBUG", "p2p.transfer", "p2p: v1 t=2.0 rack=r0 rates down=1 up=1 have=1") + "{not json\n")
    p = _swarm_peers(str(tmp_path))
    assert p.returncode == 2 and "worker-127.0.0.10-aaaaaa.log:2: cannot read this line" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_two_downloads_in_one_log_are_refused_and_ipv6_sorts_beside_ipv4(tmp_path: Path) -> None:
    """A daemon's own log may hold several downloads: their samples must not be mixed (one line, exit
    2); workers on IPv4 and IPv6 addresses in one round are read side by side."""
    one = tmp_path / "one"
    one.mkdir()
    (one / "worker-127.0.0.10-aaaaaa.log").write_text(
        _line("02.000", "DEBUG", "p2p.transfer", "p2p: v1 t=2.0 rack=r0 rates down=5 up=0 have=1")
        + _line("09.000", "DEBUG", "p2p.transfer", "p2p: v2 t=1.0 rack=r0 rates down=7 up=0 have=1"))
    p = _swarm_peers(str(one))
    assert p.returncode == 2 and "127.0.0.10's log has the downloads of 2 torrents (v1, v2)" in p.stderr, p.stderr
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for ip in ("127.0.0.10", "::1"):
        (mixed / f"worker-{ip}-aaaaaa.log").write_text(
            _line("02.000", "DEBUG", "p2p.transfer", f"p2p: v1 t=2.0 rack=r0 rates down=5 up=0 have=1 ::2:5/0/1")
            + _line("02.000", "DEBUG", "p2p.transfer", "p2p: v1 t=9.0 rack=r0 rates+ 127.0.0.9:1/0/0"))
    p = _swarm_peers(str(mixed))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [r["ip"] for r in out["workers"]] == ["127.0.0.10", "::1"], out["workers"]
    assert all(r["from_unknown_kBps"] == 5 and r["cut_lines"] == 1 for r in out["workers"]), out["workers"]
