"""A careless config must not delete published checkpoints: hot, warm, cold and the state directory are
refused at load unless they are separate directories (by resolved path, and by device and inode for a
bind mount), and weightd removes only what it can prove it made (a tier root carrying its marker, a
version directory holding nothing its manifest does not list); what it refuses is left alone, logged,
counted and reported. Every attack is played through the real ``weightd`` CLI in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, NodeEnv, assert_one_line_error
TIER_MARKER = ".weightd-tier"   # (weightd's marker in a local tier root: tiering.layout.TIER_MARKER)


def _files(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*")) if p.is_file()}


def _config(env: NodeEnv, *, hot: Path | None = None, warm: Path | None = None, cold: Path | None = None,
            state: Path | None = None, warm_capacity: str = "1MiB") -> Path:
    """``env``'s config with some places changed (warm's capacity small: gc wants to evict)."""
    hot, warm, cold, state = hot or env.hot, warm or env.warm, cold or env.cold, state or env.state
    f = env.tmp / "careless.toml"
    f.write_text(f'state_dir = "{state}"\n'
                 f'[tiers.hot]\npath = "{hot}"\ncapacity = "64MiB"\n'
                 f'[tiers.warm]\npath = "{warm}"\ncapacity = "{warm_capacity}"\n'
                 f'[tiers.cold]\npath = "{cold}"\n'
                 f'[api]\nsocket = "{env.state}/weightd.sock"\n'
                 f'[p2p]\nlisten = "127.0.0.1:0"\n')
    return f


@pytest.fixture
def published(wd, node_env: NodeEnv, ckpt: Path) -> dict[str, int]:
    """Two versions published to cold storage (with a config that is fine); what cold holds."""
    for v in ("v1", "v2"):
        r = wd("publish", ckpt, "--name", "acme/m", "--version", v)
        assert r.returncode == 0, r.stderr
    return _files(node_env.cold)


def test_warm_on_the_cold_path_is_refused_and_deletes_nothing(weightd, node_env: NodeEnv, published) -> None:
    """The reported attack: [tiers.warm] path = the cold path, 1 MiB. Was: status listed cold's versions
    as warm copies and gc "evicted" them from cold storage."""
    cfg = _config(node_env, warm=node_env.cold)
    for args in (("status",), ("gc",), ("evict", "acme/m@v1", "--tier", "warm"), ("preload", "acme/m@v1")):
        r = weightd("--config", cfg, "--no-daemon", *args)
        assert_one_line_error(r, 2, "tiers.warm.path", "tiers.cold.path", str(node_env.cold), "same directory")
    assert _files(node_env.cold) == published


@pytest.mark.parametrize("case", ["warm inside cold", "cold inside warm", "state inside hot", "hot contains warm"])
def test_nested_places_are_refused_at_load(weightd, node_env: NodeEnv, published, case: str) -> None:
    keys = {"warm inside cold": ("tiers.warm.path", "tiers.cold.path", "is inside"),
            "cold inside warm": ("tiers.warm.path", "tiers.cold.path", "contains"),
            "state inside hot": ("tiers.hot.path", "state_dir", "contains"),
            "hot contains warm": ("tiers.hot.path", "tiers.warm.path", "contains")}[case]
    if case == "warm inside cold":
        cfg = _config(node_env, warm=node_env.cold / "acme")
    elif case == "cold inside warm":
        # (the store moved under a directory the warm tier is then pointed at)
        moved = node_env.tmp / "data"
        moved.mkdir()
        shutil.move(node_env.cold, moved / "cold")
        node_env.cold = moved / "cold"
        published = _files(node_env.cold)
        cfg = _config(node_env, warm=moved, cold=node_env.cold)
    elif case == "state inside hot":
        cfg = _config(node_env, state=node_env.hot / "state")
    else:
        cfg = _config(node_env, warm=node_env.hot / "warm")
    for args in (("gc",), ("status",)):
        r = weightd("--config", cfg, "--no-daemon", *args)
        assert_one_line_error(r, 2, *keys)
    assert _files(node_env.cold) == published
    assert not (node_env.hot / "state").exists() and not (node_env.cold / "acme" / ".weightd-tier").exists()


def test_a_symlinked_spelling_of_the_cold_directory_is_refused(weightd, node_env: NodeEnv, published) -> None:
    """warm = <alias>/cold where <alias> is a symlink to cold's parent: the same directory by another
    name (the tier root itself is no symlink, so the root check alone does not catch it)."""
    alias = node_env.tmp / "alias"
    alias.symlink_to(node_env.cold.parent, target_is_directory=True)
    cfg = _config(node_env, warm=alias / node_env.cold.name)
    r = weightd("--config", cfg, "--no-daemon", "gc")
    assert_one_line_error(r, 2, "tiers.warm.path", "tiers.cold.path", "same directory", str(alias / "cold"))
    assert _files(node_env.cold) == published


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a bind mount needs root")
def test_a_bind_mount_of_the_cold_directory_is_refused(isolated_env, node_env: NodeEnv, published) -> None:
    """warm = a bind mount of cold storage (in a mount namespace of its own): same device and inode,
    no symlink to resolve."""
    bind = node_env.tmp / "bind"
    bind.mkdir()
    cfg = _config(node_env, warm=bind)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount --bind "$1" "$2" && exec "$3" -m weightd --config "$4" --no-daemon gc', "sh",
                        str(node_env.cold), str(bind), sys.executable, str(cfg)],
                       capture_output=True, text=True, timeout=120, env=isolated_env, cwd=ROOT)
    if "mount:" in r.stderr and "permission denied" in r.stderr.lower():
        pytest.skip(f"no bind mounts here: {r.stderr.strip()}")
    assert_one_line_error(r, 2, "tiers.warm.path", "tiers.cold.path", "same directory", str(bind))
    assert _files(node_env.cold) == published


def _data_dir_with_a_version_and_notes(node_env: NodeEnv) -> tuple[Path, Path]:
    """An existing data directory (no weightd marker) holding a directory shaped like a version (a
    copy of a published one, manifest and all) with the operator's NOTES.txt beside the weights."""
    data = node_env.tmp / "data"
    run = data / "acme" / "m" / "v1"
    shutil.copytree(node_env.cold / "acme" / "m" / "v1", run)
    (run / "NOTES.txt").write_text("run 1: lr 3e-4, loss 1.92 at step 40k\n")
    for d in (data, *data.rglob("*")):
        if d.is_dir():
            d.chmod(0o755)
    return data, run


