"""The admin API: JSON over HTTP on the unix socket, one route per operation of the node's
:class:`~weightd.node.service.NodeService`, plus health, pressure history and /metrics.

Around the service, only what a daemon has: the caller's credentials (mutating routes), single
flight (everyone asking for one version in one tier shares one transfer), the thread pools, and
bounded requests: headers and body within ``[api] request_timeout_s``, JSON at most
``MAX_JSON_DEPTH`` deep. A body may come from a CLI one release older or newer (:mod:`weightd.compat`):
its ``"v"`` and ``"weightd"`` are checked, keys no route reads are ignored, the ones a route reads are
checked as always. Errors answer ``{"error", "exit_code", "hint"}`` with the HTTP status of
their type (:mod:`weightd.errors`), so the CLI prints the same line either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tiering import (HOT, LOCAL_TIERS, WARM, CheckpointNotFound, Progress, TieringError, TimedOut, refuse_if_stuck,
                     run_bounded_async)

from ..compat import check_envelope
from ..errors import ApiError, DaemonStopping, WeightdError, exit_code_for, hint_for, http_status_for
from ..node.service import DEFAULT, PreloadRequest, check_companion, split_ref
from .authz import Caller, authorize, caller_may_read, check_caller_can_read, check_caller_may_sign
from .leases import LeaseGuard, Who, who

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
API_VERSION = "v1"
MAX_JSON_DEPTH = 32            # request bodies are small flat objects; deeper nesting is an attack
SET_AT_ONCE = 8                # a set's models in flight at once (the tier's threads run 2 of them)
PROGRESS_EVERY_S = 0.5         # a streamed preload's progress lines (and heartbeat)
FEATURES = ["stream", "hold"]  # what clients may ask of this daemon (health says so)
INTERNAL = object()            # a preload the daemon asks for itself (fleet intent): no caller's limits
# Work that reads cold storage is bounded (a hung mount holds a thread, never a request or a pool for
# ever) and refused at once while tiering.copy.STUCK_CAP threads are stuck in it (ColdStorageStuck):
COLD_CHECK_S = 20.0            # check-cold (doctor): every manifest read, every file opened
COLD_LIST_S = 60.0             # ls, pin and unpin (which resolve NAME), a preload's resolve without timeout_s
PATH_COLD_S = 5.0              # path NAME (the latest published) or a part of it: which version is in cold
COLD_AT_ONCE = 8               # reads of cold storage the API runs at once (each on a thread of its own, never
                               # a pool's): more wait for a slot, within their own bound
WAIT_POLL_S = 1.0              # a preload's wait for publication asks cold storage this often


class Api:
    def __init__(self, daemon: "DaemonContext") -> None:
        self.d = daemon
        # status, path NAME@VERSION and /metrics run in a pool of their own: local facts only, never
        # queued behind work that reads cold storage (misc and the tiers' pools)
        daemon.pools.setdefault("query", ThreadPoolExecutor(2, "weightd-query"))
        self.cold_slots = asyncio.Semaphore(COLD_AT_ONCE)
        self._metrics_job: "asyncio.Future[bytes] | None" = None   # (the exposition being generated)
        # (NAME, VERSION, tier, *what): what="" for the version, else its partial copy's or companion's
        self.inflight: dict[tuple[str, ...], asyncio.Task[dict[str, Any]]] = {}
        self.transfers: dict[tuple[str, ...], Progress] = {}   # the same keys: what each flight is doing
        self.leases = LeaseGuard(daemon)   # (read-only callers' leases: their length and their share)

    def _who(self, request: web.Request) -> Who | None:
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        return who(sock, self.d.config.settings.api.admin_group)

    def app(self) -> web.Application:
        d = self.d
        app = web.Application(middlewares=[self._errors], client_max_size=1 << 20)
        r = app.router
        v = f"/{API_VERSION}"
        r.add_get(f"{v}/health", self._health)
        r.add_get(f"{v}/pressure", self._pressure)
        r.add_get(f"{v}/status", self._h(self._status))
        r.add_post(f"{v}/preload", self._preload_route)
        r.add_post(f"{v}/preload-set", self._preload_set_route)
        r.add_post(f"{v}/publish", self._h(self._publish, admin="publish"))
        # (admin: it reads every published manifest and opens every file, as the daemon's user)
        r.add_get(f"{v}/check-cold", self._h(lambda b, c: self._cold(d.service.check_cold, COLD_CHECK_S,
                                                                     "the check of cold storage"), admin="check-cold"))
        r.add_post(f"{v}/versions", self._h(lambda b: self._cold(
            lambda: d.service.versions(_opt_str(b, "name")), COLD_LIST_S, "listing cold storage")))
        r.add_post(f"{v}/hold", self._hold_route)
        r.add_post(f"{v}/path", self._h(self._path))
        r.add_post(f"{v}/pin", self._h(lambda b, c: self._pin(b, True), admin="pin"))
        r.add_post(f"{v}/unpin", self._h(lambda b, c: self._pin(b, False), admin="unpin"))
        r.add_post(f"{v}/evict", self._h(self._evict, admin="evict"))
        r.add_post(f"{v}/gc", self._h(lambda b, c: d.run_blocking("misc", d.service.gc), admin="gc"))
        r.add_get(f"{v}/intent", self._h(self._intent))
        r.add_get(f"{v}/intent/explain", self._h(self._intent_explain))
        return app

    # -- preload: single flight around the service --------------------------------------------------
    async def _preload_route(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/preload: the report as one JSON document, or with ``"stream": true`` an NDJSON
        stream: a ``{"progress": {...}}`` line every PROGRESS_EVERY_S (a heartbeat even while nothing
        moves), then one ``{"result": report}`` or ``{"error", "exit_code", "hint", "retry"}`` line."""
        body = await self._read_body(request) if request.can_read_body else {}
        _log_request(request, body)
        holder, caller = _holder(request), self._who(request)
        if body.get("stream") is not True:
            return web.json_response(await self.preload(body, holder=holder, caller=caller))
        return await self._stream(request, body, holder, caller)

    async def preload(self, body: dict[str, Any], *, holder: str | None = None,
                      joined: Callable[[Progress], None] | None = None, rate_bytes_per_s: int = 0,
                      waited_on: bool = True, caller: Any = INTERNAL) -> dict[str, Any]:
        """``joined(progress)``: called with the flight's progress once this request shares in one;
        ``rate_bytes_per_s``: a cap on the transfer this request starts (fleet intent's bandwidth);
        ``waited_on``: someone waits for the answer (a caller, not fleet intent's background work):
        counted in time to ready. ``caller``: who asked on the socket (:func:`.leases.who`; None when
        the kernel did not say): a caller who is not an admin leases within :class:`.leases.LeaseGuard`'s
        limits; INTERNAL (the daemon's own work, fleet intent) is not limited."""
        svc = self.d.service
        t0 = time.monotonic()
        refuse_if_stuck()   # (cold storage known hung: at once, never a thread more or a wait in a queue)
        limited = caller is not INTERNAL and not (caller is not None and caller.admin)
        lease_s = body.get("lease_s", DEFAULT)
        if limited:
            lease_s = self.leases.lease_s(caller, lease_s)
        req = svc.preload_request(_str(body, "ref"), tier=body.get("tier", HOT), strict=body.get("strict", False),
                                  lease_s=lease_s, timeout_s=body.get("timeout_s"),
                                  wait=body.get("wait", False), holder=holder, selection=body.get("selection"),
                                  whole=body.get("whole", False), companion=body.get("companion"))
        if svc.needs_resolving(req):  # resolve (and wait for publication) before joining a flight
            req = await self._unless_stopping(self._resolve(req))
        if limited and req.lease_s > 0:   # (its share of the tier, reserved until its lease is recorded)
            deadline = None if req.timeout_s is None else time.monotonic() + req.timeout_s
            size = await self.d.run_blocking("misc", svc.local_size, req)
            if size is None:   # (what is placed: a selection's or a companion's bytes, not the version's)
                size = await self._cold(lambda: svc.placed_size(req), COLD_LIST_S if deadline is None
                                        else max(0.001, deadline - time.monotonic()), f"the size of {req.ref[:200]}")
            if deadline is not None:   # (one deadline for the lookup and the load)
                req = replace(req, timeout_s=max(0.001, deadline - time.monotonic()))
            async with AsyncExitStack() as rooms:
                # (a copy that does not fit hot falls back to warm unless strict: it fits the share of both)
                for tier in (req.tier, *((WARM,) if req.tier == HOT and not req.strict else ())):
                    await rooms.enter_async_context(self.leases.room(caller, tier, req.name, str(req.version), size))
                return await self._flight(req, t0, joined, rate_bytes_per_s, waited_on)
        return await self._flight(req, t0, joined, rate_bytes_per_s, waited_on)

    async def _flight(self, req: PreloadRequest, t0: float, joined: Callable[[Progress], None] | None,
                      rate_bytes_per_s: int, waited_on: bool) -> dict[str, Any]:
        """A resolved preload through the single flight (and this caller's own lease when it joined one)."""
        svc = self.d.service
        key = (req.name, req.version, req.tier, *req.what)   # (a partial copy or a companion: its own flight)
        task = self.inflight.get(key)
        shared = task is not None
        if task is None:  # single flight: everyone asking for this version in this tier shares one
            progress = self.transfers[key] = Progress(f"{req.name}@{req.version}", rate_bytes_per_s=rate_bytes_per_s)
            task = asyncio.get_running_loop().create_task(self._preload_task(req, progress))
            self.inflight[key] = task
            task.add_done_callback(lambda _t, k=key: self._flight_done(k))
        progress = self.transfers[key]
        if shared and not rate_bytes_per_s:
            progress.lift_cap()   # (a server joining an intent's capped transfer does not wait for the cap)
        if joined is not None:
            joined(progress)
        progress.waiters += 1
        try:
            report = dict(await self._unless_stopping(asyncio.shield(task)))
        finally:
            progress.waiters -= 1
        if shared:
            if not report.get("already_present"):
                report["shared_transfer"] = True
            report = await self.d.run_blocking("misc", svc.join_lease, req, report)
            self.d.intent.loaded(req.name, report["version"], report["tier"])   # (a lease taken: a load)
        if waited_on:
            svc.ready(req.name, report, time.monotonic() - t0)
        return report

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
                return await self.preload({**common, "ref": r}, holder=holder, caller=caller)
        outcomes = await asyncio.gather(*(one(r) for r in refs), return_exceptions=True)
        for o in outcomes:
            if isinstance(o, BaseException) and not isinstance(o, (TieringError, WeightdError, OSError, ValueError)):
                raise o
        summary = summarize(refs, list(outcomes), time.monotonic() - t0, common.get("tier", HOT))
        log.info("preloaded a set models=%d ready=%d failed=%d bytes=%d seconds=%.3f caller=%s", summary["models"],
                 summary["ready"], len(summary["failed"]), summary["bytes"], summary["seconds"], holder)
        return web.json_response(summary)

    async def _stream(self, request: web.Request, body: dict[str, Any], holder: str, caller: Any
                      ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
        await resp.prepare(request)
        seen: list[Progress] = []
        wait = body.get("wait") is True
        ref = body.get("ref") if isinstance(body.get("ref"), str) else "?"
        job = asyncio.ensure_future(self.preload(body, holder=holder, joined=seen.append, caller=caller))
        try:
            while True:
                done, _ = await asyncio.wait({job}, timeout=PROGRESS_EVERY_S)
                if done:
                    break
                snap = seen[0].snapshot() if seen else {
                    "label": ref[:200], "phase": "resolve", "done": 0, "total": 0,
                    "detail": f"waiting for {ref[:200]} to be published" if wait else "resolving"}
                await resp.write(_line({"progress": snap}))
            try:
                last: dict[str, Any] = {"result": job.result()}
            except (TieringError, WeightdError, OSError, ValueError) as exc:
                last = {"error": str(exc), "exit_code": exit_code_for(exc), "hint": hint_for(exc)}
                if isinstance(exc, DaemonStopping):
                    last["retry"] = True
            except Exception as exc:  # the daemon keeps serving
                log.exception("internal error on a streamed preload")
                last = {"error": f"internal error: {type(exc).__name__}: {exc}", "exit_code": 1}
            await resp.write(_line(last))
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            # the client went away: its wait ends here, the shared transfer goes on for the others
            job.cancel()
            job.add_done_callback(_consume)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.info("a streamed preload's client went away ref=%s", ref[:200])
        return resp

    async def _cold(self, fn: Callable[[], Any], seconds: float, what: str) -> Any:
        """``fn()`` (which reads cold storage), refused at once while reads of cold storage are stuck, and
        answered within ``seconds`` (TimedOut, exit 4), waiting for one of COLD_AT_ONCE slots included.
        It runs on a thread of its own: no pool thread waits for it, so cold storage that never answers
        keeps that thread (counted against tiering.copy.STUCK_CAP), never a pool or the caller."""
        refuse_if_stuck()
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self.cold_slots.acquire(), seconds)
        except asyncio.TimeoutError:
            raise TimedOut(f"{what}: not started within {seconds:g} s ({COLD_AT_ONCE} reads of cold storage "
                           "already running; is it hung?)") from None
        try:
            return await run_bounded_async(fn, seconds=max(0.001, seconds - (time.monotonic() - t0)), what=what)
        finally:
            self.cold_slots.release()

    async def _resolve(self, req: PreloadRequest) -> PreloadRequest:
        """``req`` with its version resolved, bounded by its timeout_s (else COLD_LIST_S); with ``wait``, a
        poll of cold storage each WAIT_POLL_S, each bounded, until it is published (until timeout_s, the
        caller going away or the daemon stopping): no thread is held by the wait itself."""
        svc = self.d.service
        deadline = None if req.timeout_s is None else time.monotonic() + req.timeout_s

        def left() -> float:
            return COLD_LIST_S if deadline is None else min(COLD_LIST_S, max(0.001, deadline - time.monotonic()))
        what = f"resolving {req.ref[:200]}"
        if not req.wait:
            return await self._cold(lambda: svc.resolved(req), left(), what)
        while True:
            got = await self._cold(lambda: svc.published(req), left(), what)
            if got is not None:   # (one deadline for the wait and the load)
                return got if deadline is None else replace(got, timeout_s=max(0.001, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() + WAIT_POLL_S > deadline:
                raise TimedOut(f"{req.ref[:200]}: not published before the timeout")
            if self.d.stopping.is_set():
                raise DaemonStopping()
            await asyncio.sleep(WAIT_POLL_S)

    async def _unless_stopping(self, aw: Awaitable[Any]) -> Any:
        """``aw``'s result, unless the daemon starts stopping first: then DaemonStopping (503, retry),
        so a waiting client never holds a restart (what ``aw`` runs goes on until the daemon exits; a
        transfer left in staging is reconciled by the next one)."""
        fut = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.d.stopping.wait())
        try:
            await asyncio.wait({fut, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if fut.done():
            return fut.result()
        fut.add_done_callback(_consume)  # (its outcome is nobody's now: never "exception never retrieved")
        raise DaemonStopping()

    async def _preload_task(self, req: PreloadRequest, progress: Progress) -> dict[str, Any]:
        self.d.set_status(f"preloading {req.name}@{req.version} into {req.tier}")
        try:
            job = self.d.run_blocking(req.tier, lambda: self.d.service.load(req, progress=progress))
            if req.timeout_s is None:
                return await job
            try:   # (queued behind the tier's busy threads counts against timeout_s too; queued: cancelled)
                return await asyncio.wait_for(job, req.timeout_s + 1.5)
            except asyncio.TimeoutError:
                raise TimedOut(f"preload of {req.name}@{req.version}: not finished within its timeout "
                               f"({req.timeout_s:g} s)") from None
        finally:
            progress.set_phase("done")
            self.d.status_changed()

    def transfer_rows(self) -> list[dict[str, Any]]:
        """What each flight is doing (``status``'s transfer rows; the metrics' transfer gauges)."""
        return [{"name": k[0], "version": k[1], "requested_tier": k[2], **p.snapshot(),
                 **({"part": ":".join(k[3:])[:200]} if len(k) > 3 else {})}
                for k, p in list(self.transfers.items())]

    def _flight_done(self, key: tuple[str, ...]) -> None:
        """A transfer ended: forget it, then say what is left (counting it would leave "1 in flight")."""
        self.inflight.pop(key, None)
        self.transfers.pop(key, None)
        self.d.set_status(self.idle_status())

    def idle_status(self) -> str:
        n = len(self.inflight)
        return f"serving ({n} transfer{'s' if n != 1 else ''} in flight)" if n else "serving, idle"

    async def _hold_route(self, request: web.Request) -> web.Response:
        """POST /v1/hold ``{"ref": "NAME@V", "tier", "lease_s"}``: renew the caller's lease on that copy
        (``weightd hold``; the holder is the caller, as for preload's lease); ``lease_s`` 0 releases it.
        Not logged per call: a holder renews every few seconds (the service logs what changes)."""
        body = await self._read_body(request) if request.can_read_body else {}
        svc = self.d.service
        caller = self._who(request)
        ref, tier, lease_s = _str(body, "ref"), body.get("tier", HOT), self.leases.lease_s(caller, body.get("lease_s"))
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
        ref, sel, whole, comp = _str(b, "ref"), b.get("selection"), b.get("whole", False), b.get("companion")
        if not svc.path_needs_cold(ref, selection=sel, whole=whole, companion=comp):
            try:   # (a copy not here: "not on this node" from the query pool; the rest asks cold, bounded)
                return await self.d.run_blocking("query", lambda: svc.path(ref, selection=sel, whole=whole,
                                                                           companion=comp, suggest=False))
            except CheckpointNotFound as plain:
                try:
                    better = await self._cold(lambda: svc.not_found(ref), PATH_COLD_S,
                                              f"path {ref[:200]}: asking cold storage whether it is published")
                except TimedOut:
                    raise plain from None
                raise better from None
        return await self._cold(lambda: svc.path(ref, selection=sel, whole=whole, companion=comp),
                                PATH_COLD_S, f"path {ref[:200]}: asking cold storage for the version")

    async def _status(self, b: dict[str, Any]) -> dict[str, Any]:
        # ("query": local tiers and the last storage check only, never behind work that reads cold storage)
        st = await self.d.run_blocking("query", self.d.service.status, self.d.storage_problems)
        st["transfers"] = self.transfer_rows()
        st["answered_by"] = "daemon"
        return st

    async def _pin(self, b: dict[str, Any], pin: bool) -> dict[str, Any]:
        """An admin's pin or unpin is the admin's from now on: fleet intent forgets it made it."""
        svc = self.d.service
        ref = _str(b, "ref")
        out = await self._cold(lambda: (svc.pin if pin else svc.unpin)(ref), COLD_LIST_S,
                               f"{'pin' if pin else 'unpin'} {ref[:200]}")
        self.d.intent.admin_pinned(out["name"], out["version"])
        return out

    async def _intent(self, b: dict[str, Any]) -> dict[str, Any]:
        return self.d.intent.status()

    async def _intent_explain(self, b: dict[str, Any]) -> dict[str, Any]:
        return await self.d.run_blocking("misc", self.d.intent.explain)

    async def _publish(self, b: dict[str, Any], caller: Caller) -> dict[str, Any]:
        name, version, src = _str(b, "name"), _str(b, "version"), _str(b, "dir")
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
            return await self.d.run_blocking("misc", self.d.service.evict, _str(b, "ref"), b.get("tier"),
                                             bool(b.get("force")), b.get("all") is True)
        finally:
            self.d.status_changed()

    async def _health(self, request: web.Request) -> web.Response:
        d = self.d
        return web.json_response({"ok": True, "pid": os.getpid(), "role": d.role, "status": d.status_text,
                                  "config": d.config.source, "features": FEATURES})

    async def _pressure(self, request: web.Request) -> web.Response:
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

    # -- plumbing -----------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
        try:
            resp = await handler(request)
        except web.HTTPException as exc:  # unknown route or method: a 4xx with a message
            resp = web.json_response({"error": f"{request.method} {request.path}: {exc.reason}", "exit_code": 2},
                                     status=exc.status)
        except (TieringError, WeightdError, OSError, ValueError) as exc:  # ApiError and ConfigError included
            body = {"error": str(exc), "exit_code": exit_code_for(exc), "hint": hint_for(exc)}
            if isinstance(exc, DaemonStopping):
                body["retry"] = True
            resp = web.json_response(body, status=http_status_for(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the daemon keeps serving
            log.exception("internal error on %s", request.path)
            resp = web.json_response({"error": f"internal error: {type(exc).__name__}: {exc}", "exit_code": 1},
                                     status=500)
        self.d.metrics.requests.labels(route, str(resp.status)).inc()
        return resp

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
        timeout_s = self.d.config.settings.api.request_timeout_s
        try:
            raw = await asyncio.wait_for(request.read(), timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"request body not received within {timeout_s:g} s ([api] request_timeout_s)") from None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, a 5000-digit int, [[[[...
            raise ApiError(400, "request body is not valid JSON (or nests too deep)") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        if _depth(body) > MAX_JSON_DEPTH:
            raise ApiError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
        try:
            check_envelope(body)
        except ValueError as exc:
            raise ApiError(400, f"request body: {exc}") from None
        return body


def _str(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str):
        raise ApiError(400, f"'{key}' must be a string")
    return v


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    return None if body.get(key) is None else _str(body, key)


def _depth(v: Any) -> int:
    """How deep containers nest in a parsed JSON value (iterative: a hostile body cannot recurse us)."""
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return deepest


def _consume(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


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
