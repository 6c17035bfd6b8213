"""Manifests of real MoE shape held compactly (issue 40): tensors as columns, the same checks as one by
one, the digest taken over what was read, and copies of one version shared in a process."""

from __future__ import annotations

import copy
import hashlib
import gc
import json
import tracemalloc
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering import build_manifest, load_manifest, manifest_from_dict, write_manifest
from tiering.content.manifest import FileEntry, Manifest, SafetensorsInfo, _file_dict, compute_digest, tree_hash
from tiering.content.manifest_parse import _Reader, _tensor_columns, _tensors_one_by_one, parse_manifest
from tiering.content.safetensors_header import DTYPE_BITS
from tiering.content.tensor_table import TensorEntry, TensorTable
from tiering.errors import BadInput, ManifestError
from tiering.sample_moe import make_moe_checkpoint, moe_tensors


def synthetic_moe(layers: int = 61, experts: int = 256, shards: int = 163, name: str = "ds/v3") -> Manifest:
    """A manifest of DeepSeek-V3's shape (~90,000 tensors) without writing its bytes: each tensor's
    digest made up, each file's hash the tree of them, so it reads back as a valid manifest."""
    tensors = moe_tensors(layers, experts=experts)
    per = -(-len(tensors) // shards)
    files = []
    for s in range(shards):
        off, entries = 4096, []
        for t in tensors[s * per:(s + 1) * per]:
            entries.append(TensorEntry(t.name, t.dtype, t.shape, off, off + t.nbytes,
                                       xxhash.xxh3_128_hexdigest(f"{s}:{t.name}".encode())))
            off += t.nbytes
        head = xxhash.xxh3_128_hexdigest(f"header {s}".encode())
        files.append(FileEntry(f"model-{s + 1:05d}-of-{shards:05d}.safetensors", off, 0o644,
                               tree_hash([head] + [e.xxh3_128 for e in entries]),
                               safetensors=SafetensorsInfo(4096, head, {"format": "pt"}, entries)))
    return Manifest(tuple(files), name=name, version="v1")


@pytest.fixture(scope="module")
def moe_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "manifest.json"
    write_manifest(synthetic_moe(), path)
    return path


def test_a_table_is_the_sequence_of_its_entries() -> None:
    entries = [TensorEntry("a.weight", "BF16", (2, 3), 8, 20, "1" * 32),
               TensorEntry("b.\u00e9\u4e2d", "F8_E4M3", (), 20, 21, "2" * 32),
               TensorEntry("c", "F32", (0, 4), 21, 21, "a" * 32)]
    table = TensorTable.of(entries)
    assert len(table) == 3 and list(table) == entries and tuple(table) == tuple(entries)
    assert table[-1] == entries[2] and table[1:] == tuple(entries[1:]) and table[::2] == (entries[0], entries[2])
    assert table.names() == [e.name for e in entries]
    assert table.spans() == [(8, 20), (20, 21), (21, 21)] and table.hex_digests() == ["1" * 32, "2" * 32, "a" * 32]
    assert table == TensorTable.of(list(entries)) and hash(table) == hash(TensorTable.of(entries))
    assert table != TensorTable.of(entries[:2]) and table != tuple(entries)  # (a table equals tables only)
    with pytest.raises(IndexError):
        table[3]
    assert len(TensorTable.of([])) == 0 and list(TensorTable.of([])) == []


def reference_digest(m: Manifest) -> str:
    """The digest as weightd has always taken it (one json.dumps of the whole body): every manifest
    already in cold storage was published with these bytes."""
    body = {"format": m.format, "chunk_size": m.chunk_size, "files": [_file_dict(f) for f in m.files]}
    return xxhash.xxh3_128(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                           .encode()).hexdigest()


def reference_json(m: Manifest) -> list[str]:
    """Each tensor line of to_json as json.dumps writes the tensor's dict."""
    return [json.dumps(t, ensure_ascii=False, separators=(", ", ": "))
            for f in m.to_dict()["files"] if "safetensors" in f for t in f["safetensors"]["tensors"]]


def test_digest_and_json_from_columns_are_json_dumps_bytes(ckpt: Path, moe_json: Path) -> None:
    for m in (build_manifest(ckpt), load_manifest(moe_json)):
        assert compute_digest(m) == m.digest == reference_digest(m)
        lines = m.to_json().split("\n")
        assert [ln.strip().rstrip(",") for ln in lines if ln.startswith("   {")] == reference_json(m)
        assert manifest_from_dict(json.loads(m.to_json())) == m


NAMES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["a\"b", "back\\slash", "tab\t", "\u2028", "\x7f", "\U0001f600", "\u00e9"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(NAMES, st.sampled_from(sorted(DTYPE_BITS)), st.lists(st.integers(0, 2**40), max_size=4),
                          st.integers(0, 2**20)), max_size=6),
       st.dictionaries(NAMES, NAMES, max_size=3), NAMES.filter(lambda p: p.isalnum()))
