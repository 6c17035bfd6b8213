"""Publish's copy of many small files (tiering/copy_many.py, issue 35): nine system calls a file, two
threads, the destination directories made without an fsync each (one syncfs ends the copy). What the
slower path guaranteed holds: a source is read only if it is still the regular file that was scanned,
at its scanned size; no symlink is followed on either side; every copy has its sanitised mode
whatever the umask, and the digest kept for it is of its bytes, with the identity the manifest's
builder checks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import xxhash

from tiering.content.build import build_manifest
from tiering.content.scan import scan_checkpoint
from tiering.copy import CopyJob
from tiering.copy_many import MadeDirs, copy_files
from tiering.errors import FileChanged, UnsafePath
from tiering.safefs import FileRef, sanitize_mode

from .test_small_files import open_dir


def cache(root: Path, n: int = 300) -> Path:
    """``n`` small files (more than SMALL_FILES) in 16 directories two levels down, of several modes."""
    for i in range(n):
        p = root / f"rank_0/{i % 16:02x}/c{i:04d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(100 + i))
        p.chmod((0o644, 0o755, 0o666, 0o600)[i % 4])
    return root


def publish_copy(src: Path, out: Path, *, threads: int = 2) -> tuple[list, dict]:
    """What Publisher._stage does: scan, copy with ``hashed``; returns the scan and the hashes."""
    files = scan_checkpoint(src)
    out.mkdir()
    hashed: dict = {}
    with open_dir(out) as d:
        copy_files([CopyJob(f.path, FileRef(d, f.relpath), f.size, f.mode) for f in files], threads=threads,
                   preallocate=False, hashed=hashed)
    return files, hashed


@pytest.mark.parametrize("threads", [1, 2])
def test_copies_are_byte_equal_with_sanitised_modes_and_their_digests(tmp_path: Path, threads: int) -> None:
    src = cache(tmp_path / "src")
    files, hashed = publish_copy(src, tmp_path / "out", threads=threads)
    assert len(hashed) == len(files) == 300
    for f in files:
        out = tmp_path / "out" / f.relpath
        data = out.read_bytes()
        assert data == (src / f.relpath).read_bytes()
        st = out.stat()
        assert stat.S_IMODE(st.st_mode) == sanitize_mode(f.mode)
        assert hashed[f.relpath] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                                     xxhash.xxh3_128_hexdigest(data))
    # the manifest built from the copies with those digests is the one reading them back gives
    staged = scan_checkpoint(tmp_path / "out")
    assert build_manifest(tmp_path / "out", files=staged, known=hashed).digest == build_manifest(tmp_path / "out").digest


def test_a_restrictive_umask_still_gives_every_copy_its_mode(tmp_path: Path) -> None:
    """The copies are made with their final mode; where the umask takes bits away, they are set
    back (and the identity kept is the one after that, so the manifest still takes the digest)."""
    src = cache(tmp_path / "src", n=260)
    old = os.umask(0o077)
    try:
        files, hashed = publish_copy(src, tmp_path / "out")
    finally:
        os.umask(old)
    modes = set()
    for f in files:
        st = (tmp_path / "out" / f.relpath).stat()
        assert stat.S_IMODE(st.st_mode) == sanitize_mode(f.mode)
        assert hashed[f.relpath][:5] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        modes.add(stat.S_IMODE(st.st_mode))
    assert modes == {0o644, 0o755, 0o600}
    assert stat.S_IMODE((tmp_path / "out/rank_0/03").stat().st_mode) == 0o700   # (a directory: umask applies)


@pytest.mark.parametrize("how", ["other inode", "symlink", "fifo", "longer", "shorter"])
def test_a_source_that_is_no_longer_the_scanned_file_is_not_read(tmp_path: Path, how: str) -> None:
    """Between the scan and the copy one file is replaced (another inode with the same bytes, a
    symlink to them, a FIFO: refused without blocking) or changes size: nothing of it is copied."""
    src = cache(tmp_path / "src")
    files = scan_checkpoint(src)
    victim = src / files[123].relpath
    data = victim.read_bytes()
    other = tmp_path / "other"
    other.write_bytes(data)
    if how == "other inode":
        os.replace(other, victim)
    elif how == "symlink":
        victim.unlink()
        victim.symlink_to(other)
    elif how == "fifo":
        victim.unlink()
        os.mkfifo(victim)
    else:
        victim.write_bytes(data + b"x" if how == "longer" else data[:-1])
    (tmp_path / "out").mkdir()
    with open_dir(tmp_path / "out") as d:
        with pytest.raises(UnsafePath if how in ("symlink", "fifo") else FileChanged) as exc:
            copy_files([CopyJob(f.path, FileRef(d, f.relpath), f.size, f.mode) for f in files], threads=2,
                       preallocate=False, hashed={})
    assert files[123].relpath in str(exc.value)
    assert not (tmp_path / "out" / files[123].relpath).exists()


def test_made_dirs_never_follow_a_symlink_planted_for_a_directory(tmp_path: Path) -> None:
    top, outside = tmp_path / "staging", tmp_path / "outside"
    top.mkdir()
    outside.mkdir()
    (top / "rank_0").mkdir()
    (top / "rank_0/07").symlink_to(outside)
    (top / "rank_0/08").write_bytes(b"a file where a directory goes")
    with open_dir(top) as d:
        made = MadeDirs()
        try:
            got, name = made.split(FileRef(d, "rank_0/06/c.py"))   # (made, and its parent opened once)
            assert name == "c.py" and (top / "rank_0/06").is_dir()
            assert made.split(FileRef(d, "rank_0/06/d.py"))[0] is got
            for bad in ("rank_0/07/c.py", "rank_0/08/c.py", "rank_0/../x/c.py"):
                with pytest.raises(UnsafePath):
                    made.split(FileRef(d, bad))
        finally:
            made.close()
    assert list(outside.iterdir()) == [] and not (tmp_path / "x").exists()


def _kernels(root: Path, dirs: int, depth: int) -> Path:
    """A compile cache of a directory per kernel under prefix directories: ``dirs`` leaves ``depth`` deep."""
    for i in range(dirs):
        p = root.joinpath(f"d{i:04d}", *(["x"] * (depth - 1)), "k.py")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"# kernel %d\n" % i)
    return root


def test_directories_on_the_way_are_not_kept_open(tmp_path: Path) -> None:
    """One descriptor a directory that holds files, as before MadeDirs: 700 kernels two levels deep
    copy under a limit of 1,024 open files (keeping the prefix directories open too needed 1,400)."""
    import subprocess
    import sys
    src, dst = _kernels(tmp_path / "src", 700, 2), tmp_path / "dst"
    dst.mkdir()
    code = (
        "import os, resource, sys\n"
        "from pathlib import Path\n"
        "from tiering.content.scan import scan_checkpoint\n"
        "from tiering.copy import CopyJob\n"
        "from tiering.copy_many import copy_files\n"
        "from tiering.safefs import Dir, FileRef\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))\n"
        "src, dst = Path(sys.argv[1]), Path(sys.argv[2])\n"
        "top = Dir(os.open(dst, os.O_RDONLY | os.O_DIRECTORY), dst)\n"
        "files = scan_checkpoint(src)\n"
        "copy_files([CopyJob(f.path, FileRef(top, f.relpath), f.size, f.mode) for f in files])\n")
    p = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert sum(1 for _ in dst.rglob("k.py")) == 700


def test_the_cli_raises_its_soft_open_files_limit_to_the_hard_one(node_env, isolated_env, tmp_path: Path) -> None:
    """An in-process publish of 1,100 kernel directories from a shell whose soft limit is 512 (hard 8,192):
    the command takes what the hard limit allows, as the daemon's unit does (LimitNOFILE)."""
    import resource
    import subprocess
    import sys
    from tiering.sample import make_checkpoint

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 8192))

    def wd(*args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--no-daemon",
                               *map(str, args)], capture_output=True, text=True, timeout=300, env=isolated_env,
                              preexec_fn=limited)
    ck = make_checkpoint(tmp_path / "m", total_bytes=1 << 20, shards=1, layers=1)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1").returncode == 0
    r = wd("publish", _kernels(tmp_path / "cache", 1100, 1), "--companion-of", "org/m@v1", "--kind", "compile-cache",
           "--key", "k")
    assert r.returncode == 0, r.stderr
