"""A worker's (and ``weightd fleet status``'s) calls to the origins' fleet endpoints: JSON over the
tracker's HTTP(S) listener, with the node's fleet certificate when ``[p2p.tls]`` is on (the tracker
requires one from the fleet CA). Synchronous and bounded in time: each request as a whole (connect,
headers, body) within its deadline, whatever pace the origin answers at (a per-read timeout alone never
fires on a server sending a byte a second); the daemon runs it in a pool. Every body carries this
weightd's message version and its own (:func:`weightd.compat.stamped`)."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from ..compat import stamped
from tiering import Cutoff

from ..errors import OriginUnavailable

if TYPE_CHECKING:
    from ..config import Config

MAX_ANSWER = 8 << 20
VIEW_BYTES = 64 << 20   # the most of an origin's fleet view (its pages together) fleet status takes
VIEW_DEADLINE_S = 120.0   # ... and the longest it waits for all of it


def origins_hash(urls: list[str]) -> str:
    """16 hex digits naming a list of origins whatever its order: sent with every report and slot
    request, so an origin can refuse a slot to a worker that counts its majority over another list
    (docs/origins.md) and ``fleet status`` can say the nodes disagree."""
    import hashlib
    return hashlib.sha256("\n".join(sorted(u.rstrip("/") for u in urls)).encode()).hexdigest()[:16]


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
        self.received = 0   # bytes of answers, all calls
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

    def call(self, method: str, path: str, body: Any = None, *, deadline: float | None = None) -> dict[str, Any]:
        """The origin's JSON answer to ``method path``, whole within ``timeout_s`` (or by ``deadline``,
        a time.monotonic(), if sooner); else OriginUnavailable."""
        u = urllib.parse.urlsplit(self.base + path)
        end = time.monotonic() + self.timeout_s
        end = end if deadline is None else min(end, deadline)
        allowed = max(0.0, end - time.monotonic())
        cut: Cutoff | None = None
        try:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("no time left")
            if u.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    u.hostname or "", u.port, timeout=left, context=self._ctx, source_address=self.source)
            else:
                conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=left,
                                                  source_address=self.source)
            cut = Cutoff(conn, end)
            try:
                data = None if body is None else json.dumps(stamped(body)).encode()
                conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data,
                             headers={"Content-Type": "application/json"} if data else {})
                r = conn.getresponse()
                status, parts, size = r.status, [], 0
                while size <= MAX_ANSWER:
                    chunk = r.read(min(1 << 20, MAX_ANSWER + 1 - size))
                    if not chunk:
                        break
                    parts.append(chunk)
                    size += len(chunk)
                raw = b"".join(parts)
                self.received += size
            finally:
                cut.stop()
                conn.close()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if cut is not None and cut.fired or isinstance(exc, TimeoutError):
                raise self._late(path, allowed) from None
            raise OriginUnavailable(f"origin {self.base}: {getattr(exc, 'strerror', None) or exc}") from None
        if cut.fired:   # (an answer cut short by the deadline may even parse)
            raise self._late(path, allowed)
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


    def _late(self, path: str, allowed: float) -> OriginUnavailable:
        return OriginUnavailable(f"origin {self.base}{path}: no whole answer within {allowed:.0f} s")


def fleet_view(client: OriginClient, model: str | None = None, *, max_bytes: int = VIEW_BYTES,
               deadline_s: float = VIEW_DEADLINE_S) -> dict[str, Any]:
    """GET /v1/fleet (of ``model``) a page at a time, as one document: the first page's versions and
    movers, every page's nodes; checked (:func:`weightd.fleet.view.view_problem`). OriginUnavailable
    when the origin's answer is not a fleet view, its ``next`` does not move past the last cursor (a
    node name and address after it), its pages pass ``max_bytes`` together, or all of them take
    longer than ``deadline_s``."""
    from .view import view_problem
    narrow = {} if model is None else {"model": model}
    end = time.monotonic() + deadline_s
    where = f"origin {client.base}/v1/fleet"
    doc = client.call("GET", "/v1/fleet" + (f"?{urllib.parse.urlencode(narrow)}" if narrow else ""), deadline=end)
    nodes, page, cursor = doc.get("nodes"), doc, None
    while isinstance(page.get("next"), str) and page["next"]:
        after = page["next"]
        node, _, ip = after.partition("@")
        if cursor is not None and (node, ip) <= cursor:
            raise OriginUnavailable(f"{where}: the next page ({after[:80]!r}) does not move past the last one")
        cursor = (node, ip)
        if client.received > max_bytes:
            raise OriginUnavailable(f"{where}: a view of more than {max_bytes >> 20} MiB")
        page = client.call("GET", "/v1/fleet?" + urllib.parse.urlencode({**narrow, "after": after}), deadline=end)
        more = page.get("nodes")
        if not isinstance(nodes, list) or not isinstance(more, list):
            break   # (said below)
        nodes.extend(more)
    if client.received > max_bytes:
        raise OriginUnavailable(f"{where}: a view of more than {max_bytes >> 20} MiB")
    doc.pop("next", None)
    problem = view_problem(doc) or (None if isinstance(page.get("nodes"), list) else "a page's 'nodes' is not a list")
    if problem:
        raise OriginUnavailable(f"{where}: not a fleet view ({problem})")
    return doc


class Origins:
    """Every origin this node reports to (:func:`origin_urls`), asked at once: the fleet has no leader,
    each origin holds what its workers told it."""

    def __init__(self, urls: list[str], cfg: "Config", **kw: Any) -> None:
        self.urls = list(urls)
        self.hash = origins_hash(self.urls)
        self.clients = [OriginClient(u, cfg, **kw) for u in self.urls]

    def only(self, urls: list[str]) -> "Origins":
        """These origins, those of ``urls`` only."""
        o = Origins([], None)   # type: ignore[arg-type]
        kept = [(u, c) for u, c in zip(self.urls, self.clients) if u in urls]
        o.urls, o.clients = [u for u, _c in kept], [c for _u, c in kept]
        o.hash = self.hash   # (the list the worker counts its majority over)
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
