"""Expert-parallel copies over P2P (issue 40 part 2): a worker asks the swarm for the pieces of the whole
version's torrent that cover its rank's kept tensors, and repacks from them.

Real libtorrent sessions on 127.0.0.x (in-process LocalNodes with the swarm as their fetcher, and real
``weightd serve`` daemons), real files, every copy opened with ``safetensors`` and compared tensor by
tensor with the original; every wait bounded. Hostile cases: the origin gone mid-transfer, a peer
serving a piece that fails its hash, a torrent describing other bytes than the manifest (its pieces
pass libtorrent's check, a tensor's xxh3 does not), and that with cold corrupted too (exit 5)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from p2p import TORRENT_RELPATH, P2PConfig, P2PFetcher, ensure_torrent, load_torrent, make_torrent, \
    read_torrent
from p2p.torrent import subset_of
from tiering import ChecksumMismatch, build_manifest, selection_from
from tiering.experts.fill import wanted_ranges
from tiering.experts.plan import EXPERT_RE
from tiering.experts.repack import jobs_for
from tiering.sample_moe import make_moe_checkpoint

from .test_experts import _check_copy
from .test_p2p import cluster  # noqa: F401 (the fixture: daemons on 127.0.0.x)
from .test_partial_p2p import Fleet, _wait_checked
from .test_verify_diff import flip_byte

KiB, MiB = 1 << 10, 1 << 20
NAME = "org/moe"
LAYERS, EXPERTS, SHARDS, D = 5, 64, 4, 256     # ~27 MiB: 2 MoE layers of 64 experts, 192 KiB each
PIECE = 256 * KiB
STALL_S = 4.0


def _moe(root: Path, seed: str = "v1") -> Path:
    return make_moe_checkpoint(root, layers=LAYERS, experts=EXPERTS, shards=SHARDS, d=D, seed=seed)


def _cfg(listen: str, **kw) -> P2PConfig:
    kw.setdefault("fallback_after_s", STALL_S)
    return P2PConfig(listen=listen, threshold=MiB, piece_size=PIECE, **kw)


class MoeFleet(Fleet):
    """The MoE checkpoint published (its torrent in cold, 256 KiB pieces), an origin session seeding it
    from cold, and workers (a LocalNode each, the swarm as its fetcher, the shared cold)."""

    def start(self) -> None:
        self.origin_env = self._env("origin")
        self.publisher = self._node(self.origin_env)
        self.src = _moe(self.tmp / "moe")
        self.publisher.publish(self.src, NAME, "v1")
        self.cold = self.publisher.published_version(NAME, "v1")
        assert ensure_torrent(_cfg("127.0.0.2:0"), self.cold) is not None
        self.ti = read_torrent(self.cold)
        assert self.ti.piece_length() == PIECE
        self.origin = self.session(_cfg("127.0.0.2:0"))
        assert self.origin.seed(self.ti, self.cold.path)

    def worker(self, label: str, ip: str, *, peers: tuple[str, ...] | None = None, **kw):
        cfg = _cfg(f"{ip}:0", peers=peers if peers is not None else (self.origin_at,), **kw)
        s = self.session(cfg)
        return self._node(self._env(label), fetchers=[P2PFetcher(cfg, s)]), s

    def pieces_for(self, node, rank: int, ranks: int):
        """(the kept bytes, the subset of pieces covering them) of rank R of N's copy, as planned."""
        m = node.resolve(NAME, "v1").manifest
        obj, src, _ = node.preloader.experts.object_of(node.resolve(NAME, "v1"),
                                                      selection_from(experts=f"{rank}/{ranks}"))
        jobs = jobs_for(obj.manifest, m)
        files, ranges = wanted_ranges(jobs)
        return sum(j.read_bytes for j in jobs), subset_of(self.ti, files, ranges), len(
            [r for j in jobs for r in j.runs])


