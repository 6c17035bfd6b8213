"""A worker's (and ``weightd fleet status``'s) calls to the origin's fleet endpoints: JSON over the
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


def origin_url(cfg: "Config") -> str | None:
    """``[intent] origin``, else the scheme and host of the first ``[p2p] trackers`` URL."""
    if cfg.settings.intent.origin:
        return cfg.settings.intent.origin
    for t in cfg.settings.p2p.trackers:
        u = urllib.parse.urlsplit(t)
        if u.scheme in ("http", "https") and u.netloc:
            return f"{u.scheme}://{u.netloc}"
    return None


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
