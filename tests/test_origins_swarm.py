"""Several origins, the data plane: two origin daemons and four workers on 127.0.0.x, every node capped
low enough for a 2-core machine, every wait bounded. An origin killed (SIGKILL) half-way, an origin that
comes back, and a tracker outage: every worker completes from the swarm, nothing from cold."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest

from tiering.sample import make_checkpoint

from .test_p2p import Node, cluster, started  # noqa: F401 (cluster: the fixture)

MiB = 1 << 20
# what the origins together may send in one run, as multiples of the version: the median over rounds is
# 1.21-1.28x (issue 39's target, 1.3x, is the median's); single runs reached 1.33-1.34x (a CI run, a
# helper's run, a bench round), so one run is held to 1.4x; origins that each sent the whole version
# (2x) would still fail here
ONE_RUN_MAX = 1.4
LIMIT = "4MB"      # every node's cap: 48 MiB takes ~6 s through both origins, ~12 s to each worker
SIZE = 48 * MiB
REF = "org/ha@v1"


def metrics(node: Node) -> str:
    listen = re.search(r'\[metrics\]\nlisten = "([^"]+)"', node.config.read_text()).group(1)
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as r:
        return r.read().decode()


def copied(node: Node) -> float:
    """How far this worker's copy from the swarm is (0-1; 0 before it starts, and once it is past it)."""
    try:
        text = metrics(node)
    except OSError:
        return 0.0
    m = re.search(r'^weightd_transfer_progress_ratio\{[^}]*phase="copy"[^}]*\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def wait_for(what: str, ok: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.1)


def two_origins(cluster, tmp_path: Path, trackers: Callable[[list[Node]], list[str]] | None = None
                ) -> tuple[list[Node], list[Node]]:
    """Origins 127.0.0.2 and .3 (one cold storage, one tracker each) seeding REF; four workers (.4-.7)
    that list both origins as ``peers`` and both trackers (or the URLs ``trackers`` gives for them)."""
    a = cluster("127.0.0.2", role="origin", limit=LIMIT, p2p_extra='piece_size = "1MiB"\n')
    src = make_checkpoint(tmp_path / "src", total_bytes=SIZE, shards=4, layers=4, seed="ha")
    pub = a.cli("publish", str(src), "--name", "org/ha", "--version", "v1", "--json")
    assert pub.returncode == 0, pub.stderr
    b = cluster("127.0.0.3", role="origin", limit=LIMIT)
    origins = [a, b]
    for o in origins:   # (each seeds every published version once it is up)
        wait_for(f"{o.ip} seeds", lambda o=o: o.metric("weightd_p2p_seeding") >= 1)
    urls = trackers(origins) if trackers else [f"http://{o.ip}:{o.tracker_port}/announce" for o in origins]
    extra = (f'peers = [{", ".join(chr(34) + o.endpoint + chr(34) for o in origins)}]\n'
             f'trackers = [{", ".join(chr(34) + u + chr(34) for u in urls)}]\n')
    # (fallback_s: a worker falls back to cold after that long without a byte; these tests claim none
    # does. 8 s was crossed once in a loaded CI run while a restarted origin came back, 2026-12-06)
    workers = started([cluster(f"127.0.0.{i}", limit=LIMIT, p2p_extra=extra, fallback_s=20, wait=False)
                       for i in (4, 5, 6, 7)])
    return origins, workers


def preload_all(workers: list[Node]) -> list[Any]:
    return [w.popen("preload", REF, "--tier", "warm", "--json", "--timeout", "150") for w in workers]


def reports_of(procs: list[Any]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        stdout, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        out.append(json.loads(stdout.splitlines()[0]))
    return out


def when_copied(workers: list[Node], fraction: float, timeout_s: float = 90) -> None:
    """Until the workers hold ``fraction`` of the version on average."""
    wait_for(f"workers at {fraction:.0%}", lambda: sum(copied(w) for w in workers) / len(workers) >= fraction,
             timeout_s)


def kill(node: Node) -> None:
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait(timeout=10)


def check_from_swarm(reports: list[dict[str, Any]], workers: list[Node]) -> int:
    """Every worker holds the verified version, 0 bytes from cold and no fallback; returns the bytes
    all workers received from the origins together."""
    size = reports[0]["bytes"]
    for r in reports:
        by = r["bytes_by_source"]
        assert by["cold"] == 0 and by["origin"] + by["peer"] >= size, r
        assert r["source_fallbacks"] == [] and r["tier_fallback"] is None, r
    for w in workers:
        assert w.cli("verify", str(w.dir / "warm/org/ha/v1")).returncode == 0
    return sum(r["bytes_by_source"]["origin"] for r in reports)


@pytest.mark.slow
def test_an_origin_killed_half_way_costs_no_cold_byte(cluster, tmp_path: Path) -> None:
    """SIGKILL one of two origins when the workers hold about half the version: the other origin and
    the workers finish it; the origins together sent about one copy."""
    (a, b), workers = two_origins(cluster, tmp_path)
    t0 = time.monotonic()
    procs = preload_all(workers)
    when_copied(workers, 0.5)
    # every worker announced to both trackers (not only the first of the tier)
    assert a.metric("weightd_tracker_peers") >= 4 and b.metric("weightd_tracker_peers") >= 4
    kill(a)
    reports = reports_of(procs)
    took = time.monotonic() - t0
    from_origins = check_from_swarm(reports, workers)
    size = reports[0]["bytes"]
    # (`bench/swarm.py --origins 2 --kill-origin-at 0.5 --n 4 --rounds 5`: 1.21x (1.17-1.25) with the kill,
    # 1.28x (1.19-1.34) without)
    assert from_origins <= ONE_RUN_MAX * size, [r["bytes_by_source"] for r in reports]
    # (one copy through one 4 MB/s origin is 12.6 s: the rest of the swarm is bounded by it)
    assert took < 60, took
    assert b.metric("weightd_p2p_upload_bytes_total") > 0


@pytest.mark.slow
def test_an_origin_that_comes_back_seeds_again(cluster, tmp_path: Path) -> None:
    """Kill origin A early, start it again (the workers keep running), then kill origin B: the workers
    finish from A (and each other), nothing from cold: the restarted A served them."""
    (a, b), workers = two_origins(cluster, tmp_path)
    pids = [w.proc.pid for w in workers]
    procs = preload_all(workers)
    when_copied(workers, 0.15)
    kill(a)
    (a.dir / "weightd.sock").unlink(missing_ok=True)
    a.start()
    wait_for("the restarted origin seeds", lambda: a.metric("weightd_p2p_seeding") >= 1, 30)
    assert a.metric("weightd_p2p_upload_bytes_total") == 0
    kill(b)   # (the workers whose home origin was A moved to B; now back to A, let in again)
    reports = reports_of(procs)
    check_from_swarm(reports, workers)
    assert [w.proc.pid for w in workers] == pids and all(w.proc.poll() is None for w in workers)
    assert a.metric("weightd_p2p_upload_bytes_total") > 0   # (it served after it came back)


class Forwarder:
    """A tracker's port in front of the real one: each connection from 127.0.0.x goes on from that same
    address (the tracker lists the asker's address), and ``close`` makes the port refuse at once."""

    def __init__(self, ip: str, target: tuple[str, int]) -> None:
        self.target, self.conns = target, []
        self.sock = socket.create_server((ip, 0))
        self.url = f"http://{ip}:{self.sock.getsockname()[1]}/announce"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, (peer, _) = self.sock.accept()
                up = socket.create_connection(self.target, timeout=5, source_address=(peer, 0))
            except OSError:
                return
            self.conns += [c, up]
            for x, y in ((c, up), (up, c)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.slow
def test_a_tracker_outage_alone_costs_running_transfers_nothing(cluster, tmp_path: Path) -> None:
    """Both trackers' ports refuse from a third of the way on (the origins stay up): the transfers
    already running finish from the swarm, nothing from cold, the origins still send about one copy."""
    fwd: list[Forwarder] = []

    def trackers_of(origins: list[Node]) -> list[str]:
        fwd.extend(Forwarder("127.0.0.9", (o.ip, o.tracker_port)) for o in origins)
        return [f.url for f in fwd]
    try:
        (a, b), workers = two_origins(cluster, tmp_path, trackers=trackers_of)
        procs = preload_all(workers)
        when_copied(workers, 0.3)
        for f in fwd:
            f.close()
        reports = reports_of(procs)
        from_origins = check_from_swarm(reports, workers)
        assert from_origins <= ONE_RUN_MAX * reports[0]["bytes"], [r["bytes_by_source"] for r in reports]
        assert all(r["swarm"]["open_all_after_s"] is None for r in reports), [r["swarm"] for r in reports]
    finally:
        for f in fwd:
            f.close()
