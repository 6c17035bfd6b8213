"""Manifests: build, round-trip, digest as content id, untrusted manifests rejected."""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering import MANIFEST_RELPATH, build_manifest, load_manifest, manifest_from_dict, write_manifest
from tiering.content.hashing import HashJob, hash_files
from tiering.content.manifest import FORMAT, tree_hash
from tiering.errors import BadInput, FileChanged, ManifestError, UnsafePath


def test_build_covers_every_file_and_tensor(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    assert m.format == FORMAT
    paths = [f.path for f in m.files]
    assert paths == sorted(paths)
    assert {"config.json", "original/params.json", "tokenizer.json", "model.safetensors.index.json"} <= set(paths)
    assert m.total_bytes == sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    tensors = {t.name: (f.path, t) for f, t in m.tensors()}
    assert set(tensors) == set(index["weight_map"])
    for name, (path, t) in tensors.items():
        assert index["weight_map"][name] == path
        with open(ckpt / path, "rb") as fh:
            fh.seek(t.begin)
            assert xxhash.xxh3_128(fh.read(t.nbytes)).hexdigest() == t.xxh3_128


def test_file_hash_is_tree_of_parts(ckpt: Path) -> None:
    m = build_manifest(ckpt)
    for f in m.files:
        parts = f.parts(m.chunk_size)
        assert parts[0].begin == 0 and parts[-1].end == f.size
        assert all(a.end == b.begin for a, b in zip(parts, parts[1:]))
        assert tree_hash([p.xxh3_128 for p in parts]) == f.xxh3_128


def test_chunks_for_large_non_safetensors_files(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    data = os.urandom(10_000)
    (d / "weights.bin").write_bytes(data)
    (d / "empty").write_bytes(b"")
    m = build_manifest(d, chunk_size=4096)
    f = m.file("weights.bin")
    assert f is not None and len(f.chunks) == 3
    assert f.chunks[2] == xxhash.xxh3_128(data[8192:]).hexdigest()
    assert len(m.file("empty").chunks) == 1
    assert manifest_from_dict(json.loads(m.to_json())) == m


def test_roundtrip_and_digest_is_content_id(ckpt: Path, tmp_path: Path) -> None:
    m = build_manifest(ckpt)
    out = tmp_path / "m.json"
    write_manifest(m, out)
    again = load_manifest(out)
    assert again == m
    labelled = m.with_labels(name="org/model", version="v1", published_at="2026-12-03T00:00:00Z", piece_size=4 << 20)
    assert labelled.digest == m.digest
    assert load_manifest(write_and(labelled, tmp_path / "l.json")).name == "org/model"
    assert build_manifest(ckpt, threads=1) == m  # thread count does not change the result


def write_and(m, path):
    write_manifest(m, path)
    return path


def test_digest_changes_with_content(ckpt: Path) -> None:
    before = build_manifest(ckpt)
    os.chmod(ckpt / "config.json", 0o600)
    assert build_manifest(ckpt).digest != before.digest  # mode is content
    os.chmod(ckpt / "config.json", 0o644)
    (ckpt / "config.json").write_text('{"changed": true}\n')
    assert build_manifest(ckpt).digest != before.digest


def mutate(d: dict, path: list, value) -> dict:
    out = copy.deepcopy(d)
    cur = out
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return out


@pytest.mark.parametrize("path,value,message", [
    (["files", 0, "path"], "/etc/passwd", "absolute"),
    (["files", 0, "path"], "../escape", "relative"),
    (["files", 0, "path"], "a/./b", "relative"),
    (["files", 0, "path"], "", "empty"),
    (["files", 0, "size"], -1, "integer"),
    (["files", 0, "xxh3_128"], "XYZ", "hex"),
    (["files", 0, "mode"], "rwx", "octal"),
    (["format"], 99, "unsupported format"),
    (["digest"], "0" * 32, "does not match"),
    (["name"], "../x", "invalid name"),
    (["version"], "a/b", "invalid version"),
    (["files"], {}, "expected a list"),
    (["extra"], 1, "unknown field"),
])
def test_untrusted_manifest_rejected(ckpt: Path, path: list, value, message: str) -> None:
    d = build_manifest(ckpt).to_dict()
    with pytest.raises(BadInput, match=message):
        manifest_from_dict(mutate(d, path, value))


def test_tampered_tensor_range_rejected(ckpt: Path) -> None:
    d = build_manifest(ckpt).to_dict()
    st_file = next(i for i, f in enumerate(d["files"]) if "safetensors" in f)
    t = d["files"][st_file]["safetensors"]["tensors"][1]
    with pytest.raises(ManifestError, match="tile"):
        manifest_from_dict(mutate(d, ["files", st_file, "safetensors", "tensors", 1, "begin"], t["begin"] + 1))


def test_duplicate_and_conflicting_paths_rejected(ckpt: Path) -> None:
    d = build_manifest(ckpt).to_dict()
    dup = copy.deepcopy(d)
    dup["files"].append(dup["files"][0])
    with pytest.raises(ManifestError, match="listed twice"):
        manifest_from_dict(dup)
    conflict = copy.deepcopy(d)
    f = copy.deepcopy(conflict["files"][0])
    f["path"] = "config.json/inner"
    conflict["files"].append(f)
    with pytest.raises(ManifestError, match="file and as a directory"):
        manifest_from_dict(conflict)


def test_load_manifest_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(tmp_path / "bad.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ManifestError):
        load_manifest(tmp_path / "bin.json")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_manifests_only_raise_bad_input(data: st.DataObject) -> None:
    base = {"format": 1, "digest": "0" * 32, "chunk_size": 16, "files": [
        {"path": "a", "size": 3, "mode": "0644", "xxh3_128": "1" * 32, "chunks": ["2" * 32]}]}
    leaves = st.none() | st.booleans() | st.integers(-3, 2**65) | st.text(max_size=40) | st.lists(st.integers(), max_size=2)
    d = copy.deepcopy(base)
    key = data.draw(st.sampled_from(["format", "digest", "chunk_size", "files", "name", "piece_size"]))
    d[key] = data.draw(leaves)
    if data.draw(st.booleans()):
        d = {"files": [data.draw(st.dictionaries(st.text(max_size=8), leaves, max_size=5))], "format": 1,
             "digest": "0" * 32, "chunk_size": 1}
    with pytest.raises(BadInput):
        manifest_from_dict(d)


def test_hashing_detects_file_changed_mid_read(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(4 << 20))
    st_ = p.stat()
    with pytest.raises(FileChanged):
        hash_files([HashJob(str(p), [(0, 8 << 20)], 8 << 20)])  # caller saw a bigger file
    with pytest.raises(FileChanged):
        hash_files([HashJob(str(p), [(0, 1 << 20), (1 << 20, 4 << 20)], st_.st_size, st_.st_mtime_ns + 1)])


def test_hashing_uses_several_threads(tmp_path: Path) -> None:
    files = []
    for i in range(8):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(1 << 20))
        files.append(p)
    seen: set[str] = set()
    lock = threading.Lock()
    both = threading.Event()

    def progress(n: int) -> None:  # each worker waits here until another worker has reported too
        with lock:
            seen.add(threading.current_thread().name)
            if len(seen) >= 2:
                both.set()
        both.wait(timeout=10)

    jobs = [HashJob(str(p), [(0, 512 << 10), (512 << 10, 1 << 20)], 1 << 20) for p in files]
    out = hash_files(jobs, threads=2, progress=progress)
    assert out[3][1] == xxhash.xxh3_128(files[3].read_bytes()[512 << 10:]).hexdigest()
    assert len(seen) == 2


def test_manifest_path_constant_matches_layout() -> None:
    assert MANIFEST_RELPATH == ".weightd/manifest.json"


def test_unsafe_path_is_bad_input() -> None:
    assert issubclass(UnsafePath, BadInput)


def test_write_to_a_device_or_fifo_never_replaces_it(ckpt: Path, tmp_path: Path) -> None:
    m = build_manifest(ckpt)
    write_manifest(m, "/dev/null")
    assert not Path("/dev/null").is_file() and Path("/dev/null").is_char_device()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    import threading
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_manifest(m, fifo)
    reader.join(timeout=10)
    assert fifo.is_fifo() and json.loads(got[0])["digest"] == m.digest
