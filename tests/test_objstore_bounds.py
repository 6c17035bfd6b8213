"""Object storage that answers too much or too slowly: a manifest larger than the limit is refused
from the response's length without its body being downloaded (a real moto S3 server), and a GET that
stalls mid-body ends at the caller's deadline, not at the client's 120 s timeout (a hostile endpoint)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tiering.errors import BadInput, TimedOut

from .test_objstore import cold, labelled, open_dir

MiB = 1 << 20
pytest.importorskip("moto.server", reason="moto[server] missing (pip install -e .[test])")
obstore = pytest.importorskip("obstore")


def test_a_huge_manifest_is_refused_from_its_length_without_downloading_it(s3_endpoint, bucket) -> None:
    """A bucket writer puts a 100 MB manifest.json (as in the attack): at the default limit (64 MiB; the
    largest real manifests are ~17 MB) reading it is refused at once, naming the object and its size,
    and its body is never read."""
    from tiering.sources.s3.client import OBJECT_MANIFEST_LIMIT
    c = cold(s3_endpoint, bucket)
    assert c.max_manifest_bytes == OBJECT_MANIFEST_LIMIT == 64 * MiB
    obstore.put(c.store, "acme/big/v1/.weightd/manifest.json", b" " * (100 * 10**6))
    before = c.stats.snapshot()
    t0 = time.monotonic()
    with pytest.raises(BadInput, match=r"manifest of 100000000 bytes, more than the 67108864 allowed; not read"):
        c.read_manifest("acme/big", "v1")
    assert time.monotonic() - t0 < 5
    assert c.stats.since(before)["bytes_read"] == 0
    # the same through the catalog a preload resolves with: the one-line refusal, exit 2
    from tiering.errors import TieringError
    with pytest.raises(TieringError) as exc:
        c.version_dir("acme/big", "v1")
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)


class StallingS3:
    """A hostile S3 endpoint on 127.0.0.1 (moto cannot stall): HEAD of any object answers with its
    size and ETag; a listing starts its answer and then sends nothing; a GET of ``manifest.json`` advertises ``manifest_bytes`` and would send zeros; a
    ranged GET sends the first half of the range and then nothing, keeping the connection open. It
    records the bytes of body it sent and when each connection was closed by the client."""

    def __init__(self, size: int, manifest_bytes: int = 600 * MiB) -> None:
        self.size, self.manifest_bytes = size, manifest_bytes
        self.sent = 0
        self.closed_at: list[float] = []
        self.stop = threading.Event()
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.srv.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buf = b""
        try:
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        chunk = conn.recv(65536)
                    except socket.timeout:
                        if self.stop.is_set():
                            return
                        continue
                    if not chunk:
                        self.closed_at.append(time.monotonic())
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path = lines[0].split()[:2]
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
                common = "ETag: \"e1\"\r\nLast-Modified: Wed, 01 Jan 2025 00:00:00 GMT\r\n"
                if method == "HEAD":
                    conn.sendall(f"HTTP/1.1 200 OK\r\n{common}Content-Length: {self.size}\r\n\r\n".encode())
                    continue
                if "list-type=" in path:   # a listing: the start of an answer, then nothing
                    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: 4096\r\n\r\n"
                                 f"<?xml".encode())
                    self._send_until_closed(conn, 0)
                    return
                if path.endswith("manifest.json"):
                    conn.sendall(f"HTTP/1.1 200 OK\r\n{common}Content-Length: {self.manifest_bytes}\r\n\r\n".encode())
                    self._send_until_closed(conn, self.manifest_bytes)
                    return
                lo, hi = (int(x) for x in headers["range"].split("=")[1].split("-"))
                n = hi - lo + 1
                conn.sendall(f"HTTP/1.1 206 Partial Content\r\n{common}Content-Range: bytes {lo}-{hi}/{self.size}\r\n"
                             f"Content-Length: {n}\r\n\r\n".encode())
                conn.sendall(b"\0" * (n // 2))
                self.sent += n // 2
                self._send_until_closed(conn, 0)   # (then silence, the connection held open)
                return
        finally:
            conn.close()

    def _send_until_closed(self, conn: socket.socket, n: int) -> None:
        """Send ``n`` zero bytes as the client takes them (none: just wait), until it closes."""
        conn.setblocking(False)
        block = b"\0" * 65536
        while not self.stop.is_set():
            if n > 0:
                try:
                    k = conn.send(block[:min(n, len(block))])
                    self.sent += k
                    n -= k
                    continue
                except BlockingIOError:
                    pass
                except OSError:
                    break
            try:
                if conn.recv(1, socket.MSG_PEEK) == b"":
                    break
            except BlockingIOError:
                time.sleep(0.05)
                continue
            except OSError:
                break
        self.closed_at.append(time.monotonic())

    def close(self) -> None:
        self.stop.set()
        self.srv.close()
        self.thread.join(5)


@pytest.fixture
def stalling(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    servers: list[StallingS3] = []

    def make(size: int) -> StallingS3:
        servers.append(StallingS3(size))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def test_a_ranged_get_that_stalls_ends_at_the_callers_deadline(stalling, tmp_path: Path) -> None:
    """The endpoint sends half of a range and then nothing: the download ends with TimedOut at its
    deadline (3 s here; it ran to obstore's 120 s client timeout before), and the request is
    abandoned: the client closes the connection then."""
    from tiering.sample import make_checkpoint
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="stall")
    m = labelled(src, "acme/s", "v1")
    size = (src / "model.safetensors").stat().st_size
    others = {f.path for f in m.files if f.path != "model.safetensors"}
    srv = stalling(size)
    c = cold(srv.endpoint, "hostile")
    done: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        try:
            with open_dir(tmp_path / "dst") as d:
                c.fetch(m, d, deadline=time.monotonic() + 3, skip=others)
        except BaseException as exc:  # noqa: BLE001 (what the test looks at)
            done["error"] = exc
        done["took"] = time.monotonic() - t0
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)   # (before the fix this waited 120 s: the test gives up on it long before)
    assert not t.is_alive(), "the download outlived its deadline by more than 17 s"
    assert isinstance(done.get("error"), TimedOut), done
    assert done["took"] < 6, done
    assert srv.sent > 0   # (the stall came mid-body)
    deadline = time.monotonic() + 5
    while not srv.closed_at and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.closed_at, "the stalled request was not abandoned (its connection is still open)"


def test_a_manifest_whose_length_is_over_the_limit_is_not_downloaded(stalling) -> None:
    """The hostile endpoint advertises a 600 MiB manifest.json (over the default 64 MiB limit) and
    would stream it: refused from the length alone, at once, with (almost) none of it sent, and the
    refused response's connection closed then. Asked 40 times: the connection was left open (until
    PyO3 next ran in the process, for as long as that took) about one refusal in 15, when the body
    was dropped with the response, which obstore's finished future still held."""
    srv = stalling(1)
    c = cold(srv.endpoint, "hostile")
    for i in range(40):
        sent = srv.sent
        t0 = time.monotonic()
        with pytest.raises(BadInput, match="more than the 67108864 allowed; not read"):
            c.read_manifest("acme/s", "v1")
        assert time.monotonic() - t0 < 5
        deadline = time.monotonic() + 5
        while len(srv.closed_at) <= i and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(srv.closed_at) > i, f"refusal {i + 1}: its connection is still open"
        assert srv.sent - sent < 8 * MiB, srv.sent - sent   # (what sat in socket buffers, not 600 MiB)


