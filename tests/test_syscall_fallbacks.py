"""The fallbacks of ``tiering/_syscalls.py`` run on this machine too: ``WEIGHTD_DISABLE_SYSCALLS``
(``openat2``, ``renameat2``) makes a process behave as on a kernel without ``openat2`` and a file system
without ``RENAME_NOREPLACE`` (NFS). Then the per-component ``openat(O_NOFOLLOW)`` walk must refuse every
planted symlink and escape that ``openat2`` refuses, and the ``lstat`` + ``renameat`` commit must never
replace anything. In-process tests set :data:`tiering._syscalls.DISABLED`; the CLI attacks of
``test_trust.py`` run again here in subprocesses with the variable set.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiering import _syscalls
from tiering.errors import UnsafePath
from tiering.safefs import Dir

from .conftest import ROOT
# the CLI attacks of test_trust.py, collected again here so they run through the fallbacks
from .test_trust import (  # noqa: F401
    test_publish_never_reuses_planted_staging_in_cold, test_removal_never_opens_a_fifo_nor_follows_a_link,
    test_symlink_inside_a_published_version_is_refused, test_symlinked_cold_staging_is_never_cleaned_by_status,
    test_symlinked_lock_file_and_trash_are_not_followed, test_symlinked_manifest_in_a_tier_is_replaced_not_written_through,
    test_symlinked_name_directory_in_cold_is_not_followed, test_symlinked_resumable_staging_is_replaced_not_followed,
    test_symlinked_tier_directories_are_refused, test_tier_root_that_is_a_symlink_or_group_writable_is_refused, victim,
)

FALLBACKS = "openat2,renameat2"


@pytest.fixture(autouse=True)
def _fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process, and every weightd it starts, without openat2 and renameat2."""
    monkeypatch.setattr(_syscalls, "DISABLED", frozenset(FALLBACKS.split(",")))


@pytest.fixture
def isolated_env(isolated_env: dict[str, str]) -> dict[str, str]:
    return {**isolated_env, "WEIGHTD_DISABLE_SYSCALLS": FALLBACKS}


