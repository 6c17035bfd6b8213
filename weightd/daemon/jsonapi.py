"""The admin API's JSON over HTTP: request bodies read within bounds (``[api] request_timeout_s``, at
most ``MAX_JSON_DEPTH`` deep, the version envelope of :mod:`weightd.compat` checked), the fields a
route reads checked, and errors answered as ``{"error", "exit_code", "hint"}`` with the HTTP status of
their type (:mod:`weightd.errors`), so the CLI prints the same line either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from tiering import TieringError

from ..compat import check_envelope
from ..errors import ApiError, DaemonStopping, WeightdError, exit_code_for, hint_for, http_status_for

log = logging.getLogger(__name__)
MAX_JSON_DEPTH = 32            # request bodies are small flat objects; deeper nesting is an attack
ANSWERED = (TieringError, WeightdError, OSError, ValueError)   # answered with their exit code (ApiError,
                                                              # ConfigError included); the rest is a 500


def error_doc(exc: BaseException) -> dict[str, Any]:
    """An error as the API answers it; ``"retry": true`` when the daemon is stopping."""
    doc: dict[str, Any] = {"error": str(exc), "exit_code": exit_code_for(exc), "hint": hint_for(exc)}
    if isinstance(exc, DaemonStopping):
        doc["retry"] = True
    return doc


def answer_errors(counted: Callable[[str, str], None]) -> Any:
    """The middleware that answers every error as JSON and counts each answer by route and status
    (``counted(route, status)``): the daemon keeps serving whatever a handler raised."""
    @web.middleware
    async def errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
        try:
            resp = await handler(request)
        except web.HTTPException as exc:  # unknown route or method: a 4xx with a message
            resp = web.json_response({"error": f"{request.method} {request.path}: {exc.reason}", "exit_code": 2},
                                     status=exc.status)
        except ANSWERED as exc:
            resp = web.json_response(error_doc(exc), status=http_status_for(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the daemon keeps serving
            log.exception("internal error on %s", request.path)
            resp = web.json_response({"error": f"internal error: {type(exc).__name__}: {exc}", "exit_code": 1},
                                     status=500)
        counted(route, str(resp.status))
        return resp
    return errors


async def read_body(request: web.Request, timeout_s: float) -> dict[str, Any]:
    """The request's JSON object, received within ``timeout_s``; 400 or 408 (ApiError) otherwise."""
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
    if depth(body) > MAX_JSON_DEPTH:
        raise ApiError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        check_envelope(body)
    except ValueError as exc:
        raise ApiError(400, f"request body: {exc}") from None
    return body


def depth(v: Any) -> int:
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


def str_field(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str):
        raise ApiError(400, f"'{key}' must be a string")
    return v


def opt_str_field(body: dict[str, Any], key: str) -> str | None:
    return None if body.get(key) is None else str_field(body, key)