def test_warm_over_a_data_directory_refuses_to_delete_it(weightd, node_env: NodeEnv, published) -> None:
    """The reported attack: warm pointed at an existing data directory. Was: the version-shaped directory
    (manifest plus NOTES.txt) was deleted whole while gc said "rejected 0"."""
    data, run = _data_dir_with_a_version_and_notes(node_env)
    before = _files(data)
    cfg = _config(node_env, warm=data)

    r = weightd("--config", cfg, "--no-daemon", "gc")
    assert r.returncode == 0, r.stderr
    assert "refused acme/m@v1 (warm)" in r.stdout and "NOTES.txt" in r.stdout, r.stdout
    assert "no .weightd-tier marker" in r.stdout, r.stdout
    r = weightd("--config", cfg, "--no-daemon", "gc", "--json")
    assert r.returncode == 0, r.stderr
    import json
    doc = json.loads(r.stdout)
    assert doc["refused"] and doc["refused"][0].startswith("acme/m@v1 (warm): ") and doc["evicted"] == []
    assert "NOTES.txt" in doc["reconcile"]["warm"]["not_ours"]

    r = weightd("--config", cfg, "--no-daemon", "evict", "acme/m@v1", "--tier", "warm")
    assert_one_line_error(r, 2, str(run), "not removed", "NOTES.txt")
    r = weightd("--config", cfg, "--no-daemon", "preload", "acme/m@v2", "--tier", "warm", "--strict")
    assert_one_line_error(r, 2, str(data), "neither places nor removes")
    assert _files(data) == before     # nothing deleted, nothing placed (not even a lock file)
    assert not (data / TIER_MARKER).exists()
    assert _files(node_env.cold) == published