def test_columns_write_what_json_dumps_writes(rows: list, metadata: dict, path: str) -> None:
    off, entries = 16, []
    for name, dtype, shape, n in rows:
        entries.append(TensorEntry(name, dtype, tuple(shape), off, off + n, xxhash.xxh3_128_hexdigest(name.encode())))
        off += n
    head = xxhash.xxh3_128_hexdigest(b"h")
    f = FileEntry(path + ".safetensors", off, 0o640, tree_hash([head] + [e.xxh3_128 for e in entries]),
                  safetensors=SafetensorsInfo(16, head, metadata, entries))
    m = Manifest(tuple(sorted((f, FileEntry("z", 3, 0o755, tree_hash(["1" * 32]), ("1" * 32,))), key=lambda e: e.path)))
    assert m.digest == reference_digest(m)
    assert [ln.strip().rstrip(",") for ln in m.to_json().split("\n") if ln.startswith("   {")] == reference_json(m)
    assert manifest_from_dict(json.loads(m.to_json())) == m


GOOD = [{"name": "a", "dtype": "U8", "shape": [4], "begin": 8, "end": 12, "xxh3_128": "1" * 32},
        {"name": "b", "dtype": "BF16", "shape": [1, 2], "begin": 12, "end": 16, "xxh3_128": "2" * 32}]
LEAVES = (st.none() | st.booleans() | st.integers(-3, 2**64) | st.floats(allow_nan=False) | st.text(max_size=34)
          | st.lists(st.integers(-1, 3) | st.booleans(), max_size=3) | st.just("f" * 32) | st.just("F" * 32))


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_column_checks_accept_exactly_what_the_one_by_one_checks_accept(data: st.DataObject) -> None:
    """The fast path (a column at a time) and the precise one (a tensor at a time) agree on every
    mutation: the fast one never accepts what the other refuses, and gives the same table."""
    raw = copy.deepcopy(GOOD)
    for _ in range(data.draw(st.integers(1, 3))):
        t = raw[data.draw(st.integers(0, 1))]
        key = data.draw(st.sampled_from(sorted(t) + ["extra"]))
        if data.draw(st.booleans()) and key in t:
            del t[key]
        else:
            t[key] = data.draw(LEAVES)
    fast = _tensor_columns(raw, 8, 16)
    try:
        slow = _tensors_one_by_one(_Reader("m"), raw, "file 'x'", 8, 16)
    except BadInput:
        assert fast is None
        return
    assert fast is None or fast == slow


def test_hostile_tensors_get_a_named_error() -> None:
    for t, message in [({"begin": True}, "begin"), ({"shape": [-1]}, "shape"), ({"shape": [2**63]}, "2\\*\\*63"),
                       ({"xxh3_128": "A" * 32}, "hex"), ({"dtype": "F128"}, "unknown dtype"), ({"end": 13}, "tile"),
                       ({"name": 5}, "name must be a string"), ({"more": 1}, "unknown field")]:
        raw = copy.deepcopy(GOOD)
        raw[0].update(t)
        if "end" in t:
            raw[1]["begin"] = 12
        with pytest.raises(ManifestError, match=message):
            _tensors_one_by_one(_Reader("m"), raw, "file 'x'", 8, 16)
        assert _tensor_columns(raw, 8, 16) is None


