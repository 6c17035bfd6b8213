"""``weightd demo`` (``make demo``) end to end: every step runs the installed entry point; the Hub
mirror (olah) and registry (docker-registry) steps run when their tools are here and say in one bold
line what is missing when not; the servers they start are gone when the demo ends."""

from __future__ import annotations

import os
import re
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

HUB_TOOLS = (find_spec("olah") is not None and Path(sys.executable).with_name("olah-cli").exists()
             and shutil.which("git-lfs") is not None)
REGISTRY_TOOL = shutil.which("docker-registry") is not None


def processes_under(d: Path) -> list[str]:
    """Command lines of the running processes that name a path under ``d`` (a server the demo started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(d) in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def test_demo_runs(weightd, tmp_path: Path) -> None:
    proc = weightd("demo", "--dir", tmp_path / "demo", "--size", "8MiB", timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "demo complete" in out and "(exit 5)" in out
    hub = out[out.index("# 11c."):out.index("# 11d.")]
    if HUB_TOOLS:
        sha = re.search(r"demo/tiny@([0-9a-f]{40}): published", hub)
        assert sha, hub
        assert re.search(r"\$ HF_ENDPOINT=http://127\.0\.0\.1:\d+ weightd --no-daemon publish hf://demo/tiny@main", hub)
        assert f"11 file(s) (2.5 MiB) match the Hub's hashes; publishing demo/tiny@{sha[1]}" in hub
        assert f"demo/tiny@{sha[1]}: 2.5 MiB from cold into warm" in hub
        assert re.search(rf"demo/tiny@{sha[1]}\s+2\.5 MiB\s+\S+\s+warm", hub), hub
    else:
        assert "(skipped: a local Hugging Face Hub mirror needs" in hub, hub
    oci = out[out.index("# 11d."):out.index("# 12.")]
    if REGISTRY_TOOL:
        assert re.search(r"\noci://127\.0\.0\.1:\d+/demo/demo/tiny-llama:v1\n", oci), oci
        assert re.search(r"demo/tiny-llama@v1: [\d.]+ MiB from cold into warm", oci), oci
        assert re.search(r"demo/tiny-llama@v1\s+[\d.]+ MiB\s+\S+\s+warm", oci), oci
    else:
        assert "(skipped: a registry as cold storage needs docker-registry: make tools)" in oci, oci
    assert processes_under(tmp_path / "demo") == []


@pytest.mark.parametrize("missing, step, needle", [
    ("git-lfs", "_demo_hub", "# 11c. (skipped: a local Hugging Face Hub mirror needs git and git-lfs: make tools)"),
    ("docker-registry", "_demo_registry", "# 11d. (skipped: a registry as cold storage needs docker-registry: make "
                                          "tools)"),
])
def test_a_step_whose_tool_is_missing_says_so_and_is_skipped(monkeypatch, capsys, tmp_path: Path, missing: str,
                                                             step: str, needle: str) -> None:
    from weightd.cli import demo
    if step == "_demo_hub" and find_spec("olah") is None:
        pytest.skip("olah missing (pip install -e .[test]): the step says that first")
    which = shutil.which
    monkeypatch.setattr(demo.shutil, "which", lambda name: None if name == missing else which(name))
    args = (tmp_path, tmp_path / "hot") if step == "_demo_hub" else (tmp_path, tmp_path / "hot", tmp_path / "v1")
    getattr(demo, step)(*args)
    assert capsys.readouterr().out.strip() == needle
    assert list(tmp_path.iterdir()) == []


def test_the_hub_step_without_olah_says_where_it_comes_from(monkeypatch, capsys, tmp_path: Path) -> None:
    from weightd.cli import demo
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-venv" / "python"))   # (no olah-cli beside it)
    demo._demo_hub(tmp_path, tmp_path / "hot")
    assert capsys.readouterr().out.strip() == ("# 11c. (skipped: a local Hugging Face Hub mirror needs olah, from "
                                                "pip install -e .[test])")
