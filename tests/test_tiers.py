"""Tiers: publish, preload, placement and eviction, through the library and the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering import verify_checkpoint
from tiering.errors import Busy, CheckpointNotFound, NoSpace, VersionConflict
from tiering.versions import list_versions
from tiering.safefs import COLD_MARKER
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error

MiB = 1 << 20


def published(env, name="org/tiny", version="v1", size=8 * MiB, seed=None):
    src = make_checkpoint(env.tmp / f"src-{name.replace('/', '-')}-{version}", total_bytes=size, shards=2,
                          layers=2, seed=seed or f"{name}{version}")
    with env.node() as n:
        n.publish(src, name, version)
    return src


# -- publish ----------------------------------------------------------------------------------------

def test_publish_copies_with_manifest_and_is_immutable(wd, node_env, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=6 * MiB, shards=2, layers=2, seed="a")
    proc = wd("publish", src, "--name", "org/tiny", "--version", "v1", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    dest = node_env.cold / "org/tiny/v1"
    assert r["path"] == str(dest) and not r["unchanged"]
    m = json.loads((dest / ".weightd/manifest.json").read_text())
    assert (m["name"], m["version"]) == ("org/tiny", "v1") and m["published_at"]
    assert sorted(p.name for p in dest.iterdir()) == sorted([".weightd", *(p.name for p in src.iterdir())])
    assert not list((node_env.cold / ".staging").iterdir())
    # the same content again: a no-op; different content under the same version: exit 2
    again = json.loads(wd("publish", src, "--name", "org/tiny", "--version", "v1", "--json").stdout)
    assert again["unchanged"] and again["digest"] == r["digest"]
    other = make_checkpoint(tmp_path / "other", total_bytes=6 * MiB, shards=2, layers=2, seed="b")
    assert_one_line_error(wd("publish", other, "--name", "org/tiny", "--version", "v1"), 2, "immutable")
    assert json.loads((dest / ".weightd/manifest.json").read_text())["digest"] == r["digest"]


def test_publish_hf_cache_snapshot(wd, node_env, tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--snap"
    src = make_checkpoint(tmp_path / "flat", total_bytes=4 * MiB, shards=1, layers=1)
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abcd"
    for f in sorted(src.rglob("*")):
        if f.is_file():
            blob = repo / "blobs" / f"blob-{f.name}"
            os.replace(f, blob)
            link = snap / f.relative_to(src)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    assert wd("publish", snap, "--name", "org/snap", "--version", "main").returncode == 0
    dest = node_env.cold / "org/snap/main"
    assert (dest / "model.safetensors").is_file() and not (dest / "model.safetensors").is_symlink()
    assert wd("verify", dest).returncode == 0


@pytest.mark.parametrize("name,version", [("../x", "v1"), ("/abs", "v1"), ("", "v1"), ("a/b/c", "v1"),
                                          ("ok", "../v"), ("ok", ""), ("ok", "v/1")])
def test_hostile_names(wd, node_env, ckpt: Path, name: str, version: str) -> None:
    assert_one_line_error(wd("publish", ckpt, "--name", name, "--version", version), 2, "invalid")
    assert not node_env.cold.exists() or not any(p.name not in (".locks", ".staging", COLD_MARKER) for p in node_env.cold.iterdir())
    ref = f"{name}@{version}"
    for cmd in (["preload", ref], ["path", ref], ["evict", ref], ["pin", ref]):
        assert_one_line_error(wd(*cmd), 2, "invalid")


def test_latest_published(node_env) -> None:
    published(node_env, version="v1")
    time.sleep(0.01)
    published(node_env, version="v2")
    with node_env.node() as n:
        assert n.resolve("org/tiny", None).version == "v2"
        r = n.preload("org/tiny", tier="warm")
    assert r.version == "v2"


# -- preload ----------------------------------------------------------------------------------------

def test_preload_cold_to_warm_to_hot(wd, node_env) -> None:
    published(node_env)
    proc = wd("preload", "org/tiny@v1", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)  # with --json, stdout is one JSON document (issue 13)
    assert r["path"] == str(node_env.warm / "org/tiny/v1")
    assert r["bytes_by_source"]["cold"] == r["bytes"] and r["bytes_by_source"]["local_reuse"] == 0
    assert r["tier"] == "warm" and set(r["bytes_by_source"]) == {"local_reuse", "peer", "origin", "cold"}

    r = json.loads(wd("preload", "org/tiny@v1", "--json").stdout.splitlines()[0])
    assert r["tier"] == "hot" and r["bytes_by_source"]["local_reuse"] == r["bytes"] and r["bytes_by_source"]["cold"] == 0
    hot = node_env.hot / "org/tiny/v1"
    assert r["path"] == str(hot)
    with node_env.node() as n:
        m = n.resolve("org/tiny", "v1").manifest
    assert verify_checkpoint(hot, m).ok
    # modes kept
    assert (hot / "config.json").stat().st_mode & 0o777 == 0o644

    again = json.loads(wd("preload", "org/tiny@v1", "--json").stdout.splitlines()[0])
    assert again["already_present"] and again["bytes_moved"] == 0
    assert wd("path", "org/tiny@v1").stdout.strip() == str(hot)


def test_preload_not_found_and_timeout(wd, node_env) -> None:
    assert_one_line_error(wd("preload", "org/none@v1"), 3, "not published")
    assert_one_line_error(wd("path", "org/none@v1"), 3)
    t0 = time.monotonic()
    assert_one_line_error(wd("preload", "org/none@v1", "--wait", "--timeout", "2"), 4, "not published before")
    assert time.monotonic() - t0 < 30


def test_preload_wait_until_published(wd, node_env, isolated_env, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "late", total_bytes=2 * MiB, shards=1, layers=1)
    waiter = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload",
                               "org/late@v1", "--wait", "--timeout", "60"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=isolated_env)
    try:
        time.sleep(1.5)
        assert waiter.poll() is None
        assert wd("publish", src, "--name", "org/late", "--version", "v1").returncode == 0
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert out.strip().splitlines()[-1] == str(node_env.hot / "org/late/v1")
    finally:
        waiter.kill()
        waiter.wait()


def test_hot_falls_back_to_warm_unless_strict(wd, node_env) -> None:
    published(node_env, size=8 * MiB)
    node_env.write_config("4MiB", "512MiB")
    proc = wd("preload", "org/tiny@v1", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[0])
    assert r["tier"] == "warm" and r["requested_tier"] == "hot" and r["tier_fallback"]["from"] == "hot" \
        and r["tier_fallback"]["to"] == "warm" and r["source_fallbacks"] == []
    assert "warning" in proc.stderr and "warm tier" in proc.stderr
    assert_one_line_error(wd("preload", "org/tiny@v1", "--strict"), 6, "tier hot cannot hold")
    assert not (node_env.hot / "org").exists()
    assert not list((node_env.hot / ".staging").glob("*"))


def test_eviction_lru_never_pinned_leased_or_in_use(node_env) -> None:
    for v in ("v1", "v2", "v3", "v4"):
        published(node_env, version=v, size=6 * MiB)
    with node_env.node() as n:
        size = n.resolve("org/tiny", "v1").size
    node_env.write_config(str(int(size * 3.6)), "512MiB")  # room for three versions, not four
    clock = [1000.0]
    with node_env.node(now=lambda: clock[0]) as n:
        for v in ("v1", "v2", "v3"):
            clock[0] += 10
            n.preload("org/tiny", v, tier="hot", lease_s=0)
        clock[0] += 10
        n.path("org/tiny", "v1")  # v1 is now the most recently used: v2 is the LRU
        r = n.preload("org/tiny", "v4", tier="hot", lease_s=0, strict=True)
        assert r.evicted == ["org/tiny@v2 (hot)"]
        assert sorted(v.version for v in list_versions(node_env.hot)) == ["v1", "v3", "v4"]

        # pinned, leased and in use are all kept; with nothing evictable the tier is full: exit 6
        n.pin("org/tiny", "v1")
        n.state.add_lease("hot", "org/tiny", "v3", 3600)
        holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); "
                                   "print('open', flush=True); time.sleep(60)",
                                   str(node_env.hot / "org/tiny/v4/config.json")], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "open"
            with pytest.raises(NoSpace) as info:
                n.preload("org/tiny", "v2", tier="hot", lease_s=0, strict=True)
            assert "pinned" in str(info.value) and "leased" in str(info.value)
            assert sorted(v.version for v in list_versions(node_env.hot)) == ["v1", "v3", "v4"]
            with pytest.raises(Busy, match="in use"):
                n.evict("org/tiny", "v4", "hot")
        finally:
            holder.kill()
            holder.wait()
            holder.stdout.close()
        # the process is gone: v4 is evictable now
        r = n.preload("org/tiny", "v2", tier="hot", lease_s=0, strict=True)
        assert r.evicted == ["org/tiny@v4 (hot)"]


def test_mapped_file_counts_as_in_use(node_env) -> None:
    published(node_env, size=4 * MiB)
    with node_env.node() as n:
        n.preload("org/tiny", "v1", tier="warm", lease_s=0)
        shard = next((node_env.warm / "org/tiny/v1").glob("*.safetensors"))
        code = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); "
                "f.close(); print('mapped', flush=True); time.sleep(60)")
        holder = subprocess.Popen([sys.executable, "-c", code, str(shard)], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "mapped"
            with pytest.raises(Busy, match="in use"):
                n.evict("org/tiny", "v1")
        finally:
            holder.kill()
            holder.wait()
            holder.stdout.close()
        assert n.evict("org/tiny", "v1") == ["org/tiny@v1 (warm)"]


def test_evict_pin_cli(wd, node_env) -> None:
    published(node_env)
    assert wd("preload", "org/tiny@v1", "--lease", "0").returncode == 0
    assert wd("pin", "org/tiny@v1").stdout.strip() == "org/tiny@v1: pinned"
    assert_one_line_error(wd("evict", "org/tiny@v1"), 1, "pinned")
    assert wd("unpin", "org/tiny@v1").returncode == 0
    proc = wd("evict", "org/tiny@v1", "--tier", "hot")
    assert proc.returncode == 0 and "org/tiny@v1 (hot)" in proc.stdout
    assert not (node_env.hot / "org").exists()
    assert_one_line_error(wd("evict", "org/tiny@v1", "--tier", "hot"), 3, "not on this node")
    st = json.loads(wd("status", "--json").stdout)
    assert st["checkpoints"] == [] and st["tiers"]["hot"]["capacity_bytes"] == 256 * MiB
    assert wd("status").returncode == 0


def test_leased_version_refuses_explicit_evict(wd, node_env) -> None:
    published(node_env)
    assert wd("preload", "org/tiny@v1", "--lease", "300").returncode == 0
    assert_one_line_error(wd("evict", "org/tiny@v1"), 1, "leased")
    assert wd("evict", "org/tiny@v1", "--force").returncode == 0


# -- state and reconciliation -----------------------------------------------------------------------

def test_reconcile_adopts_forgets_and_cleans(node_env) -> None:
    published(node_env)
    with node_env.node() as n:
        n.preload("org/tiny", "v1", tier="warm", lease_s=0)
        n.roots.must("hot")   # (weightd's own hot tier: a root it did not make adopts nothing unrecorded)
        assert [r.version for r in n.state.copies("warm")] == ["v1"]
        assert n.state.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # in weightd's tiers, a version that appeared behind weightd's back (complete, with manifest) is adopted;
    # one removed behind its back is forgotten; stale staging is removed
    import shutil
    shutil.copytree(node_env.warm / "org/tiny/v1", node_env.hot / "org/tiny/v1")
    shutil.rmtree(node_env.warm / "org/tiny/v1")
    stale = node_env.hot / ".staging" / "org--tiny@v9.deadbeef"
    stale.mkdir(parents=True)
    (stale / "half.safetensors").write_bytes(b"x" * 1000)
    with node_env.node() as n:
        assert [(r.tier, r.version) for r in n.state.copies()] == [("hot", "v1")]
        assert not stale.exists()


def test_status_reports_usage(wd, node_env) -> None:
    published(node_env)
    wd("preload", "org/tiny@v1")
    st = json.loads(wd("status", "--json").stdout)
    (c,) = st["checkpoints"]
    assert c["name"] == "org/tiny" and set(c["tiers"]) == {"hot"} and c["tiers"]["hot"]["leases"]
    assert st["tiers"]["hot"]["used_bytes"] == c["bytes"] and st["tiers"]["hot"]["checkpoints"] == 1


# -- integrity and failures --------------------------------------------------------------------------

def test_corrupt_or_truncated_cold_copy_fails_with_5(wd, node_env) -> None:
    published(node_env)
    shard = sorted((node_env.cold / "org/tiny/v1").glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert_one_line_error(wd("preload", "org/tiny@v1"), 5, "mismatch", shard.name)
    assert not (node_env.hot / "org").exists()
    assert not [p for p in (node_env.hot / ".staging").iterdir() if p.is_dir()]
    os.truncate(shard, 1000)
    assert_one_line_error(wd("preload", "org/tiny@v1", "--tier", "warm"), 5, shard.name)
    assert not (node_env.warm / "org").exists()


def _open_by(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a file called ``name`` open (its /proc fd links)."""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").endswith("/" + name) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # (fds come and go while we look)
        return False


