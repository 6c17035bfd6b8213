"""Durable when publish and preload return (docs/tiers.md): every file is ``fsync``ed (or its file
system ``syncfs``ed) before the version is renamed into place, every directory made on the way is
``fsync``ed, and so is ``NAME/`` after the rename. Observed, not assumed: the real CLI runs under
``strace -f -y`` (installed by scripts/install-tools.sh), which records each fsync/fdatasync/syncfs and
rename with the path of the descriptor it was made on, in the order the kernel saw them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

from .conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace missing (scripts/install-tools.sh)")

LEADER = re.compile(r"^(\d+)\s+(.*)$")
CALL = re.compile(r'^(?P<call>fsync|fdatasync|syncfs|renameat2|renameat|rename)\((?P<args>.*)\)\s+=\s+(?P<rc>-?\d+)')
FD_PATH = re.compile(r"\d+<(?P<path>[^>]*)>")


def traced(isolated_env: dict[str, str], config: Path, log: Path, *args: str, env: dict[str, str] | None = None):
    """``weightd --no-daemon ARGS`` under strace; returns (the process, :func:`parse_calls`)."""
    cmd = ["strace", "-f", "-qq", "-y", "-e", "signal=none",
           "-e", "trace=fsync,fdatasync,syncfs,rename,renameat,renameat2", "-o", str(log),
           sys.executable, "-m", "weightd", "--config", str(config), "--no-daemon", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**isolated_env, **(env or {})}, cwd=ROOT)
    return r, parse_calls(log.read_text())


def parse_calls(log: str) -> list[tuple[str, str, list[str]]]:
    """[(call, args, paths)] of the calls that succeeded, in the order they returned. strace pads the
    pid column to five characters ("%-5u "), so a pid under 10000 is followed by more than one space;
    a call that another thread's came between is split into "<unfinished ...>" and "<... resumed>"
    lines, joined here (two copy threads fsyncing at once do that, more often on a busy machine)."""
    calls, unfinished = [], {}
    for line in log.splitlines():
        pid, rest = LEADER.match(line).groups()
        if rest.endswith("<unfinished ...>"):
            unfinished[pid] = rest.removesuffix("<unfinished ...>").rstrip()
            continue
        if rest.startswith("<... ") and pid in unfinished:
            rest = unfinished.pop(pid) + rest.split("resumed>", 1)[1]
        m = CALL.match(rest)
        if m and m["rc"] == "0":
            calls.append((m["call"], m["args"], [p["path"] for p in FD_PATH.finditer(m["args"])]))
    return calls


def test_calls_split_by_another_thread_are_joined() -> None:
    """The lines of a real run in which the two copy threads' fsyncs overlapped, pids of four digits:
    each file's fsync is seen once, in the order the calls returned (before this parser, only the
    thread whose calls were never split was seen, and the test failed on a busy machine)."""
    log = (
        "6708  fsync(9</c/.staging>) = 0\n"
        "6721  fsync(12</c/.staging/s/model-00002.safetensors> <unfinished ...>\n"
        "6719  fsync(14</c/.staging/s/model-00001.safetensors> <unfinished ...>\n"
        "6721  <... fsync resumed>)              = 0\n"
        "6721  fsync(12</c/.staging/s/config.json> <unfinished ...>\n"
        "6719  <... fsync resumed>)              = 0\n"
        "6721  <... fsync resumed>)              = -1 EIO (Input/output error)\n"
        "12345 renameat2(9</c/.staging>, \"s\", 12</c/org/tiny>, \"v1\", RENAME_NOREPLACE) = 0\n")
    assert parse_calls(log) == [
        ("fsync", "9</c/.staging>", ["/c/.staging"]),
        ("fsync", "12</c/.staging/s/model-00002.safetensors>", ["/c/.staging/s/model-00002.safetensors"]),
        ("fsync", "14</c/.staging/s/model-00001.safetensors>", ["/c/.staging/s/model-00001.safetensors"]),
        ("renameat2", '9</c/.staging>, "s", 12</c/org/tiny>, "v1", RENAME_NOREPLACE', ["/c/.staging", "/c/org/tiny"])]


def commit_index(calls, parent: Path, version: str) -> int:
    """The rename that placed ``parent/version``."""
    for i, (call, args, paths) in enumerate(calls):
        if call.startswith("rename") and paths and paths[-1] == str(parent) and f'"{version}"' in args:
            return i
    raise AssertionError(f"no rename into {parent}/{version}: {[c for c in calls if c[0].startswith('rename')]}")


def synced(calls, upto: int, path_ok) -> bool:
    return any(c in ("fsync", "fdatasync") and paths and path_ok(paths[0]) for c, _, paths in calls[:upto])


def fs_synced(calls, upto: int, root: Path) -> bool:
    return any(c == "syncfs" and paths and paths[0].startswith(str(root)) for c, _, paths in calls[:upto])


def assert_durable(calls, root: Path, name: str, version: str, files: list[str], made: list[Path]) -> None:
    parent = root / name
    i = commit_index(calls, parent, version)
    for f in files:   # each file before the rename, in staging (by its own fsync, or its file system's;
        # a side file is written to a temporary name, fsynced, and renamed: .NAME.<hex>.incomplete)
        head, _, base = f.rpartition("/")
        tmp = re.compile(re.escape(f"/{head}/." if head else "/.") + re.escape(base) + r"\.[0-9a-f]+\.incomplete$")
        assert synced(calls, i, lambda p, f=f: "/.staging/" in p and (p.endswith("/" + f) or bool(tmp.search(p)))) \
            or fs_synced(calls, i, root), (f, calls[:i])
    subdirs = {str(Path(f).parent) for f in files if "/" in f}
    for d in ["", *subdirs]:   # the staged version and every directory in it, before the rename
        assert synced(calls, i, lambda p, d=d: "/.staging/" in p and re.search(
            r"/\.staging/[^/]+" + (re.escape("/" + d) if d else "") + "$", p)), (d, calls[:i])
    for d in made:    # each directory made on the way: its parent holds the new entry
        assert synced(calls, i, lambda p, d=d: p == str(d.parent)), (d, calls[:i])
    # after the rename, NAME/ (which now holds VERSION)
    assert any(c in ("fsync", "fdatasync") and paths == [str(parent)] for c, _, paths in calls[i + 1:]), calls[i:]


@pytest.mark.parametrize("rename", ["renameat2", "renameat (no RENAME_NOREPLACE)"])
def test_publish_and_preload_are_durable_when_they_return(isolated_env, node_env, tmp_path: Path, rename: str) -> None:
    env = {"WEIGHTD_DISABLE_SYSCALLS": "renameat2"} if rename != "renameat2" else {}
    src = make_checkpoint(tmp_path / "src", total_bytes=3 << 20, shards=2, layers=2, seed="d")
    files = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file())
    r, calls = traced(isolated_env, node_env.config, tmp_path / "publish.strace",
                      "publish", src, "--name", "org/tiny", "--version", "v1", env=env)
    assert r.returncode == 0, r.stderr
    assert_durable(calls, node_env.cold, "org/tiny", "v1", files + [".weightd/manifest.json"],
                   made=[node_env.cold / "org", node_env.cold / "org/tiny"])

    r, calls = traced(isolated_env, node_env.config, tmp_path / "preload.strace",
                      "preload", "org/tiny@v1", "--tier", "warm", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["path"] == str(node_env.warm / "org/tiny/v1")
    assert_durable(calls, node_env.warm, "org/tiny", "v1", files,
                   made=[node_env.warm, node_env.warm / "org", node_env.warm / "org/tiny"])


def test_many_small_files_are_made_durable_by_one_syncfs(isolated_env, node_env, tmp_path: Path) -> None:
    """A compile-cache-like version (more than 256 small files): one syncfs of the tier, before the
    rename, instead of an fsync each."""
    src = tmp_path / "cache"
    for i in range(300):
        (src / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 10}/k{i}.bin").write_bytes(bytes([i % 251]) * (1000 + i))
    assert subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "publish", src,
                           "--name", "org/cache", "--version", "v1"], env=isolated_env, cwd=ROOT,
                          capture_output=True, timeout=300).returncode == 0
    r, calls = traced(isolated_env, node_env.config, tmp_path / "preload.strace",
                      "preload", "org/cache@v1", "--tier", "warm")
    assert r.returncode == 0, r.stderr
    i = commit_index(calls, node_env.warm / "org/cache", "v1")
    assert fs_synced(calls, i, node_env.warm), calls[:i]
    per_file = [p for c, _, p in calls[:i] if c == "fsync" and p and p[0].endswith(".bin")]
    assert len(per_file) < 30, per_file   # not one each
    assert any(c == "fsync" and p == [str(node_env.warm / "org/cache")] for c, _, p in calls[i + 1:])
