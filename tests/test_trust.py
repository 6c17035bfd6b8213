"""Trust boundaries on the node (design §13): each attack played for real against the real CLI.

Planted symlinks in every tier, foreign tier roots, a read-only cold mount, FIFOs and reads that never
return, manifest modes, crashed copies, adopted versions. Each asserts the documented exit code and
one-line message, and that nothing outside the tiers changed (a victim tree hashed before and after).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tiering.copy import run_all
from tiering.errors import TimedOut
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error

MiB = 1 << 20
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a second uid, bind mounts)")


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (never following a link): type, mode, size, content hash or target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = os.lstat(p)
            what = None
            if stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(p)
            out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, what)
    return out


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Files of the host that an attacker would like weightd to delete or overwrite."""
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True)
    (v / "keep.json").write_text('{"precious": true}\n')
    (v / "sub" / "data.bin").write_bytes(os.urandom(4096))
    (v / "org--tiny@v1.resumable").mkdir()
    (v / "org--tiny@v1.resumable" / "inner.txt").write_text("mine\n")
    return v


def publish(wd, tmp_path: Path, name: str = "org/tiny", version: str = "v1", size: int = 4 * MiB,
            seed: str = "a") -> Path:
    src = make_checkpoint(tmp_path / f"src-{uuid.uuid4().hex[:6]}", total_bytes=size, shards=2, layers=2, seed=seed)
    r = wd("publish", src, "--name", name, "--version", version)
    assert r.returncode == 0, r.stderr
    return src


# -- 1. planted symlinks are never followed ---------------------------------------------------------
def test_symlinked_cold_staging_is_never_cleaned_by_status(wd, node_env, tmp_path: Path, victim: Path) -> None:
    publish(wd, tmp_path)
    shutil.rmtree(node_env.cold / ".staging", ignore_errors=True)
    os.symlink(victim, node_env.cold / ".staging")
    before = snapshot(victim)
    for args in (("status", "--json"), ("path", "org/tiny@v1"), ("preload", "org/tiny@v1", "--tier", "warm"),
                 ("gc",)):
        wd(*args)
    assert snapshot(victim) == before
    assert os.path.islink(node_env.cold / ".staging")  # cold is not weightd's to tidy from a worker


@pytest.mark.parametrize("tier", ["hot", "warm"])
def test_symlinked_resumable_staging_is_replaced_not_followed(wd, node_env, tmp_path: Path, victim: Path,
                                                             tier: str) -> None:
    publish(wd, tmp_path)
    root = node_env.tier_root(tier)
    (root / ".staging").mkdir(mode=0o700)
    os.symlink(victim / "org--tiny@v1.resumable", root / ".staging" / "org--tiny@v1.resumable")
    os.symlink(victim / "keep.json", root / ".staging" / "org--tiny@v1.resumable.json")
    before = snapshot(victim)
    r = wd("preload", "org/tiny@v1", "--tier", tier, "--json")
    assert r.returncode == 0, r.stderr
    assert snapshot(victim) == before
    placed = root / "org/tiny/v1"
    assert placed.is_dir() and not placed.is_symlink()
    assert wd("verify", placed).returncode == 0


@pytest.mark.parametrize("planted", [".staging", ".locks", "org"])
def test_symlinked_tier_directories_are_refused(wd, node_env, tmp_path: Path, victim: Path, planted: str) -> None:
    publish(wd, tmp_path)
    node_env.tier_root("warm")
    os.symlink(victim / "sub", node_env.warm / planted)
    before = snapshot(victim)
    r = wd("preload", "org/tiny@v1", "--tier", "warm")
    assert_one_line_error(r, 2, str(node_env.warm / planted))
    assert snapshot(victim) == before


