"""The reference pages and the man page are generated from the code (scripts/gen_reference.py) and
must match it: a command, option, metric or exit code changed without regenerating them fails here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .test_daemon import DaemonProc

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_pages_match_the_code() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/gen_reference.py"), "--check"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_every_metric_a_live_daemon_exports_is_documented(node_env, isolated_env, tmp_path: Path) -> None:
    page = (ROOT / "docs/reference/metrics.md").read_text()
    documented = set(re.findall(r"^\| `(weightd_[a-z0-9_]+)`", page, re.M))
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        text = d.metrics()
    finally:
        d.stop()
    exported = {f"{n}_total" if t == "counter" else n
                for n, t in re.findall(r"^# TYPE (weightd_[a-z0-9_]+) (\w+)$", text, re.M)}
    assert len(exported) > 30 and exported <= documented, sorted(exported - documented)


def test_every_command_is_in_the_reference_and_the_man_page() -> None:
    from weightd.cli.app import COMMANDS
    cli_md = (ROOT / "docs/reference/cli.md").read_text()
    man = (ROOT / "man/weightd.1").read_text()
    for name in COMMANDS:
        assert f"## `weightd {name}`" in cli_md, name
        assert f"\\fBweightd {name}" in man, name


@pytest.mark.skipif(shutil.which("groff") is None, reason="no groff")
def test_the_man_page_renders_without_warnings() -> None:
    proc = subprocess.run(["groff", "-man", "-ww", "-z", str(ROOT / "man/weightd.1")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
