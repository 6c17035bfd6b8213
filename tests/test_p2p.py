"""P2P with real libtorrent sessions and real daemons on 127.0.0.x (loopback only, bounded in time)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from p2p import TORRENT_RELPATH, P2PConfig, P2PSession, TorrentRejected, load_torrent, make_torrent
from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

from .conftest import reserve_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def free_port(ip: str) -> int:
    """A port on ``ip`` held for the daemon until the test ends (conftest.reserve_port)."""
    return reserve_port(ip)


tracker_of: dict[str, int] = {}  # running origin's endpoint -> its tracker port (a Node's, from start to stop)


class Node:
    """One weightd daemon on its own 127.0.0.x with its own tiers, state and socket; shared cold."""

    def __init__(self, base: Path, ip: str, cold: Path, *, role: str = "worker", origin: str | None = None,
                 allow: str = "127.0.0.0/8", env: dict[str, str], limit: str = "40MB", p2p_extra: str = "",
                 cold_toml: str | None = None, fallback_s: float = 4, cmd: list[str] | None = None,
                 wait: bool = True) -> None:
        """``cmd``: how to run weightd (default: this checkout's, as ``python -m weightd``; the install
        tests pass an installed ``weightd``, run from outside the checkout). ``wait``: False returns once
        the daemon is launched (``wait_started`` then waits for it: several start at once)."""
        self.cmd, self.cwd = (cmd, base) if cmd is not None else ([sys.executable, "-m", "weightd"], ROOT)
        self.ip, self.dir = ip, base / f"node-{ip}"
        self.dir.mkdir(parents=True)
        self.hot = Path(f"/dev/shm/weightd-test-p2p-{uuid.uuid4().hex[:8]}")
        self.port = free_port(ip)
        self.tracker_port = free_port(ip)
        tracker = (f'tracker_listen = "{ip}:{self.tracker_port}"\n' if role == "origin" else
                   f'trackers = ["http://{origin.rpartition(":")[0]}:{tracker_of[origin]}/announce"]\n'
                   if origin and origin in tracker_of else "")
        self.config = self.dir / "weightd.toml"
        self.config.write_text(
            f'state_dir = "{self.dir}/state"\n'
            f'[tiers.hot]\npath = "{self.hot}"\ncapacity = "256MiB"\n'
            f'[tiers.warm]\npath = "{self.dir}/warm"\ncapacity = "512MiB"\n'
            + (cold_toml or f'[tiers.cold]\npath = "{cold}"\n') +
            f'[api]\nsocket = "{self.dir}/weightd.sock"\n'
            f'[metrics]\nlisten = "{ip}:{free_port(ip)}"\n'
            f'[p2p]\nthreshold = "1MiB"\nlisten = "{ip}:{self.port}"\nallow = ["{allow}"]\n'
            f'upload_limit = "{limit}"\ndownload_limit = "{limit}"\nfallback_after_s = {fallback_s}\n'
            + (f'peers = ["{origin}"]\n' if origin else "") + tracker + p2p_extra)
        self.env, self.role = env, role
        self.log = open(self.dir / "daemon.log", "a")
        self.start(wait=wait)

    def start(self, wait: bool = True) -> None:
        if self.log.closed:
            self.log = open(self.dir / "daemon.log", "a")
        if self.role == "origin":   # (gone again at stop: a later origin on the same endpoint is another)
            tracker_of[self.endpoint] = self.tracker_port
        self.proc = subprocess.Popen([*self.cmd, "-v", "--config", str(self.config), "serve",
                                      "--role", self.role], stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.cwd)
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Until the daemon's socket is there (30 s at most)."""
        deadline = time.monotonic() + 30
        while not (self.dir / "weightd.sock").exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, (self.dir / "daemon.log").read_text()
            time.sleep(0.1)

    @property
    def endpoint(self) -> str:
        return f"{self.ip}:{self.port}"

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.cmd, "--config", str(self.config), *args],
                              capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.cwd)

    def popen(self, *args: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
        return subprocess.Popen([*self.cmd, "--config", str(self.config), *args],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=self.env, cwd=self.cwd)

    def metric(self, name: str) -> float:
        """One sample of this daemon's /metrics, by its full name with labels (0 when absent)."""
        import urllib.request
        listen = re.search(r'\[metrics\]\nlisten = "([^"]+)"', self.config.read_text()).group(1)
        text = urllib.request.urlopen(f"http://{listen}/metrics", timeout=10).read().decode()
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self) -> None:
        tracker_of.pop(self.endpoint, None)
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.hot, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path, isolated_env):
    nodes: list[Node] = []

    def start(ip: str, **kw) -> Node:
        n = Node(tmp_path, ip, tmp_path / "cold", env=isolated_env, **kw)
        nodes.append(n)
        return n
    try:
        yield start
    finally:
        for n in nodes:
            n.stop()


