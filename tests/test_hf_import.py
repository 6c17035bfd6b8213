"""``weightd publish hf://ORG/REPO[@REVISION]`` against a real Hub-protocol server: olah (a self-hosted
Hugging Face mirror, offline) serving a git repository whose safetensors shards are git-lfs objects,
on 127.0.0.1, driven through the installed CLI (huggingface_hub is never mocked)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering.sample import LocalHub as Hub, git, local_hub

from .conftest import assert_one_line_error, reserve_port
from .test_daemon import daemon  # noqa: F401  (the real daemon fixture)

pytest.importorskip("olah", reason="olah missing (pip install -e .[test])")
pytest.importorskip("huggingface_hub", reason="huggingface_hub missing (pip install -e .)")
if shutil.which("git-lfs") is None:
    pytest.skip("git-lfs missing (scripts/install-tools.sh installs it)", allow_module_level=True)

TOKEN = "hf_weightdTestTokenNeverLogged0123456789"


class _TestHub(Hub):
    """The module's olah server as one test sees it: the same server and repository, but a client
    environment (``env()``: HF_HOME) of the test's own."""

    def __init__(self, server: Hub, hf_home: Path) -> None:
        self.__dict__.update(server.__dict__)
        self.hf_home = hf_home

    def env(self, **extra: str) -> dict[str, str]:
        return {**super().env(), "HF_HOME": str(self.hf_home), **extra}

    def stop(self) -> None:      # (the module's fixture stops the server)
        raise RuntimeError("the module's shared Hub: a test that stops its Hub takes one of its own")


def _refs(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname)").split()


def _lfs_objects(repo: Path) -> dict[str, bytes]:
    objects = repo / ".git" / "lfs" / "objects"
    return {str(p.relative_to(objects)): p.read_bytes() for p in sorted(objects.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def _hub_server(tmp_path_factory: pytest.TempPathFactory):
    """One olah server for the module: making its git-lfs repository and starting and stopping olah
    for each test that used it was most of the module's 28 s of setup in a full run (of 95 s), once
    per module now; ``hub`` resets it."""
    with local_hub(tmp_path_factory.mktemp("hub")) as h:
        yield h, h.commit(), _lfs_objects(h.repo), _refs(h.repo)


@pytest.fixture
def hub(_hub_server, tmp_path: Path):
    """The module's Hub, as it was made, for each test: what a test changes (a commit on main, an LFS
    object tampered with or moved away, the working tree) is put back after it; HF_HOME is the test's."""
    server, first, lfs, refs = _hub_server
    yield _TestHub(server, tmp_path / "hf-home")
    repo, objects = server.repo, server.repo / ".git" / "lfs" / "objects"
    if _lfs_objects(repo) != lfs:
        shutil.rmtree(objects, ignore_errors=True)
        shutil.rmtree(objects.with_name("objects.away"), ignore_errors=True)
        for rel, data in lfs.items():
            (objects / rel).parent.mkdir(parents=True, exist_ok=True)
            (objects / rel).write_bytes(data)
    git(repo, "checkout", "-q", "-f", "main")
    git(repo, "reset", "-q", "--hard", first)
    git(repo, "clean", "-q", "-fdx")
    git(repo, "tag", "-f", "v1", first)
    for ref in set(_refs(repo)) - set(refs):   # (a branch or tag a test made)
        git(repo, "update-ref", "-d", ref)
    assert server.commit() == first and git(repo, "status", "--porcelain") == "" and _lfs_objects(repo) == lfs
    assert _refs(repo) == refs, _refs(repo)


@pytest.fixture
def big_hub(tmp_path: Path):
    """As ``hub``, with 160 MiB of shards: olah serves ~34 MB/s, so an import is seconds long."""
    with local_hub(tmp_path / "hub", total_bytes=160 << 20) as h:
        yield h


def repo_cache(node_env, hub: Hub) -> Path:
    """The import's HF cache of org/repo: STATE_DIR/imports/hf/endpoint-<hash>/models--org--repo."""
    from tiering.sources.hf import endpoint_key
    return node_env.state / "imports" / "hf" / endpoint_key(hub.endpoint) / "models--org--repo"


def fetched(hub: Hub, root: Path, monkeypatch, **kw):
    """fetch_snapshot in this process (no publish): the download and check steps on their own."""
    from tiering.sources.hf import fetch_snapshot, parse_hub_ref
    for k, v in hub.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return fetch_snapshot(parse_hub_ref("hf://org/repo@main"), root, endpoint=hub.endpoint, **kw)


def source_files(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(repo).parts[:1]}


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not str(p.relative_to(path)).startswith(".weightd")}


def published(wd, hub: Hub, *args: str) -> dict:
    r = wd("publish", *args, "--json", env=hub.env())
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)


