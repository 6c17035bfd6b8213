"""The registry client under the OCI cold tier: one registry and repository prefix
(:class:`RegistryLocation`), credentials as docker and podman keep them (:mod:`.auth`), and every
request counted (:class:`~tiering.sources.s3.client.Stats`), classified, retried when transient and
ended at the caller's deadline. The catalog, ranged reads and publishing (the modules beside this one)
make their requests through :class:`RegistryClient` and nothing else.

Library: the standard library's ``http.client``, one keep-alive connection per worker thread (and per
host: a blob redirected to another host gets its own). oras-py cannot set a manifest's
``artifactType`` (a ModelPack artifact needs it), and what remains of it here would be requests'
sessions around the same calls: the distribution API is a dozen requests (docs/sources.md).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urljoin, urlsplit

from ...content.names import validate_label, validate_name
from ...errors import BadInput, CheckpointNotFound, TieringError, TimedOut
from ..s3.client import Stats, deadline_of
from . import auth
from .layout import OCI_MANIFEST, REPO_COMPONENT, name_component, repo_component, tag_of
from .errors import RegistryError, RegistrySetupError, ShortRead

DEFAULT_RANGE = 64 << 20       # bytes per ranged GET
STREAM_CHUNK = 4 << 20         # a response body is read in pieces of at most this size
DEFAULT_CONCURRENCY = 4
DEFAULT_CHUNK = 16 << 20       # bytes per PATCH of a chunked blob upload
RETRIES = 4
IO_TIMEOUT_S = 60.0            # a socket that says nothing for this long, without a nearer deadline
OCI_MANIFEST_LIMIT = 4 << 20   # distribution refuses larger manifests itself
ACCEPT = f"{OCI_MANIFEST}, application/vnd.oci.image.index.v1+json"
MAX_REPO_NAME = 255            # distribution's bound on REGISTRY/REPOSITORY


@dataclass(frozen=True, slots=True)
class RegistryLocation:
    """``oci://REGISTRY[/PREFIX]``: NAME@VERSION is the artifact ``PREFIX/NAME:VERSION``."""
    host: str            # host[:port], as the registry is addressed (and as credentials are keyed)
    prefix: str

    @classmethod
    def parse(cls, url: str) -> "RegistryLocation":
        u = urlsplit(url)
        if u.scheme != "oci" or not u.netloc or u.query or u.fragment or "@" in u.netloc:
            raise BadInput(f"[tiers.cold] url: expected oci://REGISTRY[/PREFIX], got {url!r}")
        prefix = u.path.strip("/")
        for part in prefix.split("/") if prefix else []:
            if not REPO_COMPONENT.fullmatch(part):
                raise BadInput(f"[tiers.cold] url: {url!r}: {part!r} is not a repository path component "
                               f"(lowercase [a-z0-9], separated by '.', '_', '__' or '-')")
        return cls(u.netloc.lower(), prefix)

    def repo(self, name: str) -> str:
        """NAME's repository (``PREFIX/NAME``, each component escaped when a registry would not take it:
        :func:`.layout.repo_component`); BadInput when that is too long for a registry."""
        validate_name(name)
        repo = "/".join(repo_component(p) for p in name.split("/"))
        repo = f"{self.prefix}/{repo}" if self.prefix else repo
        if len(self.host) + 1 + len(repo) > MAX_REPO_NAME:
            raise BadInput(f"name {name!r}: its repository {self.host}/{repo} is longer than a registry takes "
                           f"({MAX_REPO_NAME} characters): an oci:// cold tier needs a shorter name")
        return repo

    def name_of(self, repo: str) -> str | None:
        """The NAME whose repository ``repo`` is, or None (outside the prefix, or not a NAME)."""
        full = repo
        if self.prefix:
            if not repo.startswith(self.prefix + "/"):
                return None
            repo = repo[len(self.prefix) + 1:]
        parts = [name_component(p) for p in repo.split("/")]
        if len(parts) > 2 or any(p is None for p in parts):
            return None
        name = "/".join(parts)   # type: ignore[arg-type]
        try:
            return name if self.repo(name) == full else None
        except BadInput:
            return None

    @staticmethod
    def tag(version: str) -> str:
        """A version's (or a companion's label's) tag: :func:`.layout.tag_of`."""
        return tag_of(validate_label(version))


@dataclass(slots=True)
class Reply:
    status: int
    headers: Any          # http.client.HTTPMessage
    body: bytes = b""
    url: str = ""


