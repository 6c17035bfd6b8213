"""The origin's fleet endpoints, on the tracker's listener (the same allowlist, and with fleet TLS the
same client certificates): workers report what they hold (``POST /v1/fleet/report``), anyone allowed
reads the aggregate (``GET /v1/fleet``, ``weightd fleet status``), and rollout movers take and give
back slots (``POST /v1/rollout/slot``, ``/v1/rollout/release``) under ``[intent] max_movers``. Several
origins run side by side, each a full origin on its own (docs/origins.md): workers report to all of
them, and a rollout slot counts only when a majority of them grant it (:mod:`weightd.fleet.rollout`).

Bounded: reports held fit ``[intent] fleet_budget`` (:class:`~weightd.fleet.view.FleetView`), one address
sends at most ``[intent] fleet_reports_per_s`` reports a second (429 past that, before its body is
read), and the view is built in a thread, a page at a time (``?limit=``, ``?after=``, ``?model=``), so
the loop (and ``/healthz`` beside it) never waits on it. Rollout slots go only to fleet members: an
address that has a valid report held (with fleet TLS, one that reported with a fleet certificate).

Workers may run the release before or after the origin's (a rollout of weightd itself): every body is
read as :mod:`weightd.compat` says, keys this version does not know ignored, the ones it knows checked."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..compat import check_envelope
from ..errors import ReportRefused
from ..fleet.ratelimit import RateLimit
from ..fleet.rollout import MoverSlots, origins_refusal
from ..fleet.view import MAX_PAGE_NODES, FleetView, build_view, encode

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
MAX_REPORT_BYTES = 1 << 20
BODY_TIMEOUT_S = 10.0


def fleet_routes(d: "DaemonContext", app: web.Application, tracker: Any) -> None:
    """The fleet endpoints on the tracker's application (``tracker.allowed``: its allow list); the
    origin's fleet view and mover slots become ``d.fleet`` and ``d.movers``."""
    ends = FleetEndpoints(d, tracker)
    app.router.add_post("/v1/fleet/report", ends.report)
    app.router.add_get("/v1/fleet", ends.view)
    app.router.add_post("/v1/rollout/slot", ends.slot)
    app.router.add_post("/v1/rollout/release", ends.release)