def preloaded(wd, ref: str) -> Path:
    r = wd("preload", ref, "--tier", "warm")
    assert r.returncode == 0, (r.stdout, r.stderr)
    return Path(r.stdout.strip().splitlines()[-1])


def nothing_published(wd) -> bool:
    r = wd("ls", "--json")
    assert r.returncode == 0, r.stderr
    return "org/repo" not in r.stdout and "org/nope" not in r.stdout


def test_import_labels_with_the_commit_sha_and_preloads_the_same_bytes(wd, hub: Hub, node_env) -> None:
    sha = hub.commit()
    doc = published(wd, hub, "hf://org/repo@main")
    assert (doc["name"], doc["version"]) == ("org/repo", sha)
    assert doc["source"]["commit"] == sha and doc["source"]["lfs_files"] == 2
    assert not nothing_published(wd)
    got = tree(preloaded(wd, f"org/repo@{sha}"))
    assert got == source_files(hub.repo) and ".gitattributes" in got
    # the download cache is gone once published (the bytes are in cold storage)
    assert not repo_cache(node_env, hub).exists()
    # the tag and the SHA itself name the same commit: the same version, unchanged, and nothing is
    # downloaded (the Hub's LFS objects moved away: a download would fail)
    lfs = hub.repo / ".git" / "lfs" / "objects"
    lfs.rename(lfs.with_name("objects.away"))
    for rev in ("v1", sha):
        again = published(wd, hub, f"hf://org/repo@{rev}")
        assert again["version"] == sha and again["unchanged"] is True and again["source"]["downloaded"] == 0
        assert again["digest"] == doc["digest"] and again["bytes"] == doc["bytes"]
    # a label given with --version is not assumed to be that commit: the import downloads (and fails here)
    r = wd("publish", "hf://org/repo@v1", "--version", "other", env=hub.env())
    assert r.returncode != 0 and "Traceback" not in r.stderr and "2.5 MiB to download" in r.stderr, r.stderr
    lfs.with_name("objects.away").rename(lfs)
    # a new commit on main: @main is a new version, and the first one is still what it was
    (hub.repo / "config.json").write_text('{"model_type": "llama", "edited": true}\n')
    git(hub.repo, "commit", "-q", "-am", "second")
    sha2 = hub.commit()
    doc2 = published(wd, hub, "hf://org/repo")          # (no revision: main)
    assert doc2["version"] == sha2 != sha
    assert tree(preloaded(wd, f"org/repo@{sha2}"))["config.json"] == b'{"model_type": "llama", "edited": true}\n'
    assert tree(preloaded(wd, f"org/repo@{sha}")) == got