def test_a_file_added_to_a_copy_weightd_placed_keeps_the_copy(wd, node_env: NodeEnv, published) -> None:
    """In weightd's own tier, a version directory holding a file its manifest does not list (notes an
    operator put beside the weights) is not evicted: refused, said, and left whole."""
    r = wd("--no-daemon", "preload", "acme/m@v1", "--tier", "warm")
    assert r.returncode == 0, r.stderr
    assert (node_env.warm / TIER_MARKER).is_file()    # weightd made the root: its marker is there
    copy = node_env.warm / "acme" / "m" / "v1"
    (copy / "original").mkdir(exist_ok=True)
    (copy / "original" / "NOTES.txt").write_text("keep me\n")
    before = _files(copy)
    r = wd("--no-daemon", "evict", "acme/m@v1", "--tier", "warm", "--force")
    assert_one_line_error(r, 2, str(copy), "original/NOTES.txt", "which its manifest does not list")
    assert _files(copy) == before
    r = wd("--no-daemon", "gc")    # (within capacity: nothing to evict, nothing refused)
    assert r.returncode == 0 and "refused" not in r.stdout.replace("refused 0", ""), (r.stdout, r.stderr)
    (copy / "original" / "NOTES.txt").unlink()
    r = wd("--no-daemon", "evict", "acme/m@v1", "--tier", "warm", "--force")   # only its own files: evicted
    assert r.returncode == 0, r.stderr
    assert not copy.exists()


def test_an_unmarked_root_is_adopted_only_with_what_weightd_recorded_placing(wd, weightd, node_env: NodeEnv,
                                                                              published) -> None:
    """An unmarked root holding a version state has no record of placing (an operator's copy of a
    published version) is not weightd's: gc evicts nothing there and writes no marker, even though
    the copy looks exactly like weightd's layout: its shape alone proves nothing, and weightd never
    deletes an operator's file from a root weightd did not make. A tier an older weightd made (no
    marker, every version in it one that state records placing, empty .trash, staging side files of
    its own names) is adopted: marked, and gc evicts from it as before."""
    old = node_env.tmp / "oldwarm"
    shutil.copytree(node_env.cold / "acme" / "m" / "v1", old / "acme" / "m" / "v1")
    for d in (old, *old.rglob("*")):
        if d.is_dir():
            d.chmod(0o700 if d == old else 0o755)
    before = _files(old)
    cfg = _config(node_env, warm=old, warm_capacity="1KiB")
    r = weightd("--config", cfg, "--no-daemon", "gc")
    assert r.returncode == 0, r.stderr
    assert "evicted acme/m@v1" not in r.stdout and "refused acme/m@v1 (warm)" in r.stdout, r.stdout
    assert "no record of placing" in r.stdout, r.stdout
    assert _files(old) == before and not (old / TIER_MARKER).exists()

    # the tier an older weightd made: weightd placed v1 (state records it), then the marker is gone
    r = wd("--no-daemon", "preload", "acme/m@v1", "--tier", "warm", "--lease", "0")
    assert r.returncode == 0, r.stderr
    (node_env.warm / TIER_MARKER).unlink()
    for d in (".trash", ".staging", ".locks"):
        (node_env.warm / d).mkdir(mode=0o700, exist_ok=True)
    (node_env.warm / ".staging" / "acme--m@v9.resumable.json").write_text("{}")
    cfg = _config(node_env, warm_capacity="1KiB")
    r = weightd("--config", cfg, "--no-daemon", "gc")
    assert r.returncode == 0, r.stderr
    assert "evicted acme/m@v1 (warm)" in r.stdout and "refused" not in r.stdout.replace("refused 0", ""), r.stdout
    assert (node_env.warm / TIER_MARKER).is_file() and not (node_env.warm / "acme" / "m" / "v1").exists()


