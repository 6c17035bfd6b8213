"""The mmap fast path hashes only files wholly in the page cache: a file that is not is read with pread
(mapping it where the page cache is smaller than the file re-reads pages from the device)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from tiering._syscalls import cachestat, has_cachestat
from tiering.content import hashing
from tiering.content.hashing import HashJob, hash_files


def _file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())   # (clean pages: DONTNEED drops them)
    return data


def _cached_pages(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return cachestat(fd, 0, 0) or 0
    finally:
        os.close(fd)


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def counted_maps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    if not has_cachestat():
        pytest.skip("kernel without cachestat(2): every leased file is mapped")
    if not hashing._leases_usable():
        pytest.fail("read leases are not usable here: the mmap path cannot run")
    maps: list[int] = []
    real_mmap = hashing.mmap.mmap

    def counted(*args, **kwargs):   # (the real mmap, counted)
        maps.append(args[1])
        return real_mmap(*args, **kwargs)
    monkeypatch.setattr(hashing.mmap, "mmap", counted)
    return maps


def test_a_file_out_of_the_page_cache_is_read_not_mapped(tmp_path: Path, counted_maps: list[int]) -> None:
    size = 3 * hashing.MMAP_WINDOW + 12345
    p = tmp_path / "shard"
    data = _file(p, size)
    _drop(p)
    if _cached_pages(p) > 0:
        pytest.skip("the file system kept the pages (tmpfs?): cannot take a file out of the page cache")
    ranges = [(0, hashing.MMAP_MIN_PART + 1), (hashing.MMAP_MIN_PART + 1, size)]
    got = hash_files([HashJob(str(p), ranges, size)], threads=1)
    assert got == [[xxhash.xxh3_128(data[b:e]).hexdigest() for b, e in ranges]]
    assert counted_maps == [], "a file not in the page cache was mapped"

    # now wholly resident (the read above brought it in, or read it again): mapped, same hashes
    with open(p, "rb") as fh:
        while fh.read(1 << 20):
            pass
    assert hash_files([HashJob(str(p), ranges, size)], threads=1) == got
    assert sum(counted_maps) >= size - hashing.MMAP_MIN_PART, "a resident file was not hashed through mmap"


def test_a_partly_resident_file_is_read_whole(tmp_path: Path, counted_maps: list[int]) -> None:
    size = 2 * hashing.MMAP_WINDOW
    p = tmp_path / "shard"
    data = _file(p, size)
    fd = os.open(p, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, size // 2, 0, os.POSIX_FADV_DONTNEED)   # the second half out
    finally:
        os.close(fd)
    if _cached_pages(p) >= size // 4096:
        pytest.skip("the file system kept the pages (tmpfs?)")
    assert hash_files([HashJob(str(p), [(0, size)], size)], threads=1) == [[xxhash.xxh3_128(data).hexdigest()]]
    assert counted_maps == []
