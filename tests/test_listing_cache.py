"""The caches that make a tier of hundreds of versions cheap to list (a LoRA set): parsed manifests
kept by file identity, NAME-directory listings kept by mtime (never within the racy window: the scan
of a root the index cannot watch, tests/test_version_index.py has the index), donor part indexes kept
by digest. Each must notice every change that matters."""

from __future__ import annotations

import os
import time

import pytest

from tiering import version_index
from tiering import versions as listing
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.versions import list_versions, read_version
from tiering.sample import make_checkpoint


def _placed(node_env, tmp_path, versions, size=256 << 10):
    with node_env.node() as n:
        for v in versions:
            src = make_checkpoint(tmp_path / f"src-{v}", total_bytes=size, shards=1, layers=1, seed=v)
            n.publish(src, "org/m", v)
            n.preload("org/m", v, tier="warm", lease_s=0)


@pytest.mark.parametrize("indexed", [True, False])
def test_a_listing_follows_every_version_that_comes_and_goes(node_env, tmp_path, monkeypatch, indexed):
    monkeypatch.setattr(version_index, "ENABLED", indexed)
    monkeypatch.setattr(listing, "RACY_NS", 0)   # (keep every listing: the cache itself is under test)
    _placed(node_env, tmp_path, ["v1", "v2"])
    assert sorted(v.version for v in list_versions(node_env.warm)) == ["v1", "v2"]
    assert sorted(v.version for v in list_versions(node_env.warm)) == ["v1", "v2"]   # (from the cache)
    _placed(node_env, tmp_path, ["v3"])
    assert sorted(v.version for v in list_versions(node_env.warm)) == ["v1", "v2", "v3"]
    with node_env.node() as n:
        n.evict("org/m", "v2", "warm", force=True)
    assert sorted(v.version for v in list_versions(node_env.warm)) == ["v1", "v3"]


def test_a_listing_taken_in_the_racy_window_is_not_kept(node_env, tmp_path, monkeypatch):
    monkeypatch.setattr(version_index, "ENABLED", False)
    _placed(node_env, tmp_path, ["v1"])
    list_versions(node_env.warm)
    st = os.stat(node_env.warm / "org/m")
    key = (str(node_env.warm / "org"), "m", st.st_dev, st.st_ino)
    if time.time_ns() - st.st_mtime_ns < listing.RACY_NS:
        assert key not in listing._LISTED
    time.sleep(listing.RACY_NS / 1e9 + 0.05)
    list_versions(node_env.warm)
    assert key in listing._LISTED


def test_a_manifest_changed_in_place_is_read_again(node_env, tmp_path):
    _placed(node_env, tmp_path, ["v1"])
    p = node_env.warm / "org/m/v1" / MANIFEST_RELPATH
    assert read_version(node_env.warm, "org/m", "v1") is not None
    os.chmod(p, 0o644)
    raw = p.read_bytes()
    with open(p, "r+b") as fh:   # same inode, same size: another label inside
        fh.write(raw.replace(b'"name": "org/m"', b'"name": "org/x"', 1))
    assert read_version(node_env.warm, "org/m", "v1") is None


def test_sharing_only_a_header_is_not_a_delta(node_env, tmp_path):
    """Two LoRA adapters of one shape share their safetensors header and nothing else: the second
    is copied plainly (a delta would read and check donor bytes for a few kilobytes)."""
    from tiering.sample import SampleTensor, fill_bytes, write_safetensors
    with node_env.node() as n:
        for i in range(2):
            root = tmp_path / f"a{i}"
            root.mkdir()
            write_safetensors(root / "adapter_model.safetensors", [SampleTensor(f"l{j}.lora_A", "F16", (512, 512))
                                                                   for j in range(4)],
                              lambda t, i=i: fill_bytes(f"{i}{t.name}", t.nbytes))
            n.publish(root, f"lora/a{i}", "v1")
        n.preload("lora/a0", "v1", tier="hot")
        r = n.preload("lora/a1", "v1", tier="hot")
        assert r.delta is None and r.bytes_by_source["cold"] == r.bytes
