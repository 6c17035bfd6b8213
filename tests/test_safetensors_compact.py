"""The safetensors header's fast path (issue 40): a header in the reference writer's compact form is read
by a regular expression instead of ``json.loads`` with a duplicate-key hook. It must decide exactly as
the general path does: the same header, or the same error, for hostile headers above all (a duplicate
key at any level, escaped quotes in names, fields out of order or repeated, metadata anywhere)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from tiering.content import safetensors_header as sh
from tiering.content.safetensors_header import DTYPE_BITS, SafetensorsHeader, parse_header_bytes, read_header
from tiering.errors import SafetensorsHeaderError
from tiering.sample import SampleTensor, fill_bytes, write_safetensors


def outcome(raw: bytes, data_size: int, *, general: bool = False) -> "SafetensorsHeader | str":
    """The parsed header, or the error's message; ``general``: with the fast path switched off."""
    saved = sh._compact_header
    if general:
        sh._compact_header = lambda *a: None  # type: ignore[assignment]
    try:
        return parse_header_bytes("h", struct.pack("<Q", len(raw)), raw, 8 + len(raw) + data_size)
    except SafetensorsHeaderError as exc:
        return str(exc)
    finally:
        sh._compact_header = saved


def fast_taken(raw: bytes, data_size: int) -> bool:
    text = raw.decode()
    return sh._compact_header(text, 8 + len(raw), 8 + len(raw) + data_size) is not None


def same_both_ways(raw: bytes, data_size: int) -> "SafetensorsHeader | str":
    got = outcome(raw, data_size)
    assert got == outcome(raw, data_size, general=True)
    return got


E = '{"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]}'


def entry(name: str, size: int, at: int) -> str:
    return f'"{name}":' + E % (size, at, at + size)