def test_include_exclude_name_and_version(wd, hub: Hub) -> None:
    doc = published(wd, hub, "hf://org/repo@v1", "--name", "acme/configs", "--version", "cfg1",
                    "--include", "*.json", "--include", "original/*", "--exclude", "tokenizer*")
    assert (doc["name"], doc["version"]) == ("acme/configs", "cfg1")
    got = tree(preloaded(wd, "acme/configs@cfg1"))
    want = {k for k in source_files(hub.repo)
            if (k.endswith(".json") and "/" not in k or k.startswith("original/")) and not k.startswith("tokenizer")}
    assert set(got) == want and "config.json" in want and "original/params.json" in want
    r = wd("publish", "hf://org/repo", "--include", "*.bin", env=hub.env())
    assert_one_line_error(r, 2, "no file matches")
    # 'dir/' is everything beneath dir, as huggingface_hub's allow_patterns read it
    doc = published(wd, hub, "hf://org/repo@v1", "--name", "acme/orig", "--version", "o1", "--include", "original/")
    assert set(tree(preloaded(wd, "acme/orig@o1"))) == {k for k in source_files(hub.repo) if k.startswith("original/")}
    doc = published(wd, hub, "hf://org/repo@v1", "--name", "acme/noorig", "--version", "n1", "--exclude", "original/")
    assert not any(k.startswith("original/") for k in tree(preloaded(wd, "acme/noorig@n1")))
    r = wd("publish", str(hub.repo), "--name", "x", "--version", "y", "--include", "*.json")
    assert_one_line_error(r, 2, "--include and --exclude select files of an hf:// repository")


def test_missing_repo_bad_revision_and_unreachable_hub_are_one_line_each(wd, hub: Hub) -> None:
    r = wd("publish", "hf://org/nope@main", env=hub.env())
    assert_one_line_error(r, 3, "no repository org/nope")
    r = wd("publish", "hf://org/repo@nobranch", env=hub.env())
    assert_one_line_error(r, 3, "no revision 'nobranch' in org/repo", "main", "v1")
    dead = f"http://127.0.0.1:{reserve_port()}"
    r = wd("publish", "hf://org/repo", env={**hub.env(), "HF_ENDPOINT": dead})
    assert_one_line_error(r, 1, f"on {dead}", "does not answer")
    r = wd("publish", "hf://org", env=hub.env())
    assert_one_line_error(r, 2, "hf://ORG/REPO[@REVISION]")
    assert nothing_published(wd)


def test_a_tampered_lfs_object_publishes_nothing(wd, hub: Hub, node_env) -> None:
    shard = "model-00001-of-00002.safetensors"
    oid = hashlib.sha256((hub.repo / shard).read_bytes()).hexdigest()
    obj = hub.repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01                       # same size, one bit: only the hash can tell
    obj.write_bytes(bytes(data))
    r = wd("publish", "hf://org/repo@main", env=hub.env())
    assert_one_line_error(r, 5, shard, f"LFS sha256 {oid}", hashlib.sha256(bytes(data)).hexdigest())
    assert nothing_published(wd)
    assert not (node_env.cold / "org" / "repo").exists()
    # the bad bytes are not kept for a retry to reuse: that file's blob and link only, the rest stays
    cache = repo_cache(node_env, hub)
    assert not (cache / "blobs" / oid).exists()
    assert not (cache / "snapshots" / hub.commit() / shard).exists()
    other = hashlib.sha256((hub.repo / "model-00002-of-00002.safetensors").read_bytes()).hexdigest()
    assert (cache / "blobs" / other).is_file()


def test_the_token_is_never_printed_nor_logged(wd, hub: Hub, node_env, tmp_path: Path) -> None:
    env = hub.env(HF_TOKEN=TOKEN)
    runs = [wd("publish", "hf://org/repo@main", "--json", env=env),
            wd("publish", "hf://org/nope", env=env),
            wd("--debug", "publish", "hf://org/repo@nobranch", env=env),
            wd("publish", "hf://org/repo@main", env={**env, "HF_ENDPOINT": f"http://127.0.0.1:{reserve_port()}"})]
    assert [r.returncode for r in runs] == [0, 3, 3, 1], [(r.returncode, r.stderr) for r in runs]
    for r in runs:
        assert TOKEN not in r.stdout + r.stderr
    for p in (node_env.state, node_env.cold, tmp_path / "home"):
        for f in p.rglob("*"):
            if f.is_file() and not f.is_symlink():
                assert TOKEN.encode() not in f.read_bytes(), f


