"""The commands answered without click (weightd.cli.fast) say exactly what the click CLI says: the
same stdout, stderr and exit code for a matrix of invocations, run both ways as real subprocesses
(``WEIGHTD_NO_FAST_PATH=1`` forces click). And they import neither click nor the config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], env: dict[str, str], cwd: Path, fast: bool) -> tuple[int, str, str]:
    e = {**env, "PYTHONPATH": str(ROOT)}
    if not fast:
        e["WEIGHTD_NO_FAST_PATH"] = "1"
    p = subprocess.run([sys.executable, "-m", "weightd", *args], capture_output=True, text=True, env=e, cwd=cwd,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    a = tmp_path / "a.bin"
    a.write_bytes(os.urandom(3 << 20))
    d = tmp_path / "dir"
    d.mkdir()
    (d / "b.safetensors").write_bytes(b"\0" * 8192)
    (d / "config.json").write_text("{}")
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"a": str(a), "dir": str(d), "empty": str(empty), "fifo": str(fifo), "missing": str(tmp_path / "nope")}


CASES = [
    ["residency", "{a}"], ["residency", "{a}", "--json"], ["residency", "--json", "{a}", "{dir}"],
    ["residency", "{dir}"], ["residency", "{empty}"], ["residency", "{missing}"], ["residency", "{a}", "{missing}"],
    ["residency", "{fifo}"], ["residency", "{missing}", "--json"], ["-q", "residency", "{a}", "{missing}"],
    ["--quiet", "residency", "{dir}"], ["residency"], ["residency", "--json"], ["residency", "--bogus", "{a}"],
    ["residency", "{a}", "--json", "--json"], ["residency", "-"], ["residency", ""],
    ["--config", "{missing}", "residency", "{a}"], ["--config={missing}", "-q", "residency", "{a}"],
    ["--no-daemon", "residency", "{a}"], ["--daemon-only", "residency", "{a}"],
    ["--no-daemon", "--daemon-only", "residency", "{a}"], ["--config", "residency", "{a}"],
    ["--config=", "residency", "{a}"], ["-v", "residency", "{a}"], ["--debug", "residency", "{missing}"],
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c) for c in CASES])
def test_fast_and_click_say_the_same(files: dict[str, str], tmp_path: Path, case: list[str]) -> None:
    args = [a.format(**files) for a in case]
    env = dict(os.environ)
    fast, slow = run(args, env, tmp_path, True), run(args, env, tmp_path, False)
    if "--json" in args and fast[0] == 0:   # (residency figures may move between the runs: compare shapes)
        import json
        f, s = json.loads(fast[1]), json.loads(slow[1])
        assert [x["path"] for x in f["files"]] == [x["path"] for x in s["files"]] and f.keys() == s.keys()
        assert fast[0] == slow[0] and fast[2] == slow[2]
        return
    assert fast == slow


#: never imported by the commands that answer in vmtouch time (each costs from ~3 to ~60 ms of a start)
HEAVY = ("click", "pydantic", "aiohttp", "libtorrent", "rich", "numpy", "prometheus_client", "weightd.cli.full",
         "tiering.store", "tiering.content.hashing", "p2p", "huggingface_hub")


def heavy_imported(args: list[str], env: dict[str, str], also: tuple[str, ...] = ()) -> list[str]:
    """Run ``weightd ARGS`` in a real interpreter (the console script's ``main``) and name the heavy
    modules it imported; the command must succeed."""
    code = ("import sys; from weightd.cli import main; rc = main(sys.argv[1:]); "
            f"print(sorted(m for m in {HEAVY + also!r} if m in sys.modules), file=sys.stderr); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                       env={**env, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    return eval(p.stderr.strip().splitlines()[-1])


def test_residency_imports_neither_click_nor_the_config(files: dict[str, str], tmp_path: Path) -> None:
    assert heavy_imported(["residency", files["a"]], dict(os.environ), also=("weightd.config",)) == []


# -- path and status through the daemon ---------------------------------------------------------------

from .test_daemon import daemon, publish  # noqa: E402,F401  (the real daemon fixture)


def test_path_and_status_through_the_daemon_say_the_same(daemon, node_env, isolated_env, wd,  # noqa: F811
                                                         tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/d@v1", "--tier", "hot").returncode == 0
    cfg = str(node_env.config)
    env = dict(isolated_env)
    for case in (["path", "org/d@v1"], ["path", "org/d@v1", "--json"], ["path", "org/d"], ["path", "org/nope@v1"],
                 ["path", "bad name"], ["-q", "path", "org/d@v1"], ["--daemon-only", "path", "org/d@v1"],
                 ["path", "org/d@v1", "--layers", "0-1"], ["status", "--json"], ["status", "-o", "json"],
                 ["status", "--output=json"], ["status", "-o", "bogus"]):
        args = ["--config", cfg, *case]
        fast, slow = run(args, env, tmp_path, True), run(args, env, tmp_path, False)
        if case[0] == "status" and fast[0] == 0:   # (the transfers and residency may move between the runs)
            import json
            f, s = json.loads(fast[1]), json.loads(slow[1])
            assert f.keys() == s.keys() and f["answered_by"] == s["answered_by"] == "daemon", case
            assert f["schema"] == s["schema"] == "weightd.status/v1"
            assert [c["name"] for c in f["checkpoints"]] == [c["name"] for c in s["checkpoints"]]
            assert fast[2] == slow[2]
            continue
        assert fast == slow, case
        if "--json" in case and fast[0] == 0:
            assert fast[1].startswith('{\n  "schema": "weightd.path/v1",'), fast[1]
    # the table: the same lines but for the residency column's figures
    fast, slow = run(["--config", cfg, "status"], env, tmp_path, True), run(["--config", cfg, "status"], env,
                                                                            tmp_path, False)
    assert fast[0] == slow[0] == 0 and fast[1].splitlines()[0] == slow[1].splitlines()[0]
    assert len(fast[1].splitlines()) == len(slow[1].splitlines())
    # another config than the daemon's: the same warning, then the daemon's answer
    other = tmp_path / "other.toml"
    other.write_text(node_env.config.read_text())
    fast, slow = (run(["--config", str(other), "path", "org/d@v1"], env, tmp_path, f) for f in (True, False))
    assert fast == slow and "its config" in fast[2]


def test_without_a_daemon_path_and_status_are_clicks(node_env, isolated_env, tmp_path: Path) -> None:
    """No daemon answers: click works in-process (or says --daemon-only cannot), the same both ways."""
    cfg = str(node_env.config)
    for case in (["path", "org/d@v1"], ["--daemon-only", "path", "org/d@v1"], ["status", "--json"],
                 ["--daemon-only", "status"]):
        args = ["--config", cfg, *case]
        fast, slow = run(args, dict(isolated_env), tmp_path, True), run(args, dict(isolated_env), tmp_path, False)
        assert fast[0] == slow[0] and fast[2] == slow[2], case


def test_path_and_status_through_the_daemon_import_nothing_heavy(daemon, node_env, isolated_env, wd,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/d@v1", "--tier", "hot").returncode == 0
    cfg = str(node_env.config)
    for case in (["path", "org/d@v1"], ["path", "org/d@v1", "--json"], ["status"], ["status", "--json"],
                 ["-q", "status", "-o", "wide"]):
        assert heavy_imported(["--config", cfg, *case], dict(isolated_env)) == [], case


@pytest.mark.xfail(strict=True, reason="issue #20 point 4, open: in-process (--no-daemon) path and status open "
                   "the node's store (tiering.store, tiering.content.hashing; no longer click, libtorrent, numpy "
                   "or prometheus_client: tests/test_startup.py), ~125 ms")
def test_path_and_status_in_process_import_nothing_heavy(node_env, isolated_env, wd, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("--no-daemon", "preload", "org/d@v1", "--tier", "hot").returncode == 0
    cfg = str(node_env.config)
    for case in (["--no-daemon", "path", "org/d@v1"], ["--no-daemon", "status"]):
        assert heavy_imported(["--config", cfg, *case], dict(isolated_env)) == [], case
