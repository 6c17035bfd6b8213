"""kill -9 at random moments of a preload: no partial NAME/VERSION ever exists, the next one completes."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering import verify_checkpoint
from tiering.versions import list_versions
from tiering.sample import make_checkpoint

MiB = 1 << 20


def _staging_files(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file in the tier's staging areas: path -> (inode, mtime_ns, size)."""
    out = {}
    try:
        for d in (root / ".staging").iterdir():
            if d.is_dir():
                for f in d.rglob("*"):
                    try:
                        st = f.stat()
                    except OSError:
                        continue
                    if f.is_file():
                        out[str(f)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:  # staging and its areas come and go while we look
        pass
    return out


def _written_since(root: Path, before: dict[str, tuple[int, int, int]]) -> bool:
    """Whether a staging file was created or written after ``before`` was taken (an earlier round's
    leftovers, as they were, do not count)."""
    return any(before.get(k) != v for k, v in _staging_files(root).items())


def _wait_for_staging(p: subprocess.Popen, root: Path, before: dict[str, tuple[int, int, int]],
                      deadline: float) -> None:
    """Poll (1 ms) until this round's preload wrote a staging file, the preload ends, or the deadline passes."""
    while p.poll() is None and time.monotonic() < deadline:
        if _written_since(root, before):
            return
        time.sleep(0.001)


@pytest.mark.slow
def test_kill_9_at_random_points(node_env, isolated_env, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=96 * MiB, shards=3, layers=4)
    with node_env.node() as n:
        n.publish(src, "org/crash", "v1")
        manifest = n.resolve("org/crash", "v1").manifest

    def preload_cmd(tier: str) -> list[str]:
        return [sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload", "org/crash@v1",
                "--tier", tier, "--lease", "0"]

    def check(tier_root: Path) -> bool:
        """A version directory is either absent or complete and verified."""
        path = tier_root / "org/crash/v1"
        if not path.exists():
            return False
        assert [v.ref for v in list_versions(tier_root)] == ["org/crash@v1"], "partial version is visible"
        assert verify_checkpoint(path, manifest).ok
        return True

    # how long does one full preload take, process start included?
    t0 = time.monotonic()
    subprocess.run(preload_cmd("warm"), env=isolated_env, check=True, capture_output=True, timeout=120)
    wall = time.monotonic() - t0
    rng = random.Random(1234)
    outcomes = {"absent": 0, "complete": 0, "killed_mid_copy": 0}
    for i in range(14):
        tier = ("warm", "hot")[i % 2]
        root = node_env.warm if tier == "warm" else node_env.hot
        shutil.rmtree(root / "org", ignore_errors=True)  # start from nothing in this tier
        before = _staging_files(root)  # (an earlier round's leftovers: this round must write its own)
        p = subprocess.Popen(preload_cmd(tier), env=isolated_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 3 == 2:
            # most of a small preload's wall time is the interpreter starting, so a random moment alone may
            # never land inside the copy (seen in CI: 0 of 14): every third round waits for staging to fill
            _wait_for_staging(p, root, before, deadline=time.monotonic() + wall * 3 + 5)
            time.sleep(rng.uniform(0, 0.01))
        else:
            time.sleep(rng.uniform(0.05, wall * 1.1))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        outcomes["complete" if check(root) else "absent"] += 1
        # killed mid-copy: this round's own staging bytes were left behind (not an earlier round's)
        outcomes["killed_mid_copy"] += p.returncode == -signal.SIGKILL and _written_since(root, before)
    assert outcomes["killed_mid_copy"] > 0, outcomes  # some kills did land while staging was being filled

    # the next preload completes and reconciliation removed every stale staging area
    for tier, root in (("warm", node_env.warm), ("hot", node_env.hot)):
        proc = subprocess.run(preload_cmd(tier), env=isolated_env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert check(root)
        assert not [p for p in (root / ".staging").iterdir()], list((root / ".staging").iterdir())