# each: (raw header, data bytes, what the general path says: a message part, or None for "parses")
HOSTILE = {
    "duplicate tensor name": ('{%s,%s}' % (entry("a", 1, 0), entry("a", 1, 1)), 2, "duplicate key 'a'"),
    "duplicate name by escape": ('{%s,%s}' % (entry("a", 1, 0), entry("\\u0061", 1, 1)), 2, "duplicate key 'a'"),
    "duplicate name, one escaped quote": ('{%s,%s}' % (entry('q\\"', 1, 0), entry("q\\u0022", 1, 1)), 2,
                                          "duplicate key"),
    "duplicate field": ('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', 1, "duplicate key 'dtype'"),
    "duplicate field, last wins otherwise": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"shape":[2]}}', 1,
                                             "duplicate key 'shape'"),
    "duplicate metadata": ('{"__metadata__":{"k":"v"},"__metadata__":{"k":"w"},%s}' % entry("a", 1, 0), 1,
                           "duplicate key '__metadata__'"),
    "duplicate metadata key": ('{"__metadata__":{"k":"v","k":"w"},%s}' % entry("a", 1, 0), 1, "duplicate key 'k'"),
    "duplicate metadata key by escape": ('{"__metadata__":{"k":"v","\\u006b":"w"},%s}' % entry("a", 1, 0), 1,
                                         "duplicate key 'k'"),
    "metadata last": ('{%s,"__metadata__":{"k":"v"}}' % entry("a", 1, 0), 1, None),
    "metadata between": ('{%s,"__metadata__":{"k":"v"},%s}' % (entry("a", 1, 0), entry("b", 1, 1)), 2, None),
    "metadata nested": ('{"__metadata__":{"k":{"x":"y"}},%s}' % entry("a", 1, 0), 1, "__metadata__"),
    "metadata not strings": ('{"__metadata__":{"k":1},%s}' % entry("a", 1, 0), 1, "__metadata__"),
    "tensor named __metadata__": ('{%s}' % entry("__metadata__", 1, 0), 1, "__metadata__"),
    "tensor named __metadata__ after metadata": ('{"__metadata__":{},%s}' % entry("__metadata__", 1, 0), 1,
                                                 "duplicate key '__metadata__'"),
    "unknown field": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}', 1, "unknown field"),
    "fields in another order": ('{"a":{"shape":[1],"dtype":"U8","data_offsets":[0,1]}}', 1, None),
    "escaped quote in name": ('{%s}' % entry('a\\"b', 1, 0), 1, None),
    "escaped quote looks like a field": ('{"x\\",\\"dtype\\":\\"U8":%s}' % (E % (1, 0, 1)), 1, None),
    "backslash in name": ('{%s}' % entry("a\\\\b", 1, 0), 1, None),
    "lone surrogate name": ('{%s}' % entry("\\ud800", 1, 0), 1, "lone UTF-16 surrogate"),
    "lone surrogate metadata": ('{"__metadata__":{"k":"\\udc00"},%s}' % entry("a", 1, 0), 1, "lone UTF-16 surrogate"),
    "raw control character in name": ('{%s}' % entry("a\tb", 1, 0), 1, "not valid JSON"),
    "spaces": ('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', 1, None),
    "leading zero": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,01]}}', 1, "not valid JSON"),
    "leading zero in shape": ('{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', 1, "not valid JSON"),
    "minus zero": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}}', 1, None),
    "negative": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,1]}}', 1, "data_offsets must be"),
    "float offset": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}', 1, "data_offsets must be"),
    "exponent": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1e0]}}', 1, "data_offsets must be"),
    "bool dim": ('{"a":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', 1, "shape must be"),
    "huge dim": ('{"a":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}}', 0, "shape must be"),
    "twenty digits": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,10000000000000000000]}}', 1, "past the end"),
    "three offsets": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', 1, "data_offsets must be"),
    "unknown dtype": ('{"a":{"dtype":"U9","shape":[1],"data_offsets":[0,1]}}', 1, "unknown dtype"),
    "size mismatch": ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1]}}', 1, "is 4 bytes but"),
    "sub-byte": ('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', 2, "whole number of bytes"),
    "out of file order": ('{%s,%s}' % (entry("b", 1, 1), entry("a", 1, 0)), 2, None),
    "zero sizes at one offset": ('{%s,%s,%s}' % (entry("z", 0, 0), entry("y", 0, 0), entry("a", 1, 0)), 1, None),
    "an end that is not the next begin": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,5]},'
                                          '"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2,
                                          "run past the end"),
    "the last end past the data": ('{%s,"b":{"dtype":"U8","shape":[1],"data_offsets":[1,3]}}' % entry("a", 1, 0), 2,
                                   "past the end"),
    "hole at the start": ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', 2, "hole of 1 bytes"),
    "hole": ('{%s,%s}' % (entry("a", 1, 0), entry("b", 1, 2)), 3, "hole of 1 bytes"),
    "overlap": ('{%s,%s}' % (entry("a", 2, 0), entry("b", 1, 1)), 3, "overlaps"),
    "trailing data": ('{%s}' % entry("a", 1, 0), 2, "after the last tensor"),
    "past the end": ('{%s}' % entry("a", 2, 0), 1, "past the end"),
    "trailing spaces": ('{%s}      ' % entry("a", 1, 0), 1, None),
    "trailing newline and tab": ('{%s}\n\t\r ' % entry("a", 1, 0), 1, None),
    "trailing garbage": ('{%s}x' % entry("a", 1, 0), 1, "not valid JSON"),
    "second object": ('{%s}{%s}' % (entry("a", 1, 0), entry("b", 1, 1)), 2, "not valid JSON"),
    "missing comma": ('{%s%s}' % (entry("a", 1, 0), entry("b", 1, 1)), 2, "not valid JSON"),
    "leading comma": ('{,%s}' % entry("a", 1, 0), 1, "not valid JSON"),
    "trailing comma": ('{%s,}' % entry("a", 1, 0), 1, "not valid JSON"),
    "unclosed": ('{%s' % entry("a", 1, 0), 1, "not valid JSON"),
    "empty": ("{}", 0, None),
    "empty with data": ("{}", 3, "after the last tensor"),
    "metadata only": ('{"__metadata__":{"format":"pt"}}', 0, None),
    "metadata only, unclosed": ('{"__metadata__":{"format":"pt"}', 0, "not valid JSON"),
    "metadata, entries unclosed": ('{"__metadata__":{"format":"pt"},%s' % entry("a", 1, 0), 1, "not valid JSON"),
    "metadata only, with data": ('{"__metadata__":{"format":"pt"}}', 1, "after the last tensor"),
    "metadata with escapes": ('{"__metadata__":{"q\\"k":"v\\\\\\n}","":""},%s}' % entry("a", 1, 0), 1, None),
    "scalar and empty dims": ('{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},'
                              '"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}}', 4, None),
    "non-ASCII names": ('{%s,%s}' % (entry("é中\u2028", 1, 0), entry("\U0001F600", 1, 1)), 2, None),
    # shapes that are no JSON arrays of integers, or integers Python will not convert (over 4,300 digits)
    "shape with an empty dim": ('{"a":{"dtype":"U8","shape":[1,,1],"data_offsets":[0,1]}}', 1, "not valid JSON"),
    "shape of a comma": ('{"a":{"dtype":"U8","shape":[,],"data_offsets":[0,1]}}', 1, "not valid JSON"),
    "shape with a trailing comma": ('{"a":{"dtype":"U8","shape":[1,],"data_offsets":[0,1]}}', 1, "not valid JSON"),
    "shape of 5,000 digits": ('{"a":{"dtype":"U8","shape":[%s],"data_offsets":[0,1]}}' % ("9" * 5000), 1, ""),
}