@pytest.fixture
def fleet(tmp_path: Path):
    f = MoeFleet(tmp_path)
    try:
        f.start()
        yield f
    finally:
        f.close()


def _no_scratch(env) -> None:
    """No staging entry (the copy's, its ranges' sparse files) and no side file is left in the tier."""
    for tier in (env.hot, env.warm):
        staging = tier / ".staging"
        left = [p.name for p in staging.iterdir()] if staging.exists() else []
        assert not [n for n in left if not n.endswith(".lock")], left


def test_a_ranged_subset_is_the_pieces_covering_its_ranges(tmp_path: Path) -> None:
    """``subset_of(..., ranges)``: every piece a range touches and no other (an edge inside a piece
    brings that whole piece), a file named without ranges whole, an empty range nothing, a range past
    its file refused; the tag tells ranged subsets apart by their pieces."""
    from p2p import TorrentRejected
    from tiering.sample import make_checkpoint
    ck = make_checkpoint(tmp_path / "v1", total_bytes=6 * MiB, shards=2, layers=2)
    m = build_manifest(ck)
    ti = load_torrent(make_torrent(ck, m, piece_size=PIECE), m)
    big, small = sorted((f for f in m.files if f.size > 4 * PIECE), key=lambda f: f.path)[0], m.file("config.json")
    p0 = subset_of(ti, {big.path}).pieces.index(True)
    sub = subset_of(ti, {big.path, small.path},
                    {big.path: [(10, 20), (PIECE - 1, PIECE + 1), (3 * PIECE, 4 * PIECE), (5, 5)]})
    config_piece = subset_of(ti, {small.path}).pieces.index(True)
    assert [i for i, w in enumerate(sub.pieces) if w] == sorted([p0, p0 + 1, p0 + 3, config_piece])
    assert sub.ranged and sub.bytes == 3 * PIECE + small.size
    assert sub.piece_priorities == [4 if w else 0 for w in sub.pieces]
    assert sub.tag != subset_of(ti, {big.path, small.path}).tag
    same = {big.path: [(0, 3), (PIECE + 2, PIECE + 3), (3 * PIECE + 9, 4 * PIECE)]}
    assert sub.tag == subset_of(ti, {big.path, small.path}, same).tag
    assert subset_of(ti, {big.path}, {big.path: [(0, 0)]}).num_pieces == 0
    with pytest.raises(TorrentRejected, match="outside the file"):
        subset_of(ti, {big.path}, {big.path: [(big.size - 1, big.size + 1)]})


def test_a_rank_takes_only_the_pieces_of_its_tensors_from_the_swarm(fleet: MoeFleet) -> None:
    """Rank 3 of 8: every byte from the swarm, none from cold, no fallback; exactly the pieces covering
    its kept tensors move (whole pieces at each range's edges: at most two more per run), a fraction of
    the version; the copy opens with safetensors and every tensor is the original's."""
    w, s = fleet.worker("w1", "127.0.0.3")
    kept, sub, runs = fleet.pieces_for(w, 3, 8)
    whole = fleet.cold.manifest.total_bytes
    assert kept <= sub.bytes <= kept + 2 * PIECE * runs and sub.ranged
    r = w.preload(NAME, "v1", tier="warm", selection=selection_from(experts="3/8"), timeout_s=90)
    assert r.version == "v1~e3of8"
    _check_copy(Path(r.path), fleet.src, 3, 8, EXPERTS)
    by = r.bytes_by_source
    assert r.source_fallbacks == [] and by.get("cold", 0) == 0, (r.source_fallbacks, by)
    moved = by["origin"] + by["peer"]
    assert sub.bytes <= moved <= sub.bytes * 1.05, (moved, sub.bytes)
    assert moved < 0.45 * whole, (moved, whole)
    st = s.stats()   # (libtorrent's own count of payload received, and no piece failed)
    assert sub.bytes <= st["download_bytes"] <= sub.bytes * 1.05 and st["hash_failures"] == 0, st
    assert r.swarm is not None and r.swarm["read_back"]
    _no_scratch(fleet.envs[-1])
    assert not s.seeding   # (an expert copy's files are not the torrent's: never seeded)


