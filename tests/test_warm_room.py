"""Warming after placement reads only what can stay resident (issue 35), in a real cgroup-v1 memory
cgroup: the room is read from the cgroup (and its ancestors) of this process and of the callers
named; a preload whose checkpoint is larger than that room places it without reading it again (the
report says why), and one that fits is warmed whole. The bytes a preload's process read from the
device are the kernel's own count for that process (``wait4``'s ``ru_inblock``): other work on the
machine does not enter it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tiering.content.units import format_bytes
from tiering.pagecache import drop_from_cache, page_cache_room
from tiering.sample import make_checkpoint

from .conftest import ROOT

MiB = 1 << 20
CG = Path("/sys/fs/cgroup/memory")
pytestmark = pytest.mark.root


@pytest.fixture
def memcg():
    """A fresh child of the v1 memory hierarchy, with a limit set by the test; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    if not (CG / "memory.limit_in_bytes").is_file():
        pytest.skip("cgroup v1 memory is not mounted at /sys/fs/cgroup/memory")
    d = CG / f"weightd-test-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    try:
        yield d
    finally:
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                (CG / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        d.rmdir()


def in_cgroup(cg: Path, cmd: list[str], env: dict[str, str]) -> tuple[int, str, str, int]:
    """``cmd`` run inside ``cg``: (exit code, stdout, stderr, bytes its processes read from storage)."""
    import tempfile
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh", *cmd], stdout=out,
                             stderr=err, env=env, cwd=ROOT, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read(), usage.ru_inblock * 512


def test_room_is_the_cgroups_limit_less_what_reclaim_cannot_drop(memcg: Path) -> None:
    """A process in a 256 MiB cgroup holding 64 MiB of anonymous memory: its room is about 192 MiB and
    names the cgroup; the same asked for by pid from outside it; unlimited, it is MemAvailable."""
    (memcg / "memory.limit_in_bytes").write_text(str(256 * MiB))
    code = ("import sys, json; from tiering.pagecache import page_cache_room; held = bytearray(64 << 20); "
            "held[::4096] = b'x' * len(held[::4096]); r = page_cache_room(); print(json.dumps([r.bytes, r.what])); "
            "sys.stdout.flush(); sys.stdin.read()")
    p = subprocess.Popen(["sh", "-c", f'echo $$ > {memcg}/cgroup.procs && exec "$@"', "sh", sys.executable, "-c", code],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        room, what = json.loads(p.stdout.readline())
        assert what == f"the memory cgroup /{memcg.name} (limit 256.0 MiB)", what
        assert 150 * MiB < room < 192 * MiB, room / MiB      # (the interpreter's own memory is held too)
        outside = page_cache_room([p.pid])                    # a daemon asking for its caller
        assert outside.what == what and abs(outside.bytes - room) < 16 * MiB
    finally:
        p.communicate("", timeout=30)
    assert page_cache_room().what == "MemAvailable"


@pytest.mark.parametrize("limit,fits", [(192 * MiB, False), (1024 * MiB, True)], ids=["too-small", "fits"])
def test_preload_warms_only_what_can_stay_resident(node_env, isolated_env, memcg: Path, tmp_path: Path,
                                                   limit: int, fits: bool) -> None:
    """A 384 MiB checkpoint preloaded cold -> warm by the real CLI inside the cgroup, the cold copy out
    of the page cache first. Too small: placed, not warmed ("warm_skipped" names the cgroup), and the
    process read the checkpoint from the device once (not once more to verify, nor to warm; `cp -r`
    there reads 1.4-1.5x). Large enough: warmed whole."""
    src = make_checkpoint(tmp_path / "src", total_bytes=384 * MiB, shards=2, layers=4, seed="room")
    with node_env.node() as n:
        n.publish(src, "org/m", "v1")
    cold = node_env.cold / "org/m/v1"
    total = sum(p.stat().st_size for p in cold.rglob("*") if p.is_file() and ".weightd" not in p.parts)
    for p in cold.rglob("*"):
        if p.is_file():
            drop_from_cache(p)
    (memcg / "memory.limit_in_bytes").write_text(str(limit))
    code, out, err, read = in_cgroup(memcg, [sys.executable, "-m", "weightd", "--config", str(node_env.config),
                                             "--no-daemon", "preload", "org/m@v1", "--tier", "warm", "--lease", "0",
                                             "--json"], {**isolated_env, "PYTHONPATH": str(ROOT)})
    assert code == 0, err
    rep = json.loads(out)
    assert rep["warm"]["limited_by"] == f"the memory cgroup /{memcg.name} (limit {format_bytes(limit)})", rep["warm"]
    if fits:
        assert rep["warm_skipped"] is None and rep["resident_percent"] > 95, rep
        # the copy is still resident after the one-pass copy: nothing to warm; dropped from the cache, the
        # next preload (already there) warms it whole
        for p in (node_env.warm / "org/m/v1").rglob("*"):
            if p.is_file():
                drop_from_cache(p)
        code, out, err, read = in_cgroup(memcg, [sys.executable, "-m", "weightd", "--config", str(node_env.config),
                                                 "--no-daemon", "preload", "org/m@v1", "--tier", "warm", "--lease",
                                                 "0", "--json"], {**isolated_env, "PYTHONPATH": str(ROOT)})
        rep = json.loads(out)
        assert rep["already_present"] and rep["warm"]["warmed_bytes"] > 0.95 * total, rep
        assert rep["resident_percent"] > 95 and 0.95 * total < read < 1.15 * total, (read / total, rep)
    else:
        assert rep["warm_skipped"] == (f"checkpoint {format_bytes(total)} > {format_bytes(rep['warm']['room_bytes'])} "
                                       f"the memory cgroup /{memcg.name} (limit 192.0 MiB) can hold"), rep
        assert rep["warm"]["warmed_bytes"] == 0 and rep["resident_percent"] < 60, rep
        # once from cold (the interpreter's own files, evicted and read again under the limit, add a
        # few MiB; nothing of the checkpoint is read back)
        assert 0.95 * total < read < 1.15 * total, (read / total, rep)


def test_a_daemon_warms_only_what_its_callers_cgroup_can_hold(node_env, isolated_env, memcg: Path,
                                                              tmp_path: Path) -> None:
    """The daemon runs outside any limit; the caller (a CLI in a 192 MiB cgroup, as a serving pod
    would be) asks it for a 384 MiB checkpoint: the daemon reads its caller's cgroup (the socket's
    SO_PEERCRED pid) and places the copy without warming it; the same request from outside the
    cgroup warms it whole."""
    from .test_daemon import DaemonProc
    src = make_checkpoint(tmp_path / "src", total_bytes=384 * MiB, shards=2, layers=4, seed="caller")
    with node_env.node() as n:
        n.publish(src, "org/c", "v1")
    (memcg / "memory.limit_in_bytes").write_text(str(192 * MiB))
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        env = {**isolated_env, "PYTHONPATH": str(ROOT)}
        cli = [sys.executable, "-m", "weightd", "--config", str(node_env.config), "--daemon-only"]
        code, out, err, _ = in_cgroup(memcg, [*cli, "preload", "org/c@v1", "--tier", "warm", "--lease", "0", "--json"],
                                      env)
        assert code == 0, err
        rep = json.loads(out)
        limit = f"the memory cgroup /{memcg.name} (limit 192.0 MiB)"
        assert rep["warm"]["limited_by"] == limit and rep["warm"]["warmed_bytes"] == 0, rep["warm"]
        assert rep["warm_skipped"] is not None and rep["warm_skipped"].endswith(f"{limit} can hold"), rep
        for p in (node_env.warm / "org/c/v1").rglob("*"):
            if p.is_file():
                drop_from_cache(p)
        p = subprocess.run([*cli, "preload", "org/c@v1", "--tier", "warm", "--lease", "0", "--json"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        rep = json.loads(p.stdout)
        assert rep["warm"]["limited_by"] != limit and rep["warm_skipped"] is None, rep
        assert rep["resident_percent"] > 95, rep
    finally:
        d.stop()