def test_copies_of_one_version_are_one_object_while_held(moe_json: Path, tmp_path: Path) -> None:
    raw = moe_json.read_bytes()
    a = parse_manifest(raw, "warm copy")
    assert parse_manifest(bytes(raw), "hot copy") is a
    relabelled = tmp_path / "other.json"
    write_manifest(a.with_labels(name="ds/other", version="v1"), relabelled)
    b = load_manifest(relabelled)
    assert b is not a and b.files == a.files and b.digest == a.digest
    edited = raw.replace(b'"name": "ds/v3"', b'"name": "ds/v4"')
    assert parse_manifest(edited, "edited").name == "ds/v4"


def test_a_held_90k_tensor_version_costs_under_25_mb(moe_json: Path) -> None:
    """Issue 40's budget, in Python's own count of what stays allocated (RSS also holds the freed parse
    tree until reused: docs/benchmarks.md gives both)."""
    gc.collect()
    tracemalloc.start()
    try:
        held = [load_manifest(moe_json)]
        gc.collect()
        one, _ = tracemalloc.get_traced_memory()
        held.append(load_manifest(moe_json))  # (the same bytes: shared)
        gc.collect()
        two, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(1 for _ in held[0].tensors()) > 89_000
    assert one < 25 << 20, f"{one / 2**20:.1f} MiB held"
    assert two - one < 1 << 20


def test_a_moe_checkpoint_builds_and_reads_back(tmp_path: Path) -> None:
    """The generator's checkpoint (fewer experts, for time) builds into a manifest whose tensors are
    its index's, and reads back equal."""
    root = make_moe_checkpoint(tmp_path / "moe", layers=6, experts=16, shards=7)
    m = build_manifest(root)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert {t.name: f.path for f, t in m.tensors()} == index["weight_map"]
    for f, t in list(m.tensors())[::997]:  # (hashed in runs of small tensors: each still its own digest)
        with open(root / f.path, "rb") as fh:
            fh.seek(t.begin)
            assert xxhash.xxh3_128_hexdigest(fh.read(t.nbytes)) == t.xxh3_128
    write_manifest(m, tmp_path / "m.json")
    assert load_manifest(tmp_path / "m.json") == m


def test_a_run_of_small_parts_that_ends_early_is_file_changed(tmp_path: Path) -> None:
    """Small consecutive parts are hashed from one read: a file shorter than its parts say (truncated
    after it was listed) is FileChanged, never a digest of missing bytes."""
    from tiering.content.hashing import HashJob, hash_files
    from tiering.errors import FileChanged
    f = tmp_path / "f"
    f.write_bytes(b"x" * 1000)
    spans = [(i, i + 100) for i in range(0, 1200, 100)]
    with pytest.raises(FileChanged):
        hash_files([HashJob(str(f), spans, 1200, None)], threads=1)
    assert hash_files([HashJob(str(f), spans[:10], 1000, None)], threads=1)[0] == \
        [xxhash.xxh3_128_hexdigest(b"x" * 100)] * 10


def test_hostile_manifests_found_by_review_are_one_line_errors(ckpt: Path) -> None:
    """Two digests that together are 64 hex digits but 48 + 16 each, a chunk list claiming a file of
    10**18 one-byte chunks (was built in memory before it was counted), a lone surrogate in a tensor
    name or a metadata value (valid JSON, not text: the digest could not be taken)."""
    d = build_manifest(ckpt).to_dict()
    i = next(k for k, f in enumerate(d["files"]) if "safetensors" in f)
    ts = d["files"][i]["safetensors"]["tensors"]
    a, b = ts[0]["xxh3_128"], ts[1]["xxh3_128"]
    split = copy.deepcopy(d)
    split["files"][i]["safetensors"]["tensors"][0]["xxh3_128"] = a + b[:16]
    split["files"][i]["safetensors"]["tensors"][1]["xxh3_128"] = b[16:]
    with pytest.raises(ManifestError, match="hex"):
        manifest_from_dict(split)
    huge = {"format": 1, "digest": "0" * 32, "chunk_size": 1, "files": [
        {"path": "x", "size": 10**18, "mode": "0644", "xxh3_128": "1" * 32, "chunks": ["2" * 32]}]}
    with pytest.raises(ManifestError, match="chunk hashes"):
        manifest_from_dict(huge)
    for where in (["tensors", 0, "name"], ["metadata", "k"]):
        bad = copy.deepcopy(d)
        node = bad["files"][i]["safetensors"]
        for k in where[:-1]:
            node = node[k]
        node[where[-1]] = "\ud800"
        with pytest.raises(ManifestError, match="surrogate"):
            parse_manifest(json.dumps(bad).encode(), "m")


