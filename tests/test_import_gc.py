"""``weightd gc`` removes the downloads Hub imports left behind: a repository's download that no import
holds and that has been idle for a day (``weightd.node.import_gc``). Downloaded for real from a
Hub-protocol server (olah, as ``tests/test_hf_import.py``); what gc keeps (a fresh download, a running
import's, another user's, whatever a symlink leads to) as carefully as what it removes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from weightd.node.hub_import import repo_lock
from weightd.node.import_gc import IMPORT_IDLE_S

from .test_hf_import import _hub_server, fetched, hub, preloaded, published, repo_cache, source_files, tree  # noqa: F401
from .test_daemon import daemon  # noqa: F401  (the real daemon fixture)

DAY_AGO = IMPORT_IDLE_S + 3600


def age(top: Path, seconds: float = DAY_AGO) -> None:
    """Everything under ``top`` (and itself) last written ``seconds`` ago; links themselves, not followed."""
    t = time.time() - seconds
    for p in [*sorted(top.rglob("*"), reverse=True), top]:
        os.utime(p, (t, t), follow_symlinks=False)


def removed(r) -> list[dict]:
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)["imports"]


def test_a_fresh_download_is_kept_one_idle_for_a_day_is_removed(wd, hub, node_env, monkeypatch) -> None:
    """What an import that died after its download leaves (fetched for real, never published): kept for
    the next import to resume while fresh, removed once idle; the next import then downloads again."""
    root = node_env.state / "imports" / "hf"
    fetched(hub, root, monkeypatch)
    cache = repo_cache(node_env, hub)
    size = sum(p.stat().st_size for p in (cache / "blobs").iterdir())
    assert size > 0
    r = wd("gc")
    assert r.returncode == 0 and "abandoned" not in r.stdout, r.stdout
    assert removed(wd("gc", "--json")) == [] and (cache / "blobs").is_dir()
    age(cache)
    r = wd("gc")
    assert r.returncode == 0 and "removed the abandoned download of hf://org/repo (" in r.stdout, r.stdout
    assert str(cache) in r.stdout and not cache.exists()
    assert (root / "models--org--repo.lock").is_file()   # (never removed: an import may be waiting on it)
    assert removed(wd("gc", "--json")) == []
    doc = published(wd, hub, "hf://org/repo@main")
    assert tree(preloaded(wd, f"org/repo@{doc['version']}")) == source_files(hub.repo)


def test_a_running_imports_download_stays_through_the_daemon(daemon, wd, hub, node_env,  # noqa: F811
                                                             monkeypatch) -> None:
    """An import that holds its repository's lock (running, or waiting for the Hub) keeps its download
    however old its files are; gc through the daemon removes it once the lock is free, sized on disk."""
    root = node_env.state / "imports" / "hf"
    fetched(hub, root, monkeypatch)
    cache = repo_cache(node_env, hub)
    age(cache)
    with repo_lock(root, "org/repo", lambda line: None):
        assert removed(wd("gc", "--json")) == [] and cache.is_dir()
    rows = removed(wd("gc", "--json"))
    assert [(x["repo"], x["path"]) for x in rows] == [("org/repo", str(cache))]
    assert rows[0]["bytes"] >= (1 << 20) and rows[0]["idle_s"] >= IMPORT_IDLE_S
    assert not cache.exists()


def test_gc_follows_no_symlink_out_of_the_cache(wd, node_env, tmp_path: Path) -> None:
    """An endpoint directory or a repository's download that is a symlink is left alone with what it
    leads to; a link inside an idle download goes, its target stays; a lock file that is a symlink
    keeps its download and says so in one line."""
    outside = tmp_path / "outside"
    (outside / "models--x--y" / "blobs").mkdir(parents=True)
    (outside / "models--x--y" / "blobs" / "b").write_bytes(b"theirs")
    (outside / "precious").write_bytes(b"keep me")
    root = node_env.state / "imports" / "hf"
    ep = root / "endpoint-00000000000000bb"
    (ep / "models--a--b" / "snapshots" / "c").mkdir(parents=True)
    (ep / "models--a--b" / "snapshots" / "c" / "f").symlink_to(outside / "precious")
    (ep / "models--c--d" / "blobs").mkdir(parents=True)
    (root / "models--c--d.lock").symlink_to(outside / "lock")
    (ep / "models--l--link").symlink_to(outside / "models--x--y")
    (root / "endpoint-00000000000000aa").symlink_to(outside)
    for p in (ep, outside):
        age(p)
    r = wd("gc")
    assert r.returncode == 0, r.stderr
    assert "hf://a/b" in r.stdout and not (ep / "models--a--b").exists()
    assert (outside / "precious").read_bytes() == b"keep me"
    assert (outside / "models--x--y" / "blobs" / "b").read_bytes() == b"theirs"
    assert (ep / "models--l--link").is_symlink() and (root / "endpoint-00000000000000aa").is_symlink()
    refused = [line for line in r.stdout.splitlines() if "models--c--d" in line]
    assert len(refused) == 1 and refused[0].startswith("refused ") and "cannot remove" in refused[0], r.stdout
    assert (ep / "models--c--d" / "blobs").is_dir() and not (outside / "lock").exists()


@pytest.mark.root
def test_another_users_imports_directory_is_left_alone(wd, node_env) -> None:
    """The imports' directory of another user (the daemon's, with gc run in-process as root): nothing
    removed, nothing created in it (a root-owned lock file would stop that user's imports), one line."""
    if os.geteuid() != 0:
        pytest.skip("needs root (chown)")
    repo = node_env.state / "imports" / "hf" / "endpoint-00000000000000cc" / "models--a--b"
    (repo / "blobs").mkdir(parents=True)
    age(repo)
    for p in (repo.parent.parent, repo.parent, repo, repo / "blobs"):
        os.chown(p, 65534, 65534)
    r = wd("gc")
    assert r.returncode == 0, r.stderr
    assert repo.is_dir() and not list(repo.parent.parent.glob("*.lock"))
    line = [x for x in r.stdout.splitlines() if "imports" in x]
    assert len(line) == 1 and "not a directory of this user's" in line[0] and "through the daemon" in line[0], r.stdout
