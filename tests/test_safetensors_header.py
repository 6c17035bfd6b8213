"""The safetensors header parser: agrees with the reference library, rejects hostile headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

from tiering.content.safetensors_header import DTYPE_BITS, MAX_HEADER_BYTES, parse_header_bytes, read_header
from tiering.errors import SafetensorsHeaderError


def raw_file(path: Path, header: bytes | dict, data: bytes = b"", length: int | None = None) -> Path:
    hb = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb) if length is None else length) + hb + data)
    return path


def test_matches_reference_writer(tmp_path: Path) -> None:
    arrays = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.zeros((0, 5), dtype=np.int64),
        "c": np.ones(7, dtype=np.float16),
        "d": np.array([True, False]),
        "e": np.arange(3, dtype=np.uint8),
    }
    p = tmp_path / "ref.safetensors"
    save_file(arrays, str(p), metadata={"format": "np"})
    hdr = read_header(p)
    assert hdr.metadata == {"format": "np"}
    assert {t.name for t in hdr.tensors} == set(arrays)
    raw = p.read_bytes()
    with safe_open(str(p), "np") as f:
        for t in hdr.tensors:
            expected = f.get_tensor(t.name)
            assert t.shape == expected.shape
            assert raw[t.begin:t.end] == expected.tobytes()
    # the tensors tile the file exactly
    assert hdr.tensors[0].begin == hdr.header_size
    assert max(t.end for t in hdr.tensors) == p.stat().st_size


def test_sample_checkpoint_opens_in_reference_loader(ckpt: Path) -> None:
    for shard in sorted(ckpt.glob("*.safetensors")):
        ours = read_header(shard)
        with safe_open(str(shard), "np") as f:
            assert sorted(f.keys()) == sorted(t.name for t in ours.tensors)


def good_header() -> dict:
    return {"__metadata__": {"k": "v"},
            "x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "y": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}}


def test_good_header_parses(tmp_path: Path) -> None:
    hdr = read_header(raw_file(tmp_path / "g.safetensors", good_header(), b"\0" * 24))
    assert [t.name for t in hdr.tensors] == ["x", "y"]
    assert hdr.tensors[1].end == hdr.file_size


def test_sub_byte_dtype(tmp_path: Path) -> None:
    h = {"q": {"dtype": "F4", "shape": [3, 2], "data_offsets": [0, 3]}}
    assert read_header(raw_file(tmp_path / "f4.safetensors", h, b"\0" * 3)).tensors[0].nbytes == 3
    h = {"q": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}
    with pytest.raises(SafetensorsHeaderError, match="whole number of bytes"):
        read_header(raw_file(tmp_path / "f4b.safetensors", h, b"\0" * 2))


BAD_CASES = {
    "length past file": (lambda p: raw_file(p, b"{}", length=1000), "exceeds the file size"),
    "length over 100MB": (lambda p: raw_file(p, b"{}", length=MAX_HEADER_BYTES + 1), "exceeds the 100000000-byte limit"),
    "too short": (lambda p: p.write_bytes(b"\x01\x02"), "too short"),
    "invalid json": (lambda p: raw_file(p, b"{not json"), "not valid JSON"),
    "not an object": (lambda p: raw_file(p, b"[1, 2]"), "not a JSON object"),
    "not utf-8": (lambda p: raw_file(p, b'{"\xff": 1}'), "not UTF-8"),
    "duplicate key": (lambda p: raw_file(p, b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                                          b'"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\0"),
                      "duplicate key"),
    "overlap": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                       "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, b"\0" * 6),
                "overlaps"),
    "hole": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                    "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}}, b"\0" * 6),
             "hole of 2 bytes"),
    "past end": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 4),
                 "past the end"),
    "trailing bytes": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 4),
                       "after the last tensor"),
    "dtype x shape": (lambda p: raw_file(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
                      "is 8 bytes but data_offsets span 4"),
    "unknown dtype": (lambda p: raw_file(p, {"a": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16),
                      "unknown dtype"),
    "negative shape": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}),
                       "shape must be"),
    "bool shape": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"\0"),
                   "shape must be"),
    "reversed offsets": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}}, b"\0" * 4),
                         "data_offsets must be"),
    "metadata not strings": (lambda p: raw_file(p, {"__metadata__": {"a": 1}}), "__metadata__"),
    "unknown field": (lambda p: raw_file(p, {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"\0"),
                      "unknown field"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_headers(tmp_path: Path, case: str) -> None:
    make, message = BAD_CASES[case]
    p = tmp_path / "bad.safetensors"
    make(p)
    with pytest.raises(SafetensorsHeaderError, match=message) as info:
        read_header(p)
    assert str(p) in str(info.value)


# -- property tests: random and mutated headers raise nothing but SafetensorsHeaderError -----------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)

tensor_entry = st.fixed_dictionaries({
    "dtype": st.sampled_from(sorted(DTYPE_BITS)) | st.text(max_size=5),
    "shape": st.lists(st.integers(-2, 2**40), max_size=4),
    "data_offsets": st.lists(st.integers(-5, 2**64), min_size=0, max_size=3),
})


def _parse(raw: bytes, file_size: int) -> None:
    try:
        parse_header_bytes("h", struct.pack("<Q", len(raw)), raw, file_size)
    except SafetensorsHeaderError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=10), tensor_entry | json_values, max_size=6),
       st.integers(0, 2**20))
def test_random_headers_only_raise_parser_error(header: dict, data_size: int) -> None:
    raw = json.dumps(header).encode()
    _parse(raw, 8 + len(raw) + data_size)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 4096))
def test_random_bytes_only_raise_parser_error(raw: bytes, extra: int) -> None:
    _parse(raw, 8 + len(raw) + extra)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_valid_headers_only_raise_parser_error(data: st.DataObject) -> None:
    raw = bytearray(json.dumps(good_header()).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "delete":
            del raw[pos]
        else:
            raw.insert(pos, data.draw(st.sampled_from(b'{}[]",:0123456789-e.')))
        if not raw:
            break
    _parse(bytes(raw), 8 + len(raw) + 24)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["U8", "F16", "F32", "BF16", "I64"]),
                          st.lists(st.integers(0, 5), max_size=3)), min_size=1, max_size=6))
def test_valid_generated_headers_parse(tensors: list) -> None:
    header, off = {}, 0
    for i, (dtype, shape) in enumerate(tensors):
        n = DTYPE_BITS[dtype] // 8
        for d in shape:
            n *= d
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    hdr = parse_header_bytes("h", struct.pack("<Q", len(raw)), raw, 8 + len(raw) + off)
    assert len(hdr.tensors) == len(tensors)
