"""Companions attacked for real: a --companion-dir another uid (65534) planted or owns, and a signed
companion a cold-storage writer re-points at other content."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tiering import make_checkpoint


def _cache(root: Path, n: int = 6, seed: str = "a") -> Path:
    for i in range(n):
        p = root / f"rank_0_0/inductor_cache/{i % 3:02d}" / f"k{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {seed} {i}\n" * 20)
    (root / "index.json").write_text(json.dumps({"seed": seed}))
    return root


def _as_nobody(fn) -> None:
    """Run ``fn`` in a forked child that dropped to uid/gid 65534 (the hostile local user)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.fixture
def shared():
    """A /tmp-like shared directory (root's, 1777) that uid 65534 can reach, and a root-only 0700
    directory beside it holding an engine's index.json."""
    base = Path(tempfile.mkdtemp(prefix="wd-shared-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        (base / "shared").mkdir()
        os.chmod(base / "shared", 0o1777)
        secret = base / "root-only"
        secret.mkdir(mode=0o700)
        (secret / "index.json").write_text("root's own\n")
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_companion_dir_planted_by_another_uid_is_refused_and_nothing_written(wd, node_env, tmp_path, shared):
    ck = make_checkpoint(tmp_path / "ck", total_bytes=1 << 20, shards=1, layers=1)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1").returncode == 0
    assert wd("publish", _cache(tmp_path / "cache"), "--companion-of", "org/m@v1", "--kind", "compile-cache",
              "--key", "k1").returncode == 0
    secret = shared / "root-only"
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in secret.iterdir()}

    # uid 65534 plants shared/cache -> the root-only directory, and owns shared/owned outright
    def plant() -> None:
        os.symlink(secret, shared / "shared/cache")
        os.mkdir(shared / "shared/owned", 0o755)
    _as_nobody(plant)
    assert (shared / "shared/cache").is_symlink() and (shared / "shared/owned").stat().st_uid == 65534

    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1",
           "--companion-dir", shared / "shared/cache")
    assert_one_line_error(r, 2, str(shared / "shared/cache"), "symlink")
    assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in secret.iterdir()} == before
    assert stat.S_IMODE(secret.stat().st_mode) == 0o700

    # a directory of uid 65534's (it could swap a file in it for a link, or read what lands there)
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1",
           "--companion-dir", shared / "shared/owned/sub")
    assert_one_line_error(r, 2, str(shared / "shared/owned"), "uid 65534")
    assert list((shared / "shared/owned").iterdir()) == []
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1",
           "--companion-dir", shared / "shared/owned")
    assert_one_line_error(r, 2, str(shared / "shared/owned"), "uid 65534")
    assert list((shared / "shared/owned").iterdir()) == []

    # a parent on the way that is a symlink is not followed either
    os.symlink(shared / "shared", shared / "alias")
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1",
           "--companion-dir", shared / "alias/mine")
    assert_one_line_error(r, 2, str(shared / "alias"), "symlink")
    assert not (shared / "shared/mine").exists()

    # root's own directory in the same shared place works (made 0755 less the umask, root's)
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1",
           "--companion-dir", shared / "shared/torchinductor_root", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["companions"][0]["installed"]["copied"] == 7
    assert (shared / "shared/torchinductor_root/index.json").stat().st_uid == 0


def test_companion_dir_with_a_subdirectory_another_uid_owns_is_refused(tmp_path, shared):
    """Inside DIR too: a directory of another uid's (say DIR was once group-writable) is not written into."""
    from weightd.node.companion import install
    from weightd.errors import InvalidRequest
    src = _cache(tmp_path / "src")
    dest = shared / "shared/mine"
    dest.mkdir(mode=0o755)
    os.mkdir(dest / "rank_0_0", 0o755)
    os.chown(dest / "rank_0_0", 65534, 65534)
    with pytest.raises(InvalidRequest, match="uid 65534"):
        install(str(src), str(dest))
    assert list((dest / "rank_0_0").iterdir()) == []


# -- a signed companion re-pointed by a cold-storage writer ------------------------------------------

def _trust(node_env, pub: Path, *, required: bool) -> None:
    with open(node_env.config, "a") as fh:
        fh.write(f'[trust]\nrequire_signature = {"true" if required else "false"}\npublic_keys = ["{pub}"]\n')