def test_only_publish_hf_imports_huggingface_hub(node_env, isolated_env, ckpt: Path, hub: Hub) -> None:
    """huggingface_hub (~100 ms of imports) is this command's only: a publish of a directory, ls and
    preload never load it, nor the Hub source module."""
    from .test_fast_path import heavy_imported
    cfg = str(node_env.config)
    also = ("tiering.sources.hf",)
    for case in (["publish", str(ckpt), "--name", "m/x", "--version", "v1"], ["ls"], ["preload", "m/x@v1"]):
        got = heavy_imported(["--config", cfg, *case], dict(isolated_env), also=also)
        assert "huggingface_hub" not in got and "tiering.sources.hf" not in got, (case, got)
    got = heavy_imported(["--config", cfg, "publish", "hf://org/repo@v1"], {**isolated_env, **hub.env()}, also=also)
    assert "huggingface_hub" in got and "tiering.sources.hf" in got   # (the check above can see it)


def test_through_the_daemon_the_cli_downloads_and_the_daemon_publishes(daemon, wd, hub: Hub,  # noqa: F811
                                                                       node_env) -> None:
    """With a daemon running, this process downloads and checks (the token stays here), and the daemon
    publishes the checked snapshot as it publishes a directory (--daemon-only: it answered)."""
    r = wd("--daemon-only", "publish", "hf://org/repo@v1", "--json", env=hub.env(HF_TOKEN=TOKEN))
    assert r.returncode == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["version"] == hub.commit() and doc["source"]["revision"] == "v1"
    assert tree(preloaded(wd, f"org/repo@{hub.commit()}")) == source_files(hub.repo)
    # again: the daemon says it is published, and nothing is downloaded
    r = wd("--daemon-only", "publish", "hf://org/repo@main", env=hub.env(HF_TOKEN=TOKEN))
    assert r.returncode == 0 and "already: nothing to download" in r.stderr, (r.stdout, r.stderr)
    assert r.stdout.strip().splitlines()[-1].endswith(f"org/repo/{hub.commit()}")
    daemon.drain()
    assert TOKEN not in daemon.log_path.read_text() + r.stdout + r.stderr


def test_kill_9_mid_download_publishes_nothing_and_the_next_import_completes(wd, big_hub: Hub, node_env,
                                                                              isolated_env) -> None:
    blobs = repo_cache(node_env, big_hub) / "blobs"
    proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "publish",
                             "hf://org/repo@main"], env={**isolated_env, **big_hub.env()},
                            cwd=Path(__file__).parent.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            partial = list(blobs.glob("*.incomplete")) if blobs.is_dir() else []
            if any(p.stat().st_size > (4 << 20) for p in partial if p.exists()):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the import ended before a download was seen in flight"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    assert list(blobs.glob("*.incomplete")), "a killed import leaves its partial download for the next one"
    assert nothing_published(wd)
    doc = published(wd, big_hub, "hf://org/repo@main")
    assert doc["version"] == big_hub.commit()
    assert tree(preloaded(wd, f"org/repo@{big_hub.commit()}")) == source_files(big_hub.repo)
    assert not blobs.exists()


def test_two_imports_of_one_repository_at_once_both_succeed(wd, hub: Hub, node_env, weightd) -> None:
    """The first to finish removes the repository's downloads: the second waits its turn instead of
    losing its files (then finds the version published with the same content, or publishes its own)."""
    cfg = ["--config", str(node_env.config)]
    weightd.env = {**weightd.env, **hub.env()}
    a, b = weightd.at_once([*cfg, "publish", "hf://org/repo@main", "--json"],
                           [*cfg, "publish", "hf://org/repo@v1", "--name", "org/other", "--json"])
    assert (a.returncode, b.returncode) == (0, 0), (a.stderr, b.stderr)
    assert json.loads(a.stdout)["version"] == json.loads(b.stdout)["version"] == hub.commit()
    assert tree(preloaded(wd, "org/other")) == tree(preloaded(wd, "org/repo")) == source_files(hub.repo)


