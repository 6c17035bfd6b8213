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


def test_residency_imports_neither_click_nor_the_config(files: dict[str, str], tmp_path: Path) -> None:
    code = ("import sys; from weightd.cli import main; rc = main(['residency', sys.argv[1]]); "
            "bad = sorted(m for m in ('click', 'weightd.config', 'pydantic', 'aiohttp', 'libtorrent', 'rich', "
            "'tiering.content.hashing', 'weightd.cli.full') if m in sys.modules); print(bad); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, files["a"]], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"