class RegistryClient:
    """One registry (and prefix), with the tier's settings; thread-safe (each thread its own
    connections). ``stats`` is what was asked and served."""

    def __init__(self, url: str, *, range_bytes: int = DEFAULT_RANGE, concurrency: int = DEFAULT_CONCURRENCY,
                 chunk_bytes: int = DEFAULT_CHUNK, bandwidth: int = 0, insecure: bool = False,
                 ca_file: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.url, self.location = url.rstrip("/"), RegistryLocation.parse(url)
        self.range_bytes, self.concurrency, self.chunk_bytes = range_bytes, max(1, concurrency), chunk_bytes
        self.bandwidth, self.insecure = bandwidth, insecure
        self.scheme = "http" if insecure else "https"
        self.max_manifest_bytes = 64 << 20   # weightd's manifest blob (as for an object store)
        self.stats = Stats()
        self.auth_files = auth.auth_files(env)
        self.creds = auth.find_credentials(self.location.host, env)
        self._tls: ssl.SSLContext | None = None
        if not insecure:
            try:
                self._tls = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            except (OSError, ssl.SSLError) as exc:
                raise RegistrySetupError(f"[tiers.cold] ca_file {ca_file}: {exc}") from None
        self._idle: dict[tuple[str, str], list[http.client.HTTPConnection]] = {}   # kept-alive, by origin
        self._idle_lock = threading.Lock()
        self._auth_lock = threading.Lock()
        self._challenge: auth.Challenge | None = None   # the registry's last 401 (basic, or a token realm)
        self._tokens: dict[str, str] = {}               # bearer tokens by scope
        from ...pagecache.throttle import TokenBucket
        self.bucket = TokenBucket(bandwidth) if bandwidth else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- connections: kept alive, each used by one thread at a time ---------------------------------------
    def _take(self, origin: tuple[str, str], timeout: float) -> http.client.HTTPConnection:
        with self._idle_lock:
            idle = self._idle.get(origin)
            c = idle.pop() if idle else None
        if c is None:
            scheme, netloc = origin
            c = (http.client.HTTPSConnection(netloc, timeout=timeout, context=self._tls) if scheme == "https"
                 else http.client.HTTPConnection(netloc, timeout=timeout))
        c.timeout = timeout
        if c.sock is not None:
            c.sock.settimeout(timeout)
        return c

    def _give_back(self, resp: http.client.HTTPResponse) -> None:
        """The response's connection back to the idle ones (its body read to the end), or closed."""
        origin, conn = resp._weightd_conn   # type: ignore[attr-defined]
        if resp.will_close or conn.sock is None:
            conn.close()
            return
        with self._idle_lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.concurrency + 2:
                idle.append(conn)
                return
        conn.close()

    def abandon(self, resp: http.client.HTTPResponse) -> None:
        """A response not read to its end (an error, a refusal): its connection is closed, never reused."""
        resp.close()
        resp._weightd_conn[1].close()   # type: ignore[attr-defined]

    def done(self, resp: http.client.HTTPResponse) -> None:
        """A streamed response read to its end: its connection is kept for the next request."""
        self._give_back(resp)

    def read_timeout(self, resp: http.client.HTTPResponse, left_s: float) -> None:
        """A streamed response's next read waits at most ``left_s`` (the caller's deadline)."""
        conn = resp._weightd_conn[1]   # type: ignore[attr-defined]
        if conn.sock is not None:
            conn.sock.settimeout(max(0.05, min(left_s, IO_TIMEOUT_S)))

    def close(self) -> None:
        """Close the kept-alive connections (the node's close)."""
        with self._idle_lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()

    # -- requests -------------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, what: str, headers: dict[str, str] | None = None,
                body: Any = None, expect: Iterable[int] = (200,), deadline: float | None = None,
                push: bool = False, stream: bool = False, retry: bool = True, limit: int | None = None) -> Any:
        """One request to the registry (``path``: /v2/..., or an absolute upload URL), authenticated
        (basic or bearer, as the registry's 401 asks), retried when transient (connection refused or
        reset, 429, 5xx) within ``deadline`` (and the deadline this thread works for). Returns a
        :class:`Reply` (its body read whole, at most ``limit`` bytes: BadInput above it), or with
        ``stream`` the open response (the caller reads it to its end, or calls :meth:`abandon`).
        A status outside ``expect`` is classified: 404 CheckpointNotFound, 401/403 RegistrySetupError."""
        deadline = deadline_of(deadline)
        expect = tuple(expect)
        delay = 0.2
        for attempt in range(RETRIES + 1):
            try:
                return self._once(method, path, what, headers or {}, body, expect, deadline, push, stream, limit)
            except Transient as exc:
                self.stats.error(exc.kind)
                late = deadline is not None and time.monotonic() + delay > deadline
                if not retry or attempt == RETRIES or late:
                    raise exc.final(self, what) from None
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _once(self, method: str, path: str, what: str, headers: dict[str, str], body: Any,
              expect: tuple[int, ...], deadline: float | None, push: bool, stream: bool, limit: int | None) -> Any:
        url = path if "://" in path else f"{self.scheme}://{self.location.host}{path}"
        for hop in range(4):   # (redirects: a blob served from another host, S3 behind the registry)
            u = urlsplit(url)
            ours = u.netloc == self.location.host
            if u.scheme == "http" and not self.insecure:
                raise RegistrySetupError(f"{self.url}: {what}: the registry sent us to plain http ({u.netloc}); set "
                                         f"[tiers.cold] insecure = true only if that is meant")
            target = (u.path or "/") + (f"?{u.query}" if u.query else "")
            hdrs = dict(headers)
            if ours:
                hdrs.update(self._auth_header(path_repo(u.path), push))
            resp = self._send(u.scheme, u.netloc, method, target, hdrs, body, deadline, what)
            if resp.status == 401 and ours:
                challenge = resp.headers.get("WWW-Authenticate", "")
                self._finish(resp, 64 << 10)
                if hop < 3 and self._authenticate(challenge, path_repo(u.path), push, deadline, what,
                                                  sent="Authorization" in hdrs):
                    continue   # (the same request, now with what the challenge asked for)
                raise auth.refused(self, what, challenge)
            if resp.status in (301, 302, 303, 307, 308) and method in ("GET", "HEAD") and resp.getheader("Location"):
                self._finish(resp, 64 << 10)
                url = urljoin(url, resp.getheader("Location"))
                continue
            if resp.status in expect:
                if stream:
                    return resp
                data = self._finish(resp, limit, what=what)
                return Reply(resp.status, resp.headers, data, url)
            data = self._finish(resp, 64 << 10)
            raise self._status_error(resp.status, data, what)
        raise RegistryError(f"{self.url}: {what}: too many redirects")

    def _send(self, scheme: str, netloc: str, method: str, target: str, headers: dict[str, str], body: Any,
              deadline: float | None, what: str) -> http.client.HTTPResponse:
        left = IO_TIMEOUT_S if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise TimedOut(f"{self.url}: {what}: not started before the deadline")
        conn = self._take((scheme, netloc), min(IO_TIMEOUT_S, left))
        try:
            conn.request(method, target, body=body, headers={"User-Agent": "weightd", **headers})
            resp = conn.getresponse()
            resp._weightd_conn = ((scheme, netloc), conn)   # type: ignore[attr-defined]
            return resp
        except BaseException as exc:
            conn.close()   # (a kept-alive connection the registry closed, a refusal, a reset: never reused)
            if isinstance(exc, ssl.SSLError):
                raise RegistrySetupError(f"{self.url}: {what}: TLS with {netloc} failed ({exc.reason or exc}): set "
                                         f"[tiers.cold] ca_file to the CA that signed its certificate") from None
            if isinstance(exc, (socket.timeout, TimeoutError)):
                if deadline is not None and time.monotonic() >= deadline - 0.05:
                    raise TimedOut(f"{self.url}: {what}: the registry did not answer before the deadline") from None
                raise Transient("timeout", f"no answer in {IO_TIMEOUT_S:g} s") from None
            if isinstance(exc, ConnectionRefusedError):
                raise Transient("unreachable", "connection refused") from None
            if isinstance(exc, socket.gaierror):
                raise Transient("unreachable", f"unknown host ({exc.strerror})") from None
            if isinstance(exc, (OSError, http.client.HTTPException)):
                raise Transient("error", f"{type(exc).__name__}: {exc}") from None
            raise

    def _finish(self, resp: http.client.HTTPResponse, limit: int | None, *, what: str = "") -> bytes:
        """The body read to its end (the connection kept for the next request), at most ``limit``."""
        n = resp.getheader("Content-Length")
        try:
            if limit is not None and n is not None and n.isdigit() and int(n) > limit:
                raise BadInput(f"{self.url}: {what}: {n} bytes, more than the {limit} allowed; not read")
            data = resp.read(limit + 1) if limit is not None else resp.read()
            if limit is not None and len(data) > limit:
                raise BadInput(f"{self.url}: {what}: more than the {limit} bytes allowed; not read further")
            if not resp.isclosed():
                resp.read()
        except BadInput:
            self.abandon(resp)
            raise
        except (OSError, http.client.HTTPException) as exc:
            self.abandon(resp)
            raise Transient("error", f"the response broke: {type(exc).__name__}") from None
        self._give_back(resp)
        return data

    def _status_error(self, status: int, data: bytes, what: str) -> TieringError:
        codes = error_codes(data)
        detail = f" ({', '.join(codes)})" if codes else ""
        where = f"{self.url}: {what}"
        if status == 404:
            err: TieringError = CheckpointNotFound(where, f"not found{detail}")
            err.codes = codes   # type: ignore[attr-defined]
            return err
        if status == 403:
            return RegistrySetupError(f"{where}: access denied (403){detail}{auth.who(self)}: the registry does not "
                                      f"let these credentials do that")
        if status == 429 or status >= 500:
            raise Transient("throttled" if status == 429 else "error", f"HTTP {status}{detail}")
        err = RegistryError(f"{where}: HTTP {status}{detail}")
        err.codes = codes   # type: ignore[attr-defined]
        return err

    # -- authentication -------------------------------------------------------------------------------
    def _auth_header(self, repo: str | None, push: bool) -> dict[str, str]:
        ch = self._challenge
        if ch is None:
            return {}
        if ch.scheme == "basic":
            return {"Authorization": auth.basic_header(self.creds)} if self.creds is not None else {}
        token = self._tokens.get(auth.scope(repo, push))
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _authenticate(self, header: str, repo: str | None, push: bool, deadline: float | None, what: str, *,
                      sent: bool) -> bool:
        """Act on a 401's challenge: basic (credentials from the auth file), or bearer (a token from
        the realm, for this repository's scope). False when there is nothing new to send (``sent``:
        the refused request carried credentials or a token already)."""
        ch = auth.parse_challenge(header)
        if ch is None:
            return False
        with self._auth_lock:
            self._challenge = ch
            if ch.scheme == "basic":
                return self.creds is not None and not sent
            key = auth.scope(repo, push)
            old = self._tokens.get(key)
            if old is not None and not sent:
                return True   # (another thread has just fetched it)
            token = auth.fetch_token(self, ch, repo, push, deadline, what)
            if token is None or (sent and token == old):
                return False
            self._tokens[key] = token
            return True

    # -- small reads ----------------------------------------------------------------------------------
    def ping(self, deadline: float | None = None) -> None:
        """``GET /v2/``: the registry answers as one (BadInput-free: every refusal is one line)."""
        try:
            self.request("GET", "/v2/", what="the registry API (/v2/)", deadline=deadline, limit=64 << 10)
        except CheckpointNotFound:
            raise RegistrySetupError(f"{self.url}: {self.location.host} does not answer /v2/ as an OCI registry "
                                     f"(check [tiers.cold] url)") from None
        self.stats.count("ping")

    def get_json(self, path: str, what: str, limit: int, *, accept: str | None = None,
                 deadline: float | None = None) -> tuple[Any, Reply]:
        r = self.request("GET", path, what=what, headers={"Accept": accept} if accept else None,
                         deadline=deadline, limit=limit)
        self.stats.count("get", len(r.body))
        try:
            return json.loads(r.body), r
        except ValueError:
            raise RegistryError(f"{self.url}: {what}: not JSON") from None


