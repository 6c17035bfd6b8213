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


# -- publish: each small file hashed from the bytes it is written from --------------------------------

def test_a_published_cache_s_manifest_is_what_reading_the_copy_back_gives(isolated_env, node_env, tmp_path: Path) -> None:
    import subprocess
    import sys
    from tiering.content.manifest_parse import parse_manifest
    src = cache(tmp_path / "src")
    (src / "empty.bin").write_bytes(b"")
    r = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--no-daemon", "publish",
                        src, "--name", "org/cache", "--version", "v1"], env=isolated_env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    published = node_env.cold / "org/cache/v1"
    m = parse_manifest((published / ".weightd/manifest.json").read_bytes(), "test")
    again = build_manifest(published)   # (every file read back and hashed)
    assert m.digest == again.digest and len(m.files) == 301


def test_build_manifest_takes_a_known_digest_only_for_the_very_file_hashed(tmp_path: Path) -> None:
    """A staged file rewritten after its bytes were hashed (another inode, or another size or time) is
    read back: the manifest says what is there, never what was hashed."""
    import xxhash
    from tiering.content.scan import scan_checkpoint as scan
    d = tmp_path / "staged"
    d.mkdir()
    (d / "a").write_bytes(b"old bytes")
    st = os.stat(d / "a")
    known = {"a": (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                   xxhash.xxh3_128_hexdigest(b"old bytes"))}
    assert build_manifest(d, known=known).digest == build_manifest(d).digest
    (d / "a").write_bytes(b"new bytes")             # same size, same inode, a later time
    os.utime(d / "a", ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    m = build_manifest(d, files=scan(d), known=known)
    assert m.files[0].chunks == (xxhash.xxh3_128_hexdigest(b"new bytes"),)
    # rewritten in place with its modification time set back (utimensat): only the change time, which
    # no one can set back, tells (a red-team finding: the digest of the old bytes was taken)
    (d / "a").write_bytes(b"old bytes")
    st = os.stat(d / "a")
    known = {"a": (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                   xxhash.xxh3_128_hexdigest(b"old bytes"))}
    with open(d / "a", "r+b") as f:
        f.write(b"EVIL")
    os.utime(d / "a", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(d / "a").st_mtime_ns == st.st_mtime_ns and os.stat(d / "a").st_ctime_ns != st.st_ctime_ns
    assert build_manifest(d, known=known).files[0].chunks == (xxhash.xxh3_128_hexdigest(b"EVILbytes"),)
    (d / "b").write_bytes(b"old bytes")             # another inode, same bytes as hashed
    os.replace(d / "b", d / "a")
    os.utime(d / "a", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert build_manifest(d, known=known).files[0].chunks == (xxhash.xxh3_128_hexdigest(b"old bytes"),)
    # ... and a fake digest is never taken for another inode
    fake = {"a": (*known["a"][:5], "0" * 32)}
    assert build_manifest(d, known=fake).files[0].chunks == (xxhash.xxh3_128_hexdigest(b"old bytes"),)


def test_a_source_file_changed_during_publish_is_caught(node_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of the cache rewritten after it was copied (and hashed): FileChanged, nothing published."""
    from tiering import copy_many
    from tiering.copy import CopyJob as Job
    src = cache(tmp_path / "src")
    real = copy_many._copy_hashed
    victim = src / "rank_0/05/c0101.py"

    def copy_then_touch(job: Job, key: str, hashed: dict, progress) -> None:
        real(job, key, hashed, progress)
        if key.endswith("c0101.py"):
            victim.write_bytes(b"changed" + victim.read_bytes()[7:])
            os.utime(victim, ns=(0, victim.stat().st_mtime_ns + 10_000_000))
    monkeypatch.setattr(copy_many, "_copy_hashed", copy_then_touch)
    with node_env.node() as n:
        with pytest.raises(FileChanged):
            n.publish(src, "org/c", "v1")
    assert not (node_env.cold / "org/c/v1").exists()


def test_many_small_files_are_published_durably_by_one_syncfs(isolated_env, node_env, tmp_path: Path) -> None:
    """Publishing more than 256 small files: one syncfs of cold storage before the rename, every
    staged directory fsynced before it, NAME/ after it; not an fsync a file."""
    from .test_durability import commit_index, fs_synced, traced
    src = cache(tmp_path / "src")
    r, calls = traced(isolated_env, node_env.config, tmp_path / "publish.strace",
                      "publish", src, "--name", "org/cache", "--version", "v1")
    assert r.returncode == 0, r.stderr
    i = commit_index(calls, node_env.cold / "org/cache", "v1")
    assert fs_synced(calls, i, node_env.cold), calls[:i]
    assert len([p for c, _, p in calls[:i] if c == "fsync" and p and p[0].endswith(".py")]) == 0
    staged_dirs = {p[0].split("/.staging/", 1)[1].partition("/")[2] for c, _, p in calls[:i]
                   if c == "fsync" and p and "/.staging/" in p[0]}
    assert {"", "rank_0", *(f"rank_0/{k:02x}" for k in range(16))} <= staged_dirs, staged_dirs
    assert any(c == "fsync" and p == [str(node_env.cold / "org/cache")] for c, _, p in calls[i + 1:])
