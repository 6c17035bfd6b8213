"""The Hub's refusals as a user of ``weightd publish hf://`` sees them: 401, 403, 429 and 5xx.

olah (the offline Hub mirror the other Hub tests use) never refuses anyone, and the real Hub cannot be
reached from here, so a small reverse proxy on 127.0.0.1 (:class:`HubFront`) stands in front of the
olah server: it passes every request through to it, except those a test names, which it answers as
huggingface.co does (status, ``X-Error-Code``/``X-Error-Message``, ``Retry-After`` and ``RateLimit``
headers, the ones huggingface_hub's ``hf_raise_for_status`` and ``http_backoff`` read). The proxy is a
fake only of those error replies; everything else (the client, the CLI, olah, the publish) is real, run
as a user runs it (``weightd --no-daemon publish hf://...`` in a subprocess, or through a daemon).

Each case checks the exit code (docs/reference/exit-codes.md), one line on stderr that names the
repository (and, for 429, when to try again), no traceback, nothing published (cold storage as it was,
no ``NAME@VERSION``, not even a partial one), and a token that never shows (stdout, stderr, the daemon's
log, every file under the state directory).
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest

from tiering.sample import LocalHub, local_hub

from .test_daemon import daemon  # noqa: F401  (the real daemon fixture)

pytest.importorskip("olah", reason="olah missing (pip install -e .[test])")
pytest.importorskip("huggingface_hub", reason="huggingface_hub missing (pip install -e .)")
if shutil.which("git-lfs") is None:
    pytest.skip("git-lfs missing (scripts/install-tools.sh installs it)", allow_module_level=True)

TOKEN = "hf_secretWeightdHubErrors0123456789abcdef"
BAD_TOKEN = "hf_secretRevokedLongAgo9876543210fedcba"
SHARD = "model-00001-of-00002.safetensors"
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclass
class Reply:
    """An answer the proxy gives instead of passing a request through."""
    method: str                           # "GET", "HEAD" or "*"
    path: str                             # a regular expression on the request's path
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    times: int | None = None              # answer this many matching requests, then pass them through
    when: Callable[[dict[str, str]], bool] = lambda headers: True
    used: int = 0


class HubFront:
    """A reverse proxy on 127.0.0.1 in front of a :class:`LocalHub` (see the module's docstring)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.replies: list[Reply] = []
        self.seen: list[tuple[str, str, int, float]] = []   # (method, path, status, time) of each request
        self.auth: set[str] = set()                          # every Authorization header received
        self.lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                front.handle(self)

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, status: int, headers: dict[str, str] | None = None, *,
               times: int | None = None, when: Callable[[dict[str, str]], bool] = lambda h: True) -> Reply:
        r = Reply(method, path, status, dict(headers or {}), times, when)
        self.replies.append(r)
        return r

    def statuses(self, path: str) -> list[int]:
        return [st for _, p, st, _ in self.seen if re.search(path, p)]

    def _reply_for(self, method: str, path: str, headers: dict[str, str]) -> Reply | None:
        with self.lock:
            for r in self.replies:
                if (r.method in ("*", method) and re.search(r.path, path) and r.when(headers)
                        and (r.times is None or r.used < r.times)):
                    r.used += 1
                    return r
        return None

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        headers = {k.lower(): v for k, v in h.headers.items()}
        if "authorization" in headers:
            with self.lock:
                self.auth.add(headers["authorization"])
        r = self._reply_for(h.command, h.path, headers)
        if r is not None:
            body = json.dumps({"error": r.headers.get("X-Error-Message", f"status {r.status}")}).encode()
            h.send_response(r.status)
            for k, v in {"Content-Type": "application/json", **r.headers}.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(body)
            self.seen.append((h.command, h.path, r.status, time.monotonic()))
            return
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            fwd = {k: v for k, v in h.headers.items() if k.lower() not in _HOP and k.lower() != "host"}
            conn.request(h.command, h.path, headers={**fwd, "Host": self.upstream})
            up = conn.getresponse()
            body = up.read() if h.command != "HEAD" else b""
            h.send_response(up.status)
            for k, v in up.getheaders():
                if k.lower() in _HOP or k.lower() == "content-length" and h.command != "HEAD":
                    continue
                h.send_header(k, v.replace(f"http://{self.upstream}", self.endpoint))
            if h.command != "HEAD":
                h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            self.seen.append((h.command, h.path, up.status, time.monotonic()))
        finally:
            conn.close()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    """One olah server for the module, serving org/repo and a copy of it as org/gated."""
    with local_hub(tmp_path_factory.mktemp("hub")) as h:
        shutil.copytree(h.repo, h.repo.with_name("gated"), symlinks=True)
        yield h


