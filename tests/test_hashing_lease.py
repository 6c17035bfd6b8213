"""The mmap fast path runs only under a read lease: same hashes as pread, and no SIGBUS on truncate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import xxhash

from tiering import build_manifest
from tiering.content import hashing
from tiering.content.hashing import HashJob, hash_files, lease_intact, open_for_read, take_read_lease
from tiering.sample import make_checkpoint

ROOT = Path(__file__).resolve().parent.parent


def test_mmap_and_pread_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = make_checkpoint(tmp_path / "big", total_bytes=96 << 20, shards=2, layers=2)
    assert max(t.nbytes for _, t in build_manifest(ckpt).tensors()) >= hashing.MMAP_MIN_PART
    if not hashing._leases_usable():
        pytest.fail("read leases are not usable here (fs.leases-enable? lease-break-time?): the mmap path cannot run")
    maps: list[int] = []
    real_mmap = hashing.mmap.mmap

    def counted(*args, **kwargs):  # (the real mmap, counted: proves the mapped path is what hashed)
        maps.append(args[1])
        return real_mmap(*args, **kwargs)
    monkeypatch.setattr(hashing.mmap, "mmap", counted)
    mapped = build_manifest(ckpt)
    assert maps and sum(maps) >= hashing.MMAP_MIN_PART, "the first manifest was not hashed through mmap"
    monkeypatch.setattr(hashing, "_lease_ok", False)
    n = len(maps)
    assert build_manifest(ckpt) == mapped
    assert len(maps) == n, "pread was forced, yet mmap ran"


def test_lease_is_taken_and_refused_for_open_writers(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 4096)
    fd = open_for_read(str(p))
    try:
        if not take_read_lease(fd):
            pytest.skip("file system without leases")
        assert lease_intact(fd)
    finally:
        os.close(fd)
    with open(p, "r+b"):  # a writer holds the file open: no read lease, so no mapping
        fd = open_for_read(str(p))
        try:
            assert not take_read_lease(fd)
        finally:
            os.close(fd)


CHILD = textwrap.dedent("""
    import subprocess, sys, time
    sys.path.insert(0, sys.argv[2])
    from tiering.content import hashing
    from tiering.errors import FileChanged
    path, size = sys.argv[1], int(sys.argv[3])
    hashing.PROGRESS_EVERY = hashing.MMAP_WINDOW
    import mmap as mmap_mod
    real_mmap, maps = mmap_mod.mmap, []
    def counted(*a, **k):  # the real mmap, counted
        maps.append(1)
        return real_mmap(*a, **k)
    mmap_mod.mmap = counted
    started, seen = [], []
    def progress(n):
        seen.append(len(maps))
        if not started:  # after the first mapped window: truncate the file from another process
            started.append(subprocess.Popen(  # truncate(2) blocks on the lease (coreutils' O_NONBLOCK open would not)
                [sys.executable, "-c", "import os, sys; os.truncate(sys.argv[1], 0)", path]))
            time.sleep(1.0)  # the truncate is now blocked on our lease
        elif len(seen) >= 2 and seen[-1] == seen[-2] and started[0].poll() is None:
            # mapping stopped (the lease was given up) and pread goes on: let the truncate land first,
            # so the read that follows meets the shorter file
            started[0].wait(timeout=20)
    try:
        hashing.hash_files([hashing.HashJob(path, [(0, size)], size)], threads=1, progress=progress)
        result = "consistent"
    except FileChanged:  # (the read meeting the end, or the size checked after it: either names the change)
        result = "changed"
    rc = started[0].wait(timeout=20)
    print(result, rc, hashing._lease_ok, seen[0] if seen else 0)
""")


def test_truncate_during_mapped_hash_is_not_a_sigbus(tmp_path: Path) -> None:
    p = tmp_path / "victim"
    size = 160 << 20
    with open(p, "wb") as fh:
        for _ in range(size >> 20):
            fh.write(os.urandom(1 << 20))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(p), str(ROOT), str(size)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != -signal.SIGBUS, "hashing was killed by SIGBUS"
    assert proc.returncode == 0, proc.stderr
    result, truncate_rc, leases, maps_first = proc.stdout.split()
    assert leases == "True", "read leases are not usable here: the mapped path this test is about cannot run"
    assert int(maps_first) >= 1, "the first window was not mapped: the pread path ran, not the mapped one"
    # the lease was given up, the truncate went through, and the read after it saw the file end
    assert (result, truncate_rc) == ("changed", "0"), proc.stdout
    assert p.stat().st_size == 0  # the writer was let through once the lease was dropped


def test_pread_fallback_when_caller_expects_more(tmp_path: Path) -> None:
    p = tmp_path / "f"
    data = os.urandom(8 << 20)
    p.write_bytes(data)
    assert hash_files([HashJob(str(p), [(0, len(data))], len(data))])[0][0] == xxhash.xxh3_128(data).hexdigest()