def test_an_operators_edited_copy_is_not_removed_at_start(weightd, node_env: NodeEnv, published) -> None:
    """A copy of a published version in a data directory, one weight file overwritten in place (same
    names as its manifest: shaped like weightd's). Was: the root was adopted by shape, the start's
    reconciliation verified the copy, and removed it for failing ("rejected 0" said nothing)."""
    data = node_env.tmp / "data"
    shutil.copytree(node_env.cold / "acme" / "m" / "v1", data / "acme" / "m" / "v1")
    for d in (data, *data.rglob("*")):
        if d.is_dir():
            d.chmod(0o755)
    shard = data / "acme" / "m" / "v1" / "model-00001-of-00003.safetensors"
    with open(shard, "r+b") as f:   # (the operator's fine-tuned bytes, same size)
        f.seek(4096)
        f.write(b"operator's own weights" * 100)
    before = _files(data)
    mine = shard.read_bytes()
    cfg = _config(node_env, warm=data)
    for args in (("gc",), ("gc", "--json")):
        r = weightd("--config", cfg, "--no-daemon", *args)
        assert r.returncode == 0, r.stderr
    assert "no record of placing acme/m@v1" in r.stdout, r.stdout
    assert _files(data) == before and shard.read_bytes() == mine and not (data / TIER_MARKER).exists()


@pytest.mark.parametrize("planted", ["trash", "staging", "locks"])
def test_an_unmarked_root_with_files_in_weightds_private_names_is_not_adopted(weightd, node_env: NodeEnv,
                                                                            published, planted: str) -> None:
    """An operator's directory (0700, weightd's owner) with files in .trash/, a non-staging name in
    .staging/ or something not a lock in .locks/. Was: adopted (those names were taken for weightd's
    own without looking inside), then reconciliation removed .trash and every staging entry."""
    warm = node_env.tmp / "mywarm"
    warm.mkdir(mode=0o700)
    sub = warm / f".{planted}"
    sub.mkdir(mode=0o700)
    if planted == "trash":
        (sub / "important.bin").write_bytes(b"x" * 4096)
    elif planted == "staging":
        (sub / "mywork").mkdir()
        (sub / "mywork" / "notes").write_text("mine\n")
    else:
        (sub / "keys").mkdir()
        (sub / "keys" / "id").write_text("mine\n")
    before = _files(warm)
    cfg = _config(node_env, warm=warm)
    r = weightd("--config", cfg, "--no-daemon", "gc", "--json")
    assert r.returncode == 0, r.stderr
    import json
    assert f".{planted}/" in json.loads(r.stdout)["reconcile"]["warm"]["not_ours"], r.stdout
    r = weightd("--config", cfg, "--no-daemon", "preload", "acme/m@v1", "--tier", "warm", "--strict")
    assert_one_line_error(r, 2, str(warm), "neither places nor removes")
    assert _files(warm) == before and not (warm / TIER_MARKER).exists()


def test_capacity_holds_when_the_only_victim_is_refused(wd, node_env: NodeEnv, published) -> None:
    """warm holds v1 with an operator's file added (not removable); v2 fits only if v1 goes. Was: the
    plan counted v1 as evictable, its eviction was refused, and v2 was placed anyway: the tier went
    over its capacity. Now: no space (exit 6), naming v1 and why it is kept."""
    node_env.write_config("64MiB", "10MiB")
    r = wd("--no-daemon", "preload", "acme/m@v1", "--tier", "warm", "--lease", "0")   # (not leased: evictable)
    assert r.returncode == 0, r.stderr
    copy = node_env.warm / "acme" / "m" / "v1"
    (copy / "NOTES.txt").write_text("keep me\n")
    before = _files(copy)
    r = wd("--no-daemon", "preload", "acme/m@v2", "--tier", "warm", "--strict")
    assert_one_line_error(r, 6, "acme/m@v1", "NOTES.txt")
    assert not (node_env.warm / "acme" / "m" / "v2").exists() and _files(copy) == before
    used = sum(p.stat().st_size for p in node_env.warm.rglob("*") if p.is_file() and ".weightd" not in p.parts)
    assert used <= 10 << 20


