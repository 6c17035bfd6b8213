"""The one-pass verified copy (issue 35): every byte read once, hashed (the manifest's xxh3-128 parts
and, for a signature, the file's SHA-256) from the buffer it is written from, written once; a part
that differs stops the copy at that part; a source that changes is caught; a hung read does not
hold the caller."""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering import verified_copy as copy_mod
from tiering.content.build import build_manifest
from tiering.content.partcheck import PartCheck
from tiering.content.manifest import FileEntry, SafetensorsInfo, tree_hash
from tiering.content.tensor_table import TensorEntry
from tiering.copy import PROGRESS_CHUNK, CopyJob, stuck_reads
from tiering.errors import ChecksumMismatch, FileChanged, TimedOut
from tiering.sample import make_checkpoint
from tiering.verified_copy import IN_MEMORY_MAX, STREAM_BUFFER, copy_verified

MiB = 1 << 20


def entry_for(data: bytes, ranges: list[tuple[int, int]], path: str = "f.safetensors") -> FileEntry:
    """A safetensors-shaped entry whose parts are ``ranges`` (in the order given: a header may list its
    tensors in any order, and leave bytes between them) with their true digests."""
    (h0, h1), rest = ranges[0], ranges[1:]
    tensors = tuple(TensorEntry(f"t{i}", "U8", (e - b,), b, e, xxhash.xxh3_128_hexdigest(data[b:e]))
                    for i, (b, e) in enumerate(rest))
    head = xxhash.xxh3_128_hexdigest(data[h0:h1])
    return FileEntry(path, len(data), 0o644, tree_hash([head] + [t.xxh3_128 for t in tensors]), (),
                     SafetensorsInfo(h1 - h0, head, {}, tensors))


