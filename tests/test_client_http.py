"""The client (http.client and its checks) on a real unix socket whose server (this uid: trusted) answers
badly: every bad answer is BadAnswer or ConnectionResetError (one line, exit 1 in the CLI), never a
traceback, a hang or unbounded memory; good answers (Content-Length, chunked, until close) are read."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from weightd.client import DaemonClient
from weightd.errors import BadAnswer


def serve_once(path: Path, answer: bytes) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def run() -> None:
        try:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    more = conn.recv(4096)
                    if not more:
                        break
                    data += more
                conn.sendall(answer)
        finally:
            srv.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


JSON = b'{"ok": true}'
GOOD = [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + JSON,
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" + JSON[:5] + b"\r\n7;x=y\r\n" + JSON[5:]
    + b"\r\n0\r\nTrailer: t\r\n\r\n",
    b"HTTP/1.0 200 OK\r\n\r\n" + JSON,   # (no length: until the connection closes)
]
BAD = [
    (b"SSH-2.0-OpenSSH\r\n", BadAnswer),
    (b"HTTP/1.1 abc OK\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\nContent-Length: lots\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\n" + b"X" * 70000, BadAnswer),          # one endless header line
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffff\r\n", BadAnswer),  # (not buffered)
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n" + JSON, BadAnswer),  # (http.client: read all)
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", BadAnswer),  # (http.client: one allocation)
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 12\r\n\r\n" + JSON, BadAnswer),
    (b"HTTP/2.0 200 OK\r\n\r\n", BadAnswer),
    (b"HTTP/1.1 200 OK\r\n", ConnectionResetError),                # (http.client: the end of the headers)
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", ConnectionResetError),
    (b"", ConnectionResetError),                                   # closed without an answer
    (b"HTTP/1.1 200 OK\r\nContent-Le", ConnectionResetError),      # closed in the headers
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + JSON, ConnectionResetError),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" + JSON, ConnectionResetError),
]


@pytest.mark.parametrize("answer", GOOD, ids=["length", "chunked", "until-close"])
def test_good_answers(tmp_path: Path, answer: bytes) -> None:
    sock = tmp_path / "d.sock"
    t = serve_once(sock, answer)
    assert DaemonClient(sock).call("GET", "health", timeout=5) == {"ok": True}
    t.join(5)


@pytest.mark.parametrize("answer,error", BAD, ids=[repr(a[:24]) for a, _ in BAD])
def test_bad_answers_are_one_error(tmp_path: Path, answer: bytes, error: type) -> None:
    sock = tmp_path / "d.sock"
    t = serve_once(sock, answer)
    client = DaemonClient(sock)
    with pytest.raises(error):
        client.call("GET", "health", timeout=5)
    t.join(5)


def test_a_progress_stream_is_read_line_by_line_and_bounded(tmp_path: Path) -> None:
    """``stream`` (preload's progress) hands each progress line over and returns the result line; a line
    longer than MAX_PROGRESS_LINE is BadAnswer once that much has come, never buffered without end."""
    from weightd.client import MAX_PROGRESS_LINE

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
    lines = [b'{"progress": {"done": 1}}\n', b'{"progress": {"done": 2}}\n{"result": {"path": "/p"}}\n']
    t = serve_once(tmp_path / "a.sock", head + b"".join(chunk(x) for x in lines) + b"0\r\n\r\n")
    seen: list[dict] = []
    assert DaemonClient(tmp_path / "a.sock").stream("preload", {}, seen.append) == {"path": "/p"}
    assert seen == [{"done": 1}, {"done": 2}]
    t.join(5)
    endless = chunk(b'{"progress": "' + b"x" * (MAX_PROGRESS_LINE + 10))
    t = serve_once(tmp_path / "b.sock", head + endless + b"0\r\n\r\n")
    with pytest.raises(BadAnswer, match="progress line longer"):
        DaemonClient(tmp_path / "b.sock").stream("preload", {}, None)
    t.join(5)


def test_a_daemon_answering_garbage_is_not_a_daemon(tmp_path: Path) -> None:
    """``available()`` (what every command asks first) counts a garbled answer as no daemon."""
    sock = tmp_path / "d.sock"
    t = serve_once(sock, b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
    assert DaemonClient(sock).available() is False
    t.join(5)


def serve_routes(path: Path, routes: dict[str, bytes], stop: threading.Event) -> threading.Thread:
    """A stand-in daemon on the node's socket (this uid: a trusted one) answering by route, until stopped."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(8)
    srv.settimeout(0.2)

    def run() -> None:
        try:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.settimeout(5)
                    data = b""
                    while b"\r\n\r\n" not in data and (more := conn.recv(4096)):
                        data += more
                    target = data.split(b" ", 2)[1].decode() if data.count(b" ") >= 2 else ""
                    body = routes.get(target.split("?")[0], b'{"error": "no"}')
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
        finally:
            srv.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "click"])
def test_a_path_outside_the_tiers_from_the_daemon_is_refused(node_env, isolated_env, tmp_path: Path,
                                                            fast: bool) -> None:
    """A daemon (or whatever serves the socket as a trusted uid) answering ``path`` with a directory
    outside the hot and warm tiers: refused, one line, exit 2, nothing printed on stdout, both ways."""
    import subprocess
    import sys

    from .conftest import assert_one_line_error
    node_env.state.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    t = serve_routes(node_env.state / "weightd.sock",
                     {"/v1/health": b'{"status": "serving"}', "/v1/path": b'{"tier": "hot", "path": "/etc"}'}, stop)
    try:
        env = {**isolated_env, **({} if fast else {"WEIGHTD_NO_FAST_PATH": "1"})}
        p = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "path", "org/d@v1"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert_one_line_error(p, 2, "answered path '/etc'", "not inside the hot or warm tier")
        assert p.stdout == ""
    finally:
        stop.set()
        t.join(5)
