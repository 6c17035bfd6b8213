"""Many small files (a compile cache) copied, checked and committed on their fast paths (issue 35):
each file's parent opened once and the file opened by name beneath it (``open_file_at``,
``create_file_at``), a file that is one part checked without its list of parts (``_OnePart``), the
staged tree's directories fsynced from the listing's types (``fsync_dirs``). Every guarantee of the
slow paths holds on them: a byte that differs, a file that changed size, a symlink or FIFO planted
in a tier, a '..' name are caught or refused, and what was published is durable before it is
visible."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tiering.content.build import build_manifest
from tiering.content.scan import Parents, create_file_at, open_file_at, scan_checkpoint
from tiering.copy import CopyJob
from tiering.errors import ChecksumMismatch, FileChanged, UnsafePath
from tiering.safefs import Dir, FileRef
from tiering.store.staging import fsync_dirs
from tiering.verified_copy import copy_verified


def open_dir(p: Path) -> Dir:
    return Dir(os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), p)


def cache(root: Path, n: int = 300) -> Path:
    """``n`` small files (more than SMALL_FILES) in 16 directories two levels down."""
    for i in range(n):
        p = root / f"rank_0/{i % 16:02x}/c{i:04d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(100 + i))
    return root


def jobs_for(src: Path, out: Path):
    m = build_manifest(src)
    out.mkdir()
    s, d = open_dir(src), open_dir(out)
    return m, s, d, [(CopyJob(FileRef(s, f.path), FileRef(d, f.path), f.size, f.mode), f) for f in m.files]


def test_many_small_files_are_copied_checked_and_named_as_before(tmp_path: Path) -> None:
    m, s, d, jobs = jobs_for(cache(tmp_path / "src"), tmp_path / "out")
    with s, d:
        copy_verified(jobs, m.chunk_size, fsync=False)
    for f in m.files:
        assert (tmp_path / "out" / f.path).read_bytes() == (tmp_path / "src" / f.path).read_bytes()
        assert stat.S_IMODE((tmp_path / "out" / f.path).stat().st_mode) == f.mode & 0o755 | 0o400


@pytest.mark.parametrize("how", ["flip", "longer", "shorter"])
def test_a_small_file_changed_after_its_manifest_is_caught(tmp_path: Path, how: str) -> None:
    """One of 300 one-part files differs from its entry (a byte flipped, a byte more, a byte less):
    ChecksumMismatch naming the file and its part, or FileChanged; never a silent copy."""
    src = cache(tmp_path / "src")
    m, s, d, jobs = jobs_for(src, tmp_path / "out")
    victim = src / m.files[123].path
    data = bytearray(victim.read_bytes())
    if how == "flip":
        data[7] ^= 1
    elif how == "longer":
        data += b"x"
    else:
        del data[-1]
    victim.write_bytes(bytes(data))
    with s, d:
        with pytest.raises((ChecksumMismatch, FileChanged)) as exc:
            copy_verified(jobs, m.chunk_size, fsync=False)
    assert m.files[123].path in str(exc.value)
    if how == "flip":
        assert isinstance(exc.value, ChecksumMismatch) and exc.value.part.startswith("chunk 0 ")
    else:
        assert isinstance(exc.value, FileChanged)


def test_a_tree_hash_that_does_not_match_its_one_part_is_caught(tmp_path: Path) -> None:
    """A manifest entry whose part is right but whose file hash is not (an edited manifest)."""
    import dataclasses
    m, s, d, jobs = jobs_for(cache(tmp_path / "src"), tmp_path / "out")
    j, e = jobs[5]
    jobs[5] = (j, dataclasses.replace(e, xxh3_128="0" * 32))
    with s, d:
        with pytest.raises(ChecksumMismatch) as exc:
            copy_verified(jobs, m.chunk_size, fsync=False)
    assert exc.value.part == "file" and exc.value.path.endswith(e.path)


def test_a_symlink_planted_for_a_source_directory_or_file_is_never_followed(tmp_path: Path) -> None:
    src = cache(tmp_path / "src")
    m, s, d, jobs = jobs_for(src, tmp_path / "out")
    outside = tmp_path / "outside"
    outside.mkdir()
    # a file swapped for a symlink to a file with the very same bytes: refused all the same
    victim = src / m.files[0].path
    (outside / "same").write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(outside / "same")
    with s, d:
        with pytest.raises(UnsafePath):
            copy_verified(jobs, m.chunk_size, fsync=False)
    # a directory swapped for a symlink to a copy of it
    m, s, d, jobs = jobs_for(cache(tmp_path / "src2"), tmp_path / "out2")
    sub = tmp_path / "src2/rank_0/03"
    sub.rename(outside / "03")
    sub.symlink_to(outside / "03")
    with s, d:
        with pytest.raises(UnsafePath):
            copy_verified(jobs, m.chunk_size, fsync=False)


def test_open_file_at_and_create_file_at_refuse_what_is_not_one_plain_name(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "sub").mkdir()
    with open_dir(tmp_path / "sub") as d:
        for bad in ("..", ".", "", "a/b", "../f"):
            with pytest.raises(UnsafePath):
                open_file_at(d, bad)
            with pytest.raises(UnsafePath):
                create_file_at(d, bad)
    with open_dir(tmp_path) as d:
        fd, st = open_file_at(d, "f")
        os.close(fd)
        assert st.st_size == 3
        for bad in ("link", "fifo", "sub"):     # a symlink, a FIFO (never waited on), a directory
            with pytest.raises(UnsafePath):
                open_file_at(d, bad)
        with pytest.raises(FileNotFoundError):
            open_file_at(d, "missing")
        for existing in ("f", "link"):          # never an existing file, never through a symlink
            with pytest.raises((FileExistsError, UnsafePath)):
                create_file_at(d, existing)
        assert (tmp_path / "f").read_bytes() == b"abc"


def test_parents_opens_each_directory_once_and_makes_missing_ones(tmp_path: Path) -> None:
    with open_dir(tmp_path) as top, Parents(create=True) as made:
        a, name = made.split(FileRef(top, "x/y/z.bin"))
        b, _ = made.split(FileRef(top, "x/y/w.bin"))
        assert a is b and name == "z.bin" and (tmp_path / "x/y").is_dir()
        assert made.split(FileRef(top, "top.bin")) == (top, "top.bin")
    (tmp_path / "real").mkdir()
    (tmp_path / "planted").symlink_to(tmp_path / "real")
    with open_dir(tmp_path) as top, Parents() as opened:
        with pytest.raises(UnsafePath):
            opened.split(FileRef(top, "planted/f"))


def test_fsync_dirs_fsyncs_every_directory_once_and_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = cache(tmp_path / "src", 40)
    (src / "rank_0/00/deeper").mkdir()
    (src / "rank_0/link").symlink_to(tmp_path)           # a symlink is not entered
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", spy)
    with open_dir(src) as d:
        fsync_dirs(d)
    dirs = sorted(str(p) for p in [src, *src.rglob("*")] if p.is_dir() and not p.is_symlink())
    assert sorted(synced) == dirs
    assert synced[-1] == str(src)   # the top last: every directory beneath it first


def test_scan_names_with_control_characters_are_still_refused(tmp_path: Path) -> None:
    for bad in ("a\x1bb", "tab\there", "c1\x9b"):
        d = tmp_path / f"d{len(bad)}{ord(bad[1])}"
        d.mkdir()
        (d / bad).write_bytes(b"x")
        with pytest.raises(UnsafePath):
            scan_checkpoint(d)
    ok = tmp_path / "ok"
    ok.mkdir()
    (ok / "é ü.py").write_bytes(b"x")
    assert [f.relpath for f in scan_checkpoint(ok)] == ["é ü.py"]