def test_the_origin_gone_mid_transfer_falls_back_to_cold(fleet: MoeFleet) -> None:
    """The origin, slowed to 1 MB/s, closes a second into the transfer: the worker waits fallback_after_s,
    says so (one p2p -> cold entry) and takes the kept ranges from cold; the copy is right."""
    fleet.origin.close()
    fleet.sessions.remove(fleet.origin)
    fleet.origin = fleet.session(_cfg("127.0.0.2:0", upload_limit=MiB))
    assert fleet.origin.seed(fleet.ti, fleet.cold.path)
    w, s = fleet.worker("w1", "127.0.0.3")

    def kill() -> None:
        deadline = time.monotonic() + 30
        while s.traffic()[0] < 512 * KiB and time.monotonic() < deadline:
            time.sleep(0.05)
        fleet.origin.close()
    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    t0 = time.monotonic()
    r = w.preload(NAME, "v1", tier="warm", selection=selection_from(experts="1/8"), timeout_s=90)
    killer.join(30)
    assert time.monotonic() - t0 < 60
    assert [(f.source, f.to) for f in r.source_fallbacks] == [("p2p", "cold")], r.source_fallbacks
    assert "no peer delivered" in r.source_fallbacks[0].reason
    assert r.bytes_by_source["cold"] > 0
    _check_copy(Path(r.path), fleet.src, 1, 8, EXPERTS)
    _no_scratch(fleet.envs[-1])