def started(nodes: list[Node]) -> list[Node]:
    """``nodes`` (made with ``wait=False``) once each one's daemon is up: launched together, they start in
    about the time one takes, not one after another."""
    for n in nodes:
        n.wait_started()
    return nodes


def preloaded_at_once(workers: list[Node], ref: str) -> list[dict[str, Any]]:
    """``preload REF --tier warm --json`` on every worker at once; their reports (each must succeed)."""
    procs = [w.popen("preload", ref, "--tier", "warm", "--json", "--timeout", "120") for w in workers]
    reports = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err
            reports.append(json.loads(out.splitlines()[0]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return reports


def test_torrent_matches_manifest_and_rejects_escapes(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=6 * MiB, shards=2, layers=2)
    m = build_manifest(ckpt)
    data = make_torrent(ckpt, m)
    ti = load_torrent(data, m)
    assert ti.info_hashes().has_v2() and not ti.info_hashes().has_v1() and ti.name() == "v1"
    other = make_checkpoint(tmp_path / "other", total_bytes=6 * MiB, shards=3, layers=2)
    with pytest.raises(TorrentRejected, match="do not match the manifest"):
        load_torrent(data, build_manifest(other))
    with pytest.raises(TorrentRejected, match="not a valid torrent"):
        load_torrent(b"d4:infod4:name3:../ee", m)
    # a real v2 torrent whose file tree was edited to climb out of the checkpoint ("../config.json"):
    # libtorrent sanitises the path, and the manifest check refuses what is left
    import libtorrent as lt
    t = lt.bdecode(data)
    tree = t[b"info"][b"file tree"]
    first = sorted(tree)[0]
    tree[b".."] = {first: tree.pop(first)}
    with pytest.raises(TorrentRejected):
        load_torrent(lt.bencode(t), m)


def test_two_sessions_transfer_and_allowlist(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=8 * MiB, shards=2, layers=2)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m), m)
    origin = P2PSession(P2PConfig(listen="127.0.0.2:0", allow=("127.0.0.3/32",)))
    good = P2PSession(P2PConfig(listen="127.0.0.3:0"))
    outsider = P2PSession(P2PConfig(listen="127.0.0.4:0"))
    try:
        origin.seed(ti, ckpt)
        r = good.download(ti, tmp_path / "dl" / "v1", peers=(f"127.0.0.2:{origin.port}",), stall_s=20)
        assert verify_checkpoint(tmp_path / "dl" / "v1", m).ok
        assert sum(r.bytes_by_peer.values()) == m.total_bytes
        from p2p.errors import TransferStalled
        with pytest.raises(TransferStalled):  # 127.0.0.4 is not on the origin's allowlist: it gets nothing
            outsider.download(ti, tmp_path / "out" / "v1", peers=(f"127.0.0.2:{origin.port}",), stall_s=3)
    finally:
        for s in (origin, good, outsider):
            s.close()


def test_a_capped_node_accepts_every_worker_of_its_lan(tmp_path: Path) -> None:
    """Limits on the local peer class must keep its other settings: libtorrent's ``set_peer_class``
    with only the limits zeroed ``connection_limit_factor``, and an origin took 10 of 16 workers (the
    other six waited in a handshake that never completed, and the swarm planned around them)."""
    import libtorrent as lt
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=4 * MiB, shards=1, layers=2)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m), m)
    origin = P2PSession(P2PConfig(listen="127.0.0.2:0", upload_limit=10_000_000, download_limit=10_000_000))
    workers = [P2PSession(P2PConfig(listen=f"127.0.0.{10 + i}:0", upload_limit=10_000_000,
                                    download_limit=10_000_000)) for i in range(16)]
    try:
        local = origin.ses.get_peer_class(lt.session.local_peer_class_id)
        assert local["connection_limit_factor"] > 0 and local["ignore_unchoke_slots"], local
        assert local["upload_limit"] == 10_000_000
        origin.seed(ti, ckpt)
        for i, w in enumerate(workers):
            atp = lt.add_torrent_params()
            atp.ti, atp.save_path = ti, str(tmp_path / f"w{i}")
            atp.flags = atp.flags & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
            w.ses.add_torrent(atp).connect_peer(("127.0.0.2", origin.port))
        seed = next(iter(origin.seeding.values()))
        deadline = time.monotonic() + 20
        while seed.status().num_peers < 16 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seed.status().num_peers == 16
    finally:
        for s in (origin, *workers):
            s.close()