def _staged_bytes(staging: Path) -> int:
    try:
        return sum(f.stat().st_blocks * 512 for d in staging.iterdir() if d.is_dir() for f in d.rglob("*") if f.is_file())
    except OSError:  # staging areas come and go while we look
        return 0


def test_two_processes_copy_once(node_env) -> None:
    """The second preload really starts while the first copies: the first is stopped (SIGSTOP) with
    its staging area partly filled, the second is seen waiting on the version's lock, then the first
    goes on. The second moves nothing."""
    published(node_env, size=48 * MiB)
    cmd = [sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload", "org/tiny@v1",
           "--tier", "warm", "--json"]
    total = sum(f.stat().st_size for f in (node_env.cold / "org/tiny/v1").rglob("*") if f.is_file())
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [first]
    try:
        deadline = time.monotonic() + 60
        while not _staged_bytes(node_env.warm / ".staging"):  # (polled every ms: the copy takes a fraction of a second)
            assert first.poll() is None and time.monotonic() < deadline, "the first preload never staged a byte"
            time.sleep(0.001)
        first.send_signal(signal.SIGSTOP)
        staged = _staged_bytes(node_env.warm / ".staging")
        assert not (node_env.warm / "org/tiny/v1").exists() and staged < total, (staged, total)  # mid-copy
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        lock = "org--tiny@v1.lock"
        while not _open_by(procs[1].pid, lock):  # the second waits on the lock the first holds
            assert procs[1].poll() is None and time.monotonic() < deadline, procs[1].communicate()
            time.sleep(0.01)
        assert not (node_env.warm / "org/tiny/v1").exists()  # (still: the first is stopped)
    finally:
        first.send_signal(signal.SIGCONT)
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        reports.append(json.loads(out.splitlines()[0]))
    assert [r["bytes_moved"] for r in reports] == [reports[0]["bytes"], 0], reports


