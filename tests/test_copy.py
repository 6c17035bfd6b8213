"""The copy engine: kernel copies with fallbacks, modes kept, short sources detected."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tiering import copy as copy_mod
from tiering.copy import CopyJob, copy_file
from tiering.copy_many import copy_files
from tiering.errors import FileChanged


@pytest.fixture
def shm_dir():
    d = Path(f"/dev/shm/weightd-test-copy-{uuid.uuid4().hex[:8]}")
    d.mkdir()
    try:
        yield d
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def test_same_fs_and_cross_fs(tmp_path: Path, shm_dir: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(3 * (1 << 20) + 123)
    src.write_bytes(data)
    os.chmod(src, 0o640)
    same = copy_file(CopyJob(str(src), str(tmp_path / "same.bin"), len(data), 0o640))
    cross = copy_file(CopyJob(str(src), str(shm_dir / "cross.bin"), len(data), 0o640))
    assert same in ("copy_file_range", "sendfile") and cross in ("copy_file_range", "sendfile")
    for p in (tmp_path / "same.bin", shm_dir / "cross.bin"):
        assert p.read_bytes() == data and p.stat().st_mode & 0o777 == 0o640


def test_read_write_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def refuse(*a, **k):
        raise OSError(errno.EINVAL, "not here")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    monkeypatch.setattr(os, "sendfile", refuse)
    src = tmp_path / "s"
    data = os.urandom(2_500_000)
    src.write_bytes(data)
    assert copy_file(CopyJob(str(src), str(tmp_path / "d"), len(data), 0o644)) == "readwrite"
    assert (tmp_path / "d").read_bytes() == data


def test_source_shorter_than_expected(tmp_path: Path) -> None:
    src = tmp_path / "s"
    src.write_bytes(b"x" * 1000)
    with pytest.raises(FileChanged):
        copy_file(CopyJob(str(src), str(tmp_path / "d"), 2000, 0o644))


def test_many_files_in_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copy_mod, "CHUNK", 1 << 20)
    jobs = []
    for i in range(6):
        p = tmp_path / f"s{i}"
        p.write_bytes(os.urandom((i + 1) * 300_000))
        jobs.append(CopyJob(str(p), str(tmp_path / "out" / "sub" / f"d{i}"), p.stat().st_size, 0o600))
    done = []
    copy_files(jobs, threads=3, progress=done.append)
    assert sum(done) == sum(j.size for j in jobs)
    for j in jobs:
        assert Path(j.dst).read_bytes() == Path(j.src).read_bytes()