def test_a_header_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    from tiering.content.safetensors_header import read_header
    from tiering.errors import SafetensorsHeaderError
    raw = b'{"\\ud800x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
    raw += b" " * (-(len(raw) + 8) % 8)
    f = tmp_path / "s.safetensors"
    f.write_bytes(len(raw).to_bytes(8, "little") + raw + b"z")
    with pytest.raises(SafetensorsHeaderError, match="surrogate"):
        read_header(f)


def hostile_names_checkpoint(root: Path) -> Path:
    """Safetensors files whose names and metadata need escaping, written by the reference writer and by
    the sample writer (ASCII escapes), with scalars, empty tensors and a non-safetensors file."""
    import numpy as np
    from safetensors.numpy import save_file

    from tiering.sample import SampleTensor, fill_bytes, write_safetensors
    root.mkdir()
    save_file({'q"uote': np.arange(6, dtype=np.float32).reshape(2, 3), "back\\slash": np.zeros((0, 5), dtype=np.int64),
               "tab\there": np.array(2.0, dtype=np.float64), "\u2028\u00e9\U0001f600": np.ones(3, dtype=np.uint8)},
              str(root / "ref.safetensors"), metadata={"fo\"r\nmat": "n\\p\u4e2d"})  # (one key: the writer's order of several varies)
    ts = [SampleTensor('na"me', "U8", (3,)), SampleTensor("\x7fdel", "F32", ()), SampleTensor("e\u00e9", "BF16", (2, 0, 3)),
          SampleTensor("__metadata__x", "F8_E4M3", (1, 2, 3, 4, 5))]
    write_safetensors(root / "sample.safetensors", ts, lambda t: fill_bytes(t.name, t.nbytes), metadata={"a": "\"}"})
    (root / "notes.txt").write_text("hi\n")
    for p in root.iterdir():
        p.chmod(0o644)
    return root


def test_a_build_renders_what_json_dumps_writes(tmp_path: Path) -> None:
    """A build renders each file's tensors once for the digest and the file (TensorTable.built): the
    bytes json.dumps wrote, for names that need escaping too, and the same as a later rendering."""
    m = build_manifest(hostile_names_checkpoint(tmp_path / "c"))
    assert m.rendered and m.tensor_count == 8
    first = m.to_json()
    assert not m.rendered   # (taken by the first to_json)
    assert compute_digest(m) == m.digest == reference_digest(m)
    assert [ln.strip().rstrip(",") for ln in first.split("\n") if ln.startswith("   {")] == reference_json(m)
    assert first == m.to_json() == m.with_labels(name=None).to_json()
    assert manifest_from_dict(json.loads(first)) == m


def test_digests_of_manifests_built_before_issue_40s_rendering_are_unchanged(tmp_path: Path) -> None:
    """Digests and file bytes taken by the code before the one-pass rendering (json.dumps per tensor and
    json.loads with a hook per header entry), for the same deterministic checkpoints."""
    moe = make_moe_checkpoint(tmp_path / "moe", layers=6, shards=7)
    for p in moe.iterdir():
        p.chmod(0o644)
    for root, digest, sha in (
            (moe, "3a1a7c412f74156390cc4a3de3e77f35", "5fe62eaab91bdf26c403683b147cd1248624b4a95ba36d801cca3b2777a57dc1"),
            (hostile_names_checkpoint(tmp_path / "c"), "725fc74a3591f55f6ea2d2afcf09f1b4",
             "c2b4338502b3b31db000ad2869ae57bad01a3c6ec3d6ddda9da620ba2d6a9067")):
        m = build_manifest(root)
        assert m.digest == digest
        assert hashlib.sha256(m.to_json().encode()).hexdigest() == sha
