"""Trust boundaries of the admin socket (issue 12 items 5, 6, 9; design §13), played as an attacker would:
a real daemon, real unix sockets, a real second uid (65534) where we are root."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error, main_as_nobody, stop_process
from .test_daemon import DaemonProc, daemon, free_port, raw_request  # noqa: F401 (daemon: a fixture)

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
NOBODY = 65534
WEEK_S = 7 * 24 * 3600
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to play a second uid (65534) against the daemon")


# -- helpers ---------------------------------------------------------------------------------------

@pytest.fixture
def shared_dir():
    """A directory uid 65534 can traverse (pytest's tmp_path is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="wd-trust-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def set_api(node_env, sock: Path, **api: Any) -> None:
    """Point ``[api] socket`` at ``sock`` and add ``[api]`` keys to node_env's config."""
    text = node_env.config.read_text()
    old = f'socket = "{node_env.state}/weightd.sock"\n'
    assert old in text
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in api.items())
    node_env.config.write_text(text.replace(old, f'socket = "{sock}"\n{extra}'))


def start_daemon(node_env, env, tmp: Path, sock: Path) -> DaemonProc:
    d = DaemonProc(node_env, env, tmp)
    d.socket_path = sock
    return d


def call(sock: Path, method: str, route: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    payload = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
    req = (f"{method} /v1/{route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    resp = raw_request(sock, req)
    head, _, data = resp.partition(b"\r\n\r\n")
    try:
        doc = json.loads(data or b"null")
    except ValueError:
        doc = data.decode(errors="replace")
    return int(head.split()[1]), doc


def in_child(fn: Callable[[], Any], *, uid: int | None = NOBODY, groups: tuple[int, ...] = (),
             timeout: float = 60) -> Any:
    """Run ``fn`` in a forked child (as ``uid`` with only ``groups``) and return its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            if uid is not None:
                os.setgroups(list(groups))
                os.setgid(NOBODY)
                os.setuid(uid)
            data = json.dumps({"ok": fn()}).encode()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            data = json.dumps({"child_error": f"{type(exc).__name__}: {exc}"}).encode()
        try:
            with os.fdopen(w, "wb") as fh:
                fh.write(data)
        finally:
            os._exit(0)
    os.close(w)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child did not finish in {timeout} s")
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                out += chunk
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    doc = json.loads(out)
    assert "child_error" not in doc, doc
    return doc["ok"]


def tree_digest(root: Path) -> str:
    """Names, modes and bytes of everything under root (symlinks not followed)."""
    h = hashlib.sha256()
    if not root.exists():
        return "absent"
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            p = Path(dirpath, n)
            st = p.lstat()
            h.update(f"{p.relative_to(root)}:{st.st_mode:o}\n".encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


def assert_refused(status: int, doc: Any, *needles: str) -> None:
    assert status == 403, (status, doc)
    assert isinstance(doc, dict) and doc["exit_code"] == 2, doc
    assert "\n" not in doc["error"], doc
    for n in needles:
        assert n in doc["error"], (n, doc)


def fake_daemon(sock: Path, routes: dict[str, Any]) -> None:
    """A minimal HTTP server on a unix socket answering each route with a fixed JSON body (forever)."""
    if sock.exists():
        sock.unlink()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock))
    os.chmod(sock, 0o666)
    srv.listen(16)
    signal.alarm(120)  # never outlive the test
    while True:
        c, _ = srv.accept()
        try:  # a client that hangs up first (the CLI refusing us) must not end the server
            c.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data:
                continue
            head, _, rest = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(rest) < length:  # read the body too: closing early would break the client's pipe
                chunk = c.recv(65536)
                if not chunk:
                    break
                rest += chunk
            route = data.split(b" ", 2)[1].decode().removeprefix("/v1/").split("?")[0]
            body = json.dumps(routes.get(route, {"ok": True, "pid": os.getpid(), "status": "fake"})).encode()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            c.close()


class FakeDaemon:
    def __init__(self, sock: Path, routes: dict[str, Any], uid: int | None) -> None:
        self.pid = os.fork()
        if self.pid == 0:
            try:
                if uid is not None:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(uid)
                fake_daemon(sock, routes)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "fake daemon did not bind"
            time.sleep(0.02)

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


# -- item 5: who may call what ---------------------------------------------------------------------

@root_only
def test_mutating_routes_are_refused_to_other_uids(node_env, isolated_env, wd, tmp_path: Path,
                                                   shared_dir: Path) -> None:
    sock = shared_dir / "weightd.sock"
    set_api(node_env, sock, group=NOBODY)  # the socket's group is the gate for reading
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2, seed="v1")
    assert wd("--no-daemon", "publish", src, "--name", "org/d", "--version", "v1").returncode == 0
    assert wd("--no-daemon", "preload", "org/d@v1").returncode == 0
    secret = make_checkpoint(shared_dir / "secret", total_bytes=2 * MiB, shards=1, layers=2, seed="s")
    os.chmod(secret, 0o700)
    d = start_daemon(node_env, isolated_env, tmp_path, sock)
    try:
        assert sock.stat().st_gid == NOBODY and (sock.stat().st_mode & 0o777) == 0o660
        cold_before, hot_before = tree_digest(node_env.cold), tree_digest(node_env.hot)

        def attack() -> dict[str, Any]:
            return {
                "health": call(sock, "GET", "health"), "status": call(sock, "GET", "status"),
                "path": call(sock, "POST", "path", {"ref": "org/d@v1"}),
                "publish": call(sock, "POST", "publish", {"dir": str(secret), "name": "org/stolen", "version": "v1"}),
                "evict": call(sock, "POST", "evict", {"ref": "org/d@v1", "force": True}),
                "pin": call(sock, "POST", "pin", {"ref": "org/d@v1"}),
                "unpin": call(sock, "POST", "unpin", {"ref": "org/d@v1"}),
                "gc": call(sock, "POST", "gc", {}),
            }
        out = in_child(attack)
        for route in ("health", "status", "path"):  # reading stays open to the socket's group
            assert out[route][0] == 200, (route, out[route])
        for route in ("publish", "evict", "pin", "unpin", "gc"):
            assert_refused(*out[route], f"uid {NOBODY}", "admin_group")
        assert tree_digest(node_env.cold) == cold_before
        assert tree_digest(node_env.hot) == hot_before
        assert not (node_env.cold / "org/stolen").exists()
        st = json.loads(wd("status", "--json").stdout)
        assert [c["pinned"] for c in st["checkpoints"]] == [False]
        # the CLI run by that uid: one line, exit 2, nothing changed
        cfg = shared_dir / "weightd.toml"
        shutil.copy(node_env.config, cfg)
        os.chmod(cfg, 0o644)
        # root still may
        assert call(sock, "POST", "pin", {"ref": "org/d@v1"})[0] == 200
        assert call(sock, "POST", "unpin", {"ref": "org/d@v1"})[0] == 200
        # (the CLI's main() in a forked child dropped to uid 65534, its modules imported first: CI's checkout
        # is a 0700 clone that uid cannot read)
        nobody_env = {**isolated_env, "HOME": "/nonexistent"}
        for args in (["pin", "org/d@v1"], ["evict", "org/d@v1", "--force"], ["gc"]):
            assert_one_line_error(main_as_nobody(["--config", str(cfg), "--daemon-only", *args], nobody_env), 2,
                                  f"uid {NOBODY}")
        assert tree_digest(node_env.hot) == hot_before
    finally:
        d.stop()


@root_only
def test_publish_reads_only_what_the_caller_could_read(node_env, isolated_env, tmp_path: Path,
                                                       shared_dir: Path) -> None:
    sock = shared_dir / "weightd.sock"
    admin_gid = 4242
    set_api(node_env, sock, group=NOBODY, admin_group=admin_gid)
    secret = make_checkpoint(shared_dir / "secret", total_bytes=2 * MiB, shards=1, layers=2, seed="s")
    os.chmod(secret, 0o700)
    public = make_checkpoint(shared_dir / "public", total_bytes=2 * MiB, shards=1, layers=2, seed="p")
    one_private = make_checkpoint(shared_dir / "onefile", total_bytes=2 * MiB, shards=1, layers=2, seed="o")
    os.chmod(one_private / "config.json", 0o600)
    closed = shared_dir / "closed"
    closed.mkdir(mode=0o700)
    behind = make_checkpoint(closed / "inside", total_bytes=2 * MiB, shards=1, layers=2, seed="b")
    for p in (public, one_private, behind):
        for dirpath, dirnames, filenames in os.walk(p):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                if Path(dirpath, f) != one_private / "config.json":
                    os.chmod(Path(dirpath, f), 0o644)
    d = start_daemon(node_env, isolated_env, tmp_path, sock)
    try:
        before = tree_digest(node_env.cold)

        def attempt(dir_: Path, name: str) -> Callable[[], Any]:
            return lambda: call(sock, "POST", "publish", {"dir": str(dir_), "name": name, "version": "v1"})
        # an admin (by supplementary group, read from /proc/<pid>/status) who cannot read the source
        for src, name, needle in ((secret, "org/secret", str(secret)), (one_private, "org/one", "config.json"),
                                  (behind, "org/behind", str(closed))):
            status, doc = in_child(attempt(src, name), groups=(admin_gid,))
            assert_refused(status, doc, f"uid {NOBODY}", needle)
            assert tree_digest(node_env.cold) == before, name
        # the same admin publishes what it can read
        status, doc = in_child(attempt(public, "org/public"), groups=(admin_gid,))
        assert status == 200, doc
        assert (node_env.cold / "org/public/v1").is_dir()
        # not in the admin group: refused before anything is read
        assert_refused(*in_child(attempt(public, "org/public2")), f"uid {NOBODY}", "admin_group")
        # root reads anything
        status, doc = call(sock, "POST", "publish", {"dir": str(secret), "name": "org/secret", "version": "v1"})
        assert status == 200, doc
    finally:
        d.stop()


# -- item 6: the CLI trusts only its own daemon; a daemon never steals a socket --------------------

@root_only
def test_cli_refuses_a_daemon_run_by_another_uid(node_env, wd, shared_dir: Path) -> None:
    fake_dir = shared_dir / "fake"
    fake_dir.mkdir()
    os.chown(fake_dir, NOBODY, NOBODY)
    sock = fake_dir / "weightd.sock"
    inside = str(node_env.hot / "org/x/v1")
    set_api(node_env, sock)
    fake = FakeDaemon(sock, {"path": {"tier": "hot", "path": inside}}, uid=NOBODY)
    try:
        for args in (["path", "org/x@v1"], ["status"], ["--daemon-only", "pin", "org/x@v1"]):
            proc = wd(*args)
            assert_one_line_error(proc, 2, f"uid {NOBODY}", str(sock))
            assert inside not in proc.stdout
        # an operator may name the daemon's user
        text = node_env.config.read_text().replace(f'socket = "{sock}"\n', f'socket = "{sock}"\ndaemon_user = "nobody"\n')
        node_env.config.write_text(text)
        proc = wd("path", "org/x@v1")
        assert proc.returncode == 0 and proc.stdout.strip() == inside, (proc.stderr, proc.stdout, proc.args)
    finally:
        fake.stop()


def test_cli_refuses_paths_outside_the_tiers(node_env, wd, tmp_path: Path) -> None:
    sock = tmp_path / "fake.sock"
    set_api(node_env, sock)
    (node_env.hot / "org").mkdir(parents=True)
    (node_env.hot / "org/evil").symlink_to("/etc")
    for bad in ("/etc", str(node_env.hot / "org/evil"), f"{node_env.hot}/../../etc", str(node_env.hot) + "x/org/d/v1"):
        report = {"name": "org/d", "version": "v1", "tier": "hot", "path": bad, "fallback": None,
                  "already_present": True, "bytes_by_source": {}, "bytes_moved": 0}
        fake = FakeDaemon(sock, {"path": {"tier": "hot", "path": bad}, "preload": report}, uid=None)
        try:
            for args in (["path", "org/d@v1"], ["preload", "org/d@v1"]):
                proc = wd(*args)
                assert_one_line_error(proc, 2, bad)
                assert proc.stdout == "", proc.stdout
        finally:
            fake.stop()
    good = str(node_env.warm / "org/d/v1")
    fake = FakeDaemon(sock, {"path": {"tier": "warm", "path": good}}, uid=None)
    try:
        proc = wd("path", "org/d@v1")
        assert proc.returncode == 0 and proc.stdout.strip() == good, proc.stderr
    finally:
        fake.stop()


def second_config(node_env, tmp_path: Path, sock: Path) -> Path:
    """Another daemon's config: its own state dir and tiers, the same socket."""
    cfg = tmp_path / "other.toml"
    other = tmp_path / "other"
    cfg.write_text(f'state_dir = "{other}/state"\n[tiers.hot]\npath = "{other}/hot"\n[tiers.warm]\n'
                   f'path = "{other}/warm"\n[tiers.cold]\npath = "{node_env.cold}"\n[api]\nsocket = "{sock}"\n'
                   f'[p2p]\nlisten = "127.0.0.1:0"\n[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
    return cfg


def serve_bounded(cfg: Path, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(cfg), "serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        out, err = proc.communicate()
        raise AssertionError(f"the daemon started instead of refusing: {err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_daemon_never_steals_a_live_socket(daemon, node_env, isolated_env, wd, tmp_path: Path) -> None:
    sock = daemon.socket_path
    ino = sock.stat().st_ino
    proc = serve_bounded(second_config(node_env, tmp_path, sock), isolated_env)
    assert_one_line_error(proc, 2, str(sock), f"pid {daemon.proc.pid}")
    assert sock.stat().st_ino == ino
    assert wd("--daemon-only", "status").returncode == 0  # the first daemon still answers on it


def test_a_daemon_refuses_a_socket_path_that_is_a_symlink_or_not_a_socket(node_env, isolated_env,
                                                                         tmp_path: Path) -> None:
    sock = tmp_path / "run" / "weightd.sock"
    sock.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    sock.symlink_to(victim)
    cfg = second_config(node_env, tmp_path, sock)
    assert_one_line_error(serve_bounded(cfg, isolated_env), 2, str(sock), "symlink")
    assert victim.read_text() == "keep me" and sock.is_symlink()
    sock.unlink()
    sock.write_text("a file")
    assert_one_line_error(serve_bounded(cfg, isolated_env), 2, str(sock), "not a socket")
    assert sock.read_text() == "a file"


def test_sighup_never_switches_state_dir(daemon, node_env, wd, tmp_path: Path) -> None:
    good = node_env.config.read_text()
    other = tmp_path / "other-state"
    node_env.config.write_text(good.replace(f'state_dir = "{node_env.state}"', f'state_dir = "{other}"'))
    daemon.proc.send_signal(signal.SIGHUP)
    msg = daemon.wait_for("config reload failed", 10)
    assert "state_dir" in msg
    assert not other.exists()
    assert daemon.metric("weightd_config_reload_failures_total") == 1
    node_env.config.write_text(good)
    assert wd("--daemon-only", "status").returncode == 0


def test_sighup_refuses_a_symlinked_hot_tier(daemon, node_env, wd, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "hot-link"
    link.symlink_to(elsewhere)
    good = node_env.config.read_text()
    node_env.config.write_text(good.replace(f'path = "{node_env.hot}"', f'path = "{link}"'))
    daemon.proc.send_signal(signal.SIGHUP)
    msg = daemon.wait_for("config reload failed", 10)
    assert "symlink" in msg and str(link) in msg, msg
    st = json.loads(wd("--daemon-only", "status", "--json").stdout)
    assert st["tiers"]["hot"]["path"] == str(node_env.hot)  # the old config keeps serving
    assert list(elsewhere.iterdir()) == []


# -- item 9: bounded numbers, bounded JSON, bounded requests, honest status ------------------------

def test_lease_and_timeout_must_be_finite_and_bounded(daemon, wd) -> None:
    sock = daemon.socket_path
    for key in ("lease_s", "timeout_s"):
        for bad in (b"NaN", b"Infinity", b"-Infinity", b"-1", str(WEEK_S + 1).encode(), b"1e400", b'"10"', b"true"):
            status, doc = call(sock, "POST", "preload", raw=b'{"ref": "org/d@v1", "%s": %s}' % (key.encode(), bad))
            assert status == 400, (key, bad, status, doc)
            assert key in doc["error"] and doc["exit_code"] == 2, doc
    for opt in ("--lease", "--timeout"):
        for bad in ("nan", "inf", "-inf", "-1", str(WEEK_S + 1)):
            assert_one_line_error(wd("preload", "org/d@v1", opt, bad), 2, opt)
            assert_one_line_error(wd("--no-daemon", "preload", "org/d@v1", opt, bad), 2, opt)


def test_deeply_nested_json_is_400(daemon, wd) -> None:
    sock = daemon.socket_path
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"ref": ' + b"[" * 100_000, b"{" * 50_000,
                b'{"ref": "org/d@v1", "x": ' + b"[" * 200 + b"]" * 200 + b"}"):
        status, doc = call(sock, "POST", "preload", raw=raw)
        assert status == 400, (raw[:40], status, doc)
        assert doc["exit_code"] == 2 and "\n" not in doc["error"], doc
    assert wd("--daemon-only", "status").returncode == 0


def wait_closed(s: socket.socket, bound: float) -> float:
    """Seconds until the server closes the connection (reading whatever it sends); fails past ``bound``."""
    t0 = time.monotonic()
    s.settimeout(bound)
    try:
        while s.recv(65536):
            pass
    except socket.timeout:
        raise AssertionError(f"the server kept a stalled connection open for {bound} s") from None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_idle_and_half_sent_requests_time_out(node_env, isolated_env, wd, tmp_path: Path) -> None:
    sock = node_env.state / "weightd.sock"
    set_api(node_env, sock, request_timeout_s=2)
    d = start_daemon(node_env, isolated_env, tmp_path, sock)
    try:
        stalls = [b"", b"GET /v1/health HTTP/1.1\r\nHost: x\r\n",
                  b"POST /v1/preload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"ref\": "]
        conns = []
        for data in stalls:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.sendall(data)
            conns.append(s)
        for s, data in zip(conns, stalls):
            try:
                assert wait_closed(s, 8) < 8, data
            finally:
                s.close()
        # a request that is being handled is not cut off: --wait longer than request_timeout_s
        assert_one_line_error(wd("--daemon-only", "preload", "org/late@v1", "--wait", "--timeout", "4"), 4,
                              "not published before")
        assert wd("--daemon-only", "status").returncode == 0
    finally:
        d.stop()


def test_status_says_idle_once_transfers_end(daemon, wd, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2, seed="v1")
    assert wd("publish", src, "--name", "org/d", "--version", "v1").returncode == 0
    assert wd("--daemon-only", "preload", "org/d@v1").returncode == 0
    status, doc = call(daemon.socket_path, "GET", "health")
    assert status == 200 and doc["status"] == "serving, idle", doc
    daemon.drain()
    last = [m for m in daemon.messages if "STATUS=" in m][-1]
    assert "STATUS=serving, idle" in last, daemon.messages
