"""A worker's (and ``weightd fleet status``'s) calls to the origins' fleet endpoints: JSON over the
tracker's HTTP(S) listener, with the node's fleet certificate when ``[p2p.tls]`` is on (the tracker
requires one from the fleet CA). Synchronous and bounded in time; the daemon runs it in a pool. Every
body carries this weightd's message version and its own (:func:`weightd.compat.stamped`)."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..compat import stamped
from ..errors import OriginUnavailable

if TYPE_CHECKING:
    from ..config import Config

MAX_ANSWER = 8 << 20


def origin_urls(cfg: "Config") -> list[str]:
    """The origins this node reports to and asks rollout slots of: ``[intent] origin`` (one or several),
    else one per host of the ``[p2p] trackers`` URLs (scheme and host, in their order): every origin
    serves its fleet endpoints on its tracker's listener."""
    given = cfg.settings.intent.origin
    if given:
        return [given] if isinstance(given, str) else list(given)
    out: dict[str, None] = {}
    for t in cfg.settings.p2p.trackers:
        u = urllib.parse.urlsplit(t)
        if u.scheme in ("http", "https") and u.netloc:
            out[f"{u.scheme}://{u.netloc}"] = None
    return list(out)


class OriginClient:
    def __init__(self, base: str, cfg: "Config", *, timeout_s: float = 5.0) -> None:
        self.base, self.timeout_s = base.rstrip("/"), timeout_s
        # from the node's own address, the one the tracker and its peers know it by (as the member list
        # fetches do): a multi-homed node reports as itself
        host = cfg.settings.p2p.listen.rpartition(":")[0].strip("[]")
        self.source = (host, 0) if host not in ("0.0.0.0", "::", "") else None
        self._ctx: ssl.SSLContext | None = None
        tls = cfg.settings.p2p.tls
        if base.startswith("https://"):
            ctx = ssl.create_default_context(cadata=tls.fleet.ca_pem.decode()) if tls is not None \
                else ssl.create_default_context()
            if tls is not None:
                ctx.check_hostname = False   # (fleet certificates name IPs or nodes; the fleet CA is checked)
                ctx.load_cert_chain(tls.cert, tls.key)
            self._ctx = ctx

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        u = urllib.parse.urlsplit(self.base + path)
        try:
            if u.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    u.hostname or "", u.port, timeout=self.timeout_s, context=self._ctx, source_address=self.source)
            else:
                conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=self.timeout_s,
                                                  source_address=self.source)
            try:
                data = None if body is None else json.dumps(stamped(body)).encode()
                conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data,
                             headers={"Content-Type": "application/json"} if data else {})
                r = conn.getresponse()
                status, raw = r.status, r.read(MAX_ANSWER + 1)
            finally:
                conn.close()
        except (OSError, http.client.HTTPException) as exc:
            raise OriginUnavailable(f"origin {self.base}: {getattr(exc, 'strerror', None) or exc}") from None
        if len(raw) > MAX_ANSWER:
            raise OriginUnavailable(f"origin {self.base}{path}: answer larger than {MAX_ANSWER} bytes")
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            raise OriginUnavailable(f"origin {self.base}{path}: HTTP {status}, not weightd's JSON (is "
                                    "[intent] origin the origin's tracker_listen address?)") from None
        if not isinstance(doc, dict):
            raise OriginUnavailable(f"origin {self.base}{path}: HTTP {status}, not a JSON object")
        if status != 200:
            raise OriginUnavailable(f"origin {self.base}{path}: HTTP {status}: {str(doc.get('error', ''))[:200]}")
        return doc


class Origins:
    """Every origin this node reports to (:func:`origin_urls`), asked at once: the fleet has no leader,
    each origin holds what its workers told it."""

    def __init__(self, urls: list[str], cfg: "Config", **kw: Any) -> None:
        self.urls = list(urls)
        self.clients = [OriginClient(u, cfg, **kw) for u in self.urls]

    def only(self, urls: list[str]) -> "Origins":
        """These origins, those of ``urls`` only."""
        o = Origins([], None)   # type: ignore[arg-type]
        kept = [(u, c) for u, c in zip(self.urls, self.clients) if u in urls]
        o.urls, o.clients = [u for u, _c in kept], [c for _u, c in kept]
        return o

    def each(self, method: str, path: str, body: Any = None) -> list[tuple[str, "dict[str, Any] | OriginUnavailable"]]:
        """(url, its answer or the OriginUnavailable it raised) of every origin, in their order; each
        bounded by its client's timeout, all asked together (a thread each)."""
        def one(c: OriginClient) -> "dict[str, Any] | OriginUnavailable":
            try:
                return c.call(method, path, body)
            except OriginUnavailable as exc:
                return exc
        if len(self.clients) == 1:
            return [(self.urls[0], one(self.clients[0]))]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix="weightd-origins") as pool:
            return list(zip(self.urls, pool.map(one, self.clients)))
