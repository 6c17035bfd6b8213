"""503 SlowDown from the object store (docs/sources.md: transient errors are retried per range with
back-off; a store that keeps throttling is one line). A real S3-protocol server (moto) behind a small
HTTP proxy that answers ``503 SlowDown`` to chosen requests, as S3 does when a prefix is asked too
fast; the real CLI preloads through it."""

from __future__ import annotations

import http.client
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

MiB = 1 << 20
pytest.importorskip("moto.server", reason="moto[server] missing (pip install -e .[test])")
pytest.importorskip("obstore")

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b'<Message>Please reduce your request rate.</Message><RequestId>T</RequestId></Error>')
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class SlowDownProxy:
    """An HTTP proxy in front of the S3 server: a request whose ``METHOD path`` matches ``pattern`` is
    answered ``503 SlowDown`` (S3's XML body) until ``times`` such requests of the same method, path and
    Range have been throttled; every other request is passed on. ``seen`` counts, per (method, path,
    range), the requests throttled and passed."""

    def __init__(self, upstream: str, pattern: str, times: int) -> None:
        u = urlparse(upstream)
        self.pattern, self.times = re.compile(pattern), times
        self.seen: dict[tuple[str, str, str], list[int]] = {}   # -> [throttled, passed]
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:   # (quiet)
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = (self.command, self.path.split("?")[0], self.headers.get("Range", ""))
                with proxy.lock:
                    counts = proxy.seen.setdefault(key, [0, 0])
                    throttle = bool(proxy.pattern.search(f"{self.command} {self.path}")) and counts[0] < proxy.times
                    counts[0 if throttle else 1] += 1
                if throttle:
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                up = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
                try:
                    up.request(self.command, self.path, body=body or None,
                               headers={k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP})
                    r = up.getresponse()
                    data = r.read()
                    self.send_response(r.status, r.reason)
                    for k, v in r.getheaders():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    # (a HEAD's length is the object's, as the store said; a body's is what was read)
                    self.send_header("Content-Length", r.getheader("Content-Length", "0") if self.command == "HEAD"
                                     else str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    up.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def throttled(self) -> dict[tuple[str, str, str], int]:
        with self.lock:
            return {k: v[0] for k, v in self.seen.items() if v[0]}

    def passed(self, key: tuple[str, str, str]) -> int:
        with self.lock:
            return self.seen.get(key, [0, 0])[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def s3_config(node_env, bucket: str, endpoint: str) -> Path:
    """node_env's config with [tiers.cold] on the bucket at ``endpoint``, 1 MiB ranges."""
    text = node_env.config.read_text().replace(
        f'[tiers.cold]\npath = "{node_env.cold}"\n',
        f'[tiers.cold]\nurl = "s3://{bucket}/models"\nendpoint = "{endpoint}"\nregion = "us-east-1"\n'
        f'range_size = "1MiB"\nconcurrency = 2\n')
    assert "url = " in text
    out = node_env.tmp / f"s3-{urlparse(endpoint).port}.toml"
    out.write_text(text)
    return out


@pytest.fixture
def published(node_env, s3_endpoint, bucket, weightd, tmp_path: Path):
    """acme/slow@v1 (4 MiB, two shards) published straight to the S3 server; its manifest."""
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2, seed="slow")
    r = weightd("--config", s3_config(node_env, bucket, s3_endpoint), "--no-daemon", "publish", src,
                "--name", "acme/slow", "--version", "v1")
    assert r.returncode == 0, r.stderr
    return build_manifest(src)


def test_slow_down_is_retried_per_range_and_the_copy_is_whole(published, node_env, s3_endpoint, bucket,
                                                             weightd) -> None:
    """The manifest's GET and every ranged GET of a shard are each answered 503 SlowDown twice: each
    is asked again (a third time) and the preload completes, verified, counting what it met."""
    proxy = SlowDownProxy(s3_endpoint, r"^GET /[^ ]*(/\.weightd/manifest\.json|\.safetensors)$", times=2)
    try:
        r = weightd("--config", s3_config(node_env, bucket, proxy.endpoint), "--no-daemon", "preload",
                    "acme/slow@v1", "--tier", "warm", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        throttled = proxy.throttled()
        ranges = [k for k in throttled if k[1].endswith(".safetensors")]
        assert any(k[1].endswith("/manifest.json") for k in throttled), throttled
        assert len(ranges) >= 2 and all(k[2].startswith("bytes=") for k in ranges), throttled
        for k, n in throttled.items():   # each throttled twice, then asked again and served (a range once;
            # the manifest is read again later, by design)
            assert n == 2 and proxy.passed(k) >= 1 and (proxy.passed(k) == 1 or k not in ranges), \
                (k, n, proxy.passed(k))
        assert rep["store"]["errors"].get("throttled", 0) >= len(ranges), rep["store"]
        assert rep["bytes_by_source"]["cold"] == rep["bytes"] == published.total_bytes
        assert verify_checkpoint(Path(rep["path"]), published).ok
    finally:
        proxy.close()


def test_a_store_that_keeps_throttling_is_one_line_after_the_retries(published, node_env, s3_endpoint, bucket,
                                                                    weightd) -> None:
    """Every ranged GET answered 503 SlowDown: each range is tried RETRIES + 1 times with back-off, no
    more, and the preload ends in one line that says what to do (exit 1), nothing placed."""
    from tiering.sources.s3.client import RETRIES
    proxy = SlowDownProxy(s3_endpoint, r"^GET /[^ ]*\.safetensors$", times=1000)
    try:
        r = weightd("--config", s3_config(node_env, bucket, proxy.endpoint), "--no-daemon", "preload",
                    "acme/slow@v1", "--tier", "warm", timeout=120)
        assert r.returncode == 1, (r.returncode, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "503 SlowDown" in lines[0] and f"after {RETRIES} retries" in lines[0] \
            and "concurrency" in lines[0], r.stderr
        throttled = proxy.throttled()
        assert throttled and max(throttled.values()) == RETRIES + 1, throttled
        assert not any(proxy.passed(k) for k in throttled), throttled
        assert not (node_env.warm / "acme/slow/v1").exists()
    finally:
        proxy.close()