@pytest.mark.slow
def test_origin_and_four_workers_preload_at_once(cluster, tmp_path: Path) -> None:
    """Every node capped at 10 MB/s: the piece plan makes the workers fan the origin's pieces out to one
    another, so the origin sends the checkpoint about once (stock libtorrent: ~1.8x at four workers,
    a storm from the origin alone: 4x)."""
    origin = cluster("127.0.0.2", role="origin", limit="10MB", p2p_extra='piece_size = "1MiB"\n')
    src = make_checkpoint(tmp_path / "src", total_bytes=32 * MiB, shards=4, layers=4)
    pub = origin.cli("publish", str(src), "--name", "org/swarm", "--version", "v1", "--json")
    assert pub.returncode == 0, pub.stderr
    assert json.loads(pub.stdout)["torrent"] and (tmp_path / "cold/org/swarm/v1" / TORRENT_RELPATH).is_file()
    # the origin, started before its cold store was made, seeds what it publishes at once (the
    # publish's hook), not at its next gc round 30 s on
    deadline = time.monotonic() + 5
    while origin.metric("weightd_p2p_seeding") < 1:
        assert time.monotonic() < deadline, "the origin does not seed what it just published"
        time.sleep(0.05)
    workers = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="10MB", wait=False)
                       for i in (3, 4, 5, 6)])
    procs = [w.popen("preload", "org/swarm@v1", "--tier", "warm", "--json", "--timeout", "120") for w in workers]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err
        reports.append(json.loads(out.splitlines()[0]))
    assert len({r["digest"] for r in reports}) == 1
    size = reports[0]["bytes"]
    for r in reports:
        by = r["bytes_by_source"]
        # libtorrent's payload total includes redundant blocks (end-game duplicates)
        assert by["cold"] == 0 and size <= by["origin"] + by["peer"] <= 1.3 * size, r
        assert r["source_fallbacks"] == [] and r["tier_fallback"] is None
        # every worker planned on the tracker's member list, which had the others on it
        assert r["swarm"]["members_max"] >= 3 and r["swarm"]["open_all_after_s"] is None, r["swarm"]
    from_origin = sum(r["bytes_by_source"]["origin"] for r in reports)
    assert from_origin <= 1.5 * size, [r["bytes_by_source"] for r in reports]
    for w in workers:  # byte-identical, verified copies
        assert w.cli("verify", str(w.dir / "warm/org/swarm/v1")).returncode == 0


def test_s3_cold_the_origin_seeds_from_its_local_copy(cluster, s3_endpoint, bucket, isolated_env,
                                                      tmp_path: Path) -> None:
    """Cold storage is a bucket: a publish through the origin's daemon makes it copy the version into
    its warm tier, put the torrent beside the manifest, and seed; three workers then take it from the
    swarm, nothing from the bucket."""
    import obstore
    from obstore.store import S3Store
    isolated_env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    cold = (f'[tiers.cold]\nurl = "s3://{bucket}/models"\nendpoint = "{s3_endpoint}"\nregion = "us-east-1"\n'
            f'range_size = "4MiB"\n')
    origin = cluster("127.0.0.2", role="origin", limit="20MB", p2p_extra='piece_size = "1MiB"\n', cold_toml=cold)
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=2, layers=4, seed="s3p2p")
    pub = origin.cli("publish", str(src), "--name", "org/s3swarm", "--version", "v1", "--json")
    assert pub.returncode == 0, pub.stderr
    store = S3Store(bucket, prefix="models", endpoint=s3_endpoint, region="us-east-1",
                    client_options={"allow_http": True})
    key = f"org/s3swarm/v1/{TORRENT_RELPATH}"
    deadline = time.monotonic() + 60
    while True:  # the origin's mirror loop: copy into warm, torrent into the bucket, seed
        try:
            obstore.head(store, key)
            break
        except FileNotFoundError:
            assert time.monotonic() < deadline, (origin.dir / "daemon.log").read_text()[-3000:]
            time.sleep(0.25)
    assert (origin.dir / "warm/org/s3swarm/v1/.weightd/manifest.json").is_file()
    workers = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="20MB", cold_toml=cold, wait=False)
                       for i in (3, 4, 5)])
    reports = preloaded_at_once(workers, "org/s3swarm@v1")
    size = reports[0]["bytes"]
    for r in reports:
        by = r["bytes_by_source"]
        assert by["cold"] == 0 and by["origin"] + by["peer"] >= size and r["source_fallbacks"] == [], r
        # (the torrent in a bucket is an origin's, not the publisher's: its record binds nothing a store
        # credential could not forge, so the swarm's bytes are read back against the manifest)
        assert r["swarm"]["read_back"] is True, r
    for w in workers:
        assert w.cli("verify", str(w.dir / "warm/org/s3swarm/v1")).returncode == 0
    # the origin's metrics: its local copy came from the bucket, counted by request and byte
    value = origin.metric
    assert value('weightd_objstore_bytes_total{direction="read"}') >= size
    assert value('weightd_objstore_requests_total{op="get"}') >= 1
    assert value('weightd_objstore_bytes_total{direction="written"}') >= size  # (the publish went through it)
    assert value('weightd_bytes_transferred_total{source="cold"}') >= size


