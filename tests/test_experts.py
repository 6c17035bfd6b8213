"""Expert-parallel copies (issue 40 part 2): rank R of N's repacked copy of a mixture of experts.

Real files, real tiers, the real ``weightd`` CLI in subprocesses (in-process and through a real
daemon), a real S3-protocol server (moto); every shard opened with ``safetensors.safe_open`` and each
tensor compared with the original's bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.test_partial import daemon  # noqa: F401 (the fixture: a daemon on node_env)
from tiering import BadInput, IntegrityError, selection_from
from tiering.content.build import build_manifest, verify_checkpoint
from tiering.content.manifest import MANIFEST_RELPATH, SafetensorsInfo
from tiering.content.manifest_parse import load_manifest
from tiering.content.tensor_table import TensorTable
from tiering.experts.plan import EXPERT_RE, expert_manifest, rank_experts, split_for
from tiering.experts.repack import jobs_for, repack
from tiering.safefs import Dir
from tiering.sample_moe import make_moe_checkpoint

LAYERS, EXPERTS, SHARDS = 6, 16, 7


def _ck(tmp_path: Path, **kw) -> Path:
    return make_moe_checkpoint(tmp_path / "moe", layers=LAYERS, experts=EXPERTS, shards=SHARDS, d=16, **kw)


def _tensors(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of a checkpoint directory, by name: (shard, its bytes), read by safetensors itself
    (``safe_open`` opens the shard and lists it, ``deserialize`` hands each tensor's bytes)."""
    from safetensors import deserialize, safe_open
    out = {}
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), framework="numpy") as fh:
            names = set(fh.keys())
            assert all(fh.get_slice(n).get_shape() is not None for n in names)
        tensors = dict(deserialize(shard.read_bytes()))
        assert set(tensors) == names
        out.update((n, (shard.name, bytes(t["data"]))) for n, t in tensors.items())
    return out


def _check_copy(copy: Path, original: Path, rank: int, ranks: int, experts: int = EXPERTS) -> None:
    """Every shard opens, each kept tensor is the original's, no other rank's expert is there, every
    non-expert tensor is, and the index json maps exactly the kept tensors."""
    mine = rank_experts(rank, ranks, experts)
    orig, got = _tensors(original), _tensors(copy)
    want = {n for n in orig if (m := EXPERT_RE.search(n)) is None or int(m.group(1)) in mine}
    assert set(got) == want
    assert all(got[n][1] == orig[n][1] and got[n][0] == orig[n][0] for n in got)
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {n: got[n][0] for n in got}
    assert (copy / "config.json").read_bytes() == (original / "config.json").read_bytes()
    assert verify_checkpoint(copy, load_manifest(copy / MANIFEST_RELPATH)).ok


