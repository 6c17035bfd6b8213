"""Storage that is not there as configured is loud everywhere: cold storage absent, an empty mount point
with nothing mounted on it, a read-only mount, a tier whose device is not mounted. Never an empty
catalog, never "not published", never a ready daemon; a copy already held here still serves."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tiering.safefs import COLD_MARKER
from tiering.sample import make_checkpoint

from .conftest import NodeEnv, Weightd, assert_one_line_error
from .test_daemon import DaemonProc

MiB = 1 << 20
MOUNTED = "is it mounted?"


@pytest.fixture
def bare(tmp_path: Path):
    """A node whose configured cold storage does not exist (the NFS share is not mounted)."""
    env = NodeEnv(tmp_path, cold_store=False)
    try:
        yield env
    finally:
        env.cleanup()


@pytest.fixture
def wdb(weightd: Weightd, bare: NodeEnv):
    def run(*args: str, **kw):
        return weightd("--config", bare.config, *args, **kw)
    run.at_once = lambda *argvs, **kw: weightd.at_once(*(["--config", bare.config, *a] for a in argvs), **kw)
    return run


def _publish(wd, tmp: Path, version: str = "v1") -> None:
    src = make_checkpoint(tmp / f"src-{version}", total_bytes=2 * MiB, shards=1, layers=2, seed=version)
    r = wd("--no-daemon", "publish", src, "--name", "acme/m", "--version", version)
    assert r.returncode == 0, r.stderr


def _readyz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_absent_cold_storage_is_an_error_for_every_command(wdb, bare: NodeEnv) -> None:
    assert not bare.cold.exists()
    cmds = (["ls"], ["ls", "acme/m"], ["preload", "acme/m@v1"], ["preload", "acme/m"], ["path", "acme/m"])
    *errors, st, js, check, install, doc = wdb.at_once(
        *(["--no-daemon", *args] for args in cmds), ["--no-daemon", "status"],
        ["--no-daemon", "status", "--json"], ["serve", "--check"], ["serve", "--check=install"],
        ["--no-daemon", "doctor", "--json", "--sample-s", "0.5", "--no-probe"])
    for r in errors:
        assert_one_line_error(r, 2, str(bare.cold), "cold storage does not exist", MOUNTED)
        assert r.stdout == "", r.stdout   # never "nothing published" on stdout
    assert st.returncode == 2 and "storage problem" in st.stderr and MOUNTED in st.stderr, st.stderr
    assert "TIER" in st.stdout   # (the local tiers are still shown)
    assert js.returncode == 2 and json.loads(js.stdout)["problems"][0]["where"] == "cold"
    assert check.returncode == 2 and "FAIL  cold" in check.stdout and MOUNTED in check.stdout, check.stdout
    assert "Traceback" not in check.stderr and len(check.stderr.strip().splitlines()) == 1, check.stderr
    assert install.returncode == 0   # (what an image build or ExecStartPre asks)
    assert doc.returncode == 7, doc.stderr
    finding = next(f for f in json.loads(doc.stdout)["findings"] if f["id"] == "cold-unavailable")
    assert finding["severity"] == "critical" and "mount cold storage" in finding["recommendation"]
    assert "chmod" not in finding["recommendation"]
    assert not bare.cold.exists()   # nothing was made by asking
    # the first publish makes the store (and its marker): from then on it is an ordinary empty-then-full store
    _publish(wdb, bare.tmp)
    assert (bare.cold / COLD_MARKER).is_file()
    assert wdb("--no-daemon", "ls").returncode == 0 and wdb("--no-daemon", "status").returncode == 0


def test_an_empty_mount_point_is_not_an_empty_catalog(wdb, bare: NodeEnv) -> None:
    """The NFS share is not mounted: its mount point is an empty directory. A store once published to
    carries a marker, so the difference shows; an empty directory without it is refused."""
    _publish(wdb, bare.tmp)
    assert wdb("--no-daemon", "preload", "acme/m@v1", "--tier", "warm").returncode == 0
    away = bare.tmp / "cold.away"
    bare.cold.rename(away)
    bare.cold.mkdir()                       # the mount point, nothing mounted on it
    r = wdb("--no-daemon", "ls")
    assert_one_line_error(r, 2, "empty directory", COLD_MARKER, MOUNTED)
    assert_one_line_error(wdb("--no-daemon", "preload", "acme/m"), 2, MOUNTED)   # the latest: unknowable
    # a version held here still serves (into hot from warm, and its path), cold storage away or not
    r = wdb("--no-daemon", "preload", "acme/m@v1")
    assert r.returncode == 0 and r.stdout.strip().endswith("acme/m/v1"), r.stderr
    assert wdb("--no-daemon", "path", "acme/m@v1").returncode == 0
    # a version not held here is not "not published": it is "cold storage is not there"
    assert_one_line_error(wdb("--no-daemon", "preload", "acme/m@v9"), 2, MOUNTED)
    # nor does publish take the empty mount point for a new store (it would become one on the wrong
    # file system, for good): it says so, and how to mark a store that really is new and empty
    src = make_checkpoint(bare.tmp / "src-v2", total_bytes=1 * MiB, shards=1, layers=1, seed="v2")
    r = wdb("--no-daemon", "publish", src, "--name", "acme/m", "--version", "v2")
    assert_one_line_error(r, 2, MOUNTED, f"touch {bare.cold}/{COLD_MARKER}")
    assert os.listdir(bare.cold) == []
    os.rmdir(bare.cold)
    away.rename(bare.cold)                  # mounted again
    assert wdb("--no-daemon", "ls").returncode == 0
    # a new, empty store marked by hand is one
    fresh = bare.tmp / "fresh"
    fresh.mkdir()
    (fresh / COLD_MARKER).touch()
    bare.config.write_text(bare.config.read_text().replace(f'path = "{bare.cold}"', f'path = "{fresh}"'))
    assert wdb("--no-daemon", "publish", src, "--name", "acme/m", "--version", "v2").returncode == 0


def test_a_store_published_before_the_marker_is_still_read(wdb, bare: NodeEnv) -> None:
    _publish(wdb, bare.tmp)
    (bare.cold / COLD_MARKER).unlink()      # as a store written by an older weightd
    r = wdb("--no-daemon", "ls", "--json")
    assert r.returncode == 0 and [v["version"] for v in json.loads(r.stdout)["versions"]] == ["v1"]
    _publish(wdb, bare.tmp, "v2")           # and the next publish marks it
    assert (bare.cold / COLD_MARKER).is_file()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")
def test_real_mounts_empty_and_read_only(wdb, bare: NodeEnv) -> None:
    """A real (empty) tmpfs mounted where cold storage should be, then the store bind-mounted read-only:
    the first is refused as unmounted-looking, the second reads (workers mount cold read-only) and a
    publish into it fails in one line, leaving nothing behind."""
    _publish(wdb, bare.tmp)
    store = bare.tmp / "store"
    bare.cold.rename(store)
    bare.cold.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(bare.cold)], check=True, timeout=30)
    try:
        assert_one_line_error(wdb("--no-daemon", "ls"), 2, "empty directory", MOUNTED)
        src = make_checkpoint(bare.tmp / "src-v3", total_bytes=1 * MiB, shards=1, layers=1, seed="v3")
        assert_one_line_error(wdb("--no-daemon", "publish", src, "--name", "acme/m", "--version", "v3"), 2, MOUNTED)
        assert os.listdir(bare.cold) == []
    finally:
        subprocess.run(["umount", str(bare.cold)], check=True, timeout=30)
    subprocess.run(["mount", "--bind", "-o", "ro", str(store), str(bare.cold)], check=True, timeout=30)
    try:
        r = wdb("--no-daemon", "ls", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["versions"][0]["version"] == "v1", r.stderr
        assert wdb("--no-daemon", "preload", "acme/m@v1", "--tier", "warm").returncode == 0
        assert wdb("serve", "--check").returncode == 0
        src = make_checkpoint(bare.tmp / "src-v2", total_bytes=1 * MiB, shards=1, layers=1, seed="v2")
        r = wdb("--no-daemon", "publish", src, "--name", "acme/m", "--version", "v2")
        assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2
        assert "read-only" in r.stderr.lower(), r.stderr
        assert not (store / "acme/m/v2").exists()
    finally:
        subprocess.run(["umount", str(bare.cold)], check=True, timeout=30)


def test_a_tier_on_a_missing_mount_is_never_made_on_the_root_fs(weightd: Weightd, node_env: NodeEnv,
                                                                 tmp_path: Path) -> None:
    """[tiers.warm] on /mnt/...: with its parent absent (the NVMe not mounted) weightd refuses to make the
    parents (that would fill the root file system) and says why; inside $HOME it still makes them."""
    _publish(lambda *a, **k: weightd("--config", node_env.config, *a, **k), tmp_path)
    gone = Path(f"/mnt/weightd-test-nvme-{os.getpid()}")
    assert not gone.exists()
    cfg = node_env.config.read_text().replace(f'path = "{node_env.warm}"', f'path = "{gone}/weightd"')
    node_env.config.write_text(cfg)
    r, st, check = weightd.at_once(*(["--config", node_env.config, *a] for a in (
        ["--no-daemon", "preload", "acme/m@v1", "--tier", "warm"], ["--no-daemon", "status"], ["serve", "--check"])))
    assert_one_line_error(r, 2, f"{gone} does not exist", MOUNTED)
    assert not gone.exists()
    assert st.returncode == 2 and f"{gone} does not exist" in st.stderr
    assert check.returncode == 2 and "FAIL  tier warm" in check.stdout
    # cold storage below a missing mount is not made by publish either
    cfg = node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{gone}/models"')
    node_env.config.write_text(cfg)
    src = make_checkpoint(tmp_path / "src-v2", total_bytes=1 * MiB, shards=1, layers=1, seed="v2")
    r = weightd("--config", node_env.config, "--no-daemon", "publish", src, "--name", "acme/m", "--version", "v2")
    assert_one_line_error(r, 2, f"{gone} does not exist", MOUNTED)
    assert not gone.exists()


def test_the_daemon_is_not_ready_without_its_cold_storage(bare: NodeEnv, isolated_env, wdb, tmp_path: Path) -> None:
    """serve starts (a copy held here still serves) but /readyz fails naming the path, status says so,
    and once cold storage is there readiness comes back by itself."""
    d = DaemonProc(bare, isolated_env, tmp_path)
    try:
        code, body = _readyz(d.port)
        assert code == 503 and MOUNTED in body["reason"] and str(bare.cold) in body["reason"], body
        st, pre, ls = wdb.at_once(["status", "--json"], ["--daemon-only", "preload", "acme/m@v1"],
                                  ["--daemon-only", "ls"])
        assert st.returncode == 2 and json.loads(st.stdout)["answered_by"] == "daemon"
        assert json.loads(st.stdout)["problems"][0]["path"] == str(bare.cold)
        assert_one_line_error(pre, 2, MOUNTED)
        assert_one_line_error(ls, 2, MOUNTED)
        assert "storage problem" in d.log_path.read_text()
        _publish(wdb, tmp_path)                # the store appears (mounted, or published to)
        deadline = time.monotonic() + 30       # (the daemon looks every 10 s)
        while _readyz(d.port)[0] != 200:
            assert time.monotonic() < deadline, _readyz(d.port)
            time.sleep(0.5)
        st = wdb("status", "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["problems"] == []
        assert wdb("--daemon-only", "preload", "acme/m@v1").returncode == 0
    finally:
        d.stop()
