"""A delta donor is held with a shared lock while it lends (docs/sources.md, Delta updates): while a
delta build of v2 reads v1, not even ``evict --force`` (which passes over leases, pins and open files)
removes v1. Real parts: the CLI, cold storage on a real FUSE file server slowed to a busy one's rate
(tests/fuse_hang.py) so the build lasts, and the kernel's lock table (/proc/locks) to see it hold v1.

The build is caught by what the kernel shows, never by timing: v1's lock held shared and a v1 file open
(/proc/locks, /proc/PID/fd), then SIGSTOP, then every thread of the build stopped (/proc/PID/task: the
signal is only queued when kill returns, and a thread in a FUSE read stops when the read answers)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering import build_manifest, read_header, verify_checkpoint
from tiering.sample import make_checkpoint, mutate_tensor

from .conftest import ROOT, assert_one_line_error, stop_process

MiB = 1 << 20


def flock_held(pid: int, path: Path) -> str | None:
    """The mode ("READ" or "WRITE") of a flock ``pid`` holds on ``path``, from /proc/locks."""
    ino = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if f[1] == "FLOCK" and f[4] == str(pid) and f[5].rsplit(":", 1)[-1] == str(ino):
            return f[3]
    return None


def open_files_under(pid: int, root: Path) -> list[str]:
    """The regular files under ``root`` that ``pid`` has open (/proc/PID/fd)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target, st = os.readlink(f"/proc/{pid}/fd/{fd}"), os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:   # (closed meanwhile)
            continue
        if target.startswith(f"{root}/") and stat.S_ISREG(st.st_mode):
            out.append(target)
    return out


def all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in the stopped state (T): none can run, so none can release a lock."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            line = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:   # (a thread that ended)
            continue
        states.append(line[line.rindex(")") + 2])
    return bool(states) and set(states) == {"T"}


def test_a_donor_cannot_be_evicted_while_a_delta_build_reads_it(node_env, wd, isolated_env, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    from .test_trust import HungCold
    v1 = make_checkpoint(tmp_path / "v1", total_bytes=4 * MiB, shards=1, layers=4, seed="donor")
    v2 = tmp_path / "v2"
    shutil.copytree(v1, v2, ignore=shutil.ignore_patterns(".weightd"))
    shard = sorted(v2.glob("*.safetensors"))[0]
    biggest = max(read_header(shard).tensors, key=lambda t: t.nbytes)   # (the embedding, 256 KiB)
    changed = mutate_tensor(shard, biggest.name, "v2")
    for version, src in (("v1", v1), ("v2", v2)):
        r = wd("--no-daemon", "publish", src, "--name", "org/d", "--version", version)
        assert r.returncode == 0, r.stderr
    r = wd("--no-daemon", "preload", "org/d@v1", "--tier", "warm")
    assert r.returncode == 0, r.stderr
    donor, donor_lock = node_env.warm / "org/d/v1", node_env.warm / ".locks/org--d@v1.lock"
    assert donor_lock.is_file()

    # the same cold storage through a file server that sends 128 KiB/s: v2's changed tensor (the bytes
    # no donor has) takes seconds to read, with v1 locked and its shard open. (A 256-byte tensor took
    # 2 ms: the build held v1 for 20-60 ms in all, and a 10 ms poll missed it on a busy machine.)
    rate = 128 << 10
    assert changed >= 2 * rate, changed
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    fs = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", "//never//", rate=rate)
    slow = tmp_path / "slow.toml"
    slow.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{mnt}"'))
    build = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(slow), "--no-daemon", "preload",
                              "org/d@v2", "--tier", "warm", "--json", "--timeout", "120"],
                             env=isolated_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        deadline = time.monotonic() + 60
        # the build holds v1 (shared) while it lends, and reads it
        while flock_held(build.pid, donor_lock) is None or not open_files_under(build.pid, donor):
            assert build.poll() is None and time.monotonic() < deadline, (build.poll(), fs.path)
            time.sleep(0.01)
        build.send_signal(signal.SIGSTOP)   # caught in the act, whatever the machine's speed
        stopped = True
        while not all_stopped(build.pid):   # (kill returns before the threads stop)
            assert build.poll() is None and time.monotonic() < deadline, build.poll()
            time.sleep(0.01)
        assert flock_held(build.pid, donor_lock) == "READ" and open_files_under(build.pid, donor)
        assert not (node_env.warm / "org/d/v2").exists()   # (stopped mid-build: nothing placed yet)
        r = wd("evict", "org/d@v1", "--tier", "warm", "--force")
        assert_one_line_error(r, 1, "org/d@v1", "another weightd is working on it")
        assert donor.is_dir() and (donor / ".weightd/manifest.json").is_file()
        assert flock_held(build.pid, donor_lock) == "READ"
        build.send_signal(signal.SIGCONT)
        stopped = False
        out, err = build.communicate(timeout=120)
    finally:
        if stopped:
            build.send_signal(signal.SIGCONT)
        stop_process(build)
        for pipe in (build.stdout, build.stderr):   # (closed on a failure too: no ResourceWarning in a later test)
            pipe.close()
        fs.release()
    assert build.returncode == 0, err
    rep = json.loads(out)
    by = rep["bytes_by_source"]
    # (from cold: the changed tensor, no more; the rest from the donor)
    assert rep["delta"]["donors"] == ["org/d@v1"] and by["cold"] == changed, (changed, rep)
    assert by["local_reuse"] == rep["bytes"] - changed, rep
    assert verify_checkpoint(node_env.warm / "org/d/v2", build_manifest(v2)).ok
    # the build over, nothing holds v1 but its lease, which --force passes over
    assert flock_held(build.pid, donor_lock) is None
    r = wd("evict", "org/d@v1", "--tier", "warm", "--force")
    assert r.returncode == 0, r.stderr
    assert not donor.exists()