def test_the_split_is_vllms_linear_placement():
    # (vLLM determine_expert_map, "linear": the first n % N ranks hold one more)
    assert [list(rank_experts(r, 3, 8)) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert [len(rank_experts(r, 8, 256)) for r in range(8)] == [32] * 8
    assert sum((list(rank_experts(r, 7, 100)) for r in range(7)), []) == list(range(100))


def test_a_rank_copy_in_process_holds_its_experts_and_every_other_tensor(node_env, tmp_path):
    ck = _ck(tmp_path)
    with node_env.node() as n:
        n.publish(ck, "org/moe", "v1")
        sel = selection_from(experts="1/4")
        r = n.preload("org/moe", "v1", tier="hot", selection=sel)
        assert r.version == "v1~e1of4" and r.part_of["experts"] == [4, 7]
        _check_copy(Path(r.path), ck, 1, 4)
        whole = n.resolve("org/moe", "v1").manifest
        expert_bytes = sum(t.nbytes for _, t in whole.tensors() if EXPERT_RE.search(t.name))
        # only the rank's bytes are read from cold: the other ranks' experts never are
        assert r.bytes_by_source["cold"] <= whole.total_bytes - expert_bytes * 3 // 4
        assert r.bytes_by_source["cold"] < r.bytes
        with pytest.raises(FileNotFoundError):   # never the whole version
            n.path("org/moe", "v1")
        assert n.path("org/moe", "v1", selection=sel) == ("hot", Path(r.path))
        assert n.path("org/moe", "v1~e1of4") == ("hot", Path(r.path))
        assert n.preload("org/moe", "v1", tier="hot", selection=sel).already_present
        st = {c["version"]: c for c in n.status()["checkpoints"]}
        assert st["v1~e1of4"]["part_of"]["kind"] == "experts"


def test_a_corrupted_tensor_in_cold_places_nothing(wd, node_env, tmp_path):
    ck = _ck(tmp_path)
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    m = load_manifest(node_env.cold / "org/moe/v1" / MANIFEST_RELPATH)
    f, t = next((f, t) for f, t in m.tensors() if ".experts.2.down_proj.weight" in t.name and t.nbytes)
    shard = node_env.cold / "org/moe/v1" / f.path
    data = bytearray(shard.read_bytes())
    data[t.begin] ^= 0xFF
    shard.chmod(0o644)
    shard.write_bytes(bytes(data))
    assert_one_line_error(wd("--no-daemon", "preload", "org/moe@v1", "--experts", "0/4"), 5, t.name)
    assert not list(node_env.hot.glob("org/moe/v1*")) and not list(node_env.warm.glob("org/moe/v1*"))
    assert wd("--no-daemon", "path", "org/moe@v1", "--experts", "0/4").returncode == 3


def test_bad_input_is_one_line(wd, node_env, tmp_path):
    ck = _ck(tmp_path)
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    (tmp_path / "noconf").mkdir()
    for f in ck.glob("*.safetensors"):
        (tmp_path / "noconf" / f.name).write_bytes(f.read_bytes())
    assert wd("publish", tmp_path / "noconf", "--name", "org/noconf", "--version", "v1").returncode == 0
    from tiering import make_checkpoint, make_ranked_checkpoint
    dense = make_checkpoint(tmp_path / "dense", total_bytes=1 << 20, shards=2, layers=2)
    (dense / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert wd("publish", dense, "--name", "org/dense", "--version", "v1").returncode == 0
    tp = make_ranked_checkpoint(tmp_path / "tp", ranks=2, total_bytes=1 << 20)
    assert wd("publish", tp, "--name", "org/tp", "--version", "v1").returncode == 0
    cases = [(["org/moe@v1", "--experts", "4/4"], "0 <= R < N"), (["org/moe@v1", "--experts", "0/0"], "0 <= R < N"),
             (["org/moe@v1", "--experts", "a/b"], "expected R/N"),
             (["org/moe@v1", "--experts", "0/17"], "more ranks than the 16"),
             (["org/moe@v1", "--experts", "0/2", "--layers", "0-1"], "not with"),
             (["org/noconf@v1", "--experts", "0/2"], "no config.json"),
             (["org/dense@v1", "--experts", "0/2"], "no number of routed experts"),
             (["org/tp@v1", "--experts", "0/2"], "per tensor-parallel rank")]
    runs = wd.at_once(*(["--no-daemon", "preload", *args] for args, _ in cases))
    for r, (_, needle) in zip(runs, cases):
        assert_one_line_error(r, 2, needle)


def _hostile(tmp_path: Path, how: str):
    ck = _ck(tmp_path)
    m = build_manifest(ck).with_labels(name="org/moe", version="v1")
    sel = selection_from(experts="0/2")
    cm = expert_manifest(m, sel, split_for(m, sel, (ck / "config.json").read_bytes()), "v1~e0of2", {})
    f = next(f for f in m.files if f.safetensors is not None)
    t = f.safetensors.tensors
    spans = t.spans()
    if how == "beyond":      # a kept tensor said to end past the file
        spans[-1] = (f.size + 100, f.size + 100 + spans[-1][1] - spans[-1][0])
    else:                    # two kept tensors over the same bytes
        spans[1] = spans[0] if spans[1][1] - spans[1][0] == spans[0][1] - spans[0][0] else spans[1]
        spans[2] = (spans[0][0], spans[0][0] + spans[2][1] - spans[2][0])
    bad = TensorTable(t.names(), [e.dtype for e in t], [e.shape for e in t], [b for b, _ in spans],
                      [e for _, e in spans], t.digest_bytes)
    files = tuple(replace(g, safetensors=SafetensorsInfo(f.safetensors.header_size, f.safetensors.header_xxh3_128,
                                                          f.safetensors.metadata, bad)) if g is f else g for g in m.files)
    return ck, replace(m, files=files), cm


@pytest.mark.parametrize("how", ["beyond", "overlap"])
def test_a_hostile_manifest_cannot_read_outside_a_file(tmp_path, how):
    ck, m, cm = _hostile(tmp_path, how)
    with pytest.raises(IntegrityError, match="outside the file|overlaps"):
        jobs_for(cm, m)
    # and the copy is written only beneath its directory, whatever a path says
    evil = replace(cm, files=tuple(replace(f, path="../evil.json") if f.path == "config.json" else f for f in cm.files))
    with pytest.raises(BadInput):
        jobs_for(evil, replace(m, files=tuple(replace(f, path="../evil.json") if f.path == "config.json" else f
                                                  for f in m.files)))
    assert not (tmp_path / "evil.json").exists()


@pytest.mark.parametrize("bad", ["__metadata__", "twice"])
def test_a_manifest_with_a_name_a_header_cannot_hold_is_refused(tmp_path, bad):
    ck = _ck(tmp_path)
    m = build_manifest(ck).with_labels(name="org/moe", version="v1")
    f = next(f for f in m.files if f.safetensors is not None)
    t = f.safetensors.tensors
    names = t.names()
    names[1] = "__metadata__" if bad == "__metadata__" else names[0]
    table = TensorTable(names, [e.dtype for e in t], [e.shape for e in t], *zip(*t.spans()), t.digest_bytes)
    files = tuple(replace(g, safetensors=replace(g.safetensors, tensors=table)) if g is f else g for g in m.files)
    sel = selection_from(experts="0/2")
    with pytest.raises(BadInput, match="repeated, or named __metadata__"):
        expert_manifest(replace(m, files=files), sel, split_for(m, sel, (ck / "config.json").read_bytes()), "x", {})


def test_repack_refuses_a_source_shorter_than_its_manifest(tmp_path):
    ck = _ck(tmp_path)
    m = build_manifest(ck).with_labels(name="org/moe", version="v1")
    sel = selection_from(experts="0/2")
    cm = expert_manifest(m, sel, split_for(m, sel, (ck / "config.json").read_bytes()), "v1~e0of2", {})
    last = ck / "model-00007-of-00007.safetensors"
    last.chmod(0o644)
    last.write_bytes(last.read_bytes()[:-8])
    (tmp_path / "out").mkdir()
    with _dir(ck) as src, _dir(tmp_path / "out") as dest, pytest.raises(IntegrityError, match="bytes in the"):
        repack(jobs_for(cm, m), src, dest)


# -- S3 cold, and through a real daemon ---------------------------------------------------------------

def test_from_s3_only_the_ranks_ranges_are_asked_for(wd, node_env, tmp_path, s3_endpoint, bucket, isolated_env):
    text = node_env.config.read_text().replace(f'[tiers.cold]\npath = "{node_env.cold}"\n',
                                               f'[tiers.cold]\nurl = "s3://{bucket}/models"\nendpoint = "{s3_endpoint}"\n'
                                               f'region = "us-east-1"\nrange_size = "1MiB"\nconcurrency = 4\n')
    node_env.config.write_text(text)
    isolated_env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    ck = _ck(tmp_path)
    r = wd("publish", ck, "--name", "org/moe", "--version", "v1")
    assert r.returncode == 0, r.stderr
    out = wd("--no-daemon", "preload", "org/moe@v1", "--experts", "3/4", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    _check_copy(Path(d["path"]), ck, 3, 4)
    m = load_manifest(Path(d["path"]) / MANIFEST_RELPATH)
    whole = build_manifest(ck)
    expert_bytes = sum(t.nbytes for _, t in whole.tensors() if EXPERT_RE.search(t.name))
    rank_bytes = sum(t.nbytes for _, t in m.tensors()) + sum(f.size for f in m.files if f.safetensors is None
                                                              and not f.path.endswith(".index.json"))
    # the store served the rank's tensors and whole small files, not the other ranks' experts
    assert d["store"]["bytes_read"] == d["bytes_by_source"]["cold"]
    assert rank_bytes <= d["bytes_by_source"]["cold"] <= rank_bytes + (1 << 20)
    assert d["bytes_by_source"]["cold"] < whole.total_bytes - expert_bytes // 2


def _dir(p: Path) -> Dir:
    import os
    return Dir(os.open(p, os.O_RDONLY | os.O_DIRECTORY), p)


def test_through_the_daemon(daemon, wd, node_env, tmp_path):
    ck = _ck(tmp_path)
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    r = wd("--daemon-only", "preload", "org/moe@v1", "--experts", "2/3", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["version"] == "v1~e2of3"
    assert not d.get("source_fallbacks") and "P2P" not in r.stderr   # (no swarm with origins configured)
    _check_copy(Path(d["path"]), ck, 2, 3)
    p = wd("--daemon-only", "path", "org/moe@v1", "--experts", "2/3")
    assert p.returncode == 0 and p.stdout.strip() == d["path"]
    assert wd("verify", d["path"]).returncode == 0
    assert_one_line_error(wd("--daemon-only", "preload", "org/moe@v1", "--experts", "3/3"), 2, "0 <= R < N")


def test_signed_versions(wd, node_env, tmp_path):
    """A signed version's copy is made (each tensor checked against the manifest) and made again as
    already there; where signatures are required it is refused, one line: no signature covers its files."""
    from tiering.content.signature import generate_keypair
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub.pem")
    ck = _ck(tmp_path)
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1", "--sign", tmp_path / "k.pem").returncode == 0
    for _ in range(2):
        r = wd("--no-daemon", "preload", "org/moe@v1", "--experts", "0/2", "--json")
        assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["already_present"]
    with open(node_env.config, "a") as fh:
        fh.write(f'[trust]\nrequire_signature = true\npublic_keys = ["{tmp_path / "k.pub.pem"}"]\n')
    assert_one_line_error(wd("--no-daemon", "preload", "org/moe@v1", "--experts", "1/2"), 2, "require_signature")


def test_intent_keeps_a_ranks_copy(node_env, isolated_env, wd, tmp_path):
    """An intent entry with ``experts = "R/N"`` keeps that rank's copy of the version, leased by it."""
    from tests.test_daemon import DaemonProc
    from tests.test_intent_daemon import intent_status, until
    ck = _ck(tmp_path)
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    idir = tmp_path / "intent.d"
    idir.mkdir()
    node_env.config.write_text(node_env.config.read_text() + f'[intent]\ndir = "{idir}"\nreconcile_s = 2\npoll_s = 0.2\n')
    (idir / "moe.toml").write_text('[[keep]]\nmodel = "org/moe@v1"\nexperts = "1/2"\n')
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        until("the entry is ready", lambda: (s := intent_status(wd)) and s["entries"]
              and s["entries"][0]["state"] == "ready")
        st = json.loads(wd("status", "--json").stdout)
        (c,) = [c for c in st["checkpoints"] if c["name"] == "org/moe"]
        assert c["version"] == "v1~e1of2" and c["part_of"]["kind"] == "experts"
        assert [le["holder"] for le in c["tiers"]["warm"]["leases"]] == ["intent moe.toml keep #1"]
        _check_copy(node_env.warm / "org/moe/v1~e1of2", ck, 1, 2)
    finally:
        d.stop()
    (idir / "moe.toml").write_text('[[keep]]\nmodel = "org/moe@v1"\nexperts = "2/2"\n')
    r = wd("intent", "check", str(idir))
    assert r.returncode != 0 and "keep #1.experts" in r.stderr and "0 <= R < N" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2


@pytest.mark.parametrize("name,expert", [
    ("model.layers.3.mlp.experts.17.down_proj.weight", 17), ("model.layers.0.block_sparse_moe.experts.7.w1.weight", 7),
    ("mlp.experts.2.up_proj.weight", 2), ("model.layers.3.mlp.shared_experts.down_proj.weight", None),
    ("model.layers.3.mlp.gate.weight", None), ("model.layers.3.mlp.experts.gate_up_proj", None),
    ("model.layers.3.xmlp.experts.1.w", None), ("model.layers.3.mlp.experts.١.w", None),
    ("a.experts.1.mlp.experts.2.w", 2)])
def test_expert_names(name, expert):
    from tiering.experts.plan import expert_of
    assert expert_of(name) == expert
    m = EXPERT_RE.search(name)
    assert (None if m is None else int(m.group(1))) == expert


def test_a_swarm_that_does_not_serve_the_version_is_not_asked(node_env, tmp_path):
    """With a swarm configured but the kept bytes under its threshold, the fetcher says no at once: no
    fallback entry, no libtorrent session started, the ranges from cold (tests/test_experts_p2p.py has
    the swarm serving a rank's pieces)."""
    from p2p import P2PConfig, P2PFetcher
    ck = _ck(tmp_path)
    fetcher = P2PFetcher(P2PConfig(listen="127.0.0.1:0", peers=("127.0.0.1:9",), threshold=1 << 40))
    with node_env.node(fetchers=[fetcher]) as n:
        n.publish(ck, "org/moe", "v1")
        r = n.preload("org/moe", "v1", tier="warm", selection=selection_from(experts="0/2"))
    assert r.source_fallbacks == []
    assert r.bytes_by_source["cold"] > 0 and not r.bytes_by_source.get("peer")
    assert fetcher._session is None
    _check_copy(Path(r.path), ck, 0, 2)