def test_a_signed_import(wd, hub: Hub, node_env, tmp_path: Path) -> None:
    """--sign signs the imported files as it signs a directory's (the same publish path)."""
    assert wd("keygen", tmp_path / "k").returncode == 0
    doc = published(wd, hub, "hf://org/repo@v1", "--sign", str(tmp_path / "k.pem"))
    assert doc["signed_by"]
    assert (node_env.cold / "org" / "repo" / hub.commit() / ".weightd" / "model.sig").is_file()
    assert tree(preloaded(wd, f"org/repo@{hub.commit()}")) == source_files(hub.repo)


def manifest_paths(node_env, name: str, version: str) -> set[str]:
    doc = json.loads((node_env.cold / name / version / ".weightd" / "manifest.json").read_text())
    return {f["path"] for f in doc["files"]}


def test_files_an_earlier_download_left_in_the_snapshot_are_not_published(wd, hub: Hub, node_env,
                                                                          monkeypatch) -> None:
    """An earlier download of every file of the commit (killed, failed or another --include) left the
    shards in the snapshot directory: an import that excludes them publishes exactly what it checked."""
    root = node_env.state / "imports" / "hf"
    first = fetched(hub, root, monkeypatch)                  # everything, downloaded and checked, not published
    assert (first.path / "model-00001-of-00002.safetensors").is_file()
    doc = published(wd, hub, "hf://org/repo@main", "--exclude", "*.safetensors")
    assert doc["version"].startswith(hub.commit() + "-")       # (a selection's label)
    paths = manifest_paths(node_env, "org/repo", doc["version"])
    assert doc["source"]["files"] == len(paths) and paths
    assert not any(p.endswith(".safetensors") for p in paths)
    assert paths == {k for k in source_files(hub.repo) if not k.endswith(".safetensors")}
    # the cache is keyed by endpoint: the same Hub by another name is another cache
    other = copy.copy(hub)
    other.endpoint = f"http://localhost:{hub.port}"
    assert repo_cache(node_env, other) != repo_cache(node_env, hub)
    again = fetched(other, root, monkeypatch, include=["config.json"])
    assert again.repo_cache == repo_cache(node_env, other) and again.path.name == hub.commit()
    assert [p.name for p in again.path.iterdir()] == ["config.json"]


def test_bytes_changed_between_the_check_and_the_publish_are_refused(hub: Hub, node_env, monkeypatch) -> None:
    """The publish is held to the inodes that were hashed, as they were: a blob rewritten in place (same
    size, mtime put back) or swapped for another file is refused (FileChanged, exit 5), nothing published."""
    from tiering.errors import FileChanged
    from weightd.errors import exit_code_for
    snap = fetched(hub, node_env.state / "imports" / "hf", monkeypatch)
    node = node_env.node()
    try:
        # a shard swapped for another file (a new inode) with the Hub's bytes and the old mtime
        shard = (snap.path / "model-00002-of-00002.safetensors").resolve()
        fresh = shard.with_name("swap")
        fresh.write_bytes(shard.read_bytes())
        os.utime(fresh, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns))
        os.replace(fresh, shard)
        with pytest.raises(FileChanged) as exc:
            node.publish(snap.path, "org/repo", "v1", check=snap.check)
        assert "model-00002-of-00002.safetensors" in str(exc.value) and exit_code_for(exc.value) == 5
        with pytest.raises(FileChanged, match="changed after its hash was checked"):
            snap.publishable()
        # config.json rewritten in place: its inode, size and mtime as verified, one bit not
        blob = (snap.path / "config.json").resolve()
        st = blob.stat()
        data = bytearray(blob.read_bytes())
        data[1] ^= 0x01
        with open(blob, "r+b") as fh:
            fh.write(bytes(data))
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(FileChanged) as exc:
            node.publish(snap.path, "org/repo", "v1", check=snap.check)
        assert "config.json" in str(exc.value) and exit_code_for(exc.value) == 5
        with pytest.raises(FileChanged, match="config.json"):
            snap.unchanged()
    finally:
        node.close()
    assert not (node_env.cold / "org" / "repo").exists()