@st.composite
def layouts(draw):
    """File bytes, a header at 0, non-overlapping tensors with gaps between some of them (listed in a
    shuffled order), and a way of cutting the file into chunks."""
    size = draw(st.integers(1, 5000))
    data = random.Random(draw(st.integers(0, 2**32))).randbytes(size)
    cuts = sorted(set(draw(st.lists(st.integers(1, size), max_size=12))) | {size})
    header = draw(st.integers(1, cuts[0]))
    ranges, begin = [(0, header)], header
    for c in cuts:
        if c <= begin:
            continue
        gap = draw(st.integers(0, (c - begin) // 2))
        ranges.append((begin + gap, c))
        begin = c
    order = draw(st.permutations(ranges[1:]))
    chunks = draw(st.lists(st.integers(1, 700), min_size=1, max_size=40))
    return data, [ranges[0], *order], chunks


@settings(max_examples=200, deadline=None)
@given(layouts(), st.data())
def test_parts_checked_whatever_the_chunking_and_order(layout, data) -> None:
    raw, ranges, sizes = layout
    e = entry_for(raw, ranges)
    check = PartCheck("f", e, 1 << 20, hashlib.sha256)
    off, i = 0, 0
    while off < len(raw):
        n = sizes[i % len(sizes)]
        check.update(memoryview(raw)[off:off + n], off)
        off += min(n, len(raw) - off)
        i += 1
    assert check.finish() == hashlib.sha256(raw).hexdigest()
    # one byte changed inside a part: that part fails, named, by the time its last byte is fed
    covered = [(b, e_) for b, e_ in ranges if e_ > b]
    b, end = data.draw(st.sampled_from(covered))
    at = data.draw(st.integers(b, end - 1))
    bad = bytearray(raw)
    bad[at] ^= 0x5A
    check = PartCheck("f", e, 1 << 20)
    label = "header" if (b, end) == ranges[0] else f"tensor 't{ranges[1:].index((b, end))}'"
    with pytest.raises(ChecksumMismatch) as exc:
        off = 0
        while off < len(bad):
            n = sizes[0]
            check.update(memoryview(bytes(bad))[off:off + n], off)
            off += min(n, len(bad) - off)
            assert off < end, "the bad part was fed whole without failing"
        check.finish()
    assert exc.value.part == label


def test_bytes_out_of_order_are_refused() -> None:
    raw = os.urandom(100)
    check = PartCheck("f", entry_for(raw, [(0, 10), (10, 100)]), 1 << 20)
    check.update(raw[:40], 0)
    with pytest.raises(ValueError, match="out of order"):
        check.update(raw[50:], 50)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, FileEntry]:
    """One real safetensors shard of ~96 MiB (above IN_MEMORY_MAX: it streams) and its manifest entry."""
    d = make_checkpoint(tmp_path_factory.mktemp("big") / "src", total_bytes=96 * MiB, shards=1, layers=4, seed="big")
    m = build_manifest(d)
    e = max(m.files, key=lambda f: f.size)
    assert e.size > IN_MEMORY_MAX
    return d / e.path, e


def test_a_large_file_streams_checked_with_its_digest(big, tmp_path: Path) -> None:
    src, e = big
    seen: list[int] = []
    out = copy_verified([(CopyJob(str(src), str(tmp_path / "d" / e.path), e.size, 0o640), e)], 1 << 20,
                        crypto=hashlib.sha256, progress=seen.append)
    data = src.read_bytes()
    assert (tmp_path / "d" / e.path).read_bytes() == data
    assert (tmp_path / "d" / e.path).stat().st_mode & 0o777 == 0o640
    assert out == {e.path: hashlib.sha256(data).hexdigest()}
    # bytes reported as they move, every few MiB
    step = PROGRESS_CHUNK + STREAM_BUFFER
    assert sum(seen) == e.size and len(seen) >= e.size // step and max(seen) <= step


def test_a_bad_part_stops_the_copy_there(big, tmp_path: Path) -> None:
    """A byte changed in the first tensor: ChecksumMismatch naming it, and the copy stopped there
    (what was written is at most the read-ahead past that tensor, not the file)."""
    src, e = big
    bad = tmp_path / "bad.safetensors"
    data = bytearray(src.read_bytes())
    t = e.safetensors.tensors[0]
    data[t.begin + 5] ^= 1
    bad.write_bytes(data)
    dst = tmp_path / "d" / "x"
    with pytest.raises(ChecksumMismatch) as exc:
        copy_verified([(CopyJob(str(bad), str(dst), e.size, 0o644), e)], 1 << 20, preallocate=False)
    assert exc.value.part == f"tensor {t.name!r}"
    assert dst.stat().st_size <= t.end + STREAM_BUFFER < e.size


@pytest.mark.parametrize("how", ["shorter", "longer", "shrinks"])
@pytest.mark.parametrize("large", [True, False], ids=["streamed", "inline"])
def test_a_source_that_is_not_its_manifest_size_is_file_changed(big, tmp_path: Path, how: str, large: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    src, e = big
    if not large:
        monkeypatch.setattr(copy_mod, "IN_MEMORY_MAX", e.size)
    f = tmp_path / "s"
    data = src.read_bytes()
    f.write_bytes(data[:-1000] if how == "shorter" else data + b"x" * 10 if how == "longer" else data)
    progress = None
    if how == "shrinks":   # cut short by another writer while it is copied
        def progress(_n: int) -> None:
            if os.stat(f).st_size == e.size:
                os.truncate(f, e.size // 2)
    with pytest.raises(FileChanged):
        copy_verified([(CopyJob(str(f), str(tmp_path / "d"), e.size, 0o644), e)], 1 << 20, progress=progress)


def test_many_files_at_once_and_small_ones_inline(tmp_path: Path) -> None:
    """Several shards streamed two at a time beside small files, all checked; the digests by path."""
    d = make_checkpoint(tmp_path / "src", total_bytes=200 * MiB, shards=2, layers=4, seed="two")
    m = build_manifest(d)
    assert sum(f.size > IN_MEMORY_MAX for f in m.files) == 2 and any(f.size < MiB for f in m.files)
    jobs = [(CopyJob(str(d / f.path), str(tmp_path / "out" / f.path), f.size, f.mode), f) for f in m.files]
    out = copy_verified(jobs, m.chunk_size, threads=2, crypto=hashlib.sha256)
    for f in m.files:
        data = (d / f.path).read_bytes()
        assert (tmp_path / "out" / f.path).read_bytes() == data
        assert out[f.path] == hashlib.sha256(data).hexdigest()


def test_a_hung_read_does_not_hold_the_caller(big, tmp_path: Path) -> None:
    """A large file on a real FUSE server whose reads never return (tests/fuse_hang.py): TimedOut by
    the deadline, the stuck reader counted (stuck_reads) until the read returns, then no longer."""
    pytest.importorskip("fuse", reason="fusepy missing (make tools)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    from .test_trust import HungCold
    src, e = big
    exported = tmp_path / "exported" / "hang"
    exported.mkdir(parents=True)
    os.link(src, exported / "model.safetensors")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fs = HungCold(tmp_path / "exported", mnt, tmp_path / "fuse.log", "hang/")
    try:
        before = stuck_reads()[0]
        t0 = time.monotonic()
        with pytest.raises(TimedOut):
            copy_verified([(CopyJob(str(mnt / "hang/model.safetensors"), str(tmp_path / "d"), e.size, 0o644), e)],
                          1 << 20, deadline=time.monotonic() + 0.5)
        assert time.monotonic() - t0 < 5
        assert stuck_reads()[0] >= before + 1
    finally:
        fs.release()
    deadline = time.monotonic() + 10
    while stuck_reads()[0] > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stuck_reads()[0] == before
