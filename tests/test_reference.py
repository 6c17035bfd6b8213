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
    exported = {f"{n}_total" if t == "counter" and not n.endswith("_total") else n
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


@pytest.mark.skipif(shutil.which("groff") is None, reason="no groff")
def test_the_configuration_man_page_renders_without_warnings() -> None:
    proc = subprocess.run(["groff", "-man", "-ww", "-z", str(ROOT / "man/weightd.toml.5")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def _gen():
    import importlib.util
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts/gen_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_configuration_key_has_a_meaning() -> None:
    from weightd.config import config_keys
    keys = list(config_keys())
    assert len(keys) > 80
    assert [k.name for k in keys if not k.info.doc.strip()] == []


def test_a_key_without_a_meaning_fails_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightd.config import IntentSettings
    gen = _gen()
    monkeypatch.setattr(IntentSettings.model_fields["poll_s"], "doc", "")
    with pytest.raises(gen.MissingMeaning, match=r"intent\.poll_s"):
        gen.config_page()


def _page_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "docs/reference/config.md").read_text().splitlines():
        if m := re.fullmatch(r"\| `([^`]+)` \| (.*) \|", line):
            rows[m.group(1)] = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
    return rows


def test_the_configuration_page_has_every_key_and_the_defaults_config_show_prints(tmp_path: Path) -> None:
    """Every key of the settings models is on the page, with the default a real ``weightd config show``
    prints for an empty config file (the embedded default), for the page's HOME=/home/$USER."""
    import os

    from weightd.config import config_keys
    rows = _page_rows()
    assert {k.name for k in config_keys() if k.table is None} == set(rows)
    home, empty = tmp_path / "home", tmp_path / "empty.toml"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "WEIGHTD_"))}
    env.update(HOME=str(home), USER="alice", LOGNAME="alice", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "weightd", "--config", str(empty), "config", "show"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.replace(str(home), "/home/$USER").replace("weightd-alice", "weightd-$USER")
    table, seen = "", 0
    for line in text.splitlines():
        if m := re.fullmatch(r"\[(.+)\]", line):
            table = m.group(1) + "."
        elif m := re.fullmatch(r"(\w+) = (.*?)(?:  # (.*))?", line):
            key, value, note = table + m.group(1), m.group(2), (m.group(3) or "").split("; ")
            shown = f"`{value}" + (f" ({note[0]})`" if len(note) > 1 else "`")
            assert rows[key][1] == shown.replace("|", "\\|"), (key, rows[key][1], shown)
            seen += 1
    assert seen > 50


def test_make_install_installs_both_man_pages(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make")
    proc = subprocess.run(["make", "-s", "install-man", f"DESTDIR={tmp_path}", "MANDIR=/usr/share/man"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for rel, src in (("man1/weightd.1", "man/weightd.1"), ("man5/weightd.toml.5", "man/weightd.toml.5")):
        assert (tmp_path / "usr/share/man" / rel).read_bytes() == (ROOT / src).read_bytes(), rel
