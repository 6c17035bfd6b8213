"""The admin API's routes: JSON over HTTP on the unix socket (mode 0660, no TCP), one route per
operation of the node's :class:`~weightd.node.service.NodeService`, plus health and pressure history.

Around the service, only what a daemon has: the caller's credentials (mutating routes,
:mod:`.authz`), single flight (:mod:`.flights`), bounded reads of cold storage (:mod:`.cold`), the
thread pools, and bounded requests (:mod:`.jsonapi`). A body may come from a CLI one release older or
newer (:mod:`weightd.compat`): its ``"v"`` and ``"weightd"`` are checked, keys no route reads are
ignored, the ones a route reads are checked as always. Each operation is logged once, with who asked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web

from tiering import HOT, LOCAL_TIERS, CheckpointNotFound, TimedOut

from ..errors import ApiError
from ..node.requests import check_companion, split_ref
from .authz import Caller, authorize, caller_may_read, check_caller_can_read, check_caller_may_sign
from .cold import COLD_CHECK_S, COLD_LIST_S, PATH_COLD_S, ColdReads
from .flights import Flights
from .health import Health
from .jsonapi import ANSWERED, answer_errors, opt_str_field, read_body, str_field
from .leases import LeaseGuard, Who, who
from .stream import stream_preload

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
API_VERSION = "v1"
SET_AT_ONCE = 8                # a set's models in flight at once (the tier's threads run 2 of them)


class Api:
    """The admin socket's application: the route table and the handlers of the node's operations."""

    def __init__(self, daemon: "DaemonContext", flights: Flights, cold: ColdReads, leases: LeaseGuard,
                 health: Health) -> None:
        self.d, self.flights, self.cold, self.leases, self.health = daemon, flights, cold, leases, health

    def _who(self, request: web.Request) -> Who | None:
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        return who(sock, self.d.config.settings.api.admin_group)

    def app(self) -> web.Application:
        d, cold = self.d, self.cold.run
        counted = lambda route, status: d.metrics.requests.labels(route, status).inc()   # noqa: E731
        app = web.Application(middlewares=[answer_errors(counted)], client_max_size=1 << 20)
        r = app.router
        v = f"/{API_VERSION}"
        r.add_get(f"{v}/health", self.health.health)
        r.add_get(f"{v}/pressure", self.health.pressure)
        r.add_get(f"{v}/status", self._h(self._status))
        r.add_post(f"{v}/preload", self._preload_route)
        r.add_post(f"{v}/preload-set", self._preload_set_route)
        r.add_post(f"{v}/publish", self._h(self._publish, admin="publish"))
        # (admin: it reads every published manifest and opens every file, as the daemon's user)
        r.add_get(f"{v}/check-cold", self._h(lambda b, c: cold(d.service.check_cold, COLD_CHECK_S,
                                                               "the check of cold storage"), admin="check-cold"))
        r.add_post(f"{v}/versions", self._h(lambda b: cold(
            lambda: d.service.versions(opt_str_field(b, "name")), COLD_LIST_S, "listing cold storage")))
        r.add_post(f"{v}/hold", self._hold_route)
        r.add_post(f"{v}/path", self._h(self._path))
        r.add_post(f"{v}/pin", self._h(lambda b, c: self._pin(b, True), admin="pin"))
        r.add_post(f"{v}/unpin", self._h(lambda b, c: self._pin(b, False), admin="unpin"))
        r.add_post(f"{v}/evict", self._h(self._evict, admin="evict"))
        r.add_post(f"{v}/gc", self._h(lambda b, c: d.run_blocking("misc", d.service.gc), admin="gc"))
        r.add_get(f"{v}/intent", self._h(self._intent))
        r.add_get(f"{v}/intent/explain", self._h(self._intent_explain))
        return app

    # -- preload: through the single flight ---------------------------------------------------------
    async def _preload_route(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/preload: the report as one JSON document, or with ``"stream": true`` an NDJSON
        stream of progress lines and the report (:mod:`.stream`)."""
        body = await self._read_body(request) if request.can_read_body else {}
        _log_request(request, body)
        holder, caller = _holder(request), self._who(request)
        if body.get("stream") is not True:
            return web.json_response(await self.flights.preload(body, holder=holder, caller=caller))
        return await stream_preload(request, body, lambda joined: self.flights.preload(
            body, holder=holder, joined=joined, caller=caller), network=lambda: self.d.network.view)

    async def _preload_set_route(self, request: web.Request) -> web.Response:
        """POST /v1/preload-set ``{"refs": [...], tier, lease_s, timeout_s, strict, selection, whole}``:
        each model through the single flight, all at once (the tier's threads bound them), one summary."""
        from ..node.sets import check_refs, summarize
        body = await self._read_body(request) if request.can_read_body else {}
        _log_request(request, {k: v for k, v in body.items() if k != "refs"})
        holder, caller = _holder(request), self._who(request)
        refs = check_refs(body.get("refs"))
        common = {k: v for k, v in body.items() if k in ("tier", "strict", "lease_s", "timeout_s", "selection", "whole")}
        svc = self.d.service
        if "lease_s" in common:   # (a lease longer than the caller may take: refused before anything moves)
            self.leases.lease_s(caller, common["lease_s"])
        for r in refs:  # every one checked before anything moves (InvalidRequest: 400, exit 2)
            svc.preload_request(r, **common, holder=holder)
        t0 = time.monotonic()
        gate = asyncio.Semaphore(SET_AT_ONCE)   # (a set of thousands never queues ahead of everyone else)

        async def one(r: str) -> dict[str, Any]:
            async with gate:
                return await self.flights.preload({**common, "ref": r}, holder=holder, caller=caller)
        outcomes = await asyncio.gather(*(one(r) for r in refs), return_exceptions=True)
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, ANSWERED):
                raise o
        summary = summarize(refs, list(outcomes), time.monotonic() - t0, common.get("tier", HOT))
        log.info("preloaded a set models=%d ready=%d failed=%d bytes=%d seconds=%.3f caller=%s", summary["models"],
                 summary["ready"], len(summary["failed"]), summary["bytes"], summary["seconds"], holder)
        return web.json_response(summary)

    async def _hold_route(self, request: web.Request) -> web.Response:
        """POST /v1/hold ``{"ref": "NAME@V", "tier", "lease_s"}``: renew the caller's lease on that copy
        (``weightd hold``; the holder is the caller, as for preload's lease); ``lease_s`` 0 releases it.
        Not logged per call: a holder renews every few seconds (the service logs what changes)."""
        body = await self._read_body(request) if request.can_read_body else {}
        svc = self.d.service
        caller = self._who(request)
        ref, tier = str_field(body, "ref"), body.get("tier", HOT)
        lease_s = self.leases.lease_s(caller, body.get("lease_s"))
        hold = lambda: self.d.run_blocking("misc", svc.hold, ref, tier, lease_s, _holder(request))  # noqa: E731
        if caller is not None and caller.admin or not isinstance(lease_s, (int, float)) or not lease_s > 0 \
                or tier not in LOCAL_TIERS:
            return web.json_response(await hold())
        name, version = split_ref(ref)
        if version is None:
            return web.json_response(await hold())   # (the service says to name the version)
        size = await self.d.run_blocking("misc", self.leases.copy_bytes, tier, name, version)
        async with self.leases.room(caller, tier, name, version, size):
            return web.json_response(await hold())

    # -- the other operations -----------------------------------------------------------------------
    async def _path(self, b: dict[str, Any]) -> dict[str, Any]:
        """NAME@VERSION is answered from the local tiers alone ("query": never behind cold work); NAME,
        or a part of it, asks cold storage which version: bounded by PATH_COLD_S."""
        svc = self.d.service
        ref, sel, whole, comp = str_field(b, "ref"), b.get("selection"), b.get("whole", False), b.get("companion")
        if not svc.path_needs_cold(ref, selection=sel, whole=whole, companion=comp):
            try:   # (a copy not here: "not on this node" from the query pool; the rest asks cold, bounded)
                return await self.d.run_blocking("query", lambda: svc.path(ref, selection=sel, whole=whole,
                                                                           companion=comp, suggest=False))
            except CheckpointNotFound as plain:
                try:
                    better = await self.cold.run(lambda: svc.not_found(ref), PATH_COLD_S,
                                              f"path {ref[:200]}: asking cold storage whether it is published")
                except TimedOut:
                    raise plain from None
                raise better from None
        return await self.cold.run(lambda: svc.path(ref, selection=sel, whole=whole, companion=comp),
                                PATH_COLD_S, f"path {ref[:200]}: asking cold storage for the version")

    async def _status(self, b: dict[str, Any]) -> dict[str, Any]:
        # ("query": local tiers and the last storage check only, never behind work that reads cold storage)
        st = await self.d.run_blocking("query", self.d.service.status, self.d.storage_problems)
        st["transfers"] = self.flights.transfer_rows()
        st["network"] = self.d.network.view   # ([network]: the link's share, weightd's limits; {} before a sample)
        st["answered_by"] = "daemon"
        return st

    async def _pin(self, b: dict[str, Any], pin: bool) -> dict[str, Any]:
        """An admin's pin or unpin is the admin's from now on: fleet intent forgets it made it."""
        svc = self.d.service
        ref = str_field(b, "ref")
        out = await self.cold.run(lambda: (svc.pin if pin else svc.unpin)(ref), COLD_LIST_S,
                               f"{'pin' if pin else 'unpin'} {ref[:200]}")
        self.d.intent.admin_pinned(out["name"], out["version"])
        return out

    async def _intent(self, b: dict[str, Any]) -> dict[str, Any]:
        return self.d.intent.status()

    async def _intent_explain(self, b: dict[str, Any]) -> dict[str, Any]:
        return await self.d.run_blocking("misc", self.d.intent.explain)

    async def _publish(self, b: dict[str, Any], caller: Caller) -> dict[str, Any]:
        name, version, src = str_field(b, "name"), str_field(b, "version"), str_field(b, "dir")
        if not os.path.isabs(src):
            raise ApiError(400, f"'dir' must be an absolute path, got {src!r}")
        await self.d.run_blocking("misc", check_caller_can_read, src, caller)  # before anything is written
        files: dict[str, Path | None] = {}
        for key in ("sign_key", "signature"):  # files the caller names are read only if the caller could read them
            value = b.get(key)
            if value is None:
                files[key] = None
                continue
            if not isinstance(value, str) or not os.path.isabs(value):
                raise ApiError(400, f"'{key}' must be an absolute path, got {value!r}"[:200])
            await self.d.run_blocking("misc", check_caller_can_read, value, caller)
            files[key] = Path(value)
        default_key = self.d.config.settings.publish.signing_key
        if files["sign_key"] is None and files["signature"] is None and default_key is not None:
            await self.d.run_blocking("misc", check_caller_may_sign, default_key, caller)   # (never lent)
        # (and again on every inode the scan pins: a tree swapped after the check above gains nothing)
        check = caller_may_read(caller) if caller.uid != 0 else None
        companion = b.get("companion")
        if companion is not None:  # a companion artefact of NAME@VERSION: {"kind", "key"}
            comp = check_companion(companion)
            assert comp is not None
            if files["signature"] is not None:
                raise ApiError(400, "a companion is signed with 'sign_key' (or [publish] signing_key), not an attached "
                               "signature")
            return await self.d.run_blocking("misc", lambda: self.d.service.publish_companion(
                Path(src), f"{name}@{version}", *comp, check=check, sign_key=files["sign_key"]))
        return await self.d.run_blocking("misc", lambda: self.d.service.publish(Path(src), name, version, check=check,
                                                                                **files))

    async def _evict(self, b: dict[str, Any], caller: Caller) -> dict[str, Any]:
        try:
            return await self.d.run_blocking("misc", self.d.service.evict, str_field(b, "ref"), b.get("tier"),
                                             bool(b.get("force")), b.get("all") is True)
        finally:
            self.d.status_changed()

    # -- plumbing -----------------------------------------------------------------------------------
    def _h(self, fn: Callable[..., Awaitable[Any]], admin: str | None = None
           ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A JSON route; ``admin`` names a mutating route: the caller is checked first and ``fn`` gets
        ``(body, caller)``."""
        async def handler(request: web.Request) -> web.Response:
            caller = None
            if admin:
                sock = request.transport.get_extra_info("socket") if request.transport is not None else None
                caller = authorize(sock, admin, self.d.config.settings.api.admin_group)
            body: dict[str, Any] = {}
            if request.method == "POST" and request.can_read_body:
                body = await self._read_body(request)
                _log_request(request, body)
            return web.json_response(await (fn(body, caller) if admin else fn(body)))
        return handler

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        return await read_body(request, self.d.config.settings.api.request_timeout_s)


def _holder(request: web.Request) -> str:
    """Who asked, for a lease: ``pid 4242 (vllm) uid 1000`` (SO_PEERCRED and /proc/PID/comm)."""
    from ..client import peer_credentials
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    try:
        pid, uid, _ = peer_credentials(sock) if sock is not None else (0, -1, -1)
    except OSError:
        return "unknown caller"
    from tiering import process_name
    comm = process_name(pid) if pid > 0 else ""
    return f"pid {pid}" + (f" ({comm})" if comm else "") + f" uid {uid}"


def _log_request(request: web.Request, body: dict[str, Any]) -> None:
    """Who asked for what (the caller's pid and uid from SO_PEERCRED): one INFO line per operation."""
    from ..client import peer_credentials
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    try:
        pid, uid, _ = peer_credentials(sock) if sock is not None else (0, -1, -1)
    except OSError:
        pid, uid = 0, -1
    keys = [k for k in ("ref", "name", "version", "tier", "wait", "timeout_s", "lease_s", "force", "all")
            if isinstance(body.get(k), (str, int, float)) and body.get(k) is not None]
    # (one argument per field: the JSON log reads each key=value, a pre-joined string is one quoted value)
    log.info("request route=%s pid=%d uid=%d" + "".join(f" {k}=%s" for k in keys), request.path.rsplit("/", 1)[-1],
             pid, uid, *(_loggable(k, body[k]) for k in keys))


def _loggable(key: str, v: Any) -> Any:
    """A request's field as its log line shows it: a number as it is; a string only once it is what
    the key says (a ref, a name, a version, a tier), else how long it was (the route refuses it with
    a message of its own; the log layer escapes and cuts whatever gets through: weightd.logs)."""
    if not isinstance(v, str):
        return v
    from tiering import LOCAL_TIERS, parse_ref, validate_label, validate_name
    check = {"ref": lambda x: parse_ref(x, local=True), "name": validate_name, "version": validate_label}.get(key)
    try:
        if key == "tier" and v in LOCAL_TIERS or check is not None and len(v) <= 600 and check(v) is not False:
            return v
    except ValueError:
        pass
    return f"<invalid, {len(v)} characters>"
