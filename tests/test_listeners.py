"""The daemon's TCP listeners under attack, and its start-up failing cleanly: real daemon subprocesses,
real sockets on 127.0.0.x (loopback only), every wait bounded."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import reserve_port, stop_process
from .test_p2p_tls import fleet  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parent.parent


def free_port(ip: str = "127.0.0.1") -> int:
    """A port on ``ip`` held for the daemon until the test ends (conftest.reserve_port)."""
    return reserve_port(ip)


def _hold_port(ip: str) -> tuple[subprocess.Popen[str], int]:
    """Another process listening on a TCP port (what an operator's second service looks like)."""
    code = ("import socket,sys,time\ns=socket.socket()\ns.bind((sys.argv[1],0))\ns.listen()\n"
            "print(s.getsockname()[1],flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code, ip], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    return p, int(p.stdout.readline())


def test_a_daemon_that_fails_to_start_leaves_no_socket(node_env, isolated_env, wd) -> None:
    """The metrics port is held by another process: serve fails with one line, and no admin socket is
    left (it is claimed first, bound only once every TCP listener is up); the next start on a free port
    works."""
    holder, port = _hold_port("127.0.0.1")
    sock = node_env.state / "weightd.sock"
    try:
        base = node_env.config.read_text()
        node_env.config.write_text(base + f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
        proc = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve"],
                              capture_output=True, text=True, timeout=60, env=isolated_env, cwd=ROOT)
        assert proc.returncode != 0
        err = [ln for ln in proc.stderr.splitlines() if "Traceback" in ln or "metrics.listen" in ln]
        assert err and "Traceback" not in proc.stderr, proc.stderr
        assert not sock.exists() and not os.path.lexists(sock), "the failed daemon left its socket file"
    finally:
        stop_process(holder)
        holder.stdout.close()
    # the state directory and socket path are free again: a daemon starts and answers
    node_env.config.write_text(base + f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
    d = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=isolated_env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert d.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert wd("status").returncode == 0
    finally:
        stop_process(d)
    assert not os.path.lexists(sock)


def test_the_admin_socket_appears_once_every_listener_is_up(node_env, isolated_env, tmp_path: Path) -> None:
    """What waits for the admin socket (an init container, a test harness, ``ExecStartPost``) may then
    use every TCP listener: an origin's P2P, tracker and metrics ports accept as soon as the socket
    exists (it appeared before the tracker listened: a refused connection in CI)."""
    p2p, tracker, metrics = (free_port("127.0.0.2") for _ in range(3))
    cfg = node_env.config.read_text().replace('[p2p]\nlisten = "127.0.0.1:0"\n', "")
    node_env.config.write_text(cfg + f'[p2p]\nlisten = "127.0.0.2:{p2p}"\n'
                               f'tracker_listen = "127.0.0.2:{tracker}"\n'
                               f'[metrics]\nlisten = "127.0.0.2:{metrics}"\n')
    sock, log = node_env.state / "weightd.sock", tmp_path / "daemon.log"
    with open(log, "w") as out:
        d = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve",
                              "--role", "origin"], stdout=out, stderr=subprocess.STDOUT, env=isolated_env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        # polled without a pause, and the daemon stopped the moment the socket is seen: the kernel still
        # accepts on a port that listens, so the dials below see the listeners as they were then (one core
        # busy for the daemon's start, ~1 s)
        while not os.path.exists(sock):
            assert d.poll() is None and time.monotonic() < deadline, log.read_text()
        d.send_signal(signal.SIGSTOP)
        try:
            for port in (tracker, metrics, p2p):   # (the last started first)
                socket.create_connection(("127.0.0.2", port), timeout=5).close()
        finally:
            d.send_signal(signal.SIGCONT)
    finally:
        stop_process(d)


def test_a_socket_path_too_long_is_one_line(node_env, isolated_env) -> None:
    """``[api] socket`` longer than AF_UNIX allows (108 bytes): serve fails with one line naming the key
    and why (the bind's OSError has no strerror: it said "cannot listen: None")."""
    deep = node_env.tmp / ("d" * 120)
    deep.mkdir()
    text = node_env.config.read_text().replace(f'socket = "{node_env.state}/weightd.sock"',
                                               f'socket = "{deep}/weightd.sock"')
    node_env.config.write_text(text + f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
    r = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve"],
                       capture_output=True, text=True, timeout=60, env=isolated_env, cwd=ROOT)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert last.startswith("weightd: api.socket ") and "path too long" in last, r.stderr
    assert not os.path.lexists(deep / "weightd.sock")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to play a second uid (65534)")
def test_a_start_that_fails_after_the_socket_is_bound_removes_it(isolated_env) -> None:
    """The daemon as uid 65534 with ``[api] group = 0``, a group it is not in: the socket is bound, its
    chown is refused, serve fails with one line naming the key, the group and the socket, and the socket
    it bound is gone."""
    from .conftest import NodeEnv, main_as_nobody
    base = Path(tempfile.mkdtemp(prefix="wd-sock-", dir="/tmp"))   # (pytest's tmp_path is 0700 root)
    try:
        os.chmod(base, 0o755)
        env = NodeEnv(base)
        env.state.mkdir(mode=0o700)
        for p in (env.state, env.cold):
            os.chown(p, 65534, 65534)
        sock = base / "run" / "weightd.sock"
        sock.parent.mkdir()
        os.chown(sock.parent, 65534, 65534)
        env.config.write_text(env.config.read_text().replace(
            f'socket = "{env.state}/weightd.sock"\n', f'socket = "{sock}"\ngroup = 0\n')
            .replace('[p2p]\nlisten = "127.0.0.1:0"\n', f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n'))
        r = main_as_nobody(["--config", str(env.config), "serve"], {**isolated_env, "HOME": "/nonexistent"},
                           timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
        last = r.stderr.strip().splitlines()[-1]
        assert "api.group 0" in last and str(sock) in last and "not permitted" in last, r.stderr
        assert not os.path.lexists(sock), "the failed daemon left the socket it bound"
        env.cleanup()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the TCP listeners under attack -------------------------------------------------------------------------
NOFILE = 512   # the daemon's RLIMIT_NOFILE in these tests: fd exhaustion is cheap to reach


class Origin:
    """An origin daemon on 127.0.0.2 (tracker and metrics listeners) run with RLIMIT_NOFILE = NOFILE."""

    def __init__(self, node_env, env: dict[str, str], *, extra: str = "", p2p_extra: str = "") -> None:
        self.env_ = node_env
        self.tracker_port, self.metrics_port = free_port("127.0.0.2"), free_port("127.0.0.2")
        cfg = node_env.config.read_text().replace('[p2p]\nlisten = "127.0.0.1:0"\n', "")
        node_env.config.write_text(
            cfg + f'[p2p]\nlisten = "127.0.0.2:{free_port("127.0.0.2")}"\nallow = ["127.0.0.0/26"]\n'
            f'tracker_listen = "127.0.0.2:{self.tracker_port}"\n{p2p_extra}'
            f'[metrics]\nlisten = "127.0.0.2:{self.metrics_port}"\nallow = ["127.0.0.0/26"]\n'
            '[listeners]\nidle_timeout_s = 2\nrequest_timeout_s = 3\ntls_handshake_timeout_s = 1.5\n' + extra)
        self.log_path = node_env.tmp / "origin.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(["prlimit", f"--nofile={NOFILE}:{NOFILE}", sys.executable, "-m", "weightd", "-v",
                                      "--config", str(node_env.config), "serve", "--role", "origin"],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + 30
        while not self._up():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log_path.read_text()
            time.sleep(0.1)

    def _up(self) -> bool:
        try:
            socket.create_connection(("127.0.0.2", self.tracker_port), timeout=1).close()
            return True
        except OSError:
            return False

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


def connect(src: str, port: int, dst: str = "127.0.0.2") -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((src, 0))
        s.settimeout(2)
        s.connect((dst, port))
        s.setblocking(False)   # (alive() peeks without waiting)
        return s
    except OSError as exc:
        s.close()
        return None


def alive(s: socket.socket) -> bool:
    """The daemon has not closed this connection (nothing to read yet, or an answer waiting)."""
    try:
        return s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def settle(conns: list[socket.socket], *, timeout: float = 3.0) -> int:
    """How many of ``conns`` are still open once the daemon has had ``timeout`` to close the refused."""
    time.sleep(timeout)
    return sum(alive(s) for s in conns)


def test_tcp_flood_is_refused_at_accept_cut_and_capped(node_env, isolated_env, wd) -> None:
    """From outside ``allow`` every connection is closed before a byte is read; from inside, hundreds of
    idle and header-trickling connections from 40 addresses: at most [listeners] max_connections are
    held (32 per address), trickled headers are cut at idle_timeout_s, the daemon's descriptors stay
    bounded under RLIMIT_NOFILE 512, the admin socket answers status promptly all along, and no
    traceback floods the log. Before: all of them held open until the daemon ran out of descriptors."""
    origin = Origin(node_env, isolated_env)
    conns: list[socket.socket] = []
    try:
        base_fds = origin.fds()
        # outsiders (127.0.0.100-104 are outside 127.0.0.0/26): closed at accept, on both listeners
        for port in (origin.tracker_port, origin.metrics_port):
            outsiders = [c for ip in range(100, 105) for _ in range(20)
                         if (c := connect(f"127.0.0.{ip}", port)) is not None]
            conns += outsiders
            assert settle(outsiders, timeout=1.0) == 0
        # a request sent at once gets no answer: the connection is reset before it is read
        probe = socket.socket()
        probe.bind(("127.0.0.101", 0))
        probe.settimeout(5)
        try:
            probe.connect(("127.0.0.2", origin.tracker_port))
            probe.sendall(b"GET /swarm HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = probe.recv(100)
        except OSError:
            answer = b""
        finally:
            probe.close()
        assert answer == b"", answer
        # one address: at most 32 connections
        one = [c for _ in range(48) if (c := connect("127.0.0.50", origin.tracker_port)) is not None]
        conns += one
        assert settle(one, timeout=1.0) == 32
        for c in one:
            c.close()
        time.sleep(0.5)
        # 40 addresses x 20: half idle, half trickling headers; the listener holds at most 256
        flood = [c for ip in range(10, 50) for _ in range(20)
                 if (c := connect(f"127.0.0.{ip}", origin.tracker_port)) is not None]
        conns += flood
        trickling = flood[1::2]
        for c in trickling:
            try:
                c.send(b"GET /announce?info_hash=")  # (non-blocking: a closed one raises)
            except OSError:
                pass
        t0 = time.monotonic()
        status = wd("status", "--json", timeout=30)   # through the unix socket, under the flood
        assert status.returncode == 0 and time.monotonic() - t0 < 10, status.stderr
        held = sum(alive(c) for c in flood)
        assert 0 < held <= 256, held
        assert origin.fds() <= base_fds + 256 + 16, (origin.fds(), base_fds)
        # keep trickling one byte per 0.3 s: aiohttp's keep-alive timer is not moved by partial headers
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            for c in trickling:
                try:
                    c.send(b"a")
                except OSError:
                    pass
            time.sleep(0.3)
        assert sum(alive(c) for c in flood) == 0
        assert origin.fds() <= base_fds + 8, (origin.fds(), base_fds)
        # the listeners still serve whoever asks properly, and counted what they refused
        with socket.create_connection(("127.0.0.2", origin.metrics_port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            body = b""
            while chunk := s.recv(65536):
                body += chunk
        text = body.decode()
        assert 'weightd_tcp_connections_refused_total{listener="tracker",reason="not_allowed"} 101.0' in text
        assert 'weightd_tcp_connections_refused_total{listener="metrics",reason="not_allowed"} 100.0' in text
        assert 'weightd_tcp_connections_refused_total{listener="tracker",reason="address_full"} 16.0' in text
        assert wd("status").returncode == 0
    finally:
        for c in conns:
            c.close()
        origin.stop()
    log = origin.log_path.read_text()
    assert "Traceback" not in log and "Too many open files" not in log and len(log) < 200_000, log[-3000:]


def _server_certificate(ctx, src: str, addr: tuple[str, int]) -> bool:
    """Whether a TLS handshake from ``src`` to ``addr`` gets the server's certificate. Through memory
    BIOs: ``wrap_socket`` on a connection the server already reset raises from inside ``SSLSocket``'s
    constructor without closing the socket it made (CPython 3.11: the pre-handshake ``recv``'s
    ECONNRESET), a ResourceWarning that failed a clean-clone CI run."""
    import ssl
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(inc, out, server_hostname=addr[0])
    try:
        with socket.create_connection(addr, timeout=5, source_address=(src, 0)) as raw:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    raw.sendall(out.read())
                    data = raw.recv(1 << 16)
                    if not data:
                        return False
                    inc.write(data)
            raw.sendall(out.read())
            return tls.getpeercert() is not None
    except (OSError, ssl.SSLError):
        return False


def test_tls_tracker_bounds_the_handshake(node_env, isolated_env, fleet) -> None:
    """With fleet TLS the tracker's handshake is bounded by tls_handshake_timeout_s (1.5 s here): a
    connection from inside ``allow`` that never sends a ClientHello is closed in time (asyncio's own
    default is 60 s), and one from outside never gets the server's certificate."""
    import ssl

    from .test_p2p_tls import tls_line
    origin = Origin(node_env, isolated_env, p2p_extra=tls_line(fleet["ca"], fleet["127.0.0.2"],
                                                               fleet["127.0.0.2.key"]))
    try:
        silent = [c for _ in range(10) if (c := connect("127.0.0.20", origin.tracker_port)) is not None]
        assert len(silent) == 10 and settle(silent, timeout=0.5) == 10
        t0 = time.monotonic()
        while any(alive(c) for c in silent) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert not any(alive(c) for c in silent) and time.monotonic() - t0 < 3.5
        for c in silent:
            c.close()
        ctx = ssl.create_default_context(cafile=str(fleet["ca"]))
        ctx.load_cert_chain(fleet["127.0.0.3"], fleet["127.0.0.3.key"])
        for src, ok in (("127.0.0.3", True), ("127.0.0.100", False)):
            assert _server_certificate(ctx, src, ("127.0.0.2", origin.tracker_port)) == ok, src
    finally:
        origin.stop()


def test_a_client_that_stops_reading_loses_its_slot(node_env, isolated_env) -> None:
    """Two clients (the listener's cap) pipeline hundreds of /metrics requests and never read: the
    answers fill their send buffers. Within request_timeout_s (3 s) of stalling each is cut, so a third
    client is served. Before: aiohttp waited for them to drain for ever (no timeout after the handler)
    and the third was reset as listener_full."""
    origin = Origin(node_env, isolated_env, extra="max_connections = 2\nmax_connections_per_address = 2\n")
    stalled: list[socket.socket] = []
    try:
        pipeline = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 400
        for ip in ("127.0.0.11", "127.0.0.12"):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((ip, 0))
            s.settimeout(5)
            s.connect(("127.0.0.2", origin.metrics_port))
            s.sendall(pipeline)
            stalled.append(s)
        time.sleep(1.0)
        assert sum(alive(s) for s in stalled) == 2   # (both held: the cap is reached)
        deadline = time.monotonic() + 15
        while any(_open_unread(s) for s in stalled) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_open_unread(s) for s in stalled), "a client that never reads still holds its slot"
        with socket.create_connection(("127.0.0.2", origin.metrics_port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            body = b""
            while chunk := s.recv(65536):
                body += chunk
        assert body.startswith(b"HTTP/1.0 200"), body[:200]
    finally:
        for s in stalled:
            s.close()
        origin.stop()
    log = origin.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]


def _open_unread(s: socket.socket) -> bool:
    """The daemon has not cut this connection (its unread answer aside): a reset or FIN means it did."""
    try:
        with open("/proc/net/tcp") as f:
            st = f.read()
    except OSError:
        st = ""
    ip, port = s.getsockname()
    local = f"{socket.inet_aton(ip)[::-1].hex().upper()}:{port:04X}"
    for line in st.splitlines()[1:]:
        cols = line.split()
        if cols[1] == local:
            return cols[3] == "01"   # ESTABLISHED (a cut one is CLOSE_WAIT or gone)
    return False