@pytest.fixture
def front(hub: LocalHub):
    f = HubFront(hub.endpoint)
    try:
        yield f
    finally:
        f.stop()


def env(hub: LocalHub, front: HubFront, token: str | None = TOKEN) -> dict[str, str]:
    e = hub.env(HF_ENDPOINT=front.endpoint)
    if token is not None:
        e["HF_TOKEN"] = token
    return e


def cold_listing(node_env) -> list[str]:
    return sorted(str(p.relative_to(node_env.cold)) for p in node_env.cold.rglob("*")) if node_env.cold.exists() else []


def refused(wd, node_env, hub: LocalHub, front: HubFront, source: str, code: int, *needles: str,
            token: str | None = TOKEN, daemon_only: bool = False):
    """``weightd publish SOURCE`` fails as a user should see it, and leaves nothing behind."""
    before = cold_listing(node_env)
    mode = "--daemon-only" if daemon_only else "--no-daemon"
    r = wd(mode, "publish", source, env=env(hub, front, token))
    assert_error_line(r, code, *needles)
    if token is not None:
        assert f"Bearer {token}" in front.auth     # (the token was sent: its absence below means something)
    assert cold_listing(node_env) == before
    assert_token_hidden(node_env, r.stdout + r.stderr)
    ls = wd("--no-daemon", "ls", "--json")
    assert ls.returncode == 0 and '"org/' not in ls.stdout, ls.stdout
    return r


_NOTES = (r"warning: http://127\.0\.0\.1:\d+: the Hugging Face token goes over plain http:// \(loopback only\)",
          r"hf://org/\w+@\w+: commit [0-9a-f]{40}: \d+ file\(s\), .* to download into /\S+",
          r"http://127\.0\.0\.1:\d+/\S+: the Hub answered \d{3}; trying again in \d+ s \(\d/\d\)")


def assert_error_line(r, code: int, *needles: str) -> None:
    """Exit ``code``, nothing on stdout, and on stderr one line of error (the last) naming ``needles``;
    the lines before it only the import's notes (the loopback-http warning, the selection's size, a
    retry), never a traceback nor a third party's log."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "", r.stdout
    *notes, last = r.stderr.strip().splitlines()
    assert last.startswith("weightd: ") and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in last, (n, last)
    for line in notes:
        assert any(re.fullmatch(p, line) for p in _NOTES), (line, r.stderr)


def assert_token_hidden(node_env, *texts: str) -> None:
    for secret in (TOKEN, BAD_TOKEN, TOKEN[len("hf_"):], BAD_TOKEN[len("hf_"):]):
        for t in texts:
            assert secret not in t
        for f in node_env.state.rglob("*") if node_env.state.exists() else ():
            if f.is_file() and not f.is_symlink():
                assert secret.encode() not in f.read_bytes(), f


HF_401_REPO = {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
HF_401_BAD_TOKEN = {"X-Error-Message": "Invalid credentials in Authorization header"}
HF_403_GATED = {"X-Error-Code": "GatedRepo",
                "X-Error-Message": "Access to model org/gated is restricted and you are not in the authorized list. "
                                   "Visit https://huggingface.co/org/gated to ask for access."}


def hf_429(retry_after: int) -> dict[str, str]:
    """huggingface.co's 429: Retry-After and the IETF RateLimit headers (r=0 requests left, t=seconds)."""
    return {"Retry-After": str(retry_after), "RateLimit": f'"api";r=0;t={retry_after}',
            "RateLimit-Policy": '"fixed window";"api";q=500;w=300',
            "X-Error-Message": "You have exceeded our hourly quotas for action: api. Retry later."}


