"""A delta donor is held with a shared lock while it lends (docs/sources.md, Delta updates): while a
delta build of v2 reads v1, not even ``evict --force`` (which passes over leases, pins and open files)
removes v1. Real parts: the CLI, cold storage on a real FUSE file server slowed to a busy one's rate
(tests/fuse_hang.py) so the build lasts, and the kernel's lock table (/proc/locks) to see it hold v1."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering import build_manifest, read_header, verify_checkpoint
from tiering.sample import make_checkpoint, mutate_tensor

from .conftest import ROOT, stop_process

MiB = 1 << 20


def flock_held(pid: int, path: Path) -> str | None:
    """The mode ("READ" or "WRITE") of a flock ``pid`` holds on ``path``, from /proc/locks."""
    ino = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if f[1] == "FLOCK" and f[4] == str(pid) and f[5].rsplit(":", 1)[-1] == str(ino):
            return f[3]
    return None


@pytest.mark.xfail(strict=False, reason="open defect, 2026-12-05: about 1 run in 3 since the one-pass copy (c024715), evict --force of the donor succeeds while the stopped build holds its lock shared; under investigation")
def test_a_donor_cannot_be_evicted_while_a_delta_build_reads_it(node_env, wd, isolated_env, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    from .test_trust import HungCold
    v1 = make_checkpoint(tmp_path / "v1", total_bytes=4 * MiB, shards=1, layers=4, seed="donor")
    v2 = tmp_path / "v2"
    shutil.copytree(v1, v2, ignore=shutil.ignore_patterns(".weightd"))
    shard = sorted(v2.glob("*.safetensors"))[0]
    changed = mutate_tensor(shard, read_header(shard).tensors[1].name, "v2")
    for version, src in (("v1", v1), ("v2", v2)):
        r = wd("--no-daemon", "publish", src, "--name", "org/d", "--version", version)
        assert r.returncode == 0, r.stderr
    r = wd("--no-daemon", "preload", "org/d@v1", "--tier", "warm")
    assert r.returncode == 0, r.stderr
    donor, donor_lock = node_env.warm / "org/d/v1", node_env.warm / ".locks/org--d@v1.lock"
    assert donor_lock.is_file()

    # the same cold storage through a file server that sends 128 KiB/s: v2's changed tensor (the bytes
    # no donor has) takes seconds to read, while v1 lends the rest
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    fs = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", "//never//", rate=128 << 10)   # (at 512 KiB/s a clean-clone CI run saw the build end before a poll)
    slow = tmp_path / "slow.toml"
    slow.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{mnt}"'))
    build = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(slow), "--no-daemon", "preload",
                              "org/d@v2", "--tier", "warm", "--json", "--timeout", "120"],
                             env=isolated_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        deadline = time.monotonic() + 60
        while flock_held(build.pid, donor_lock) is None:   # the build holds v1 (shared) while it lends
            assert build.poll() is None and time.monotonic() < deadline, (build.poll(), fs.path)
            time.sleep(0.01)
        build.send_signal(signal.SIGSTOP)   # caught in the act, whatever the machine's speed
        stopped = True
        assert flock_held(build.pid, donor_lock) == "READ"
        r = wd("evict", "org/d@v1", "--tier", "warm", "--force")
        assert r.returncode == 1 and "org/d@v1" in r.stderr and "another weightd is working on it" in r.stderr, \
            (r.returncode, r.stderr)
        assert donor.is_dir() and (donor / ".weightd/manifest.json").is_file()
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
