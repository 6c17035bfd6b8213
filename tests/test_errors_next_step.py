"""Errors that say what to do (issue #15): every case gets one line naming the cause and the next step,
checked with its text through the real CLI, in-process and (where a daemon is involved) through one."""

from __future__ import annotations

import os
import sys
import socket
from pathlib import Path

import pytest

from tiering import parse_size
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error
from .conftest import main_as_nobody
from .test_daemon import daemon  # noqa: F401 (the fixture)

MiB = 1 << 20


@pytest.fixture
def published(wd, tmp_path: Path) -> Path:
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2)
    assert wd("publish", src, "--name", "acme/llama-big", "--version", "v1").returncode == 0
    return src


def test_not_found_says_what_was_meant(wd, published) -> None:
    for args, text in (
        (["preload", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                           "(did you mean acme/llama-big? versions: v1)"),
        (["preload", "acme/llama-big@v2"], "acme/llama-big@v2: not published and not on this node "
                                           "(published versions: v1)"),
        (["preload", "acme/llama-bgi"], "acme/llama-bgi: no version published and none on this node "
                                        "(did you mean acme/llama-big? versions: v1)"),
        (["preload", "other/thing@v1"], "other/thing@v1: not published and not on this node"),
    ):
        r = wd(*args)
        assert_one_line_error(r, 3, text)
        assert r.stderr.strip() == f"weightd: {text}", r.stderr


def test_pin_of_a_version_that_does_not_exist(wd, published) -> None:
    assert_one_line_error(wd("pin", "acme/llama-big@v9"), 3, "acme/llama-big@v9: not published and not on this "
                          "node (published versions: v1)")
    assert wd("pin", "acme/llama-big@v1").returncode == 0  # published, not local yet: pinning ahead is fine


def test_evict_without_a_version_needs_all(wd, published) -> None:
    assert wd("preload", "acme/llama-big@v1", "--tier", "warm").returncode == 0
    assert_one_line_error(wd("evict", "acme/llama-big"), 2, "evict acme/llama-big: name a version "
                          "(acme/llama-big@VERSION), or pass --all to evict every local version of acme/llama-big")
    r = wd("evict", "acme/llama-big", "--all", "--force")  # (--force: the preload's default lease)
    assert r.returncode == 0 and "evicted" in r.stdout, r.stderr


def test_empty_directory_is_not_a_checkpoint(wd, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert_one_line_error(wd("manifest", "build", tmp_path / "empty"), 2, "no files to hash")
    assert not (tmp_path / "empty/.weightd").exists()
    assert_one_line_error(wd("publish", tmp_path / "empty", "--name", "a/b", "--version", "v1"), 2,
                          "no files to publish")


def test_config_typo_and_kubernetes_sizes(weightd, tmp_path: Path) -> None:
    cfg = tmp_path / "typo.toml"
    cfg.write_text(f'state_dir = "{tmp_path}/s"\n[tiers.hot]\npath = "/dev/shm/x"\ncapacty = "1GiB"\n')
    assert_one_line_error(weightd("--config", cfg, "status"), 2,
                          "tiers.hot.capacty: unknown key (did you mean capacity?)")
    cfg.write_text(f'state_dir = "{tmp_path}/s"\n[p2p]\nupload_limt = "1GB"\n')
    assert_one_line_error(weightd("--config", cfg, "status"), 2, "p2p.upload_limt: unknown key (did you mean "
                          "upload_limit?)")
    assert parse_size("3Gi") == 3 << 30 and parse_size("512Mi") == 512 << 20 and parse_size("1Ki") == 1024


def test_socket_permission_names_the_group(tmp_path: Path) -> None:
    """A socket this user may not connect to (mode 0660, another group): the error says which group may
    and how to join it. Played by a forked child that drops to uid 65534 (root connects anywhere)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    from weightd.client import DaemonClient
    from weightd.errors import SocketDenied
    import shutil
    import tempfile
    run = Path(tempfile.mkdtemp(prefix="weightd-test-sock-", dir="/tmp"))  # (pytest's tmp_path is 0700 root)
    os.chmod(run, 0o755)
    sock_path = run / "weightd.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(sock_path))
        s.listen()
        os.chmod(sock_path, 0o660)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: uid 65534, asks the way the CLI does
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    DaemonClient(sock_path).available()
                    msg = "no error"
                except SocketDenied as exc:
                    msg = f"{exc.exit_code} {exc}"
                os.write(w, msg.encode())
            except BaseException as exc:  # noqa: BLE001 (say it in the parent's assertion)
                os.write(w, f"child failed: {exc!r}".encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as fh:
            msg = fh.read()
        os.waitpid(pid, 0)
        assert msg.startswith("2 cannot connect to the daemon's socket") and "permission denied" in msg, msg
        assert "group root: add this user to 'root' (usermod -aG root $USER" in msg, msg
    finally:
        s.close()
        shutil.rmtree(run, ignore_errors=True)


def test_config_ignored_because_the_daemon_answered(daemon, weightd, node_env, tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text(node_env.config.read_text())  # (same socket; another file, maybe other settings)
    r = weightd("--config", other, "status")
    assert r.returncode == 0, r.stderr
    assert (f"the daemon on {daemon.socket_path} answered; its config ({node_env.config}) applies, not --config "
            f"{other} (--no-daemon to use yours in-process)") in r.stderr, r.stderr
    r = weightd("--config", node_env.config, "status")
    assert r.returncode == 0 and "applies, not --config" not in r.stderr, r.stderr


def _as_nobody(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The CLI as uid 65534 (conftest.main_as_nobody): (exit code, stdout and stderr together)."""
    p = main_as_nobody(args, env)
    return p.returncode, p.stdout + p.stderr


def test_a_cold_version_this_user_cannot_read_is_named_never_skipped(tmp_path: Path) -> None:
    """Cold storage holds v1 (readable) and v2 (mode 0700, another owner): as the daemon's user,
    'preload NAME' must not quietly resolve to v1, and 'NAME@v2' is not "not published"."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    import shutil
    import tempfile
    from tiering.sample import make_checkpoint
    from .conftest import NodeEnv
    base = Path(tempfile.mkdtemp(prefix="weightd-test-uid-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        env = NodeEnv(base)
        node = env.node()
        try:
            for v in ("v1", "v2"):
                node.publish(make_checkpoint(tmp_path / v, total_bytes=1 << 20, shards=1, layers=1, seed=v), "org/m", v)
        finally:
            node.close()
        for d in (env.hot, env.warm, env.state):
            d.mkdir(parents=True, exist_ok=True)
            for p in [d, *d.rglob("*")]:
                os.chown(p, 65534, 65534, follow_symlinks=False)
        # a checkpoint's own directories are published 0755 (they were 0700: a daemon user could not read them)
        assert os.stat(env.cold / "org/m/v1/original").st_mode & 0o777 == 0o755
        os.chmod(env.cold / "org/m/v2", 0o700)  # root's, and private
        cfg = {"WEIGHTD_CONFIG": str(env.config), "HOME": str(base)}
        code, err = _as_nobody(["--no-daemon", "preload", "org/m", "--tier", "warm"], cfg)
        assert code == 2, err
        assert err.strip() == (f"weightd: org/m@v2 is published but this process (uid 65534) cannot read it: "
                               f"Permission denied on {env.cold}/org/m/v2; make cold storage readable by the "
                               f"daemon's user (e.g. chmod -R a+rX on the version's directory, or fix the export's "
                               f"uid mapping)"), err
        code, err2 = _as_nobody(["--no-daemon", "preload", "org/m@v2", "--tier", "warm"], cfg)
        assert code == 2 and err2 == err, err2
        assert not (env.warm / "org/m/v1").exists()  # nothing older was served instead
        code, err = _as_nobody(["--no-daemon", "-q", "preload", "org/m@v1", "--tier", "warm"], cfg)
        assert code == 0, err  # what it can read, it serves when asked by name
        # the doctor, run as that user, finds it too (exit 7: critical)
        code, err = _as_nobody(["--no-daemon", "doctor", "--sample-s", "0.1", "--no-probe", "--no-verify"], cfg)
        assert code == 7, err
        assert "[CRITICAL] this process (uid 65534) cannot read cold storage: org/m: org/m@v2 is published" in err, err
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_lease_refusal_names_its_holder_and_expiry(daemon, wd, node_env, published) -> None:
    """The lease is taken through the daemon by this test process: the refusal names it (pid and
    name from SO_PEERCRED) and says when it ends and what to do."""
    from weightd.client import DaemonClient
    DaemonClient(daemon.socket_path).preload("acme/llama-big@v1", tier="hot", lease_s=600)
    r = wd("evict", "acme/llama-big@v1", "--tier", "hot")
    assert_one_line_error(r, 1, f"acme/llama-big@v1: leased in hot by pid {os.getpid()} (", f") uid {os.geteuid()} until ",
                          " UTC (", "s left): wait for the lease to expire, or --force")


def test_a_full_tier_says_how_much_in_human_sizes_and_the_fix(weightd, tmp_path: Path) -> None:
    from .conftest import NodeEnv
    env = NodeEnv(tmp_path, hot_capacity="2MiB")
    run = lambda *a: weightd("--config", env.config, *a)  # noqa: E731
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2)
    assert run("publish", src, "--name", "acme/m", "--version", "v1").returncode == 0
    import json
    from tiering import format_bytes
    size = json.loads(run("ls", "--json").stdout)["versions"][0]["bytes"]
    r = run("preload", "acme/m@v1", "--strict")
    assert_one_line_error(r, 6, f"weightd: tier hot cannot hold {format_bytes(size)} (2.0 MiB available after eviction): "
                          "capacity 2.0 MiB, 0 B used; raise [tiers.hot] capacity, or unpin or evict what is kept "
                          "(weightd status shows what holds each copy) (or preload into another --tier)")


def test_daemon_only_without_a_daemon_says_how_to_start_it(wd, node_env) -> None:
    r = wd("--daemon-only", "status")
    sock = node_env.state / "weightd.sock"
    assert_one_line_error(r, 1, f"--daemon-only: the node daemon does not answer on {sock}: no socket there: the "
                          "daemon is not running, or it uses another [api] socket (weightd config show)",
                          "(start it: systemctl start weightd, or weightd serve)")
    node_env.state.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))  # bound, never listening: what a crashed daemon leaves
    s.close()
    assert_one_line_error(wd("--daemon-only", "status"), 1, "nothing listens there (a stale socket: the daemon "
                          "stopped or crashed; systemctl status weightd)")


def test_a_control_character_in_a_file_name_never_reaches_the_terminal(wd, tmp_path: Path) -> None:
    """A file named with an escape sequence: refused by name (escaped) before anything is written, and
    a manifest carrying one is refused when read; no raw control character is ever printed."""
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2)
    (src / "evil\x1b[2J\x07.json").write_text("{}")
    for r in (wd("manifest", "build", src, "-o", "-"), wd("publish", src, "--name", "acme/e", "--version", "v1")):
        assert_one_line_error(r, 2, "control character in a file name", "\\x1b[2J\\x07")
        assert "\x1b" not in r.stderr + r.stdout and "\x07" not in r.stderr + r.stdout
    import json
    (src / "evil\x1b[2J\x07.json").unlink()
    m = json.loads(wd("manifest", "build", src, "-o", "-").stdout)
    m["files"][0]["path"] = "x\x1b]0;pwn\x07"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(m))
    r = wd("verify", src, "--manifest", bad)
    assert r.returncode == 2 and "control character in path" in r.stderr and "\x1b" not in r.stderr, r.stderr


def test_a_renamed_copy_of_a_version_does_not_stop_resolving_the_latest(wd, node_env, tmp_path: Path) -> None:
    """cp -a cold/NAME/v2 cold/NAME/v2-old: its manifest describes v2, so it is not a version of its
    own; it is skipped (and logged), never an error that stops every `preload NAME`."""
    import shutil
    for v in ("v1", "v2"):
        src = make_checkpoint(tmp_path / v, total_bytes=1 * MiB, shards=1, layers=1, seed=v)
        assert wd("publish", src, "--name", "acme/r", "--version", v).returncode == 0
    shutil.copytree(node_env.cold / "acme/r/v2", node_env.cold / "acme/r/v2-old")
    r = wd("preload", "acme/r", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads(r.stdout)["version"] == "v2"