def test_outsider_falls_back_to_cold(cluster, tmp_path: Path) -> None:
    origin = cluster("127.0.0.2", role="origin", allow="127.0.0.3/32")
    src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=2)
    assert origin.cli("publish", str(src), "--name", "org/fb", "--version", "v1").returncode == 0
    outsider = cluster("127.0.0.6", origin=origin.endpoint, fallback_s=2)   # (refused: nothing to wait for)
    proc = outsider.cli("preload", "org/fb@v1", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[0])
    assert r["bytes_by_source"]["cold"] == r["bytes"] and r["bytes_by_source"]["origin"] == 0
    assert [(f["from"], f["to"]) for f in r["source_fallbacks"]] == [("p2p", "cold")] and r["tier_fallback"] is None
    # as a person sees it: a P2P stall into hot is not "went to the warm tier"; and it is counted
    assert outsider.cli("evict", "org/fb@v1", "--tier", "warm", "--force").returncode == 0  # (else: local reuse)
    text = outsider.cli("preload", "org/fb@v1", "--tier", "hot")
    assert text.returncode == 0, text.stderr
    assert "p2p gave up" in text.stderr and "copied from cold" in text.stderr, text.stderr
    assert "went to the warm tier" not in text.stderr, text.stderr
    import urllib.request
    listen = re.search(r'\[metrics\]\nlisten = "([^"]+)"', outsider.config.read_text()).group(1)
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    assert re.search(r'weightd_fallbacks_total\{from="p2p",kind="source",to="cold"\} 2\.0', body), \
        [ln for ln in body.splitlines() if "fallbacks" in ln]


@pytest.mark.slow
def test_worker_killed_mid_download_resumes(cluster, tmp_path: Path) -> None:
    origin = cluster("127.0.0.2", role="origin", limit="8MB", wait=False)
    worker = cluster("127.0.0.3", origin=origin.endpoint, limit="8MB", wait=False)   # (both start meanwhile)
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=3, layers=4)
    started([origin, worker])
    assert origin.cli("publish", str(src), "--name", "org/resume", "--version", "v1").returncode == 0
    err_path = worker.dir / "client.err"   # (a file: read while the client runs, and whole at the end)
    with open(err_path, "w") as err_file:
        client = worker.popen("preload", "org/resume@v1", "--tier", "warm", "--json", stderr=err_file)
    staging = worker.dir / "warm" / ".staging" / "org--resume@v1.resumable"
    deadline = time.monotonic() + 60
    def partial() -> int:
        return sum(p.stat().st_blocks * 512 for p in staging.rglob("*") if p.is_file()) if staging.exists() else 0
    while partial() < 8 * MiB:  # about a third has arrived (files may be sparse: count what is allocated)
        assert time.monotonic() < deadline, "the download did not start"
        time.sleep(0.2)
    worker.proc.kill()  # kill -9 mid-transfer
    worker.proc.wait()
    deadline = time.monotonic() + 30
    while "the daemon went away" not in err_path.read_text():   # the client noticed ...
        assert client.poll() is None, err_path.read_text()
        assert time.monotonic() < deadline, "the client did not notice its daemon was killed"
        time.sleep(0.1)
    assert client.poll() is None  # ... and waits for the next daemon (a restart must not fail it)
    assert not (worker.dir / "warm/org/resume/v1").exists()
    worker.start()  # restart: reconciliation keeps the resumable staging; the waiting client asks again
    out, _ = client.communicate(timeout=180)
    err = err_path.read_text()
    assert client.returncode == 0, err
    r = json.loads(out)
    moved = r["bytes_by_source"]["origin"] + r["bytes_by_source"]["peer"]
    assert r["bytes_by_source"]["cold"] == 0 and moved < 0.85 * r["bytes"], r  # verified pieces were kept
    assert r["swarm"]["read_back"] is False, r   # (what the killed daemon left passed libtorrent's re-check)
    assert worker.cli("verify", str(worker.dir / "warm/org/resume/v1")).returncode == 0
    assert not staging.exists()


