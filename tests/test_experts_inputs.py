"""Expert-parallel copies (issue 40 part 2), the review's findings: the ranged download's sparse files
outside the copy's tree and counted in the space reserved, the index json from the version's own,
other weight formats left out, bad input one line, and the timeout inside a shard. Real files, real
tiers, the real CLI, a real S3-protocol server (moto); each copy opened with safetensors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.test_experts import EXPERTS, _check_copy, _ck, _dir, _tensors
from tiering import BadInput, TimedOut, selection_from
from tiering.content.build import build_manifest
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.content.manifest_parse import load_manifest
from tiering.content.tensor_table import TensorTable
from tiering.experts.plan import expert_manifest, split_for
from tiering.experts.repack import jobs_for, repack
from tiering.sample import SampleTensor, write_safetensors


def _s3(node_env, isolated_env, s3_endpoint: str, bucket: str) -> None:
    s3 = (f'[tiers.cold]\nurl = "s3://{bucket}/models"\nendpoint = "{s3_endpoint}"\nregion = "us-east-1"\n'
          f'range_size = "1MiB"\nconcurrency = 4\n')
    text = node_env.config.read_text().replace(f'[tiers.cold]\npath = "{node_env.cold}"\n', s3)
    node_env.config.write_text(text)
    isolated_env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")


def _staging_left(root: Path) -> list[str]:
    area = root / ".staging"
    return sorted(p.name for p in area.iterdir()) if area.exists() else []


def test_a_file_under_the_old_scratch_name_stays_in_an_s3_copy(wd, node_env, tmp_path, s3_endpoint, bucket,
                                                                isolated_env):
    _s3(node_env, isolated_env, s3_endpoint, bucket)
    ck = _ck(tmp_path)
    (ck / ".weightd-ranges").mkdir()
    (ck / ".weightd-ranges" / "notes.txt").write_text("kept\n")
    (ck / "tokenizer.json").write_text("{}\n")
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    out = wd("--no-daemon", "preload", "org/moe@v1", "--experts", "1/2", "--tier", "hot", "--json")
    assert out.returncode == 0, out.stderr
    path = Path(json.loads(out.stdout)["path"])
    assert (path / ".weightd-ranges" / "notes.txt").read_text() == "kept\n"
    assert wd("verify", path).returncode == 0
    _check_copy(path, ck, 1, 2)
    # the sparse files went with the fill; what a kill leaves beside a copy is swept
    assert _staging_left(node_env.hot) == []
    left = node_env.hot / ".staging" / "org--moe@v1~e0of2.ranges.resumable"
    (left / "model-00001-of-00007.safetensors").parent.mkdir(parents=True)
    (left / "model-00001-of-00007.safetensors").write_bytes(b"x" * 4096)
    assert wd("--no-daemon", "gc").returncode == 0
    assert _staging_left(node_env.hot) == []


def test_space_for_an_s3_copy_counts_its_sparse_files(wd, node_env, tmp_path, s3_endpoint, bucket, isolated_env):
    """A tier that holds the copy but not the copy and the ranges downloaded for it: NoSpace (exit 6)
    before a byte is fetched, nothing left behind; one that holds both: placed."""
    _s3(node_env, isolated_env, s3_endpoint, bucket)
    ck = _ck(tmp_path, pad_bytes=1 << 20)
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    m = build_manifest(ck).with_labels(name="org/moe", version="v1")
    sel = selection_from(experts="0/2")
    copy = expert_manifest(m, sel, split_for(m, sel, (ck / "config.json").read_bytes()), "v1~e0of2", {}).total_bytes
    node_env.write_config(f"{copy * 3 // 2}B", f"{copy * 3 // 2}B")
    _s3(node_env, isolated_env, s3_endpoint, bucket)
    r = wd("--no-daemon", "preload", "org/moe@v1", "--experts", "0/2", "--tier", "hot")
    assert_one_line_error(r, 6, "warm")
    for tier in (node_env.hot, node_env.warm):
        assert _staging_left(tier) == [] and not list(tier.glob("org/moe/v1*"))
    node_env.write_config(f"{copy * 5 // 2}B", f"{copy * 3 // 2}B")
    _s3(node_env, isolated_env, s3_endpoint, bucket)
    r = wd("--no-daemon", "preload", "org/moe@v1", "--experts", "0/2", "--tier", "hot", "--json")
    assert r.returncode == 0, r.stderr
    _check_copy(Path(json.loads(r.stdout)["path"]), ck, 0, 2)


def test_the_index_names_only_the_versions_own_shards(wd, node_env, tmp_path):
    """A consolidated.safetensors beside the HF shards is not in the index: not in the copy either."""
    ck = _ck(tmp_path)
    (ck / "consolidated.safetensors").write_bytes((ck / "model-00001-of-00007.safetensors").read_bytes())
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    r = wd("--no-daemon", "preload", "org/moe@v1", "--experts", "0/2", "--json")
    assert r.returncode == 0, r.stderr
    path = Path(json.loads(r.stdout)["path"])
    assert not (path / "consolidated.safetensors").exists()
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) <= {f"model-{i:05d}-of-00007.safetensors" for i in range(1, 8)}
    assert index["metadata"]["total_size"] == sum(t.nbytes for _, t in load_manifest(path / MANIFEST_RELPATH).tensors())
    (ck / "consolidated.safetensors").unlink()
    _check_copy(path, ck, 0, 2)


def test_a_tensor_in_two_shards_is_refused(wd, node_env, tmp_path):
    ck = _ck(tmp_path)
    dup = next(iter(_tensors(ck)))
    write_safetensors(ck / "model-extra.safetensors",
                      [SampleTensor(dup, "BF16", (4,)), SampleTensor("model.extra.w", "BF16", (4,))],
                      lambda t: b"\1" * 8)
    index = json.loads((ck / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.extra.w"] = "model-extra.safetensors"
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    assert wd("publish", ck, "--name", "org/moe", "--version", "v1").returncode == 0
    assert_one_line_error(wd("--no-daemon", "preload", "org/moe@v1", "--experts", "0/2"), 2, dup)


def test_other_weight_formats_are_left_out_unless_included(node_env, tmp_path):
    ck = _ck(tmp_path)
    for n in ("pytorch_model.bin", "extra.pt", "w.pth"):
        (ck / n).write_bytes(b"\0" * 1000)
    with node_env.node() as n:
        n.publish(ck, "org/moe", "v1")
        r = n.preload("org/moe", "v1", tier="hot", selection=selection_from(experts="0/2"))
        assert not {"pytorch_model.bin", "extra.pt", "w.pth"} & {p.name for p in Path(r.path).iterdir()}
        sel = selection_from(experts="0/2", include=["*.safetensors", "*.json", "pytorch_model.bin"])
        r = n.preload("org/moe", "v1", tier="hot", selection=sel)
        assert (Path(r.path) / "pytorch_model.bin").stat().st_size == 1000
        assert not (Path(r.path) / "extra.pt").exists()


def test_a_huge_expert_number_and_a_deep_config_are_one_line(wd, node_env, tmp_path):
    ck = _ck(tmp_path)
    write_safetensors(ck / "model-extra.safetensors",
                      [SampleTensor(f"model.layers.9.mlp.experts.{'7' * 5000}.w", "BF16", (4,))], lambda t: b"\1" * 8)
    assert wd("publish", ck, "--name", "org/huge", "--version", "v1").returncode == 0
    (ck / "model-extra.safetensors").unlink()
    (ck / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert wd("publish", ck, "--name", "org/deep", "--version", "v1").returncode == 0
    huge, deep = wd.at_once(["--no-daemon", "preload", "org/huge@v1", "--experts", "0/2"],
                            ["--no-daemon", "preload", "org/deep@v1", "--experts", "0/2"])
    assert_one_line_error(huge, 2, f"{EXPERTS} routed experts")
    assert_one_line_error(deep, 2, "not JSON")


def test_a_shape_that_disagrees_with_the_bytes_is_refused(tmp_path):
    ck = _ck(tmp_path)
    m = build_manifest(ck).with_labels(name="org/moe", version="v1")
    f = next(f for f in m.files if f.safetensors is not None)
    t = f.safetensors.tensors
    shapes = [e.shape for e in t]
    shapes[0] = (12345,)
    table = TensorTable(t.names(), [e.dtype for e in t], shapes, *zip(*t.spans()), t.digest_bytes)
    files = tuple(replace(g, safetensors=replace(g.safetensors, tensors=table)) if g is f else g for g in m.files)
    sel = selection_from(experts="0/2")
    with pytest.raises(BadInput, match="shape"):
        expert_manifest(replace(m, files=files), sel, split_for(m, sel, (ck / "config.json").read_bytes()), "x", {})


def test_the_timeout_is_checked_inside_a_shard(tmp_path):
    ck = _ck(tmp_path, pad_bytes=20 << 20)
    m = build_manifest(ck).with_labels(name="org/moe", version="v1")
    sel = selection_from(experts="0/2")
    cm = expert_manifest(m, sel, split_for(m, sel, (ck / "config.json").read_bytes()), "v1~e0of2", {})
    job = next(j for j in jobs_for(cm, m) if j.read_bytes > 16 << 20)
    ticks = iter([0.0, 0.0] + [9.0] * 100)   # (the deadline passes after the shard's first 8 MiB)
    (tmp_path / "out").mkdir()
    with _dir(ck) as src, _dir(tmp_path / "out") as dest, pytest.raises(TimedOut):
        repack([job], src, dest, deadline=1.0, clock=lambda: next(ticks))


def test_the_space_reserved_for_a_swarm_fill_is_never_more_than_the_files(node_env, tmp_path):
    """A swarm fill reserves its kept ranges plus a whole piece at each edge, but never more than the
    files read: a manifest's piece size is outside its digest, and large pieces around many runs once
    reserved many times the shards."""
    from p2p import P2PConfig, P2PFetcher, P2PSession
    ck = _ck(tmp_path, pad_bytes=1 << 20)
    pub = node_env.node()
    pub.publish(ck, "org/moe", "v1")
    origin = pub.published_version("org/moe", "v1")
    pub.close()
    cfg = P2PConfig(listen="127.0.0.1:0", peers=("127.0.0.1:9",))   # (a swarm configured: its pieces count)
    session = P2PSession(cfg)
    node = node_env.node(fetchers=[P2PFetcher(cfg, session)])
    try:
        sel = selection_from(experts="0/2")
        m = build_manifest(ck).with_labels(name="org/moe", version="v1")
        copy = expert_manifest(m, sel, split_for(m, sel, (ck / "config.json").read_bytes()), "v1~e0of2", {})
        files = sum(f.size for f in origin.manifest.files)
        assert 0 < node.preloader.experts.scratch_bytes(copy, origin) <= files
        huge = replace(origin, manifest=replace(origin.manifest, piece_size=1 << 40))
        assert node.preloader.experts.scratch_bytes(copy, huge) <= files
    finally:
        node.close()
        session.close()