def test_symlinked_lock_file_and_trash_are_not_followed(wd, node_env, tmp_path: Path, victim: Path) -> None:
    publish(wd, tmp_path)
    (node_env.tier_root("warm") / ".locks").mkdir(mode=0o700)
    os.symlink(victim / "keep.json", node_env.warm / ".locks" / "org--tiny@v1.lock")
    os.symlink(victim, node_env.warm / ".trash")
    before = snapshot(victim)
    r = wd("preload", "org/tiny@v1", "--tier", "warm")
    assert_one_line_error(r, 2, "org--tiny@v1.lock", "symlink")
    assert snapshot(victim) == before
    assert not (node_env.warm / ".trash").exists()  # the planted link itself was removed, its target kept


def test_symlinked_manifest_in_a_tier_is_replaced_not_written_through(wd, node_env, tmp_path: Path,
                                                                       victim: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    mpath = node_env.warm / "org/tiny/v1/.weightd/manifest.json"
    mpath.unlink()
    os.symlink(victim / "keep.json", mpath)
    before = snapshot(victim)
    r = wd("preload", "org/tiny@v1", "--tier", "warm")
    assert r.returncode == 0, r.stderr
    assert snapshot(victim) == before
    assert not mpath.is_symlink() and json.loads(mpath.read_text())["name"] == "org/tiny"


def test_symlinked_name_directory_in_cold_is_not_followed(wd, node_env, tmp_path: Path) -> None:
    # a writer of cold storage links NAME/ to a directory outside cold that holds a complete version
    publish(wd, tmp_path, name="org2/real")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(node_env.cold / "org2/real", outside / "real")
    os.symlink(outside / "real", node_env.cold / "org2/real")
    r = wd("preload", "org2/real@v1", "--tier", "warm")
    assert_one_line_error(r, 3, "org2/real@v1")
    assert not (node_env.warm / "org2").exists()


def test_symlink_inside_a_published_version_is_refused(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    cfg = node_env.cold / "org/tiny/v1/config.json"
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    cfg.unlink()
    os.symlink(secret, cfg)
    r = wd("preload", "org/tiny@v1", "--tier", "warm")
    assert_one_line_error(r, 2, "config.json")
    assert not (node_env.warm / "org/tiny/v1").exists()
    assert not any(node_env.warm.rglob("config.json"))


# -- 2. a tier root is weightd's --------------------------------------------------------------------
@ROOT_ONLY
def test_hot_root_precreated_by_another_user_is_refused(weightd, isolated_env, tmp_path: Path) -> None:
    hot = Path(f"/dev/shm/weightd-{isolated_env['USER']}")
    hot.mkdir()
    try:
        os.chown(hot, 65534, 65534)
        os.chmod(hot, 0o777)
        (hot / "planted").write_text("x")
        before = snapshot(hot)
        for args in (("status",), ("path", "org/tiny@v1"), ("gc",)):
            r = weightd(*args)
            assert_one_line_error(r, 2, str(hot), "uid 65534")
        assert snapshot(hot) == before
    finally:
        shutil.rmtree(hot, ignore_errors=True)


def test_tier_root_that_is_a_symlink_or_group_writable_is_refused(wd, node_env, tmp_path: Path) -> None:
    real = tmp_path / "real-warm"
    real.mkdir(mode=0o700)
    os.symlink(real, node_env.warm)
    assert_one_line_error(wd("status"), 2, str(node_env.warm), "symlink")
    node_env.warm.unlink()
    node_env.warm.mkdir()
    os.chmod(node_env.warm, 0o775)
    assert_one_line_error(wd("status"), 2, str(node_env.warm), "writable by group or others", "0775")


def test_tier_roots_are_made_private_and_with_the_configured_group(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    assert stat.S_IMODE(os.stat(node_env.warm).st_mode) == 0o700
    text = node_env.config.read_text().replace("[tiers.hot]\n", "[tiers.hot]\ngroup = 100\n")
    node_env.config.write_text(text)
    assert wd("preload", "org/tiny@v1", "--tier", "hot").returncode == 0
    st = os.stat(node_env.hot)
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == 100


# -- 3. read-only and side-effect-free where they should be ------------------------------------------
def test_status_and_path_change_nothing_on_disk(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    # leftovers a query must not tidy: stale staging, trash
    (node_env.warm / ".staging" / "org--x@v9.resumable").mkdir(parents=True)
    (node_env.warm / ".trash" / "old").mkdir(parents=True)
    trees = [node_env.warm, node_env.cold]
    before = [snapshot(t) for t in trees]
    assert wd("status", "--json").returncode == 0
    assert wd("path", "org/tiny@v1").returncode == 0
    assert wd("path", "org/none@v1").returncode == 3
    assert [snapshot(t) for t in trees] == before
    assert not node_env.hot.exists()  # nothing is even created for a query


@ROOT_ONLY
def test_read_only_cold_mount_works(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    # what a publisher that crashed elsewhere left on the share: only publish may ever tidy it
    (node_env.cold / ".staging" / "org--gone@v1.resumable").mkdir(parents=True, exist_ok=True)
    ro = tmp_path / "cold-ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(node_env.cold), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("bind mounts are not allowed here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True, capture_output=True)
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")
        node_env.config.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"',
                                                                       f'path = "{ro}"'))
        before = snapshot(node_env.cold)
        for args in (("status",), ("preload", "org/tiny@v1", "--tier", "warm"), ("path", "org/tiny@v1"),
                     ("preload", "org/tiny@v1", "--tier", "hot"), ("gc",), ("verify", ro / "org/tiny/v1")):
            r = wd(*args)
            assert r.returncode == 0, (args, r.stderr)
        assert snapshot(node_env.cold) == before
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


# -- 4. reading cold is bounded and regular-files-only ----------------------------------------------
def test_fifo_in_a_published_version_is_refused_at_once(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    cfg = node_env.cold / "org/tiny/v1/config.json"
    cfg.unlink()
    os.mkfifo(cfg)
    t0 = time.monotonic()
    r = wd("preload", "org/tiny@v1", "--tier", "warm", "--timeout", "20", timeout=60)
    assert_one_line_error(r, 2, "config.json", "not a regular file")
    assert time.monotonic() - t0 < 20
    # and the tier is still usable by the next preload
    publish(wd, tmp_path, name="org/other", seed="b")
    assert wd("preload", "org/other@v1", "--tier", "warm").returncode == 0


def test_a_read_that_never_returns_does_not_outlive_the_deadline() -> None:
    """A worker blocked in a system call that never returns (a pipe nobody writes: the same as a read
    from a hung NFS server) is left behind; the caller gets TimedOut at its deadline."""
    r, w = os.pipe()
    try:
        t0 = time.monotonic()
        with pytest.raises(TimedOut):
            run_all(lambda _: os.read(r, 1), [1, 2], threads=2, name="test-hang", deadline=time.monotonic() + 1.0)
        assert time.monotonic() - t0 < 3.0
    finally:
        os.write(w, b"xx")  # let the stuck workers go
        os.close(w)
        time.sleep(0.1)
        os.close(r)


# -- 7. modes are sanitised --------------------------------------------------------------------------
def test_modes_from_a_manifest_are_sanitised(wd, node_env, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=1)
    os.chmod(src / "config.json", 0o777)
    os.chmod(src / "tokenizer.json", 0o4755 if os.geteuid() == 0 else 0o755)
    os.chmod(src / "generation_config.json", 0o2775)
    assert wd("publish", src, "--name", "org/modes", "--version", "v1").returncode == 0
    for tier in ("warm", "hot"):
        assert wd("preload", "org/modes@v1", "--tier", tier).returncode == 0
        root = node_env.warm if tier == "warm" else node_env.hot
        for p in (root / "org/modes/v1").rglob("*"):
            mode = stat.S_IMODE(os.lstat(p).st_mode)
            assert not mode & (stat.S_IWGRP | stat.S_IWOTH | stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX), (p, oct(mode))


# -- 8. faults lose nothing and brick nothing --------------------------------------------------------
def test_crashed_copy_staging_never_counts_against_its_own_retry(wd, node_env, tmp_path: Path) -> None:
    node_env.write_config(node_env.hot_capacity, "12MiB")
    publish(wd, tmp_path, size=8 * MiB)
    # what a cold copy killed mid-way left on main: a staging area marked resumable (every copy was),
    # its side file, and no lock holder
    area = node_env.tier_root("warm") / ".staging"
    area.mkdir()
    (area / "org--tiny@v1.resumable").mkdir()
    (area / "org--tiny@v1.resumable" / "model-00001-of-00002.safetensors").write_bytes(b"\0" * (6 * MiB))
    (area / "org--tiny@v1.resumable.json").write_text(json.dumps(
        {"name": "org/tiny", "version": "v1", "bytes": 8 * MiB, "resumable": True, "created": time.time()}))
    r = wd("preload", "org/tiny@v1", "--tier", "warm", "--strict")
    assert r.returncode == 0, r.stderr
    assert wd("verify", node_env.warm / "org/tiny/v1").returncode == 0
    assert not any(area.iterdir())


def test_stale_copy_staging_is_removed_at_once(wd, node_env, tmp_path: Path) -> None:
    area = node_env.tier_root("warm") / ".staging"
    area.mkdir()
    (area / "org--x@v1.resumable").mkdir()
    (area / "org--x@v1.resumable.json").write_text(json.dumps({"bytes": 10, "resumable": False,
                                                                "created": time.time()}))
    (area / "org--y@v1.resumable").mkdir()  # a P2P transfer that can resume: kept for a day
    (area / "org--y@v1.resumable.json").write_text(json.dumps({"bytes": 10, "resumable": True,
                                                                "created": time.time()}))
    r = wd("gc", "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in area.iterdir()) == ["org--y@v1.resumable", "org--y@v1.resumable.json"]


def test_side_file_temporaries_a_kill_left_are_removed_unless_their_writer_lives(wd, node_env) -> None:
    """A kill -9 inside the atomic write of a staging side file leaves ``.<id>.json.<hex>.incomplete``
    (CI's crash test found one that nothing ever removed). Reconciliation removes those of every id whose
    version lock is free, a kept resumable area's too; one whose version lock is held is a live write and
    stays, and a dot-file that is no temporary of weightd's is not touched."""
    area = node_env.tier_root("warm") / ".staging"
    area.mkdir()
    (area / ".org--x@v1.resumable.json.0123456789ab.incomplete").write_text("{")
    (area / "org--y@v1.resumable").mkdir()  # resumable: kept for a day, its torn temporary is not
    (area / "org--y@v1.resumable.json").write_text(json.dumps({"bytes": 10, "resumable": True,
                                                                "created": time.time()}))
    (area / ".org--y@v1.resumable.json.ba9876543210.incomplete").write_text("{")
    (area / ".org--z@v1.resumable.json.00000000cafe.incomplete").write_text("{")  # its writer holds the lock
    (area / ".not-ours").write_text("x")
    # what else may sit under such a name: a directory, a FIFO, a symlink to a victim (the link goes)
    (area / ".org--d@v1.resumable.json.aaaaaaaaaaaa.incomplete").mkdir()
    (area / ".org--d@v1.resumable.json.aaaaaaaaaaaa.incomplete" / "f").write_text("x")
    os.mkfifo(area / ".org--f@v1.resumable.json.bbbbbbbbbbbb.incomplete")
    victim = node_env.warm.parent / "victim"
    victim.write_text("keep")
    (area / ".org--s@v1.resumable.json.cccccccccccc.incomplete").symlink_to(victim)
    locks = node_env.warm / ".locks"
    locks.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(locks / "org--z@v1.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = wd("gc", "--json")
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in area.iterdir()) == [".not-ours", ".org--z@v1.resumable.json.00000000cafe.incomplete",
                                                      "org--y@v1.resumable", "org--y@v1.resumable.json"]
    assert victim.read_text() == "keep"
    assert wd("gc", "--json").returncode == 0  # the writer is gone: now it goes
    assert ".org--z@v1.resumable.json.00000000cafe.incomplete" not in {p.name for p in area.iterdir()}


def test_an_adopted_version_is_verified_before_it_is_served(wd, node_env, tmp_path: Path) -> None:
    """A version state does not know (crash between rename and record, or a rebuilt state) is
    re-verified; a damaged one is never served and reconciliation removes it."""
    publish(wd, tmp_path)
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    assert wd("unpin", "org/tiny@v1").returncode in (0, 1)
    for p in node_env.state.glob("state.db*"):
        p.unlink()
    shard = sorted((node_env.warm / "org/tiny/v1").glob("*.safetensors"))[0]
    with open(shard, "r+b") as fh:  # a torn write the crash left behind
        fh.seek(shard.stat().st_size - 100)
        fh.write(b"\xff" * 50)
    r = wd("path", "org/tiny@v1")
    assert_one_line_error(r, 3, "org/tiny@v1")
    assert shard.exists()  # a query never deletes
    r = wd("gc")
    assert r.returncode == 0, r.stderr
    assert not (node_env.warm / "org/tiny/v1").exists()
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    assert wd("path", "org/tiny@v1").returncode == 0


def test_an_intact_adopted_version_is_served_after_verification(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    for p in node_env.state.glob("state.db*"):
        p.unlink()
    r = wd("path", "org/tiny@v1")
    assert r.returncode == 0 and r.stdout.strip().endswith("org/tiny/v1"), r.stderr


# -- 9. smaller holes ---------------------------------------------------------------------------------
def test_corrupt_cold_manifest_is_exit_2(wd, node_env, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    (node_env.cold / "org/tiny/v1/.weightd/manifest.json").write_text("{not json")
    assert_one_line_error(wd("preload", "org/tiny@v1", "--tier", "warm"), 2, "manifest.json", "bad manifest")


@pytest.mark.parametrize("tier", ["warm", "hot"])
def test_source_shorter_than_its_manifest_is_exit_5(wd, node_env, tmp_path: Path, tier: str) -> None:
    publish(wd, tmp_path)
    shard = sorted((node_env.cold / "org/tiny/v1").glob("*.safetensors"))[0]
    os.truncate(shard, shard.stat().st_size - 1000)
    assert_one_line_error(wd("preload", "org/tiny@v1", "--tier", tier, "--strict"), 5, shard.name)


def test_delta_from_a_short_source_is_exit_5(wd, node_env, tmp_path: Path) -> None:
    from safetensors import safe_open

    from tiering.sample import mutate_tensor
    publish(wd, tmp_path)
    assert wd("preload", "org/tiny@v1", "--tier", "warm").returncode == 0
    src2 = make_checkpoint(tmp_path / "src2", total_bytes=4 * MiB, shards=2, layers=2, seed="a")
    shard = sorted(src2.glob("*.safetensors"))[-1]
    with safe_open(str(shard), "np") as f:
        name = sorted(f.keys())[-1]
    mutate_tensor(shard, name)  # a v2 that shares all but one tensor with v1
    assert wd("publish", src2, "--name", "org/tiny", "--version", "v2").returncode == 0
    cold_shard = node_env.cold / "org/tiny/v2" / shard.name
    os.truncate(cold_shard, 100)  # the changed tensor now lies past the end
    assert_one_line_error(wd("preload", "org/tiny@v2", "--tier", "warm"), 5, shard.name)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e12"])
def test_in_process_lease_and_timeout_are_bounded(node_env, tmp_path: Path, value: str) -> None:
    from tiering.errors import BadInput
    node = node_env.node()
    try:
        src = make_checkpoint(tmp_path / "s", total_bytes=1 * MiB, shards=1, layers=1)
        node.publish(src, "org/tiny", "v1")
        with pytest.raises(BadInput, match="lease_s"):
            node.preload("org/tiny", "v1", tier="warm", lease_s=float(value))
        with pytest.raises(BadInput, match="timeout_s"):
            node.preload("org/tiny", "v1", tier="warm", timeout_s=float(value))
    finally:
        node.close()


# -- what a review of the mechanism found (each played for real) ----------------------------------------
def test_publish_never_reuses_planted_staging_in_cold(wd, node_env, tmp_path: Path) -> None:
    """A cold writer pre-creates NAME@V's staging area with a file of theirs, marked resumable: publish
    starts from nothing, and the manifest holds exactly the source's files."""
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=1)
    area = node_env.cold / ".staging"
    area.mkdir(parents=True, mode=0o700)
    (area / "org--tiny@v1.resumable").mkdir()
    (area / "org--tiny@v1.resumable" / "modeling_evil.py").write_text("import os; os.system('id')\n")
    (area / "org--tiny@v1.resumable.json").write_text(json.dumps({"resumable": True, "created": time.time()}))
    r = wd("publish", src, "--name", "org/tiny", "--version", "v1")
    assert r.returncode == 0, r.stderr
    m = json.loads((node_env.cold / "org/tiny/v1/.weightd/manifest.json").read_text())
    assert sorted(f["path"] for f in m["files"]) == sorted(
        str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    assert not (node_env.cold / "org/tiny/v1/modeling_evil.py").exists()


@ROOT_ONLY
@pytest.mark.parametrize("planted", [".staging", ".locks"])
def test_cold_private_directories_of_another_user_are_refused(wd, node_env, tmp_path: Path, planted: str) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=1)
    d = node_env.cold / planted
    shutil.rmtree(d, ignore_errors=True)   # (the store's own, made with it: replaced by another uid's)
    d.mkdir()
    os.chown(d, 65534, 65534)
    os.chmod(d, 0o777)
    r = wd("publish", src, "--name", "org/tiny", "--version", "v1")
    assert_one_line_error(r, 2, str(d), "not weightd's own", "uid 65534")
    assert not (node_env.cold / "org").exists()


@ROOT_ONLY
def test_tier_under_a_directory_of_another_user_is_refused(weightd, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'state_dir = "{tmp_path}/state"\n[tiers.hot]\npath = "{tmp_path}/hot"\n'
                   f'[tiers.warm]\npath = "{theirs}/warm"\n[tiers.cold]\npath = "{tmp_path}/cold"\n'
                   f'[api]\nsocket = "{tmp_path}/state/s.sock"\n')
    assert_one_line_error(weightd("--config", cfg, "status"), 2, f"{theirs}/warm", "uid 65534")


def test_removal_never_opens_a_fifo_nor_follows_a_link(tmp_path: Path, victim: Path) -> None:
    from tiering.safefs import open_cold_root
    tree = tmp_path / "t" / "doomed"
    (tree / "a" / "b").mkdir(parents=True)
    os.mkfifo(tree / "a" / "fifo")
    os.symlink(victim, tree / "a" / "b" / "link")
    os.symlink(victim / "sub", tree / "dirlink")
    before = snapshot(victim)
    done = threading.Event()
    with open_cold_root(tmp_path / "t") as d:
        th = threading.Thread(target=lambda: (d.remove("doomed"), done.set()), daemon=True)
        th.start()
        assert done.wait(10), "removal blocked (a FIFO was opened?)"
    assert not tree.exists() and snapshot(victim) == before


def test_listing_one_directory_from_many_threads_is_exact(tmp_path: Path) -> None:
    from tiering.safefs import open_cold_root
    base = tmp_path / "many"
    base.mkdir()
    for i in range(3000):
        (base / f"e{i:05d}").mkdir()
    counts: list[int] = []
    with open_cold_root(base) as d:
        def run() -> None:
            for _ in range(15):
                counts.append(len(d.entries()))
        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert counts and set(counts) == {3000}


def test_origin_never_hands_libtorrent_a_version_others_can_change(wd, node_env, tmp_path: Path) -> None:
    from tiering.errors import UnsafePath
    from tiering.versions import read_version
    from weightd.node.swarm import check_seedable
    publish(wd, tmp_path)
    v = read_version(node_env.cold, "org/tiny", "v1")
    check_seedable(v)  # as published: only weightd's user can change it
    os.chmod(node_env.cold / "org/tiny/v1", 0o777)
    with pytest.raises(UnsafePath, match="can be changed by others"):
        check_seedable(v)
    os.chmod(node_env.cold / "org/tiny/v1", 0o755)
    os.chmod(node_env.cold / "org", 0o777)  # a NAME directory on the way counts too
    with pytest.raises(UnsafePath, match="can be changed by others"):
        check_seedable(v)
    os.chmod(node_env.cold / "org", 0o755)
    (node_env.cold / "org/tiny/v1/extra").symlink_to("/etc/hostname")
    with pytest.raises(UnsafePath, match="symlink"):
        check_seedable(v)


class HungCold:
    """Cold storage served through a real FUSE file server (tests/fuse_hang.py) whose reads of
    ``org/hang``'s safetensors never return, as reads from a hung NFS server do."""

    def __init__(self, source: Path, mnt: Path, log: Path, hang: str, rate: int = 0) -> None:
        """``rate``: bytes per second each reader gets (0: as fast as the source)."""
        self.path = mnt
        self.log = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuse_hang.py")), str(source),
                                      str(mnt), hang, str(rate)], stdout=self.log, stderr=subprocess.STDOUT)
        self.dev: int | None = None
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.release()
                pytest.skip(f"FUSE mount failed here (exit {self.proc.poll()}): {log.read_text()[-300:]}")
            time.sleep(0.05)
        self.dev = os.minor(os.stat(mnt).st_dev)

    def release(self) -> None:
        """Abort the connection (every reader still waiting gets an error, so stuck processes can
        end), unmount, stop the server. Call before stopping anything that may be stuck in it."""
        if self.dev is not None:
            conn = Path(f"/sys/fs/fuse/connections/{self.dev}/abort")
            if not conn.parent.exists():
                subprocess.run(["mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections"], capture_output=True)
            if conn.exists():
                conn.write_text("1")
            self.dev = None
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture(params=["org/hang/v1/model-", "org/hang/v1/.weightd/manifest.json"], ids=["data", "manifest"])
def hung_cold(node_env, tmp_path: Path, request):
    """What never returns: the safetensors data (the copy), or the manifest (resolving the version)."""
    pytest.importorskip("fuse", reason="fusepy missing (make tools)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    node_env.cold.mkdir(exist_ok=True)  # (the mount's root is cold's root: it must exist first)
    h = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", request.param)
    try:
        yield h
    finally:
        h.release()


def test_a_hung_cold_server_ends_in_exit_4_and_the_tier_keeps_working(wd, node_env, isolated_env, tmp_path: Path,
                                                                      hung_cold: HungCold) -> None:
    """Through the real daemon: a preload whose cold reads never return ends with exit 4 at its
    --timeout; another preload into the same tier completes meanwhile and after."""
    from .test_daemon import DaemonProc
    for name, seed in (("org/hang", "a"), ("org/ok", "b"), ("org/ok2", "c")):
        publish(wd, tmp_path, name=name, seed=seed, size=2 * MiB)
    node_env.config.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"',
                                                                   f'path = "{hung_cold.path}"'))
    d = DaemonProc(node_env, isolated_env, tmp_path)
    stuck = None
    try:
        t0 = time.monotonic()
        stuck = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload",
                                  "org/hang@v1", "--tier", "warm", "--timeout", "4"],
                                 env=isolated_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        ok = wd("preload", "org/ok@v1", "--tier", "warm", timeout=60)
        assert ok.returncode == 0, ok.stderr
        out, err = stuck.communicate(timeout=40)
        assert stuck.returncode == 4, (stuck.returncode, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
        assert time.monotonic() - t0 < 30
        again = wd("preload", "org/ok2@v1", "--tier", "warm", timeout=60)  # the tier's pool is not wedged
        assert again.returncode == 0, again.stderr
        assert not (node_env.warm / "org/hang/v1").exists()
    finally:
        hung_cold.release()  # first: a daemon with a reader stuck in FUSE cannot exit until then
        if stuck is not None and stuck.poll() is None:
            stuck.kill()
            stuck.wait(10)
        d.stop()