class FleetEndpoints:
    def __init__(self, d: "DaemonContext", tracker: Any) -> None:
        intent = d.config.settings.intent
        self.d, self.tracker = d, tracker
        d.fleet = FleetView(ttl_s=max(300.0, 4 * intent.report_s), budget_bytes=intent.fleet_budget)
        d.movers = MoverSlots(intent.max_movers, path=d.config.settings.state_dir / "rollout-slots.json")
        self.odd_lists: set[tuple[str, str | None]] = set()   # (address, its list) refused a slot, said once
        self.rate = RateLimit(intent.fleet_reports_per_s, max(16.0, 4 * intent.fleet_reports_per_s))

    def _refuse(self, request: web.Request) -> web.Response | None:
        """403 for an address outside the tracker's allow list (None: allowed)."""
        if not self.tracker.allowed(request.remote or ""):
            self.d.metrics.trust_refusals.labels("fleet_not_allowed").inc()
            return web.json_response({"error": "not allowed"}, status=403)
        return None

    async def report(self, request: web.Request) -> web.Response:
        """POST /v1/fleet/report: a worker's holdings, within the budget and the per-address rate."""
        d, rate = self.d, self.rate
        if (r := self._refuse(request)) is not None:
            return r
        now = d.config.settings.intent   # (a reload's budget and rate apply from the next report)
        d.fleet.budget = now.fleet_budget
        rate.rate, rate.burst = now.fleet_reports_per_s, max(16.0, 4 * now.fleet_reports_per_s)
        if not rate.allow(request.remote or "?"):   # (before the body is read: refusing costs nothing)
            d.metrics.trust_refusals.labels("fleet_report_rate").inc()
            return web.json_response({"error": f"more than {rate.rate:g} report(s) a second from "
                                      f"{request.remote} ([intent] fleet_reports_per_s)"}, status=429,
                                     headers={"Retry-After": "1"})
        evicted = d.fleet.evicted
        try:
            d.fleet.report(request.remote or "", await _body(request))
        except ReportRefused as exc:
            d.metrics.trust_refusals.labels("fleet_bad_report" if exc.status == 400 else "fleet_budget").inc()
            return web.json_response({"error": str(exc)[:300]}, status=exc.status)
        except ValueError as exc:
            d.metrics.trust_refusals.labels("fleet_bad_report").inc()
            return web.json_response({"error": str(exc)[:300]}, status=400)
        if d.fleet.evicted != evicted:
            log.info("fleet view: %d larger report(s) evicted to hold the one from %s held_bytes=%d budget=%d",
                     d.fleet.evicted - evicted, request.remote, d.fleet.held_bytes, d.fleet.budget)
        return web.json_response({"ok": True})

    async def view(self, request: web.Request) -> web.Response:
        """GET /v1/fleet: a page of the fleet view (``?limit=``, ``?after=``, ``?model=``), built in a thread."""
        d = self.d
        if (r := self._refuse(request)) is not None:
            return r
        q = request.query
        try:
            limit = int(q["limit"]) if "limit" in q else None
            if limit is not None and not 1 <= limit <= MAX_PAGE_NODES:
                raise ValueError
        except ValueError:
            return web.json_response({"error": f"limit: expected a number of nodes from 1 to {MAX_PAGE_NODES}"},
                                     status=400)
        model, after = q.get("model"), q.get("after")
        if model is not None and not 0 < len(model) <= 511 or after is not None and not 0 < len(after) <= 400:
            return web.json_response({"error": "model and after: expected a model name and a NODE@IP"}, status=400)
        records, now = d.fleet.snapshot()   # (on the loop, in one step; built and encoded in a thread)
        movers, cap = d.movers.movers(), d.movers.cap

        def build() -> bytes:
            doc = build_view(records, now, model=model, after=after, limit=limit)
            doc["movers"], doc["max_movers"] = movers, cap
            return encode(doc)
        return web.Response(body=await d.run_blocking("misc", build), content_type="application/json")

    async def slot(self, request: web.Request) -> web.Response:
        """POST /v1/rollout/slot: a mover slot for a member of the fleet, one per address."""
        d = self.d
        if (r := self._refuse(request)) is not None:
            return r
        try:
            b = _request(await _body(request))
            node, moving, number = _short(b, "node"), _short(b, "moving"), _number(b)
        except ValueError as exc:
            return web.json_response({"error": str(exc)[:300]}, status=400)
        # one slot per address: a peer cannot take the fleet's slots by inventing node names, nor
        # renew or release another address's; and only a member of the fleet (an address with a valid
        # report held) gets or keeps one: an address that stopped reporting loses its slot at renewal
        key = request.remote or "?"
        # (a holder of a slot read back at a restart renews it before its first report comes in)
        if not d.fleet.member(key) and not d.movers.restored_holder(key):
            d.movers.release(key)
            d.metrics.trust_refusals.labels("rollout_not_member").inc()
            return web.json_response({"error": f"{key} is not a member of this fleet: no report from it is "
                                      "held (a worker reports every [intent] report_s; ask again after its "
                                      "report)"}, status=403)
        # a worker listing other origins than most reporting nodes counts its majority over another list:
        # the cap would not hold (docs/origins.md)
        asked = b.get("origins") if isinstance(b.get("origins"), str) else None
        if (why := origins_refusal(asked, d.fleet.origin_lists())) is not None:
            if (key, asked) not in self.odd_lists:
                if len(self.odd_lists) >= 4096:
                    self.odd_lists.clear()
                self.odd_lists.add((key, asked))
                log.warning("rollout slot refused to %s (%s): %s", key, node, why)
            return web.json_response({"error": why}, status=409)
        got = d.movers.ask(key, f"{node}: {moving}", number)
        if got["granted"]:
            log.debug("rollout slot for %s (%s): %d of %d", key, moving, got["movers"], got["cap"])
        return web.json_response(got)

    async def release(self, request: web.Request) -> web.Response:
        """POST /v1/rollout/release: this address's slot given back."""
        if (r := self._refuse(request)) is not None:
            return r
        try:
            _short(_request(await _body(request)), "node")
        except ValueError as exc:
            return web.json_response({"error": str(exc)[:300]}, status=400)
        self.d.movers.release(request.remote or "?")
        return web.json_response({"ok": True})


async def _body(request: web.Request) -> Any:
    """The request's JSON, at most MAX_REPORT_BYTES, received within BODY_TIMEOUT_S (else ValueError)."""
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


def _request(b: Any) -> dict[str, Any]:
    """A slot request or release: a JSON object whose version keys are well formed (other keys than
    the ones read are a newer worker's: ignored)."""
    if not isinstance(b, dict):
        raise ValueError("body: expected a JSON object")
    check_envelope(b)
    return b


def _number(b: dict[str, Any]) -> int | None:
    """The slot number a worker asks for (absent: any; an older worker's request)."""
    v = b.get("slot")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 20):
        raise ValueError("'slot' must be a slot number (a whole number from 0)")
    return v


def _short(b: dict[str, Any], key: str) -> str:
    v = b.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= 300 or not v.isprintable():
        raise ValueError(f"'{key}' must be a short printable string")
    return v
