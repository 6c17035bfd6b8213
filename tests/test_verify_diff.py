"""verify finds the first bad file/tensor; diff names what changed and counts new bytes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tiering import build_manifest, diff_manifests, verify_checkpoint
from tiering.content.safetensors_header import read_header
from tiering.errors import ChecksumMismatch, IntegrityError
from tiering.sample import make_checkpoint, mutate_tensor


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 1]))


def test_intact_checkpoint_verifies(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    report = verify_checkpoint(ckpt, m)
    assert report.ok and report.bytes_checked == m.total_bytes
    report.raise_for_problems()


def test_flipped_byte_names_the_tensor(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    t = read_header(shard).tensors[3]
    flip_byte(shard, t.begin + t.nbytes // 2)
    report = verify_checkpoint(ckpt, m)
    assert [(p.path, p.what) for p in report.problems] == [(shard.name, f"tensor {t.name!r}")]
    with pytest.raises(ChecksumMismatch, match=t.name):
        report.raise_for_problems()


def test_header_corruption_and_chunk_corruption(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    flip_byte(sorted(ckpt.glob("*.safetensors"))[0], 20)
    flip_byte(ckpt / "tokenizer.json", 5)
    whats = [p.what for p in verify_checkpoint(ckpt, m).problems]
    assert whats[0] == "header" and whats[1].startswith("chunk 0")


def test_missing_extra_and_truncated_files(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    (ckpt / "config.json").unlink()
    (ckpt / "intruder.bin").write_bytes(b"x")
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    os.truncate(shard, shard.stat().st_size - 1)
    problems = {(p.path, p.what.split(" (")[0]) for p in verify_checkpoint(ckpt, m).problems}
    assert problems == {("config.json", "missing"), ("intruder.bin", "unexpected file"), (shard.name, "size")}
    with pytest.raises(IntegrityError, match="config.json: missing"):
        verify_checkpoint(ckpt, m).raise_for_problems()


def test_diff_one_tensor_changed(ckpt: Path, tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    shutil.copytree(ckpt, v2)
    shard = sorted(v2.glob("*.safetensors"))[1]
    name = read_header(shard).tensors[2].name
    changed = mutate_tensor(shard, name, seed="v2")
    d = diff_manifests(build_manifest(ckpt), build_manifest(v2))
    assert d.files_changed == [shard.name] and not d.files_added and not d.files_removed
    assert [(t.kind, t.name) for t in d.tensors] == [("changed", name)]
    assert d.changed_bytes == changed


def test_diff_added_removed_moved_and_resharded(tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "a", total_bytes=4 << 20, shards=2, layers=2, seed="s")
    b = make_checkpoint(tmp_path / "b", total_bytes=4 << 20, shards=3, layers=2, seed="s")  # same tensors, resharded
    (b / "extra.txt").write_text("new file")
    (b / "original" / "params.json").unlink()
    d = diff_manifests(build_manifest(a), build_manifest(b))
    assert "extra.txt" in d.files_added and "original/params.json" in d.files_removed
    assert d.count("changed") == 0 and d.count("added") == 0 and d.count("moved") > 0
    # only headers, the index and the new file are new content: every tensor's bytes exist in A
    headers = sum(read_header(p).header_size for p in b.glob("*.safetensors"))
    assert d.changed_bytes <= headers + (b / "model.safetensors.index.json").stat().st_size + len("new file")
    c = make_checkpoint(tmp_path / "c", total_bytes=4 << 20, shards=2, layers=3, seed="s")  # one more layer
    d2 = diff_manifests(build_manifest(a), build_manifest(c))
    assert d2.count("added") == 9 and d2.count("removed") == 0


def test_identical(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    d = diff_manifests(m, m)
    assert d.identical and d.changed_bytes == 0 and not d.tensors