def test_a_foreign_root_is_reported_by_check_status_and_readyz(weightd, node_env: NodeEnv, published) -> None:
    """warm over a data directory weightd will not use. Was: serve --check said ok, status listed no
    problem (so /readyz was ready) while every preload into warm failed with exit 2."""
    data, run = _data_dir_with_a_version_and_notes(node_env)
    before = _files(data)
    cfg = _config(node_env, warm=data)
    r = weightd("--config", cfg, "serve", "--check")
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = next(x for x in r.stdout.splitlines() if "tier warm" in x)
    assert line.startswith("FAIL") and "NOTES.txt" in line and "neither places nor removes" in line, r.stdout
    r = weightd("--config", cfg, "--no-daemon", "status", "--json")
    assert r.returncode == 2, r.stderr   # (storage not as configured: as for cold storage unmounted)
    import json
    problems = json.loads(r.stdout)["problems"]
    assert [p["where"] for p in problems] == ["warm"] and "NOTES.txt" in problems[0]["reason"], problems
    assert _files(data) == before and not (data / TIER_MARKER).exists()   # (reads only: no marker written)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a mount needs root")
def test_lost_and_found_at_a_mount_root_is_the_file_systems(isolated_env, node_env: NodeEnv, published) -> None:
    """A disk mounted as the tier root has lost+found (the file system's, not an operator's): tolerated
    there, and only there (a lost+found in a plain directory is reported)."""
    mnt = node_env.tmp / "disk"
    mnt.mkdir(mode=0o700)
    cfg = _config(node_env, warm=mnt, warm_capacity="64MiB")
    script = ('mount -t tmpfs -o mode=0700 wdtest "$1" && mkdir -m 0700 "$1/lost+found" && '
              '"$2" -m weightd --config "$3" serve --check && "$2" -m weightd --config "$3" --no-daemon preload '
              'acme/m@v1 --tier warm --strict')
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(mnt),
                        sys.executable, str(cfg)], capture_output=True, text=True, timeout=120, env=isolated_env,
                       cwd=ROOT)
    if "mount:" in r.stderr and "permission denied" in r.stderr.lower():
        pytest.skip(f"no mounts here: {r.stderr.strip()}")
    assert r.returncode == 0, (r.stdout, r.stderr)
    (mnt / "lost+found").mkdir(mode=0o700)   # (the same name in a directory that is no mount point)
    r = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "serve", "--check"],
                       capture_output=True, text=True, timeout=120, env=isolated_env, cwd=ROOT)
    assert r.returncode == 2 and "lost+found" in r.stdout, (r.stdout, r.stderr)


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_an_entry_weightds_user_cannot_open_makes_the_root_foreign_not_a_crash(isolated_env, ckpt: Path) -> None:
    """weightd running as uid 65534; its warm root (its own, 0700) holds acme/ of uid 1234, mode 0700.
    Was: a raw PermissionError out of the root check, at every start, preload, gc and evict."""
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="wd-own-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        env = NodeEnv(base)
        cold_cfg = env.config.read_text()
        warm = base / "warm"
        (warm / "acme").mkdir(parents=True)
        os.chmod(warm, 0o700)
        os.chmod(warm / "acme", 0o700)
        os.chown(warm / "acme", 1234, 1234)
        for p in (warm, env.cold, *env.cold.rglob("*")):
            os.chown(p, NOBODY, NOBODY)
        env.state.mkdir(mode=0o700)
        os.chown(env.state, NOBODY, NOBODY)
        env.config.write_text(cold_cfg.replace(f'socket = "{env.state}/weightd.sock"',
                                               f'socket = "{base}/nobody.sock"'))

        def nobody(*args: str) -> subprocess.CompletedProcess[str]:
            # (a forked child dropped to 65534 with everything imported: it runs in a 0700 checkout too)
            from .conftest import main_as_nobody
            return main_as_nobody(["--config", str(env.config), "--no-daemon", *args],
                                  {**isolated_env, "HOME": "/nonexistent"}, timeout=120)
        r = nobody("gc", "--json")
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
        import json
        assert "acme" in json.loads(r.stdout)["reconcile"]["warm"]["not_ours"], r.stdout
        r = nobody("evict", "acme/m@v1", "--tier", "warm")
        assert "Traceback" not in r.stderr and r.returncode in (2, 3), (r.stdout, r.stderr)
        assert (warm / "acme").stat().st_uid == 1234 and not (warm / TIER_MARKER).exists()
        env.cleanup()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_refused_eviction_keeps_the_copys_record_and_its_lease(node_env: NodeEnv, published) -> None:
    """The final check and the removal are one step, and state forgets a copy (and releases its leases)
    only once it is gone. Played for real: an evict made to wait on the state database (another
    process's write transaction, as a second weightd would hold) while an operator adds a file to the
    copy. Was: the copy's record and its lease were dropped, then the removal was refused: a copy on
    disk that state no longer knew, its lease holder's lease gone."""
    import sqlite3
    import threading
    import time
    from tiering.errors import NotOurs
    with node_env.node() as node:
        node.preload("acme/m", "v1", tier="warm", lease_s=3600)
        copy = node_env.warm / "acme" / "m" / "v1"
        db = sqlite3.connect(node.state.path, timeout=30, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        out: list[object] = []
        t = threading.Thread(target=lambda: out.append(_try(lambda: node.evict("acme/m", "v1", "warm", force=True))))
        t.start()
        time.sleep(1.5)   # (the evict runs its checks, then waits for the database)
        try:
            (copy / "NOTES.txt").write_text("written while weightd was evicting\n")
        except FileNotFoundError:
            pass          # (already moved out of the way: nothing of the operator's can be in it)
        db.execute("ROLLBACK")
        db.close()
        t.join(60)
        assert not t.is_alive()
        row = node.state.copy("warm", "acme/m", "v1")
        leases = [le for le in node.state.leases() if (le.tier, le.name, le.version) == ("warm", "acme/m", "v1")]
        if copy.exists():   # refused: the copy, its record and its lease all stay
            assert isinstance(out[0], NotOurs) and (copy / "NOTES.txt").is_file(), out
            assert row is not None and leases, (row, leases)
        else:               # evicted: gone from disk and from state together
            assert out[0] == ["acme/m@v1 (warm)"] and row is None and not leases, (out, row, leases)


def _try(fn):
    try:
        return fn()
    except Exception as exc:   # (the test inspects what the evict raised)
        return exc


def test_the_daemon_counts_what_it_refused_to_remove(node_env: NodeEnv, isolated_env, tmp_path: Path,
                                                     published) -> None:
    """gc through a real daemon over the data directory: refused, said in its answer, and counted in
    weightd_evictions_refused_total{tier, reason}."""
    from tests.test_daemon import DaemonProc
    data, run = _data_dir_with_a_version_and_notes(node_env)
    before = _files(data)
    node_env.config = _config(node_env, warm=data)
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        r = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--daemon-only",
                            "gc", "--json"], capture_output=True, text=True, timeout=120, env=isolated_env, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        assert "NOTES.txt" in r.stdout and "acme/m@v1 (warm)" in r.stdout, r.stdout
        assert d.metric('weightd_evictions_refused_total{reason="foreign_root",tier="warm"}') >= 1
        r = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--daemon-only",
                            "evict", "acme/m@v1", "--tier", "warm"], capture_output=True, text=True, timeout=120,
                           env=isolated_env, cwd=ROOT)
        assert_one_line_error(r, 2, "not removed", "NOTES.txt")
    finally:
        d.stop()
    assert _files(data) == before


def test_a_removal_cut_short_while_checking_is_never_deleted(wd, node_env: NodeEnv, published) -> None:
    """A version is checked only after it is moved into .trash (as checking.*); weightd killed at that
    moment leaves it there unproven, so reconciliation keeps it (and deletes the rest of .trash)."""
    r = wd("--no-daemon", "preload", "acme/m@v1", "--tier", "warm", "--lease", "0")
    assert r.returncode == 0, r.stderr
    trash = node_env.warm / ".trash"
    trash.mkdir(mode=0o700, exist_ok=True)
    caught = trash / "checking.v1.0123456789ab"
    shutil.copytree(node_env.warm / "acme" / "m" / "v1", caught)
    (caught / "NOTES.txt").write_text("mine\n")
    (trash / "v0.0123456789ab").mkdir()   # (a removal that was proven: its leftovers go)
    before = _files(caught)
    r = wd("--no-daemon", "gc")
    assert r.returncode == 0, r.stderr
    assert _files(caught) == before and not (trash / "v0.0123456789ab").exists()
