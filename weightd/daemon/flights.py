"""Single flight around the node service's preload: everyone asking for one version (or one partial
copy, or one companion) in one tier shares one transfer, run on that tier's pool. A preload resolves
its version first (bounded; with ``wait``, polling cold storage until it is published), a caller who
is not an admin leases within :class:`.leases.LeaseGuard`'s limits, and a caller who joins a flight
takes a lease of its own once the copy is there. The table of flights is what ``status`` shows as
transfers and what the intent runner counts as in flight.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from tiering import HOT, WARM, Progress, TimedOut, refuse_if_stuck

from ..errors import DaemonStopping
from ..node.requests import DEFAULT, PreloadRequest
from .cold import COLD_LIST_S, ColdReads
from .jsonapi import str_field
from .leases import LeaseGuard

if TYPE_CHECKING:
    from .context import DaemonContext

INTERNAL = object()            # a preload the daemon asks for itself (fleet intent): no caller's limits
WAIT_POLL_S = 1.0              # a preload's wait for publication asks cold storage this often


class Flights:
    """The preloads in flight (:class:`.context.Preloads`), keyed (NAME, VERSION, tier, *what):
    what="" for the version, else its partial copy's or companion's."""

    def __init__(self, daemon: "DaemonContext", cold: ColdReads, leases: LeaseGuard) -> None:
        self.d, self.cold, self.leases = daemon, cold, leases
        self.inflight: dict[tuple[str, ...], asyncio.Task[dict[str, Any]]] = {}
        self.transfers: dict[tuple[str, ...], Progress] = {}   # the same keys: what each flight is doing

    async def preload(self, body: dict[str, Any], *, holder: str | None = None,
                      joined: Callable[[Progress], None] | None = None, rate_bytes_per_s: int = 0,
                      waited_on: bool = True, caller: Any = INTERNAL) -> dict[str, Any]:
        """``joined(progress)``: called with the flight's progress once this request shares in one;
        ``rate_bytes_per_s``: a cap on the transfer this request starts (fleet intent's bandwidth);
        ``waited_on``: someone waits for the answer (a caller, not fleet intent's background work):
        counted in time to ready. ``caller``: who asked on the socket (:func:`.leases.who`; None when
        the kernel did not say): a caller who is not an admin leases within :class:`.leases.LeaseGuard`'s
        limits; INTERNAL (the daemon's own work, fleet intent) is not limited. The caller's memory
        cgroup (by its pid) bounds what the copy warms, as the daemon's own does: a flight's first
        caller's, when several share it."""
        svc = self.d.service
        t0 = time.monotonic()
        refuse_if_stuck()   # (cold storage known hung: at once, never a thread more or a wait in a queue)
        limited = caller is not INTERNAL and not (caller is not None and caller.admin)
        lease_s = body.get("lease_s", DEFAULT)
        if limited:
            lease_s = self.leases.lease_s(caller, lease_s)
        req = svc.preload_request(str_field(body, "ref"), tier=body.get("tier", HOT), strict=body.get("strict", False),
                                  lease_s=lease_s, timeout_s=body.get("timeout_s"),
                                  wait=body.get("wait", False), holder=holder, selection=body.get("selection"),
                                  whole=body.get("whole", False), companion=body.get("companion"),
                                  warm_for=(caller.pid,) if getattr(caller, "pid", 0) > 0 else ())
        if svc.needs_resolving(req):  # resolve (and wait for publication) before joining a flight
            req = await self.unless_stopping(self._resolve(req))
        if limited and req.lease_s > 0:   # (its share of the tier, reserved until its lease is recorded)
            return await self._within_share(req, caller, t0, joined, rate_bytes_per_s, waited_on)
        return await self._flight(req, t0, joined, rate_bytes_per_s, waited_on)

    async def _within_share(self, req: PreloadRequest, caller: Any, t0: float,
                            joined: Callable[[Progress], None] | None, rate_bytes_per_s: int,
                            waited_on: bool) -> dict[str, Any]:
        """A limited caller's leased preload: the bytes it places are reserved in its share of the
        tier (and of warm, where a copy that does not fit hot falls back) while it runs."""
        svc = self.d.service
        deadline = None if req.timeout_s is None else time.monotonic() + req.timeout_s
        size = await self.d.run_blocking("misc", svc.local_size, req)
        if size is None:   # (what is placed: a selection's or a companion's bytes, not the version's)
            size = await self.cold.run(lambda: svc.placed_size(req), COLD_LIST_S if deadline is None
                                       else max(0.001, deadline - time.monotonic()), f"the size of {req.ref[:200]}")
        if deadline is not None:   # (one deadline for the lookup and the load)
            req = replace(req, timeout_s=max(0.001, deadline - time.monotonic()))
        async with AsyncExitStack() as rooms:
            # (a copy that does not fit hot falls back to warm unless strict: it fits the share of both)
            for tier in (req.tier, *((WARM,) if req.tier == HOT and not req.strict else ())):
                await rooms.enter_async_context(self.leases.room(caller, tier, req.name, str(req.version), size))
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
            task = asyncio.get_running_loop().create_task(self._run(req, progress))
            self.inflight[key] = task
            task.add_done_callback(lambda _t, k=key: self._done(k))
        progress = self.transfers[key]
        if shared and not rate_bytes_per_s:
            progress.lift_cap()   # (a server joining an intent's capped transfer does not wait for the cap)
        if joined is not None:
            joined(progress)
        progress.waiters += 1
        try:
            report = dict(await self.unless_stopping(asyncio.shield(task)))
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
            return await self.cold.run(lambda: svc.resolved(req), left(), what)
        while True:
            got = await self.cold.run(lambda: svc.published(req), left(), what)
            if got is not None:   # (one deadline for the wait and the load)
                return got if deadline is None else replace(got, timeout_s=max(0.001, deadline - time.monotonic()))
            if deadline is not None and time.monotonic() + WAIT_POLL_S > deadline:
                raise TimedOut(f"{req.ref[:200]}: not published before the timeout")
            if self.d.stopping.is_set():
                raise DaemonStopping()
            await asyncio.sleep(WAIT_POLL_S)

    async def unless_stopping(self, aw: Awaitable[Any]) -> Any:
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
        fut.add_done_callback(consume)  # (its outcome is nobody's now: never "exception never retrieved")
        raise DaemonStopping()

    async def _run(self, req: PreloadRequest, progress: Progress) -> dict[str, Any]:
        """The flight's one transfer, on the tier's pool (queued there counts against timeout_s too)."""
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

    def _done(self, key: tuple[str, ...]) -> None:
        """A transfer ended: forget it, then say what is left (counting it would leave "1 in flight")."""
        self.inflight.pop(key, None)
        self.transfers.pop(key, None)
        self.d.set_status(self.idle_status())

    def idle_status(self) -> str:
        n = len(self.inflight)
        return f"serving ({n} transfer{'s' if n != 1 else ''} in flight)" if n else "serving, idle"


def consume(fut: "asyncio.Future[Any]") -> None:
    """A done callback that retrieves an abandoned future's outcome (never "exception never retrieved")."""
    if not fut.cancelled():
        fut.exception()