class Transient(Exception):
    """A failure worth asking again (connection refused or reset, 429, 5xx); ``final`` is what it
    becomes when the retries are spent."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail

    def final(self, c: RegistryClient, what: str) -> TieringError:
        if self.kind == "unreachable":
            err: RegistryError = RegistrySetupError(f"{c.url}: cannot reach the registry {c.location.host} "
                                                    f"({self.detail}): is it running? check [tiers.cold] url")
        elif self.kind == "throttled":
            err = RegistryError(f"{c.url}: {what}: the registry kept throttling (429) after {RETRIES} retries: "
                                f"lower [tiers.cold] concurrency")
        elif self.kind == "short_read":
            err = ShortRead(f"{c.url}: {what}: {self.detail}")
        else:
            err = RegistryError(f"{c.url}: {what}: {self.detail}")
        err.kind = self.kind
        return err


def path_repo(path: str) -> str | None:
    """The repository a /v2/REPO/{manifests,blobs,tags}/... path is about (the bearer scope), or None."""
    m = re.fullmatch(r"/v2/(.+?)/(?:manifests|blobs|tags)/.*", path)
    return m.group(1) if m else None


def error_codes(data: bytes) -> list[str]:
    """The distribution error codes of an error body (``{"errors": [{"code": ...}]}``)."""
    try:
        doc = json.loads(data)
        return [str(e.get("code")) for e in doc.get("errors", []) if isinstance(e, dict) and e.get("code")][:3]
    except (ValueError, AttributeError):
        return []

