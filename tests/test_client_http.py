"""The client's own HTTP/1.1 reader against a real unix socket whose server (this uid: trusted) answers
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


def test_a_daemon_answering_garbage_is_not_a_daemon(tmp_path: Path) -> None:
    """``available()`` (what every command asks first) counts a garbled answer as no daemon."""
    sock = tmp_path / "d.sock"
    t = serve_once(sock, b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
    assert DaemonClient(sock).available() is False
    t.join(5)