@contextlib.contextmanager
def tiny_tmpfs(tmp_path: Path, size: str):
    """A real tmpfs of ``size`` (root only), unmounted afterwards even when the test fails."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_no_space_on_tiny_tmpfs_before_writing(wd, node_env, tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path, "8m") as mnt:
        published(node_env, size=12 * MiB)
        published(node_env, name="org/small", size=2 * MiB)
        node_env.write_config("1GiB", "512MiB", hot_path=mnt / "hot")  # capacity above what the fs has
        assert wd("preload", "org/small@v1", "--strict").returncode == 0
        assert_one_line_error(wd("preload", "org/tiny@v1", "--strict"), 6, "file system")
        assert sorted(v.version for v in list_versions(mnt / "hot")) == ["v1"]
        assert not [p for p in (mnt / "hot" / ".staging").iterdir() if p.is_dir()]


def test_enospc_mid_copy_cleans_staging(node_env, tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path, "16m") as mnt:
        published(node_env, name="org/keep", size=2 * MiB)
        published(node_env, size=10 * MiB)
        node_env.write_config("1GiB", "512MiB", hot_path=mnt / "hot")
        with node_env.node() as n:
            n.preload("org/keep", "v1", tier="hot", strict=True)
            filled = []

            def fill_the_disk(_: int) -> None:  # another tenant takes the space while we copy
                if not filled:
                    filled.append(1)
                    with open(mnt / "filler", "wb") as fh:
                        try:
                            while True:
                                fh.write(b"\0" * MiB)
                        except OSError:
                            pass

            with pytest.raises(NoSpace, match="filled up during the copy"):
                n.preload("org/tiny", "v1", tier="hot", strict=True, progress=fill_the_disk)
            assert filled
        assert sorted(v.ref for v in list_versions(mnt / "hot")) == ["org/keep@v1"]
        assert not [p for p in (mnt / "hot" / ".staging").iterdir() if p.is_dir()]


def test_library_errors(node_env, tmp_path: Path) -> None:
    published(node_env)
    other = make_checkpoint(tmp_path / "o", total_bytes=2 * MiB, shards=1, layers=1, seed="zz")
    with node_env.node() as n:
        with pytest.raises(VersionConflict):
            n.publish(other, "org/tiny", "v1")
        with pytest.raises(CheckpointNotFound):
            n.resolve("org/tiny", "v7")