def test_a_large_metadata_value_is_read_in_bounded_time_and_memory() -> None:
    """A backtracking repeat kept ~130 bytes a character: a 10 MB metadata value took 1.35 GB and 1 s
    (99 MB: 13 GB, 18 s). Measured in a child process, whose peak RSS is its own."""
    import subprocess
    import sys
    code = """
import resource, struct, time
from tiering.content.safetensors_header import parse_header_bytes
raw = ('{"__metadata__":{"k":"' + 'x' * 20_000_000 + '"},'
       '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}').encode()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
parse_header_bytes('h', struct.pack('<Q', len(raw)), raw, 8 + len(raw) + 1)
print(time.monotonic() - t0, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    took, grew_mb = map(float, p.stdout.split())
    assert grew_mb < 400 and took < 10, (took, grew_mb)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_decided_as_the_general_path_does(case: str) -> None:
    text, data_size, expected = HOSTILE[case]
    got = same_both_ways(text.encode(), data_size)
    if expected is None:
        assert isinstance(got, SafetensorsHeader), got
    else:
        assert isinstance(got, str) and expected in got, got


def header_of(p: Path) -> tuple[bytes, int]:
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n], len(raw) - 8 - n


def test_reference_writer_headers_take_the_fast_path(tmp_path: Path) -> None:
    arrays = {"model.layers.0.mlp.experts.0.up_proj.weight": np.ones((8, 8), dtype=np.uint8),
              "s": np.array(1.5, dtype=np.float32), "e": np.zeros((0, 4), dtype=np.float16),
              "é中\u2028": np.arange(3, dtype=np.uint8).reshape(3, 1, 1)}
    p = tmp_path / "ref.safetensors"
    save_file(arrays, str(p), metadata={"format": "np", 'q"': "\\"})
    raw, data_size = header_of(p)
    assert fast_taken(raw, data_size)
    hdr = read_header(p)
    assert hdr == outcome(raw, data_size, general=True)
    assert {t.name: t.shape for t in hdr.tensors} == {k: v.shape for k, v in arrays.items()}
    assert hdr.metadata == {"format": "np", 'q"': "\\"}


def test_sample_writer_headers_take_the_fast_path(tmp_path: Path) -> None:
    ts = [SampleTensor("model.layers.0.mlp.experts.0.up_proj.weight", "F8_E4M3", (8, 8)),
          SampleTensor("s", "F32", ()), SampleTensor("e", "BF16", (0, 4)), SampleTensor("x.y", "U8", (3, 1, 1))]
    p = tmp_path / "x.safetensors"
    write_safetensors(p, ts, lambda t: fill_bytes(t.name, t.nbytes))
    raw, data_size = header_of(p)
    assert fast_taken(raw, data_size)
    hdr = read_header(p)
    assert hdr == outcome(raw, data_size, general=True)
    assert [(t.name, t.dtype, t.shape) for t in hdr.tensors] == [(t.name, t.dtype, t.shape) for t in ts]


def test_the_duplicate_cases_really_reach_the_fast_parser() -> None:
    """The compact duplicates are in the fast path's form: it must be the one refusing them."""
    for case in ("duplicate tensor name", "tensor named __metadata__ after metadata", "duplicate metadata key"):
        text, data_size, _ = HOSTILE[case]
        assert not fast_taken(text.encode(), data_size), case
    text, data_size, _ = HOSTILE["duplicate tensor name"]
    body = "," + text[1:-1]
    assert len(sh._ENTRY.findall(body)) == 2   # (both entries matched: refused for the repeated name)


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
tensors = st.lists(st.tuples(names, st.sampled_from(sorted(DTYPE_BITS)), st.lists(st.integers(0, 3), max_size=3)),
                   max_size=5)


def compact(ts: list, meta: "dict | None") -> tuple[bytes, int]:
    header: dict = {} if meta is None else {"__metadata__": meta}
    off = 0
    for name, dtype, shape in ts:
        bits = DTYPE_BITS[dtype]
        for d in shape:
            bits *= d
        size = -(-bits // 8)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode(), off


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors, st.none() | st.dictionaries(names, names, max_size=3), st.data())
def test_mutated_compact_headers_decided_as_the_general_path_does(ts: list, meta: "dict | None",
                                                                  data: st.DataObject) -> None:
    raw, size = compact(ts, meta)
    same_both_ways(raw, size)
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        if not buf:
            break
        pos = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert", "repeat"]))
        if op == "flip":
            buf[pos] = data.draw(st.sampled_from(b'{}[]",:0123456789-e.\\ aU_'))
        elif op == "delete":
            del buf[pos]
        elif op == "insert":
            buf.insert(pos, data.draw(st.sampled_from(b'{}[]",:0123456789-e.\\ aU_')))
        else:   # a stretch repeated: duplicate entries, fields and keys
            end = data.draw(st.integers(pos, min(len(buf), pos + 80)))
            buf[pos:pos] = buf[pos:end]
    try:
        bytes(buf).decode()
    except UnicodeDecodeError:
        return
    same_both_ways(bytes(buf), size + data.draw(st.integers(-1, 1)) if size else size)
