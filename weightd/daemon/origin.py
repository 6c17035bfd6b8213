"""The origin's fleet endpoints, on the tracker's listener (the same allowlist, and with fleet TLS the
same client certificates): workers report what they hold (``POST /v1/fleet/report``), anyone allowed
reads the aggregate (``GET /v1/fleet``, ``weightd fleet status``), and rollout movers take and give
back slots (``POST /v1/rollout/slot``, ``/v1/rollout/release``) under ``[intent] max_movers``.

Workers may run the release before or after the origin's (a rollout of weightd itself): every body is
read as :mod:`weightd.compat` says, keys this version does not know ignored, the ones it knows checked."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..compat import check_envelope
from ..fleet import FleetView
from ..rollout import MoverSlots

if TYPE_CHECKING:
    from .app import Daemon

log = logging.getLogger(__name__)
MAX_REPORT_BYTES = 1 << 20
BODY_TIMEOUT_S = 10.0


def fleet_routes(d: "Daemon", app: web.Application, tracker: Any) -> None:
    d.fleet = FleetView(ttl_s=max(300.0, 4 * d.config.settings.intent.report_s))
    d.movers = MoverSlots(d.config.settings.intent.max_movers)

    def refuse(request: web.Request) -> web.Response | None:
        if not tracker.allowed(request.remote or ""):
            d.metrics.trust_refusals.labels("fleet_not_allowed").inc()
            return web.json_response({"error": "not allowed"}, status=403)
        return None

    async def body(request: web.Request) -> Any:
        if request.content_length is not None and request.content_length > MAX_REPORT_BYTES:
            raise ValueError(f"body larger than {MAX_REPORT_BYTES} bytes")
        try:   # (the whole body, however many segments it came in; client_max_size bounds it)
            raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ValueError(f"body not received within {BODY_TIMEOUT_S:g} s") from None
        except web.HTTPRequestEntityTooLarge:
            raise ValueError(f"body larger than {MAX_REPORT_BYTES} bytes") from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise ValueError("body is not JSON") from None

    async def report(request: web.Request) -> web.Response:
        if (r := refuse(request)) is not None:
            return r
        try:
            d.fleet.report(request.remote or "", await body(request))
        except ValueError as exc:
            d.metrics.trust_refusals.labels("fleet_bad_report").inc()
            return web.json_response({"error": str(exc)[:300]}, status=400)
        return web.json_response({"ok": True})

    async def view(request: web.Request) -> web.Response:
        if (r := refuse(request)) is not None:
            return r
        doc = d.fleet.view()
        doc["movers"] = d.movers.movers()
        doc["max_movers"] = d.movers.cap
        return web.json_response(doc)

    async def slot(request: web.Request) -> web.Response:
        if (r := refuse(request)) is not None:
            return r
        try:
            b = _request(await body(request))
            node, moving = _short(b, "node"), _short(b, "moving")
        except ValueError as exc:
            return web.json_response({"error": str(exc)[:300]}, status=400)
        # one slot per address: a peer cannot take the fleet's slots by inventing node names, nor
        # renew or release another address's
        key = request.remote or "?"
        got = d.movers.ask(key, f"{node}: {moving}")
        if got["granted"]:
            log.debug("rollout slot for %s (%s): %d of %d", key, moving, got["movers"], got["cap"])
        return web.json_response(got)

    async def release(request: web.Request) -> web.Response:
        if (r := refuse(request)) is not None:
            return r
        try:
            node = _short(_request(await body(request)), "node")
        except ValueError as exc:
            return web.json_response({"error": str(exc)[:300]}, status=400)
        d.movers.release(request.remote or "?")
        return web.json_response({"ok": True})

    app.router.add_post("/v1/fleet/report", report)
    app.router.add_get("/v1/fleet", view)
    app.router.add_post("/v1/rollout/slot", slot)
    app.router.add_post("/v1/rollout/release", release)


def _request(b: Any) -> dict[str, Any]:
    """A slot request or release: a JSON object whose version keys are well formed (other keys than
    the ones read are a newer worker's: ignored)."""
    if not isinstance(b, dict):
        raise ValueError("body: expected a JSON object")
    check_envelope(b)
    return b


def _short(b: dict[str, Any], key: str) -> str:
    v = b.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= 300 or not v.isprintable():
        raise ValueError(f"'{key}' must be a short printable string")
    return v