class _Listing:
    """The Hub's answers as JSON, through huggingface_hub's own RepoFile: a hostile Hub olah cannot be."""

    def __init__(self, entries: list[dict], sha: str = "c" * 40) -> None:
        from huggingface_hub.hf_api import RepoFile
        self.endpoint, self.sha = "https://hub.example", sha
        self.entries = [RepoFile(**e) for e in entries]

    def list_repo_tree(self, repo_id, revision, recursive):
        return iter(self.entries)

    def model_info(self, repo_id, revision, timeout=None):
        from types import SimpleNamespace
        return SimpleNamespace(sha=self.sha)


GOOD = {"path": "config.json", "size": 3, "oid": "a" * 40}
LFS = {"path": "m.safetensors", "size": 9, "oid": "b" * 40, "lfs": {"size": 9, "oid": "d" * 64, "pointerSize": 130}}


@pytest.mark.parametrize("entry, code, needle", [
    ({**GOOD, "path": "/etc/passwd"}, 2, "absolute path"),
    ({**GOOD, "path": "a/../../x"}, 2, "'..'"),
    ({**GOOD, "path": "a//b"}, 2, "empty parts"),
    ({**GOOD, "path": "a\\..\\b"}, 2, "backslash"),
    ({**GOOD, "path": "x\x1b[2Jy"}, 2, "control character"),
    ({**GOOD, "size": "3"}, 1, "not a byte count"),
    ({**GOOD, "size": None}, 1, "not a byte count"),
    ({**GOOD, "size": -1}, 1, "not a byte count"),
    ({**GOOD, "oid": "zz"}, 1, "not 40 hex digits"),
    ({**GOOD, "oid": None}, 1, "not 40 hex digits"),
    ({**LFS, "lfs": {"size": 9, "oid": "../x", "pointerSize": 1}}, 1, "not 64 hex digits"),
    ({**LFS, "lfs": {"size": 10, "oid": "d" * 64, "pointerSize": 1}}, 1, "LFS size 10"),
])
def test_a_hostile_listing_is_one_line_with_its_exit_code(entry: dict, code: int, needle: str) -> None:
    from tiering.sources.hf import list_files, parse_hub_ref
    from weightd.errors import exit_code_for
    with pytest.raises(Exception) as exc:
        list_files(_Listing([GOOD, entry]), parse_hub_ref("hf://org/repo"), "c" * 40)
    assert exit_code_for(exc.value) == code, repr(exc.value)
    assert needle in str(exc.value) and "\n" not in str(exc.value) and "\x1b" not in repr(str(exc.value))[1:-1]


def test_a_listing_twice_the_same_path_and_a_well_formed_one() -> None:
    from tiering.sources.hf import list_files, parse_hub_ref
    from tiering.sources.hf_files import HubError
    ref = parse_hub_ref("hf://org/repo")
    with pytest.raises(HubError, match="twice"):
        list_files(_Listing([GOOD, GOOD]), ref, "c" * 40)
    files = list_files(_Listing([LFS, {**GOOD, "oid": "A" * 40}]), ref, "c" * 40)
    assert [(f.path, f.size, f.blob_sha1, f.sha256) for f in files] == [
        ("config.json", 3, "a" * 40, None), ("m.safetensors", 9, "b" * 40, "d" * 64)]