def _writable_tree(d: Path) -> None:   # (a cold writer owns the store: publish leaves it read-only)
    for p in [d, *d.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, 0o755 if p.is_dir() else 0o644)


def test_a_signed_companion_cannot_be_re_pointed_at_other_content(wd, node_env, tmp_path):
    from tiering.content.manifest import MANIFEST_RELPATH
    r = wd("keygen", tmp_path / "fleet")
    assert r.returncode == 0, r.stderr
    key, pub = tmp_path / "fleet.pem", tmp_path / "fleet.pub.pem"
    a = make_checkpoint(tmp_path / "a", total_bytes=1 << 20, shards=1, layers=1, seed="a")
    assert wd("publish", a, "--name", "org/m", "--version", "v1", "--sign", key).returncode == 0
    r = wd("publish", _cache(tmp_path / "cache"), "--companion-of", "org/m@v1", "--kind", "compile-cache",
           "--key", "k1", "--sign", key)
    assert r.returncode == 0, r.stderr
    comp = node_env.cold / "org/m/v1~compile-cache~k1"
    # the signature says what it was built for, and model-signing's own verifier still accepts it
    from tests.test_signing import _model_signing
    v = _model_signing("verify", "key", str(comp), "--signature", str(comp / ".weightd/model.sig"),
                       "--public_key", str(pub))
    assert v.returncode == 0, v.stdout + v.stderr
    # v1 is published again with other (signed) content; its old cache is not valid for it...
    shutil.rmtree(node_env.cold / "org/m/v1")
    b = make_checkpoint(tmp_path / "b", total_bytes=1 << 20, shards=1, layers=1, seed="b")
    assert wd("publish", b, "--name", "org/m", "--version", "v1", "--sign", key).returncode == 0
    new_digest = json.loads((node_env.cold / "org/m/v1" / MANIFEST_RELPATH).read_text())["digest"]
    _trust(node_env, pub, required=True)
    assert_one_line_error(wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1"), 3,
                          "published for other content")
    # ... so a cold writer re-points it: of.digest is outside the manifest digest and was outside the signature
    _writable_tree(comp)
    mpath = comp / MANIFEST_RELPATH
    m = json.loads(mpath.read_text())
    m["of"]["digest"] = new_digest
    mpath.write_text(json.dumps(m))
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1")
    assert_one_line_error(r, 5, "org/m@v1~compile-cache~k1", "of.digest", "re-pointed")
    assert not (node_env.hot / "org/m/v1~compile-cache~k1").exists()
    assert not (node_env.warm / "org/m/v1~compile-cache~k1").exists()


def test_a_companion_signed_the_old_way(wd, node_env, tmp_path):
    """A signature made before the statement bound the companion to its version (the same bundle without
    "companion_of"): refused where signatures are required, naming what to do; loaded as unsigned
    (with a warning) where they are not."""
    from tiering.content.build import verify_checkpoint
    from tiering.content.manifest import MANIFEST_RELPATH
    from tiering.content.manifest_parse import load_manifest
    from tiering.content.signature import HASHERS, SIGNATURE_RELPATH, sign
    assert wd("keygen", tmp_path / "fleet").returncode == 0
    key, pub = tmp_path / "fleet.pem", tmp_path / "fleet.pub.pem"
    a = make_checkpoint(tmp_path / "a", total_bytes=1 << 20, shards=1, layers=1, seed="a")
    assert wd("publish", a, "--name", "org/m", "--version", "v1", "--sign", key).returncode == 0
    assert wd("publish", _cache(tmp_path / "cache"), "--companion-of", "org/m@v1", "--kind", "compile-cache",
              "--key", "old").returncode == 0
    comp = node_env.cold / "org/m/v1~compile-cache~old"
    m = load_manifest(comp / MANIFEST_RELPATH)
    digests = verify_checkpoint(comp, m, crypto=HASHERS["sha256"]).crypto_digests
    _writable_tree(comp)
    (comp / SIGNATURE_RELPATH).write_bytes(sign(key, "org/m@v1~compile-cache~old", digests))   # (as weightd did)
    cfg = node_env.config.read_text()
    _trust(node_env, pub, required=True)
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "old")
    assert_one_line_error(r, 5, "org/m@v1~compile-cache~old", "does not cover which content",
                          "publish the companion again")
    node_env.config.write_text(cfg)
    _trust(node_env, pub, required=False)
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "old", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["companions"][0]["signature"] is None
