"""``weightd hold``: the restart-safe serving pattern (a native sidecar beside vLLM), against a real daemon
subprocess: the path appears once the copy is ready, the lease outlives its own length while hold runs,
a copy evicted or deleted under it (also while the daemon was down) is preloaded again and the path
rewritten, SIGTERM releases and exits 0, and bad input is one line with its exit code."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from .conftest import ROOT, assert_one_line_error, stop_process
from .test_daemon import DaemonProc, daemon, publish  # noqa: F401 (daemon: the fixture)


class HoldProc:
    """``weightd hold ...`` running in the background, stdout and stderr in files; always stopped."""

    def __init__(self, env: dict[str, str], config: Path, tmp: Path, *args: str) -> None:
        self.out, self.err = tmp / "hold.out", tmp / "hold.err"
        self._out, self._err = open(self.out, "w"), open(self.err, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(config), "hold", *args],
                                     stdout=self._out, stderr=self._err, env=env, cwd=ROOT)

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_until(self, what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"hold exited {self.proc.returncode} waiting for {what}: {self.stderr()}")
            time.sleep(0.05)
        raise AssertionError(f"{what}: not within {timeout} s; hold said: {self.stderr()}")

    def stop(self) -> int | None:
        rc = stop_process(self.proc)
        self._out.close()
        self._err.close()
        return rc


@pytest.fixture
def hold(isolated_env, node_env, tmp_path: Path):
    procs: list[HoldProc] = []

    def start(*args: str) -> HoldProc:
        h = HoldProc(isolated_env, node_env.config, tmp_path, *args)
        procs.append(h)
        return h
    yield start
    for h in procs:
        h.stop()


def leases_of(wd, pid: int) -> list[dict]:
    st = json.loads(wd("status", "--json").stdout)
    return [le for c in st["checkpoints"] for t in c["tiers"].values() for le in t["leases"]
            if le["holder"] and le["holder"].startswith(f"pid {pid} ")]


def test_hold_writes_the_path_keeps_the_copy_past_its_lease_and_releases_on_sigterm(
        daemon, wd, node_env, hold, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    path_file = tmp_path / "handoff" / "model-path"
    path_file.parent.mkdir()
    h = hold("org/d@v1", "--path-file", str(path_file), "--lease", "2", "--every", "0.5")
    # the startup probe's test -s: the file appears only once the copy is ready, whole
    h.wait_until("the path file", lambda: path_file.exists() and path_file.stat().st_size > 0)
    want = str(node_env.hot / "org/d/v1")
    assert path_file.read_text() == want + "\n"
    assert (node_env.hot / "org/d/v1/.weightd/manifest.json").is_file()
    h.wait_until("the path on stdout", lambda: h.out.read_text() == want + "\n")
    assert not list(path_file.parent.glob(".*incomplete"))
    # three lease lengths later the copy is still leased, by hold's pid, and a plain evict is refused
    time.sleep(6)
    assert h.proc.poll() is None, h.stderr()
    assert len(leases_of(wd, h.proc.pid)) == 1
    refused = wd("evict", "org/d@v1")
    assert_one_line_error(refused, 1, "leased in hot by pid", str(h.proc.pid))
    assert (node_env.hot / "org/d/v1").is_dir()
    # SIGTERM: exit 0, the lease released, the path file gone; nothing keeps the copy now
    h.proc.send_signal(signal.SIGTERM)
    assert h.proc.wait(timeout=15) == 0, h.stderr()
    assert "Traceback" not in h.stderr() and "released org/d@v1" in h.stderr()
    assert not path_file.exists()
    assert leases_of(wd, h.proc.pid) == []
    assert wd("evict", "org/d@v1").returncode == 0


def test_a_plain_preload_lease_lapses_without_hold(daemon, wd, node_env, tmp_path: Path) -> None:
    """The control: the same copy with the init-container's one-shot lease is evictable once it ends."""
    publish(wd, tmp_path)
    assert wd("preload", "org/d@v1", "--lease", "1").returncode == 0
    time.sleep(2)
    assert wd("evict", "org/d@v1").returncode == 0