def test_the_switch_reaches_a_weightd_process(isolated_env: dict[str, str]) -> None:
    code = ("from tiering import _syscalls as s; import os; "
            "print(s.openat2_available(), s.renameat2_noreplace(-1, 'a', -1, 'b'))")
    out = subprocess.run([sys.executable, "-c", code], env=isolated_env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["False", "None"], out
    assert _syscalls.openat2_available() is False


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Dir, Path, Path]:
    """A root holding a/b/c/file.bin, and an outside tree of the same shape an attacker wants reached."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for base in (root, outside):
        (base / "a/b/c").mkdir(parents=True)
        (base / "a/b/c/file.bin").write_bytes(b"inside" if base is root else b"precious")
    d = Dir(os.open(root, os.O_RDONLY | os.O_DIRECTORY), root)
    yield d, root, outside
    d.close()


@pytest.mark.parametrize("planted", ["a", "a/b", "a/b/c", "a/b/c/file.bin"])
@pytest.mark.parametrize("target", ["absolute", "relative escape"])
def test_walk_refuses_a_symlink_at_every_component(tree, planted: str, target: str) -> None:
    d, root, outside = tree
    victim = outside / planted
    link = root / planted
    os.rename(link, root / "moved")
    os.symlink(victim if target == "absolute" else os.path.relpath(victim, link.parent), link)
    assert (root / "a/b/c/file.bin").read_bytes() == b"precious"   # the link does lead outside
    with pytest.raises(UnsafePath):
        os.close(d.open("a/b/c/file.bin", os.O_RDONLY))
    with pytest.raises(UnsafePath):
        os.close(d.open("a/b/c/file.bin", os.O_WRONLY | os.O_TRUNC))
    if planted != "a/b/c/file.bin":
        with pytest.raises(UnsafePath):
            os.close(d.open("a/b/c/new.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        with pytest.raises(UnsafePath):
            d.sub("a/b/c").close()
        with pytest.raises(UnsafePath):
            d.sub("a/b/c/d", create=True).close()
    assert (outside / "a/b/c/file.bin").read_bytes() == b"precious"
    assert sorted(p.name for p in (outside / "a/b/c").iterdir()) == ["file.bin"]


@pytest.mark.parametrize("rel", ["..", "../outside/a", "a/../../outside", "/etc/passwd", "a/./b", "a//b", ""])
def test_dot_dot_and_absolute_paths_are_refused(tree, rel: str) -> None:
    d, _, _ = tree
    with pytest.raises(UnsafePath):
        os.close(d.open(rel, os.O_RDONLY))


def test_walk_opens_what_is_really_there(tree) -> None:
    d, root, _ = tree
    fd = d.open("a/b/c/file.bin", os.O_RDONLY)
    try:
        assert os.read(fd, 16) == b"inside"
    finally:
        os.close(fd)
    with d.sub("a/b/c/d/e", create=True) as made:
        assert made.path == root / "a/b/c/d/e"
    assert (root / "a/b/c/d/e").is_dir() and not (root / "a/b/c/d").is_symlink()


@pytest.mark.parametrize("existing", ["file", "empty directory", "directory", "symlink", "dangling symlink"])
def test_rename_without_noreplace_never_replaces(tmp_path: Path, existing: str) -> None:
    """The commit of a version into ``NAME/`` (an empty directory in place is what a plain renameat
    would silently replace)."""
    src_root, dst_root = tmp_path / "staging", tmp_path / "NAME"
    src_root.mkdir()
    dst_root.mkdir()
    (src_root / "v1").mkdir()
    (src_root / "v1/weights.bin").write_bytes(b"new")
    there = dst_root / "v1"
    if existing == "file":
        there.write_bytes(b"old")
    elif existing == "empty directory":
        there.mkdir()
    elif existing == "directory":
        there.mkdir()
        (there / "weights.bin").write_bytes(b"old")
    elif existing == "symlink":
        (tmp_path / "elsewhere").mkdir()
        there.symlink_to(tmp_path / "elsewhere")
    else:
        there.symlink_to(tmp_path / "nowhere")
    before = os.lstat(there)
    with Dir(os.open(src_root, os.O_RDONLY | os.O_DIRECTORY), src_root) as src, \
            Dir(os.open(dst_root, os.O_RDONLY | os.O_DIRECTORY), dst_root) as dst:
        with pytest.raises(FileExistsError) as info:
            src.rename("v1", dst, "v1")
        assert info.value.errno == errno.EEXIST
        assert str(there) in str(info.value)
        src.rename("v1", dst, "v2")   # a free name is committed
    after = os.lstat(there)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert (dst_root / "v2/weights.bin").read_bytes() == b"new"
    assert not (src_root / "v1").exists()


def test_publish_and_preload_commit_through_renameat(wd, node_env, tmp_path: Path) -> None:
    """End to end with both fallbacks: publish, preload, a no-op preload, and a different content under
    the same version refused (exit 2) without touching the published one."""
    from tiering.sample import make_checkpoint
    a = make_checkpoint(tmp_path / "a", total_bytes=2 << 20, shards=2, layers=2, seed="a")
    b = make_checkpoint(tmp_path / "b", total_bytes=2 << 20, shards=2, layers=2, seed="b")
    assert wd("publish", a, "--name", "org/x", "--version", "v1").returncode == 0
    published = sorted((p.name, p.read_bytes()) for p in (node_env.cold / "org/x/v1").glob("*.safetensors"))
    r = wd("publish", b, "--name", "org/x", "--version", "v1")
    assert r.returncode == 2, r.stderr
    assert sorted((p.name, p.read_bytes()) for p in (node_env.cold / "org/x/v1").glob("*.safetensors")) == published
    for _ in range(2):
        r = wd("preload", "org/x@v1", "--tier", "warm")
        assert r.returncode == 0, r.stderr
    assert wd("verify", node_env.warm / "org/x/v1").returncode == 0