def test_a_commit_sha_revision_names_only_that_commit() -> None:
    from tiering.sources.hf import parse_hub_ref, resolve
    from tiering.sources.hf_files import HubError
    asked = "e" * 40
    with pytest.raises(HubError, match=f"answered commit {'f' * 40} for the commit SHA {asked}"):
        resolve(_Listing([GOOD], sha="f" * 40), parse_hub_ref(f"hf://org/repo@{asked}"))
    assert resolve(_Listing([GOOD], sha=asked), parse_hub_ref(f"hf://org/repo@{asked.upper()}")) == asked
    assert resolve(_Listing([GOOD], sha=asked), parse_hub_ref("hf://org/repo@main")) == asked


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_cache_too_small_is_no_space_before_any_download(wd, hub: Hub, node_env) -> None:
    """1 MiB of tmpfs for 4 MiB of files: the size is said, then exit 6 before a byte is downloaded."""
    cache = node_env.state / "imports" / "hf"
    _mount_tmpfs(cache, "size=1m,mode=0700")
    try:
        r = wd("publish", "hf://org/repo@main", env=hub.env())
        assert_one_line_error(r, 6, "still to download", "free there")
        assert "selected" in r.stderr and "to download into" in r.stderr
        assert not list(cache.rglob("blobs/*"))
        assert nothing_published(wd)
    finally:
        subprocess.run(["umount", str(cache)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only tmpfs (root only)")
def test_the_cache_directory_must_be_ours_and_private(wd, hub: Hub, node_env, tmp_path: Path) -> None:
    imports = node_env.state / "imports"
    imports.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (imports / "hf").symlink_to(tmp_path / "elsewhere")
    assert_one_line_error(wd("publish", "hf://org/repo@main", env=hub.env()), 2, "not a directory (a symlink?)")
    (imports / "hf").unlink()
    (imports / "hf").mkdir(mode=0o755)
    os.chmod(imports / "hf", 0o755)
    assert_one_line_error(wd("publish", "hf://org/repo@main", env=hub.env()), 2, "open to other users (mode 755)")
    shutil.rmtree(imports)
    _mount_tmpfs(imports, "ro,size=1m")                 # a read-only state directory: the user's ~/.cache
    try:
        doc = published(wd, hub, "hf://org/repo@main", "--include", "*.json")
        assert doc["version"].startswith(hub.commit() + "-")
        assert (tmp_path / "home" / ".cache" / "weightd" / "hf").is_dir()
    finally:
        subprocess.run(["umount", str(imports)], check=True)


def test_an_endpoints_cache_must_be_ours_and_private(wd, hub: Hub, node_env, tmp_path: Path) -> None:
    """The cache of one endpoint (imports/hf/endpoint-<hash>) swapped for a symlink to a directory
    someone planted, or opened to others: refused in one line, nothing written through the link."""
    from tiering.sources.hf import endpoint_key
    published(wd, hub, "hf://org/repo@main", "--include", "*.json", "--version", "json")
    d = node_env.state / "imports" / "hf" / endpoint_key(hub.endpoint)
    assert d.is_dir()
    shutil.rmtree(d)
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    d.symlink_to(planted)
    assert_one_line_error(wd("publish", "hf://org/repo@main", env=hub.env()), 2,
                          "the endpoint's download cache is not a directory (a symlink?)")
    assert list(planted.iterdir()) == []
    d.unlink()
    d.mkdir()
    os.chmod(d, 0o755)
    assert_one_line_error(wd("publish", "hf://org/repo@main", env=hub.env()), 2,
                          "the endpoint's download cache is open to other users (mode 755)")
    os.chmod(d, 0o700)
    os.chown(d, 65534, 65534)
    assert_one_line_error(wd("publish", "hf://org/repo@main", env=hub.env()), 2,
                          "the endpoint's download cache belongs to uid 65534")


def test_a_selection_has_a_label_of_its_own_and_a_later_whole_import_is_not_taken_for_it(wd, hub: Hub) -> None:
    """--include without --version: the label is the commit and the selection (<sha>-<8 hex>); the whole
    repository imported after it is the commit's own label, downloaded, never reported as the selection."""
    part = published(wd, hub, "hf://org/repo@main", "--include", "*.json")
    assert part["version"].startswith(hub.commit() + "-") and part["source"].get("downloaded") != 0
    whole = published(wd, hub, "hf://org/repo@main")
    assert whole["version"] == hub.commit() and not whole["unchanged"] and whole["bytes"] > part["bytes"]
    again = published(wd, hub, "hf://org/repo@main", "--include", "*.json")
    assert again["version"] == part["version"] and again["source"]["downloaded"] == 0


def test_root_on_a_node_whose_state_directory_is_the_daemons_downloads_under_its_home(wd, hub: Hub, node_env,
                                                                                      tmp_path: Path) -> None:
    """The state directory owned by the daemon's user: a root CLI import must not leave a root-owned
    cache there (the daemon's own imports would then fail), so it downloads under ~/.cache."""
    node_env.state.mkdir(parents=True, exist_ok=True)
    os.chown(node_env.state, 65534, 65534)
    try:
        doc = published(wd, hub, "hf://org/repo@main", "--include", "*.json")
        assert doc["version"].startswith(hub.commit())
        assert not (node_env.state / "imports").exists()
        assert (tmp_path / "home" / ".cache" / "weightd" / "hf").is_dir()
    finally:
        os.chown(node_env.state, 0, 0)


def test_a_token_goes_over_https_or_loopback_only_and_no_userinfo_is_shown(wd, hub: Hub) -> None:
    r = wd("publish", "hf://org/repo@main", env=hub.env(HF_TOKEN=TOKEN, HF_ENDPOINT="http://u:s3cret@192.0.2.1:9"))
    assert_one_line_error(r, 2, "refusing to send the Hugging Face token over plain http://", "http://192.0.2.1:9")
    dead = reserve_port()
    r = wd("publish", "hf://org/repo@main", env=hub.env(HF_ENDPOINT=f"http://u:s3cret@127.0.0.1:{dead}"))
    assert_one_line_error(r, 1, f"on http://127.0.0.1:{dead}", "does not answer")
    for out in (r,):
        assert "s3cret" not in out.stdout + out.stderr and TOKEN not in out.stdout + out.stderr
    r = wd("publish", "hf://org/repo@main", "--include", "*.json", env=hub.env(HF_TOKEN=TOKEN))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("token goes over plain http://") == 1 and TOKEN not in r.stderr


def test_a_bad_download_removes_its_own_blob_and_nothing_a_planted_link_leads_to(tmp_path: Path) -> None:
    """remove_download after a hash mismatch: a snapshot link into the repository's blobs/ takes its
    blob with it; one planted to lead elsewhere (a file of the user's) loses the link only."""
    from tiering.sources.hf_files import remove_download
    repo = tmp_path / "models--org--repo"
    blobs, snap = repo / "blobs", repo / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "b1").write_bytes(b"bad")
    (snap / "model.safetensors").symlink_to(blobs / "b1")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (snap / "config.json").symlink_to(victim)
    remove_download(snap, "model.safetensors")
    assert not (blobs / "b1").exists() and not (snap / "model.safetensors").is_symlink()
    remove_download(snap, "config.json")
    assert victim.read_bytes() == b"keep" and not (snap / "config.json").is_symlink()


def test_the_first_import_into_a_cold_store_not_made_yet_makes_it(wd, hub: Hub, node_env) -> None:
    """As the first publish of a directory does: no store yet is not 'published already?' failing."""
    shutil.rmtree(node_env.cold)
    doc = published(wd, hub, "hf://org/repo@main", "--include", "*.json")
    assert (node_env.cold / "org" / "repo" / doc["version"] / ".weightd" / "manifest.json").is_file()