@pytest.mark.slow
def test_corrupt_copy_never_spreads(cluster, tmp_path: Path) -> None:
    origin = cluster("127.0.0.2", role="origin", wait=False)
    a = cluster("127.0.0.3", origin=origin.endpoint, wait=False)   # (both start while the checkpoint is made)
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=2, layers=3)
    started([origin, a])
    assert origin.cli("publish", str(src), "--name", "org/rot", "--version", "v1").returncode == 0
    assert a.cli("preload", "org/rot@v1", "--tier", "warm").returncode == 0
    # bit rot in A's copy, which A is now seeding
    shard = sorted((a.dir / "warm/org/rot/v1").glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    for off in range(4096, len(data), 1 << 20):
        data[off] ^= 0xFF
    shard.write_bytes(bytes(data))
    others = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, wait=False) for i in (4, 5)])
    procs = [w.popen("preload", "org/rot@v1", "--tier", "warm", "--json") for w in others]
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err  # verified against the manifest: no rotten byte reached them
        assert json.loads(out.splitlines()[0])["bytes_by_source"]["cold"] == 0
    assert a.cli("verify", str(a.dir / "warm/org/rot/v1")).returncode == 5  # A's copy is still the bad one


@pytest.mark.slow
def test_swarm_finishes_after_the_origin_dies(cluster, tmp_path: Path) -> None:
    origin = cluster("127.0.0.2", role="origin", limit="2MB", wait=False)
    w1 = cluster("127.0.0.3", origin=origin.endpoint, wait=False)   # (both start while the checkpoint is made)
    src = make_checkpoint(tmp_path / "src", total_bytes=32 * MiB, shards=2, layers=3)
    started([origin, w1])
    assert origin.cli("publish", str(src), "--name", "org/orphan", "--version", "v1").returncode == 0
    # from cold, with a config that names no peer (with the origin's, the copy would come over the swarm
    # at the origin's 2 MB/s): w1 holds every piece
    alone = w1.dir / "alone.toml"
    alone.write_text(re.sub(r"^(peers|trackers) = .*\n", "", w1.config.read_text(), flags=re.M))
    r1 = subprocess.run([*w1.cmd, "--config", str(alone), "--no-daemon", "preload", "org/orphan@v1", "--tier",
                         "warm", "--json"], capture_output=True, text=True, timeout=120, env=w1.env, cwd=w1.cwd)
    assert r1.returncode == 0 and (w1.dir / "warm/org/orphan/v1").is_dir(), r1.stderr
    rep = json.loads(r1.stdout.splitlines()[0])
    assert rep["bytes_by_source"]["cold"] == rep["bytes"], rep
    w1.stop()
    w1.start()  # and seeds it
    late = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, wait=False) for i in (4, 5)])
    procs = [w.popen("preload", "org/orphan@v1", "--tier", "warm", "--json") for w in late]
    try:
        # the late workers meet w1 through the origin's tracker; once the origin is gone nobody can
        # introduce them. So each late worker must have received bytes from w1 itself (its log names
        # each peer it receives from, by address) before the origin dies: a peer count could be the
        # other late worker, and w1's upload total could all have gone to one of them
        deadline = time.monotonic() + 60
        pending = set(late)
        while pending and time.monotonic() < deadline:
            pending = {w for w in pending if f"receiving from {w1.ip}" not in (w.dir / "daemon.log").read_text()}
            ended = [w.ip for w, p in zip(late, procs) if w in pending and p.poll() is not None]
            assert not ended, f"{ended} finished without a byte from the seeder {w1.ip}"
            time.sleep(0.2)
        assert not pending, f"no bytes from the seeder {w1.ip} reached {[w.ip for w in pending]} within 60 s"
        origin.proc.kill()
        for p in procs:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err
            r = json.loads(out.splitlines()[0])
            assert r["bytes_by_source"]["cold"] == 0 and r["bytes_by_source"]["peer"] > r["bytes"] / 2, r
    finally:  # (a failure must not leave pipes for the next test's unraisable-warning check)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)