def test_a_missing_or_private_repository_is_not_found(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    """huggingface.co answers 401 RepoNotFound for a repository that is not there or that the token may
    not see (it does not tell which), to every request about it."""
    front.answer("*", r"^(/api/models)?/org/private(/|$)", 401, HF_401_REPO)
    refused(wd, node_env, hub, front, "hf://org/private@main", 3, "hf://org/private@main", "no repository org/private",
            "HF_TOKEN")
    refused(wd, node_env, hub, front, "hf://org/private", 3, "no repository org/private", token=None)
    assert front.statuses("/org/private") and set(front.statuses("/org/private")) == {401}


def test_a_bad_token_is_unauthorized(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    front.answer("*", "", 401, HF_401_BAD_TOKEN, when=lambda h: h.get("authorization") != f"Bearer {TOKEN}")
    refused(wd, node_env, hub, front, "hf://org/repo@main", 2, "hf://org/repo@main", "unauthorized (401)", "HF_TOKEN",
            token=BAD_TOKEN)
    assert front.auth == {f"Bearer {BAD_TOKEN}"}


def test_a_gated_repository_is_access_denied(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    """On huggingface.co a gated repository's card and file list are public; its files answer 403
    GatedRepo to a token that has not been granted access (401 GatedRepo without a token)."""
    front.answer("*", r"^/org/gated/resolve/", 403, HF_403_GATED, when=lambda h: "authorization" in h)
    front.answer("*", r"^/org/gated/resolve/", 401, HF_403_GATED)
    for token in (TOKEN, None):
        refused(wd, node_env, hub, front, "hf://org/gated@main", 2, "hf://org/gated@main", "access denied",
                "gated", token=token)
    assert {401, 403} <= set(front.statuses("^/org/gated/resolve/"))


def test_429_on_the_first_request_says_when_to_try_again(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    front.answer("GET", r"^/api/models/org/repo/revision/", 429, hf_429(3600))
    t0 = time.monotonic()
    refused(wd, node_env, hub, front, "hf://org/repo@main", 1, "hf://org/repo@main", "rate-limited (429)",
            "3600 s")
    assert time.monotonic() - t0 < 30, "a wait longer than the cap is not waited for"
    assert len(front.statuses("^/api/models/org/repo/revision/")) == 1


def test_429_during_a_file_download_after_the_metadata(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    front.answer("GET", rf"^/org/repo/resolve/[0-9a-f]{{40}}/{SHARD}", 429, hf_429(3600))
    refused(wd, node_env, hub, front, "hf://org/repo@main", 1, "hf://org/repo@main", "rate-limited (429)", "3600 s")
    assert front.statuses(r"^/api/models/org/repo/revision/") == [200]
    assert 429 in front.statuses(rf"/resolve/[0-9a-f]{{40}}/{SHARD}")


def test_a_short_429_is_waited_for_then_the_import_completes(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    front.answer("GET", r"^/api/models/org/repo/revision/", 429, hf_429(1), times=1)
    front.answer("GET", rf"^/org/repo/resolve/[0-9a-f]{{40}}/{SHARD}", 429, hf_429(1), times=2)
    r = wd("--no-daemon", "publish", "hf://org/repo@main", "--json", env=env(hub, front))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("answered 429; trying again in 1 s") == 3, r.stderr
    assert json.loads(r.stdout)["version"] == hub.commit()
    assert_token_hidden(node_env, r.stdout, r.stderr)


def test_429_that_never_ends_is_given_up_on_in_bounded_time(wd, node_env, hub: LocalHub, front: HubFront) -> None:
    front.answer("GET", rf"^/org/repo/resolve/[0-9a-f]{{40}}/{SHARD}", 429, hf_429(1))
    t0 = time.monotonic()
    refused(wd, node_env, hub, front, "hf://org/repo@main", 1, "rate-limited (429, 4 tries)", "in 1 s")
    took = time.monotonic() - t0
    n = len(front.statuses(rf"/resolve/[0-9a-f]{{40}}/{SHARD}"))
    assert 2 <= n <= 8 and took < 40, (n, took)


@pytest.mark.parametrize("where, status, retry_after", [(r"^/api/models/org/repo/revision/", 500, None),
                                                        (r"^/api/models/org/repo/tree/", 502, "0"),
                                                        (rf"^/org/repo/resolve/[0-9a-f]{{40}}/{SHARD}", 503, "0")])
def test_a_server_error_is_one_line(wd, node_env, hub: LocalHub, front: HubFront, where: str, status: int,
                                    retry_after: str | None) -> None:
    """A 5xx that never ends is tried 1 + RETRIES times, then one line. With no Retry-After (the 500)
    the client's own back-off is waited (1, 2, 4 s); the 502 and 503 say ``Retry-After: 0`` (as a server
    may), so the same retries run without 7 s of sleep each."""
    headers = {"X-Error-Message": "Internal Error - We're working hard to fix this"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    front.answer("*", where, status, headers)
    t0 = time.monotonic()
    r = refused(wd, node_env, hub, front, "hf://org/repo@main", 1, "hf://org/repo@main", f"answered {status}")
    assert time.monotonic() - t0 < 60
    assert len(front.statuses(where)) == 4, front.statuses(where)
    waits = re.findall(rf"answered {status}; trying again in (\d+) s \((\d)/3\)", r.stderr)
    assert waits == ([("1", "1"), ("2", "2"), ("4", "3")] if retry_after is None else
                     [("0", "1"), ("0", "2"), ("0", "3")]), r.stderr


def test_through_a_daemon_the_refusals_are_the_same_and_its_log_holds_no_token(daemon, wd, node_env,  # noqa: F811
                                                                                hub: LocalHub, front: HubFront) -> None:
    """With a daemon answering (--daemon-only), this process still talks to the Hub: the same lines and
    exit codes, and the daemon's log never sees the token."""
    front.answer("*", r"^/org/gated/resolve/", 403, HF_403_GATED)
    front.answer("GET", r"^/api/models/org/repo/revision/", 429, hf_429(600))
    refused(wd, node_env, hub, front, "hf://org/gated@main", 2, "access denied", daemon_only=True)
    refused(wd, node_env, hub, front, "hf://org/repo@main", 1, "rate-limited (429)", "in 600 s", daemon_only=True)
    daemon.drain()
    assert_token_hidden(node_env, daemon.log_path.read_text())


@pytest.mark.parametrize("headers,wait,when", [
    ({"retry-after": "\u00b2"}, None, "later"),                         # a digit to isdigit(), not to float()
    ({"retry-after": "9" * 20}, None, "later"),
    ({"ratelimit": '"api";r=0;t=' + "9" * 400}, None, "later"),
    ({"retry-after": "7"}, 7.0, "in 7 s"),
])
def test_what_a_reply_asks_to_wait_is_read_safely(headers: dict, wait: float | None, when: str) -> None:
    """A hostile or broken Retry-After / RateLimit never raises while the wait or its message is made."""
    from tiering.sources.hf import _when
    from tiering.sources.hf_http import asked_wait
    assert asked_wait(headers) == wait
    assert when in _when(asked_wait(headers))
    assert _when(1e20) == "later" and _when(float("inf")) == "later"
