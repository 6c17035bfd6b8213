"""``weightd gc`` removes the downloads Hub imports left behind: a repository's download that no import
holds and that has been idle for a day (``weightd.node.import_gc``). Downloaded for real from a
Hub-protocol server (olah, as ``tests/test_hf_import.py``); what gc keeps (a fresh download, a running
import's, another user's, whatever a symlink leads to) as carefully as what it removes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from weightd.node.hub_import import repo_lock
from weightd.node.import_gc import IMPORT_IDLE_S

from .test_hf_import import (_hub_server, fetched, hub, preloaded, published, repo_cache,  # noqa: F401
                             source_files, tree)
from .test_daemon import daemon  # noqa: F401  (the real daemon fixture)

DAY_AGO = IMPORT_IDLE_S + 3600


def age(top: Path, seconds: float = DAY_AGO) -> None:
    """Everything under ``top`` (and itself) last written ``seconds`` ago; links themselves, not followed."""
    t = time.time() - seconds
    for p in [*sorted(top.rglob("*"), reverse=True), top]:
        os.utime(p, (t, t), follow_symlinks=False)


def removed(r) -> list[dict]:
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)["imports"]["removed"]


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
    deep = sorted((cache / "blobs").iterdir())[0]   # (written just now deep in an old tree: its directory is not)
    os.utime(deep)
    assert removed(wd("gc", "--json")) == [] and (cache / "blobs").is_dir()
    age(cache)
    hf_locks = cache.parent / ".locks" / cache.name   # (huggingface_hub's own, made by the download)
    assert hf_locks.is_dir()
    r = wd("gc")
    assert r.returncode == 0 and "removed the abandoned download of hf://org/repo (" in r.stdout, r.stdout
    assert str(cache) in r.stdout and not cache.exists() and not hf_locks.exists()
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
    on_disk = sum(p.lstat().st_blocks * 512 for p in cache.rglob("*") if p.is_file() and not p.is_symlink())
    with repo_lock(root, "org/repo", lambda line: None):   # (the daemon's own gc runs every 30 s too)
        age(cache)
        assert removed(wd("gc", "--json")) == [] and cache.is_dir()
    rows = removed(wd("gc", "--json"))
    if not rows:   # (the daemon's own gc was first, or is removing it now: it says so in its log)
        deadline = time.monotonic() + 20
        while "gc removed the abandoned download of hf://org/repo" not in daemon.log_path.read_text():
            assert time.monotonic() < deadline, daemon.log_path.read_text()
            time.sleep(0.1)
    else:
        assert [(x["repo"], x["path"], x["bytes"]) for x in rows] == [("org/repo", str(cache), on_disk)]
        assert rows[0]["idle_s"] >= IMPORT_IDLE_S
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
    for d in (root, ep):
        d.chmod(0o700)   # (as imports make them)
    (outside / "hub-locks" / "models--a--b").mkdir(parents=True)
    (ep / ".locks").symlink_to(outside / "hub-locks")
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
    assert (outside / "precious").read_bytes() == b"keep me" and (outside / "hub-locks" / "models--a--b").is_dir()
    assert (outside / "models--x--y" / "blobs" / "b").read_bytes() == b"theirs"
    assert (ep / "models--l--link").is_symlink() and (root / "endpoint-00000000000000aa").is_symlink()
    refused = [line for line in r.stdout.splitlines() if "models--c--d" in line]
    assert len(refused) == 1 and refused[0].startswith("refused ") and "cannot take its lock" in refused[0], r.stdout
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
    assert len(line) == 1 and "not this user's" in line[0] and "through the daemon" in line[0], r.stdout


def test_a_cache_that_is_no_private_directory_is_one_line_and_the_rest_of_gc_runs(wd, node_env) -> None:
    """imports/hf open to others (imports refuse it too), or imports/ a file: one refused line each,
    exit 0, the tiers' part of gc reported as ever; nothing removed."""
    repo = node_env.state / "imports" / "hf" / "endpoint-00000000000000dd" / "models--a--b"
    (repo / "blobs").mkdir(parents=True)
    age(repo)
    (node_env.state / "imports" / "hf").chmod(0o755)
    r = wd("gc", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["imports"]["removed"] == [] and repo.is_dir() and "hot" in doc["reconcile"]
    assert len(doc["imports"]["refused"]) == 1 and doc["refused"] == [], doc
    assert doc["imports"]["refused"][0].endswith("open to other users: the Hub imports' downloads in it left alone "
                                                 "(imports refuse it too: chmod 700 it)")
    import shutil
    shutil.rmtree(node_env.state / "imports")
    (node_env.state / "imports").write_text("not a directory")
    r = wd("gc")
    assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    refused = [x for x in r.stdout.splitlines() if x.startswith("refused ") and "imports" in x]
    assert len(refused) == 1 and "Not a directory" in refused[0], r.stdout


def test_a_fifo_or_a_tree_too_deep_never_stops_gc(wd, node_env) -> None:
    """A fifo where gc expects a directory (huggingface_hub's .locks entry of an idle download: unlinked
    with it; or a download's name: left) is never opened to block; a download ~1,500 directories deep is one line (the walks
    recurse), and the rest of gc runs."""
    root = node_env.state / "imports" / "hf"
    ep = root / "endpoint-00000000000000ee"
    (ep / "models--f--g" / "blobs").mkdir(parents=True)
    (ep / ".locks").mkdir()
    os.mkfifo(ep / ".locks" / "models--f--g")
    os.mkfifo(ep / "models--h--i")
    deep = ep / "models--d--e"
    deep.mkdir()
    os.chdir(deep)   # (relative steps: the whole path is longer than one call may name)
    try:
        for _ in range(1500):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(node_env.state)
    for d in (root, ep):
        d.chmod(0o700)
    age(ep / "models--f--g")
    os.utime(deep, (time.time() - DAY_AGO,) * 2)
    try:
        r = wd("gc", "--json", timeout=60)
        doc = json.loads(r.stdout)
        assert r.returncode == 0 and "hot" in doc["reconcile"], (r.stdout, r.stderr)
        assert [x["repo"] for x in doc["imports"]["removed"]] == ["f/g"] and not (ep / "models--f--g").exists()
        assert not os.path.lexists(ep / ".locks" / "models--f--g")   # (unlinked with its download, never opened)
        assert stat.S_ISFIFO((ep / "models--h--i").lstat().st_mode)     # (no directory: no download of gc's)
        assert [x for x in doc["imports"]["refused"] if "models--d--e" in x and "too deep a tree" in x], doc
    finally:
        subprocess.run(["rm", "-rf", str(deep)], check=True, timeout=60)