def test_a_listing_that_stalls_ends_at_the_callers_deadline(stalling) -> None:
    """Resolving NAME's versions (a listing, then a HEAD each) inside a bounded call: the stalled
    listing's request is abandoned at the deadline (its connection closed by the client), not held
    until obstore's 120 s client timeout on a thread the daemon counts as stuck."""
    from tiering.copy import run_bounded
    srv = stalling(1)
    c = cold(srv.endpoint, "hostile")
    t0 = time.monotonic()
    with pytest.raises(TimedOut):
        run_bounded(lambda: c.versions("acme/s"), deadline=time.monotonic() + 2, what="versions", grace_s=0.5)
    assert time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while not srv.closed_at and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.closed_at and srv.closed_at[0] - t0 < 5, "the stalled listing was not abandoned at its deadline"


def test_a_cli_that_read_object_storage_exits_with_its_own_code(s3_endpoint, weightd, isolated_env,
                                                                tmp_path: Path) -> None:
    """obstore hands each async result over from a tokio thread that takes the GIL; a command that
    then failed and exited at once aborted in the interpreter's teardown about one run in three (exit
    -6 instead of 2). Five runs of such a command: every one ends with its own exit code. (They run at
    once: each is its own process, and most of its time is the retries' back-off.)"""
    from .conftest import NodeEnv
    env = NodeEnv(tmp_path)
    env.config.write_text(env.config.read_text().replace(
        f'[tiers.cold]\npath = "{env.cold}"\n',
        f'[tiers.cold]\nurl = "s3://no-such-bucket/models"\nendpoint = "{s3_endpoint}"\nregion = "us-east-1"\n'))
    runs = weightd.at_once(*(["--config", env.config, "ls"] for _ in range(5)))
    codes = [r.returncode for r in runs]
    assert codes == [2] * 5, (codes, [r.stderr for r in runs])