def test_a_peer_serving_a_bad_piece_is_caught_by_its_hash(fleet: MoeFleet) -> None:
    """A peer that passed its own check, then serves a piece with a flipped byte (in a tensor rank 0
    keeps): libtorrent's SHA-256 check refuses it (a hash failure), nothing of it lands, the swarm
    stalls on that piece and the copy comes from cold, right."""
    copy = fleet.tmp / "hostile" / "v1"
    shutil.copytree(fleet.cold.path, copy, ignore=shutil.ignore_patterns(".weightd"))
    hostile = fleet.session(_cfg("127.0.0.9:0"))
    files = frozenset(f.path for f in fleet.cold.manifest.files)
    assert hostile.seed(fleet.ti, copy, files=files)   # (checked when it starts, not on upload)
    st = _wait_checked(hostile)
    assert all(st.pieces)
    m = fleet.cold.manifest
    f, t = next((f, t) for f, t in m.tensors() if ".experts.0.down_proj.weight" in t.name and t.nbytes)
    os.chmod(copy / f.path, 0o644)
    flip_byte(copy / f.path, t.begin + t.nbytes // 2)
    w, s = fleet.worker("w1", "127.0.0.3", peers=(f"127.0.0.9:{hostile.port}",))
    r = w.preload(NAME, "v1", tier="warm", selection=selection_from(experts="0/8"), timeout_s=90)
    assert s.stats()["hash_failures"] >= 1, s.stats()
    assert [(fb.source, fb.to) for fb in r.source_fallbacks] == [("p2p", "cold")], r.source_fallbacks
    assert r.bytes_by_source["cold"] > 0
    _check_copy(Path(r.path), fleet.src, 0, 8, EXPERTS)
    _no_scratch(fleet.envs[-1])


def _evil_torrent(fleet: MoeFleet, tensor: str) -> tuple[Path, object]:
    """A cold writer's doing: the version's torrent replaced by one for other bytes (the same files and
    sizes, one byte of ``tensor`` flipped), and those bytes seeded from 127.0.0.9."""
    evil = fleet.tmp / "evil" / "v1"
    shutil.copytree(fleet.cold.path, evil, ignore=shutil.ignore_patterns(".weightd"))
    m = fleet.cold.manifest
    f, t = next((f, t) for f, t in m.tensors() if t.name == tensor)
    os.chmod(evil / f.path, 0o644)
    flip_byte(evil / f.path, t.begin + 7)
    data = make_torrent(evil, build_manifest(evil), piece_size=PIECE)
    ti = load_torrent(data, m)   # (passes the files-and-sizes check)
    published = fleet.cold.path / TORRENT_RELPATH
    published.chmod(0o644)
    tmp = published.with_name(published.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, published)
    fleet.origin.close()
    fleet.sessions.remove(fleet.origin)
    fleet.origin = fleet.session(_cfg("127.0.0.2:0"))
    assert fleet.origin.seed(ti, evil)
    return evil, ti


def test_swarm_bytes_that_fail_a_tensor_are_rejected_and_cold_is_used(fleet: MoeFleet, tmp_path: Path) -> None:
    """A torrent for other bytes: its pieces pass libtorrent's check, the repack's xxh3 of the tensor
    does not. The swarm's bytes are dropped (a p2p -> cold entry naming the tensor), the torrent is not
    used again by this worker, and the copy is made from cold, right. With cold corrupted in the same
    tensor as well, a fresh worker places nothing: ChecksumMismatch (exit 5)."""
    m = fleet.cold.manifest
    tensor = next(t.name for _, t in m.tensors() if ".experts.9.up_proj.weight" in t.name and t.nbytes)
    assert int(EXPERT_RE.search(tensor).group(1)) in range(8, 16)   # (rank 1 of 8 keeps it)
    _evil_torrent(fleet, tensor)
    w, s = fleet.worker("w1", "127.0.0.3")
    r = w.preload(NAME, "v1", tier="warm", selection=selection_from(experts="1/8"), timeout_s=90)
    assert [(f.source, f.to) for f in r.source_fallbacks] == [("p2p", "cold")], r.source_fallbacks
    why = r.source_fallbacks[0].reason
    assert tensor in why and "not used again" in why, why
    assert r.bytes_by_source["cold"] > 0 and s.stats()["hash_failures"] == 0
    _check_copy(Path(r.path), fleet.src, 1, 8, EXPERTS)
    assert len(s.bad_torrents) == 1
    _no_scratch(fleet.envs[-1])

    # cold corrupted in that tensor too: the swarm's bytes fail, then cold's: nothing placed
    f, t = next((f, t) for f, t in m.tensors() if t.name == tensor)
    shard = fleet.cold.path / f.path
    shard.chmod(0o644)
    flip_byte(shard, t.begin + 7)
    w2, _ = fleet.worker("w2", "127.0.0.4")
    with pytest.raises(ChecksumMismatch, match="up_proj"):
        w2.preload(NAME, "v1", tier="warm", selection=selection_from(experts="1/8"), timeout_s=90)
    env = fleet.envs[-1]
    assert not list(env.warm.glob("org/moe/v1*")) and not list(env.hot.glob("org/moe/v1*"))
    _no_scratch(env)


# -- daemons ------------------------------------------------------------------------------------------

def _staged_bytes(tier: Path) -> int:
    """Bytes on disk in a tier's sparse ranges entries (what the swarm has written so far)."""
    n = 0
    for p in (tier / ".staging").glob("*.ranges.resumable/**/*"):
        try:
            n += p.stat().st_blocks * 512 if p.is_file() else 0
        except FileNotFoundError:
            pass
    return n


@pytest.mark.slow
def test_daemons_rank_copy_over_the_swarm_then_origin_killed(cluster, tmp_path: Path) -> None:  # noqa: F811
    """Real daemons: an origin publishes (and seeds) the MoE; worker 1 runs ``preload --experts 0/8``:
    every byte from the origin over the swarm, under half the version, nothing from cold; its
    /metrics count what it received. Worker 2 (origin slowed to 2 MB/s, killed mid-transfer) falls
    back to cold with one entry, and its copy is right too."""
    origin = cluster("127.0.0.2", role="origin", limit="2MB", p2p_extra=f'piece_size = "{PIECE >> 10}KiB"\n')
    src = _moe(tmp_path / "src")
    assert origin.cli("publish", str(src), "--name", NAME, "--version", "v1").returncode == 0
    whole = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    w1 = cluster("127.0.0.3", origin=origin.endpoint, limit="200MB", fallback_s=STALL_S)
    proc = w1.cli("preload", f"{NAME}@v1", "--experts", "0/8", "--tier", "warm", "--json", "--timeout", "90")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[0])
    by = r["bytes_by_source"]
    assert r["version"] == "v1~e0of8" and r["source_fallbacks"] == [], r
    assert by.get("cold", 0) == 0 and by["peer"] == 0 and r["bytes"] * 0.8 <= by["origin"] < 0.45 * whole, r
    got = w1.metric("weightd_p2p_download_bytes_total")
    assert by["origin"] <= got <= by["origin"] * 1.05, (got, by)
    _check_copy(Path(r["path"]), src, 0, 8, EXPERTS)
    w1.stop()

    w2 = cluster("127.0.0.4", origin=origin.endpoint, fallback_s=STALL_S)
    p = w2.popen("preload", f"{NAME}@v1", "--experts", "5/8", "--tier", "warm", "--json", "--timeout", "90")
    try:
        deadline = time.monotonic() + 30
        while _staged_bytes(w2.dir / "warm") < 512 * KiB and p.poll() is None:   # (pieces landing)
            assert time.monotonic() < deadline, "no P2P bytes within 30 s"
            time.sleep(0.1)
        origin.stop()
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err
    r2 = json.loads(out.splitlines()[0])
    assert [(f["from"], f["to"]) for f in r2["source_fallbacks"]] == [("p2p", "cold")], r2
    assert r2["bytes_by_source"]["cold"] > 0, r2
    _check_copy(Path(r2["path"]), src, 5, 8, EXPERTS)