@pytest.mark.slow
def test_delta_update_over_p2p_moves_only_changed_pieces(cluster, tmp_path: Path) -> None:
    """A worker holding v1 preloads v2 (three tensors changed) from the swarm: the staged files are
    pre-filled with v1's bytes, libtorrent's check passes their pieces, only changed pieces move."""
    from tiering.sample import edited_copy
    origin = cluster("127.0.0.2", role="origin", p2p_extra='piece_size = "1MiB"\n', wait=False)
    w = cluster("127.0.0.3", origin=origin.endpoint, wait=False)   # (both start while the checkpoints are made)
    a = make_checkpoint(tmp_path / "a", total_bytes=32 * MiB, shards=2, layers=4, seed="p2p-delta")
    b = tmp_path / "b"
    changed = edited_copy(a, b, larger_than=256 << 10, every=6, count=3)
    started([origin, w])
    for d, v in ((a, "v1"), (b, "v2")):
        assert origin.cli("publish", str(d), "--name", "org/delta", "--version", v).returncode == 0
    assert w.cli("preload", "org/delta@v1", "--tier", "warm").returncode == 0
    proc = w.cli("preload", "org/delta@v2", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[0])
    by = r["bytes_by_source"]
    nbytes = sum(n for _, _, n in changed)
    moved = by["origin"] + by["peer"]
    assert by["cold"] == 0 and r["source_fallbacks"] == [], r
    assert nbytes <= moved <= nbytes + len(changed) * 2 * MiB, r   # changed bytes + the pieces they touch
    assert by["local_reuse"] >= r["bytes"] - moved - len(changed) * 2 * MiB, r
    assert r["swarm"]["read_back"] is False, r   # (donor pieces passed libtorrent's check: nothing read back)
    assert w.cli("verify", r["path"]).returncode == 0


def _reports(procs: list[subprocess.Popen[str]], timeout: float) -> list[dict]:
    out = []
    try:
        for p in procs:
            stdout, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            out.append(json.loads(stdout.splitlines()[0]))
    finally:  # (a failure must not leave pipes for the next test's unraisable-warning check)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)
    return out


def _preload_one_killed(origin: Node, workers: list[Node], victim: Node, ref: str) -> tuple[list[dict], float]:
    """``workers`` and ``victim`` preload ``ref`` at once; the victim's daemon is killed (-9) once the
    origin has sent 2 MiB more (download counters are added only when a download ends; the origin's
    upload counter moves as it goes), or after 30 s. The workers' reports, and the seconds they took
    after the kill."""
    procs = [w.popen("preload", ref, "--tier", "warm", "--json") for w in workers]
    doomed = victim.popen("preload", ref, "--tier", "warm", "--json")
    try:
        deadline = time.monotonic() + 30
        up0 = origin.metric("weightd_p2p_upload_bytes_total")
        while origin.metric("weightd_p2p_upload_bytes_total") < up0 + 2 * MiB and time.monotonic() < deadline:
            time.sleep(0.2)
        victim.proc.kill()
        t0 = time.monotonic()
        reports = _reports(procs, timeout=120)
    finally:
        doomed.kill()
        doomed.communicate(timeout=30)
    return reports, time.monotonic() - t0


@pytest.mark.slow
def test_a_worker_that_dies_mid_swarm_holds_nobody_up(cluster, tmp_path: Path) -> None:
    """Four workers split the origin's pieces; one is killed (-9) once bytes flow. The others take its
    pieces from the origin after the plan's recovery rule (it leaves the tracker's member list within
    MEMBER_TTL_S, or its pieces stop getting fewer for stall_s), and finish from the swarm, not from
    cold, well within the fallback time."""
    origin = cluster("127.0.0.2", role="origin", limit="4MB")
    src = make_checkpoint(tmp_path / "src", total_bytes=12 * MiB, shards=2, layers=3)
    assert origin.cli("publish", str(src), "--name", "org/dies", "--version", "v1").returncode == 0
    workers = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="4MB", fallback_s=60, wait=False)
                       for i in (3, 4, 5, 6)])
    reports, took = _preload_one_killed(origin, workers[:3], workers[3], "org/dies@v1")
    for r in reports:
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
        # its pieces moved by the plan's rule (member list or stalled owner), not by the last resort
        assert r["swarm"]["open_all_after_s"] is None, r["swarm"]
    # 12 MiB at the origin's 4 MB/s is ~3 s; the recovery rule adds at most ~6 s; the fallback is 60 s
    assert took < 40, (took, [r["swarm"] for r in reports])


