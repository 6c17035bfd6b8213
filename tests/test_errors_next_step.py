"""Errors that say what to do (issue #15): every case gets one line naming the cause and the next step,
checked with its text through the real CLI, in-process and (where a daemon is involved) through one."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tiering import parse_size
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error
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
