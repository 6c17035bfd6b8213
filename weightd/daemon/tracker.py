"""The origin's tracker listener (``[p2p] tracker_listen``): the announce and swarm-members endpoints
of ``p2p.Tracker``, which tracks only the versions this origin seeds, and the fleet endpoints of
:mod:`.origin` beside them. With fleet TLS it speaks HTTPS with this node's certificate and requires
a client certificate from the fleet CA.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import WeightdError
from ..node.swarm import seed_held
from .origin import fleet_routes

if TYPE_CHECKING:
    from .context import DaemonContext
    from .servers import Servers

log = logging.getLogger(__name__)
RESEED_S = 10.0  # the tracker looks for newly published versions at most this often


class TrackerEndpoint:
    def __init__(self, d: "DaemonContext") -> None:
        self.d = d
        self.tracker: Any = None   # p2p.Tracker, once started
        self.ssl: Any = None       # ssl.SSLContext of the HTTPS endpoint (with p2p.tls)
        self._reseed_at = -RESEED_S
        self._reseed_task: asyncio.Task[None] | None = None

    async def start(self, servers: "Servers") -> None:
        """Listen, on an origin with ``tracker_listen``. A version published by another node is refused
        until the origin picks it up: a refusal triggers that pick-up at once (at most every RESEED_S)."""
        d = self.d
        tl = d.config.settings.p2p.tracker_listen
        if not tl or d.role != "origin":
            return
        from p2p import Tracker
        tracker = Tracker(d.config.settings.p2p.allow, known=d.session.seeds_announced)
        tapp = web.Application(client_max_size=1 << 20)
        tapp.router.add_get("/announce", self._announce)
        tapp.router.add_get("/swarm", self._members)
        fleet_routes(d, tapp, tracker)
        self.tracker = tracker
        await servers.start_tcp(tapp, tl, "p2p.tracker_listen", "tracker", ssl_context=self._tls())
        d.metrics.tracker_peers.set_function(tracker.peers)
        log.info("tracker announce endpoint on %s://%s/announce", "https" if self.ssl else "http", tl)

    async def _pick_up(self) -> None:
        try:
            await self.d.run_blocking("misc", seed_held, self.d.node, self.d.session, self.d.role)
        except Exception as exc:  # noqa: BLE001 (the next announce or gc round tries again)
            log.warning("tracker: cannot pick up newly published versions: %s", exc)

    async def _announce(self, request: web.Request) -> web.Response:
        body, refused = self.tracker.announce(request.remote or "", request.rel_url.raw_query_string)
        if refused is not None:
            self.d.metrics.trust_refusals.labels(refused).inc()
            now = time.monotonic()
            if refused == "tracker_unknown_torrent" and now - self._reseed_at > RESEED_S:
                self._reseed_at = now
                self._reseed_task = asyncio.get_running_loop().create_task(self._pick_up())
        return web.Response(body=body, content_type="text/plain")

    async def _members(self, request: web.Request) -> web.Response:
        body, refused = self.tracker.members(request.remote or "", request.rel_url.raw_query_string)
        if refused is not None:
            self.d.metrics.trust_refusals.labels(refused).inc()
        status = 200 if refused is None else 404 if refused == "tracker_unknown_torrent" else \
            403 if refused == "tracker_not_allowed" else 400
        return web.Response(body=body, status=status, content_type="application/json")

    def _tls(self) -> Any:
        """With fleet TLS the tracker speaks HTTPS with this node's certificate and requires a client
        certificate from the fleet CA: libtorrent checks the server's against the torrent's CA and the
        URL's host (IP or DNS subjectAltName), and presents the torrent's certificate (the node's) as
        its client certificate to the https tracker of an SSL torrent (measured with 2.1.1)."""
        tls = self.d.config.settings.p2p.tls
        if tls is None:
            return None
        import ssl
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=tls.fleet.ca_pem.decode())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(tls.cert, tls.key)
        except (OSError, ValueError) as exc:
            raise WeightdError(f"p2p.tls: {tls.cert}: {exc}") from None
        self.ssl = ctx
        return ctx

    def rotate_certificate(self, tls: Any) -> None:
        """After a reload: new handshakes present the certificate the new config names (load_config
        checked these files a moment ago)."""
        if self.ssl is None:
            return
        try:
            self.ssl.load_cert_chain(tls.cert, tls.key)
        except (OSError, ValueError) as exc:  # (ssl.SSLError is an OSError)
            log.error("tracker: keeping the previous certificate: %s: %s", tls.cert, exc)
