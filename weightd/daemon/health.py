"""How the daemon is doing, for whoever asks: on the admin socket ``/v1/health`` (who answers, what it
can do) and ``/v1/pressure`` (the node counters' history ``weightd doctor`` reads); on the metrics
port the probes a kubelet uses (``/healthz``, ``/readyz``) and the Prometheus exposition (``/metrics``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from .context import DaemonContext

FEATURES = ["stream", "hold"]  # what clients may ask of this daemon (health says so)


class Health:
    def __init__(self, daemon: "DaemonContext") -> None:
        self.d = daemon
        self._metrics_job: "asyncio.Future[bytes] | None" = None   # (the exposition being generated)

    def app(self) -> web.Application:
        """The metrics port's application: ``/metrics``, ``/healthz``, ``/readyz``."""
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def health(self, request: web.Request) -> web.Response:
        d = self.d
        return web.json_response({"ok": True, "pid": os.getpid(), "role": d.role, "status": d.status_text,
                                  "config": d.config.source, "features": FEATURES})

    async def pressure(self, request: web.Request) -> web.Response:
        """The first and last counter texts within ``?window=`` seconds (60 by default)."""
        try:
            window = float(request.query.get("window", "60"))
        except ValueError:
            raise web.HTTPBadRequest(text="window: expected seconds") from None
        pressure = self.d.pressure
        if len(pressure) < 2:
            return web.json_response({"error": "no history yet"}, status=404)
        t1, texts1 = pressure[-1]
        t0, texts0 = next(((t, x) for t, x in pressure if t1 - t <= window), pressure[-2])
        if t0 == t1:
            t0, texts0 = pressure[-2]
        return web.json_response({"window_s": round(t1 - t0, 3), "t0": texts0, "t1": texts1,
                                  "age_s": round(time.monotonic() - t1, 3)})

    async def healthz(self, request: web.Request) -> web.Response:
        """Liveness, on the metrics port (kubelet probes cannot reach a unix socket): the event loop
        answers (this handler ran) and the P2P alert pump is alive. 503 with the reason otherwise."""
        session = self.d.session
        if session is not None and not session.alerts.is_alive():
            return web.json_response({"ok": False, "reason": "the P2P alert pump stopped"}, status=503)
        return web.json_response({"ok": True, "pid": os.getpid(), "role": self.d.role})

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: serving the admin socket (READY=1 was sent), not stopping, and the configured
        storage there (the last storage check found no problem)."""
        if self.d.stopping.is_set():
            return web.json_response({"ok": False, "reason": "stopping"}, status=503)
        if not self.d.ready:
            return web.json_response({"ok": False, "reason": "starting"}, status=503)
        if self.d.storage_problems:   # (cold storage unmounted, a tier's device missing: see status)
            return web.json_response({"ok": False, "reason": self.d.storage_problems[0]["reason"],
                                      "problems": self.d.storage_problems}, status=503)
        return await self.healthz(request)

    async def metrics(self, request: web.Request) -> web.Response:
        """The exposition, one generation at a time: a scrape arriving while one is generated shares it
        (/metrics is open over TCP: its callers never queue more than one job ahead of status in the
        "query" pool)."""
        job = self._metrics_job
        if job is None or job.done():
            job = self._metrics_job = asyncio.ensure_future(
                self.d.run_blocking("query", generate_latest, self.d.registry))   # (never behind cold work)
        body = await asyncio.shield(job)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
