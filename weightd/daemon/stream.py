"""A preload's progress, streamed: ``POST /v1/preload`` with ``"stream": true`` answers NDJSON, a
``{"progress": {...}}`` line every PROGRESS_EVERY_S (a heartbeat even while nothing moves), then one
``{"result": report}`` or ``{"error", "exit_code", "hint", "retry"}`` line. A client that goes away
ends its own wait; the shared transfer goes on for the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from tiering import Progress

from .flights import consume
from .jsonapi import ANSWERED, error_doc

log = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.5         # a streamed preload's progress lines (and heartbeat)


async def stream_preload(request: web.Request, body: dict[str, Any],
                         start: Callable[[Callable[[Progress], None]], Awaitable[dict[str, Any]]],
                         network: Callable[[], dict[str, Any]] | None = None) -> web.StreamResponse:
    """The NDJSON answer to ``body``'s preload; ``start(joined)`` runs the preload, calling
    ``joined(progress)`` once it shares in a flight; ``network()``: the ``[network]`` state, in each
    progress line while weightd yields the link (the progress bar says so)."""
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
    await resp.prepare(request)
    seen: list[Progress] = []
    wait = body.get("wait") is True
    ref = body.get("ref") if isinstance(body.get("ref"), str) else "?"
    job = asyncio.ensure_future(start(seen.append))
    try:
        while True:
            done, _ = await asyncio.wait({job}, timeout=PROGRESS_EVERY_S)
            if done:
                break
            snap = seen[0].snapshot() if seen else {
                "label": ref[:200], "phase": "resolve", "done": 0, "total": 0,
                "detail": f"waiting for {ref[:200]} to be published" if wait else "resolving"}
            net = network() if network is not None else None
            if net and net.get("yielding"):
                snap = {**snap, "network": net}
            await resp.write(_line({"progress": snap}))
        await resp.write(_line(_last_line(job)))
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError) as exc:
        # the client went away: its wait ends here, the shared transfer goes on for the others
        job.cancel()
        job.add_done_callback(consume)
        if isinstance(exc, asyncio.CancelledError):
            raise
        log.info("a streamed preload's client went away ref=%s", ref[:200])
    return resp


def _last_line(job: "asyncio.Future[dict[str, Any]]") -> dict[str, Any]:
    """The stream's last line: the report, or the error as the API answers it."""
    try:
        return {"result": job.result()}
    except ANSWERED as exc:
        return error_doc(exc)
    except Exception as exc:  # the daemon keeps serving
        log.exception("internal error on a streamed preload")
        return {"error": f"internal error: {type(exc).__name__}: {exc}", "exit_code": 1}


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
