"""``--json``: stdout is exactly one JSON document for every command that has the flag (the real CLI,
``json.loads`` of all of stdout), and it says first which document it is and which promise it keeps
(``"schema": "weightd.<command>/v1"``, docs/commands.md "JSON output"); without it, a
command that makes something local ends with its path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

MiB = 1 << 20


# every command with --json, by its schema name, and the test that checks its document: a new command
# with --json fails test_every_json_command_is_checked until it is checked here
CHECKED = {
    "preload": "test_preload_json_is_one_document_and_text_ends_with_the_path",
    "preload-set": "test_ls_and_set_json", "manifest.diff-plan": "test_content_commands_json",
    "path": "test_tier_commands_json", "status": "test_tier_commands_json", "publish": "test_tier_commands_json",
    "ls": "test_ls_and_set_json", "pin": "test_tier_commands_json", "unpin": "test_tier_commands_json",
    "gc": "test_tier_commands_json", "evict": "test_tier_commands_json",
    "manifest.build": "test_content_commands_json", "manifest.diff": "test_content_commands_json",
    "verify": "test_content_commands_json",
    "warm": "test_page_cache_commands_json", "residency": "test_page_cache_commands_json",
    "cool": "test_page_cache_commands_json",
    "doctor": "test_node_commands_json", "config.show": "test_node_commands_json", "bench.disk": "test_node_commands_json",
    "intent.check": "test_daemon_commands_json",
    "intent.status": "test_daemon_commands_json", "intent.explain": "test_daemon_commands_json",
    "fleet.status": "tests/test_mixed_versions.py (it needs an origin)",
}


def one_document(proc, schema: str, *codes: int) -> dict:
    """All of stdout as one JSON object (a trailing line would fail), whose first key is its schema."""
    assert proc.returncode in (codes or (0,)), (proc.returncode, proc.stdout, proc.stderr)
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict) and next(iter(doc), None) == "schema", proc.stdout[:200]
    assert doc["schema"] == f"weightd.{schema}/v1", doc["schema"]
    return doc


@pytest.fixture
def published(wd, tmp_path: Path) -> Path:
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2, seed="v1")
    assert wd("--no-daemon", "publish", src, "--name", "org/j", "--version", "v1").returncode == 0
    return src


def test_preload_json_is_one_document_and_text_ends_with_the_path(wd, node_env, published) -> None:
    r = one_document(wd("--no-daemon", "preload", "org/j@v1", "--tier", "warm", "--json"), "preload")
    assert r["path"] == str(node_env.warm / "org/j/v1") and r["tier"] == "warm"
    again = one_document(wd("--no-daemon", "preload", "org/j@v1", "--tier", "warm", "--json"), "preload")
    assert again["already_present"] is True
    text = wd("--no-daemon", "preload", "org/j@v1", "--tier", "warm")
    assert text.returncode == 0 and text.stdout.strip().splitlines()[-1] == r["path"]
    assert wd("--no-daemon", "path", "org/j@v1").stdout.strip().splitlines()[-1] == r["path"]


def test_tier_commands_json(wd, node_env, published, tmp_path: Path) -> None:
    src2 = make_checkpoint(tmp_path / "src2", total_bytes=2 * MiB, shards=1, layers=1, seed="v2")
    pub = one_document(wd("--no-daemon", "publish", src2, "--name", "org/j", "--version", "v2", "--json"), "publish")
    assert pub["unchanged"] is False and pub["bytes"] > 0
    one_document(wd("--no-daemon", "preload", "org/j@v1", "--json"), "preload")
    assert one_document(wd("--no-daemon", "path", "org/j@v1", "--json"), "path")["tier"] == "hot"
    st = one_document(wd("--no-daemon", "status", "--json"), "status")
    assert [c["version"] for c in st["checkpoints"]] == ["v1"]
    assert one_document(wd("--no-daemon", "pin", "org/j@v1", "--json"), "pin")["changed"] is True
    assert one_document(wd("--no-daemon", "unpin", "org/j@v1", "--json"), "unpin")["changed"] is True
    assert one_document(wd("--no-daemon", "gc", "--json"), "gc")["evicted"] == []
    evicted = one_document(wd("--no-daemon", "evict", "org/j@v1", "--tier", "hot", "--force", "--json"), "evict")
    assert evicted["evicted"] and all("org/j@v1" in e for e in evicted["evicted"])


def test_content_commands_json(weightd, ckpt: Path, tmp_path: Path) -> None:
    built = one_document(weightd("manifest", "build", ckpt, "--json"), "manifest.build")
    assert built["path"] == str(ckpt / ".weightd" / "manifest.json")
    other = tmp_path / "other"
    shutil.copytree(ckpt, other, ignore=shutil.ignore_patterns(".weightd"))
    (other / "extra.txt").write_text("x")
    assert one_document(weightd("manifest", "diff", ckpt, other, "--json"), "manifest.diff")["files"]["added"] == ["extra.txt"]
    plan = one_document(weightd("manifest", "diff", ckpt, other, "--plan", "--json"), "manifest.diff-plan")
    assert plan["p2p"]["piece_size"] > 0
    assert one_document(weightd("verify", ckpt, "--json"), "verify")["ok"] is True
    (ckpt / "extra.txt").write_text("x")
    bad = one_document(weightd("verify", ckpt, "--json"), "verify", 5)  # the error goes to stderr, never stdout
    assert bad["ok"] is False and "extra.txt" in bad["problems"][0]["path"]


def test_page_cache_commands_json(weightd, ckpt: Path, tmp_path: Path) -> None:
    assert one_document(weightd("warm", ckpt, "--json"), "warm")["files"] > 0
    assert one_document(weightd("residency", ckpt, "--json"), "residency")["files"]
    assert one_document(weightd("cool", ckpt, "--json"), "cool")["skipped"] == []
    missing = one_document(weightd("residency", ckpt, tmp_path / "missing", "--json"), "residency", 3)
    assert missing["skipped"]


def test_node_commands_json(wd, tmp_path: Path) -> None:
    doc = one_document(wd("--no-daemon", "doctor", "--sample-s", "0.2", "--no-probe", "--json"), "doctor", 0, 7)
    assert doc["verdict"] in ("healthy", "disk", "network", "gpu")
    cfg = one_document(wd("config", "show", "--json"), "config.show")
    assert set(cfg) >= {"schema", "source", "config"}
    bench = one_document(wd("bench", "disk", str(tmp_path), "--size", "4MiB", "--seconds", "0.2", "--depths", "1",
                            "--no-record", "--json"), "bench.disk")
    assert bench["randread_4k"]["1"]["reads"] > 0


def test_ls_and_set_json(wd, node_env, published, tmp_path: Path) -> None:
    ls = one_document(wd("--no-daemon", "ls", "--json"), "ls")
    assert [(v["name"], v["version"]) for v in ls["versions"]] == [("org/j", "v1")]
    assert one_document(wd("--no-daemon", "ls", "org/j", "--json"), "ls")["versions"]
    (tmp_path / "set.txt").write_text("org/j@v1\n")
    got = one_document(wd("--no-daemon", "preload", "--set", tmp_path / "set.txt", "--tier", "warm", "--json"),
                       "preload-set")
    assert got["ready"] == 1


def test_daemon_commands_json(node_env, isolated_env, wd, tmp_path: Path) -> None:
    """Through a running daemon (its answers become the CLI's documents, with the CLI's schema), and
    the intent commands, which only a daemon answers."""
    from .test_daemon import DaemonProc
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=1, seed="v1")
    assert wd("--no-daemon", "publish", src, "--name", "org/j", "--version", "v1").returncode == 0
    idir = tmp_path / "intent.d"
    idir.mkdir()
    (idir / "a.toml").write_text('[[keep]]\nmodel = "org/j@latest"\n')
    node_env.config.write_text(node_env.config.read_text() + f'[intent]\ndir = "{idir}"\n')
    assert one_document(wd("intent", "check", "--json"), "intent.check")["entries"]
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        r = one_document(wd("--daemon-only", "preload", "org/j@v1", "--tier", "warm", "--json"), "preload")
        assert one_document(wd("--daemon-only", "path", "org/j@v1", "--json"), "path")["path"] == r["path"]
        assert one_document(wd("--daemon-only", "status", "--json"), "status")["answered_by"] == "daemon"
        assert one_document(wd("--daemon-only", "ls", "--json"), "ls")["versions"]
        assert "entries" in one_document(wd("intent", "status", "--json"), "intent.status")
        assert "forecast" in one_document(wd("intent", "explain", "--json"), "intent.explain")
    finally:
        d.stop()


def _json_commands() -> set[str]:
    """Every command of the real CLI that has a --json flag, as its schema names it (``fleet.status``)."""
    import click

    from weightd.cli.app import cli
    found: set[str] = set()

    def walk(group: click.Group, path: list[str], ctx: click.Context) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            if isinstance(cmd, click.Group):
                walk(cmd, [*path, name], click.Context(cmd, parent=ctx, info_name=name))
            elif any("--json" in getattr(p, "opts", ()) for p in cmd.params):
                found.add(".".join([*path, name]))
    walk(cli, [], click.Context(cli, info_name="weightd"))
    return found


def test_every_json_command_is_checked() -> None:
    found = _json_commands()
    assert {"status", "ls", "preload", "path", "fleet.status", "intent.status", "doctor"} <= found, found
    missing = found - set(CHECKED)
    assert not missing, f"--json commands whose document no test checks (add them to CHECKED): {sorted(missing)}"
    from weightd.cli.output import json_schema
    assert json_schema("fleet.status") == "weightd.fleet.status/v1"