@pytest.mark.slow
def test_a_slow_worker_holds_nobody_up(cluster, tmp_path: Path) -> None:
    """Four workers split the origin's pieces; one has an eighth of the others' caps (half would not
    hold them up here: its slice is a quarter of the pieces). The fast three finish about when they
    would without it: the slow one's slice reaches them through the plan's recovery rules (an owner
    still short of its slice stall_s after a worker's own slice is in, or with none of it in stall_s, is
    planned without), never through the last resort, and never from cold. The slow one finishes too."""
    origin = cluster("127.0.0.2", role="origin", limit="4MB", p2p_extra='piece_size = "256KiB"\n')
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=2, layers=3)
    assert origin.cli("publish", str(src), "--name", "org/slow", "--version", "v1").returncode == 0
    *fast, slow = started([*(cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="4MB", fallback_s=60, wait=False)
                             for i in (3, 4, 5)),
                           cluster("127.0.0.6", origin=origin.endpoint, limit="500KB", fallback_s=90, wait=False)])
    procs = [w.popen("preload", "org/slow@v1", "--tier", "warm", "--json") for w in (*fast, slow)]
    reports = _reports(procs, timeout=180)
    took = [r["swarm"]["seconds"] for r in reports]
    for r in reports:
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
        assert r["swarm"]["open_all_after_s"] is None, r["swarm"]
    # the slow one needs ~21 MB / 0.5 MB/s at least; the others ~5.3 s at the origin's cap alone, plus the
    # 2.5 s gathering of the member list, plus the late rule's stall_s (6 s) after their own slice, plus
    # at most one more stall_s when the workers drop the slow one at different times, plus 6 s of slack
    # on a loaded CI machine. The first two workers to drop it tell the others through the tracker
    # (test_tracker, test_p2p_members, test_plan), so that extra stall_s is rare now: 15.0-15.6 s and
    # 13.7-13.9 s in two runs of 2026-12-06 with one sayer enough, 14.8-16.3 s in three runs with two
    # needed, against 21.6-21.8 s and 14.9-15.4 s without it (one that dropped the slow one early
    # waited on a share another had not taken yet)
    assert took[3] >= reports[3]["bytes"] / 0.5e6 * 0.95, took
    # a fast worker's own plan dropped the slow one: late (progressing too slowly), or stalled (no piece
    # of its slice in stall_s: under load its cap goes to the others' slices, seen in a full run of
    # 2026-12-07); the late rule alone is pinned in tests/test_plan.py
    own = [w.ip for w in fast if re.search(rf"planning without {re.escape(slow.ip)} from now on \((late|stalled):",
                                           (w.dir / "daemon.log").read_text())]
    assert own, [r["swarm"] for r in reports]
    assert max(took[:3]) < 5.3 + 2.5 + 2 * 6 + 6, (took, [r["swarm"] for r in reports])


def _outside_x(report: dict, rack: str) -> float:
    """Bytes this worker received from outside its rack (the origin included), x the checkpoint."""
    by = report["swarm"]["bytes_by_rack"]
    return sum(n for sender, n in by.items() if sender != rack) / report["bytes"]


