"""``--json``: stdout is exactly one JSON document for every command that has the flag (the real CLI,
``json.loads`` of all of stdout); without it, a command that makes something local ends with its path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

MiB = 1 << 20


def one_document(proc, *codes: int) -> object:
    assert proc.returncode in (codes or (0,)), (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)  # all of it: a trailing line would make this fail


@pytest.fixture
def published(wd, tmp_path: Path) -> Path:
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2, seed="v1")
    assert wd("--no-daemon", "publish", src, "--name", "org/j", "--version", "v1").returncode == 0
    return src


def test_preload_json_is_one_document_and_text_ends_with_the_path(wd, node_env, published) -> None:
    r = one_document(wd("--no-daemon", "preload", "org/j@v1", "--tier", "warm", "--json"))
    assert r["path"] == str(node_env.warm / "org/j/v1") and r["tier"] == "warm"
    again = one_document(wd("--no-daemon", "preload", "org/j@v1", "--tier", "warm", "--json"))
    assert again["already_present"] is True
    text = wd("--no-daemon", "preload", "org/j@v1", "--tier", "warm")
    assert text.returncode == 0 and text.stdout.strip().splitlines()[-1] == r["path"]
    assert wd("--no-daemon", "path", "org/j@v1").stdout.strip().splitlines()[-1] == r["path"]


def test_tier_commands_json(wd, node_env, published, tmp_path: Path) -> None:
    src2 = make_checkpoint(tmp_path / "src2", total_bytes=2 * MiB, shards=1, layers=1, seed="v2")
    pub = one_document(wd("--no-daemon", "publish", src2, "--name", "org/j", "--version", "v2", "--json"))
    assert pub["unchanged"] is False and pub["bytes"] > 0
    one_document(wd("--no-daemon", "preload", "org/j@v1", "--json"))
    assert one_document(wd("--no-daemon", "path", "org/j@v1", "--json"))["tier"] == "hot"
    st = one_document(wd("--no-daemon", "status", "--json"))
    assert [c["version"] for c in st["checkpoints"]] == ["v1"]
    assert one_document(wd("--no-daemon", "pin", "org/j@v1", "--json"))["changed"] is True
    assert one_document(wd("--no-daemon", "unpin", "org/j@v1", "--json"))["changed"] is True
    assert one_document(wd("--no-daemon", "gc", "--json"))["evicted"] == []
    evicted = one_document(wd("--no-daemon", "evict", "org/j@v1", "--tier", "hot", "--force", "--json"))
    assert evicted["evicted"] and all("org/j@v1" in e for e in evicted["evicted"])


def test_content_commands_json(weightd, ckpt: Path, tmp_path: Path) -> None:
    built = one_document(weightd("manifest", "build", ckpt, "--json"))
    assert built["path"] == str(ckpt / ".weightd" / "manifest.json")
    other = tmp_path / "other"
    shutil.copytree(ckpt, other, ignore=shutil.ignore_patterns(".weightd"))
    (other / "extra.txt").write_text("x")
    assert one_document(weightd("manifest", "diff", ckpt, other, "--json"))["files"]["added"] == ["extra.txt"]
    plan = one_document(weightd("manifest", "diff", ckpt, other, "--plan", "--json"))
    assert plan["p2p"]["piece_size"] > 0
    assert one_document(weightd("verify", ckpt, "--json"))["ok"] is True
    (ckpt / "extra.txt").write_text("x")
    bad = one_document(weightd("verify", ckpt, "--json"), 5)  # the error goes to stderr, never stdout
    assert bad["ok"] is False and "extra.txt" in bad["problems"][0]["path"]


def test_page_cache_commands_json(weightd, ckpt: Path, tmp_path: Path) -> None:
    assert one_document(weightd("warm", ckpt, "--json"))["files"] > 0
    assert one_document(weightd("residency", ckpt, "--json"))["files"]
    assert one_document(weightd("cool", ckpt, "--json"))["skipped"] == []
    missing = one_document(weightd("residency", ckpt, tmp_path / "missing", "--json"), 3)
    assert missing["skipped"]


def test_node_commands_json(wd, tmp_path: Path) -> None:
    doc = one_document(wd("--no-daemon", "doctor", "--sample-s", "0.2", "--no-probe", "--json"), 0, 7)
    assert doc["verdict"] in ("healthy", "disk", "network", "gpu")
    cfg = one_document(wd("config", "show", "--json"))
    assert set(cfg) == {"source", "config"}
    bench = one_document(wd("bench", "disk", str(tmp_path), "--size", "4MiB", "--seconds", "0.2", "--depths", "1",
                            "--no-record", "--json"))
    assert bench["randread_4k"]["1"]["reads"] > 0