def test_hold_preloads_again_when_the_copy_is_evicted_or_deleted(daemon, wd, node_env, hold, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    path_file = tmp_path / "model-path"
    h = hold("org/d", "--path-file", str(path_file), "--lease", "30", "--every", "0.3")   # (latest: v1)
    h.wait_until("the path file", lambda: path_file.exists())
    want = str(node_env.hot / "org/d/v1")
    assert path_file.read_text().strip() == want
    publish(wd, tmp_path, version="v2")   # a newer version: hold stays on the one it resolved
    for n, take_away in enumerate((lambda: wd("evict", "org/d@v1", "--force").returncode == 0,
                                   lambda: shutil.rmtree(node_env.hot / "org/d/v1") is None), start=1):
        assert take_away()
        h.wait_until(f"notice {n}", lambda: h.stderr().count("is gone from the hot tier") == n)
        h.wait_until(f"ready again {n}", lambda: h.stderr().count("is ready again") == n)
        assert path_file.read_text().strip() == want
        assert (node_env.hot / "org/d/v1/.weightd/manifest.json").is_file()
        assert not (node_env.hot / "org/d/v2").exists()
    assert h.out.read_text().splitlines() == [want] * 3
    assert h.stop() == 0


def test_hold_survives_a_daemon_restart_that_lost_the_copy(daemon, wd, node_env, hold, isolated_env,
                                                             tmp_path: Path) -> None:
    publish(wd, tmp_path)
    path_file = tmp_path / "model-path"
    h = hold("org/d@v1", "--path-file", str(path_file), "--lease", "30", "--every", "0.3")
    h.wait_until("the path file", lambda: path_file.exists())
    daemon.stop()
    h.wait_until("noticing the daemon is gone", lambda: "does not answer" in h.stderr())
    assert path_file.exists()   # nothing evicts while no daemon runs: the path stays valid
    shutil.rmtree(node_env.hot / "org/d/v1")   # ... and the daemon comes back without the copy
    node_env.write_config(node_env.hot_capacity, node_env.warm_capacity)
    again_dir = tmp_path / "again"
    again_dir.mkdir()
    again = DaemonProc(node_env, isolated_env, again_dir)
    try:
        h.wait_until("the daemon back", lambda: "answers again" in h.stderr())
        h.wait_until("ready again", lambda: "is ready again" in h.stderr())
        assert path_file.read_text().strip() == str(node_env.hot / "org/d/v1")
        assert (node_env.hot / "org/d/v1/.weightd/manifest.json").is_file()
        assert h.stop() == 0
        assert not path_file.exists()
    finally:
        again.stop()


def test_hold_bad_input_is_one_line_with_its_exit_code(daemon, wd, tmp_path: Path) -> None:
    publish(wd, tmp_path)   # (cold storage exists: a missing one is its own error)
    path_file = tmp_path / "model-path"
    for args, code, needle in (
            (["hold", "../x"], 2, "name"),
            (["hold", "org/d@v1", "--every", "5", "--lease", "2"], 2, "--every"),
            (["hold", "org/d@v1", "--lease", "0"], 2, "--lease"),
            (["hold", "org/d@v1", "--path-file", str(tmp_path / "no/such/dir/p")], 2, "does not exist"),
            (["--no-daemon", "hold", "org/d@v1"], 2, "node daemon only"),
            (["hold", "org/none@v1", "--path-file", str(path_file)], 3, "org/none@v1")):
        proc = wd(*args, timeout=60)
        assert_one_line_error(proc, code, needle)
        assert proc.stdout == ""
    assert not path_file.exists()


def test_hold_without_a_daemon_never_copies_in_process(wd, node_env, tmp_path: Path) -> None:
    proc = wd("hold", "org/d@v1", "--path-file", str(tmp_path / "p"), timeout=60)
    assert_one_line_error(proc, 1, "does not answer", "never copies in-process")
    assert not (tmp_path / "p").exists() and not node_env.hot.exists()