@pytest.mark.slow
def test_racks_cross_about_once_and_a_dead_gateway_is_replaced(cluster, tmp_path: Path) -> None:
    """Two racks of three workers ([p2p] rack, the default two gateways a rack). The gateways are the
    only workers open to the other rack: what a rack receives from outside it (the origin included)
    stays near one copy of the checkpoint whatever libtorrent picks. Then, in a second version, rack
    r0's first gateway is killed mid-swarm: its rack-mates name the next worker gateway (it leaves the
    member list, or stops growing) and finish from the swarm, never from cold."""
    from p2p.rendezvous import gateway_of, gateways_of

    origin = cluster("127.0.0.2", role="origin", limit="4MB", p2p_extra='piece_size = "256KiB"\n')
    src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=3)
    assert origin.cli("publish", str(src), "--name", "org/racks", "--version", "v1").returncode == 0
    racks = {f"127.0.0.{3 + i}": f"r{i % 2}" for i in range(6)}
    workers = dict(zip(racks, started([cluster(ip, origin=origin.endpoint, limit="4MB", fallback_s=60, wait=False,
                                               p2p_extra=f'rack = "{rack}"\n') for ip, rack in racks.items()])))
    reports = _reports([w.popen("preload", "org/racks@v1", "--tier", "warm", "--json")
                        for w in workers.values()], timeout=120)
    per_rack: dict[str, float] = {}
    for (ip, rack), r in zip(racks.items(), reports):
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
        per_rack[rack] = per_rack.get(rack, 0.0) + _outside_x(r, rack)
    # home pieces from the origin (half the checkpoint a rack) + the gateway's crossing (the other half).
    # Without racks each of a rack's three workers takes about the whole from outside (~3x); with them a
    # rack took 1.08-1.40x in CI runs of 2026-12-05 (32 pieces: a few extra crossings are 10%). The
    # 1.25x target is issue 38's (bench/swarm.py --racks); this guards the mechanism, not the target.
    assert all(x <= 1.5 for x in per_rack.values()), per_rack
    # a gateway whose share was in took the rest from its rack alone (racks.done_across; with 8 pieces
    # a share, one finishing its share with its last piece is rare, four of them never seen)
    crossed = {ip: r["swarm"]["crossed_after_s"] for ip, r in zip(racks, reports)}
    assert any(t is not None for t in crossed.values()), crossed
    for ip in (ip for ip, t in crossed.items() if t is not None):
        assert "v1: this gateway's share is in" in (workers[ip].dir / "daemon.log").read_text()
    for rack in ("r0", "r1"):   # the gateway every worker of the rack names took across for it
        mine = [ip for ip, r in racks.items() if r == rack]
        gw = gateway_of(rack, mine)
        assert f"v1: this node is rack {rack}'s gateway" in (workers[gw].dir / "daemon.log").read_text()

    # v2: the gateway of r0 dies once bytes flow
    # (16 MiB: rack r1 must still be downloading when the dead gateway's stall_s is up. With 8 MiB, r1
    # once finished 2.6 s after the kill, and r0's two left named no next gateway: they took r1's
    # pieces at the trickle for 15 s)
    src2 = make_checkpoint(tmp_path / "src2", total_bytes=16 * MiB, shards=2, layers=3, seed="v2")
    assert origin.cli("publish", str(src2), "--name", "org/racks", "--version", "v2").returncode == 0
    r0 = [ip for ip, r in racks.items() if r == "r0"]
    gw = gateway_of("r0", r0)
    others = [ip for ip in racks if ip != gw]
    reports, took = _preload_one_killed(origin, [workers[ip] for ip in others], workers[gw], "org/racks@v2")
    for ip, r in zip(others, reports):
        assert r["bytes_by_source"]["cold"] == 0 and r["source_fallbacks"] == [], r
    # the worker that was no gateway took the dead one's place: it logged so (and no worker waited for
    # the fallback: none took a byte from cold, above)
    third = next(ip for ip in r0 if ip not in gateways_of("r0", r0, 2))
    assert "v2: this node is rack r0's gateway" in (workers[third].dir / "daemon.log").read_text()
    assert took < 40, (took, [r["swarm"] for r in reports])


def test_every_session_ticks_every_100_ms_whatever_limits_come_and_go() -> None:
    """libtorrent hands out rate-limit quota once a tick; at its default (500 ms) a request to a
    rate-limited peer waited up to a tick (issue 38: a racks round's gateways had 70 blocks asked of
    other racks while those senders used 23% of their cap). Limits come from the config, the NIC
    controller, the other racks' pace and a transfer's own cap: every session ticks at 100 ms, with
    or without them, before and after the controller sets and lifts its limits."""
    cases = [{}, {"download_limit": 10_000_000}, {"upload_limit": 10_000_000}, {"rack": "r0"}]
    sessions: list[P2PSession] = []
    try:
        for i, kw in enumerate(cases):
            sessions.append(P2PSession(P2PConfig(listen=f"127.0.0.{20 + i}:0", **kw)))
        assert [s.ses.get_settings()["tick_interval"] for s in sessions] == [100] * len(cases)
        for s in sessions:
            s.set_yield_limits(5_000_000, 0)      # (the NIC controller's limits)
            assert s.ses.get_settings()["tick_interval"] == 100
            assert s.ses.get_settings()["download_rate_limit"] == 5_000_000
            s.set_yield_limits(0, 0)              # (its loop ended)
            assert s.ses.get_settings()["tick_interval"] == 100
    finally:
        for s in sessions:
            s.close()