@pytest.mark.slow
def test_daemons_two_ranks_twice_at_once_share_their_pieces(cluster, tmp_path: Path) -> None:  # noqa: F811
    """Four workers, two per rank (0 and 1 of 8), preloading at the same time through the tracker: each
    plans with the worker that wants the same pieces only (the member lists group them by the pieces'
    tag), so nothing comes from cold, no owner is found stalled, and the origin sends each rank's
    pieces about once (the other worker of the rank takes its share from the first)."""
    from .test_p2p import _reports, started
    origin = cluster("127.0.0.2", role="origin", limit="10MB", p2p_extra=f'piece_size = "{PIECE >> 10}KiB"\n')
    src = _moe(tmp_path / "src")
    assert origin.cli("publish", str(src), "--name", NAME, "--version", "v1").returncode == 0
    workers = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="10MB", wait=False)
                       for i in (3, 4, 5, 6)])
    ranks = [0, 1, 0, 1]
    reports = _reports([w.popen("preload", f"{NAME}@v1", "--experts", f"{r}/8", "--tier", "warm", "--json",
                                "--timeout", "120") for w, r in zip(workers, ranks)], timeout=150)
    for r, rank in zip(reports, ranks):
        by = r["bytes_by_source"]
        assert by.get("cold", 0) == 0 and r["source_fallbacks"] == [], r
        sw = r["swarm"]
        assert sw["members_max"] <= 2 and sw["stalled_owners"] == 0 and sw["open_all_after_s"] is None, sw
        _check_copy(Path(r["path"]), src, rank, 8, EXPERTS)
    whole = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    for rank in (0, 1):
        mine = [r["bytes_by_source"] for r, k in zip(reports, ranks) if k == rank]
        moved = [b["origin"] + b["peer"] for b in mine]   # (the same pieces; the end game sends a few twice)
        assert max(moved) < 0.45 * whole and max(moved) <= 1.15 * min(moved), mine
        assert sum(b["origin"] for b in mine) <= 1.5 * min(moved), mine
