"""A worker's report to the origin (``POST /v1/fleet/report``), checked: it comes from the network, from
a worker that may be broken or hostile, so :func:`check_report` checks every field it knows (types,
sizes, ranges, names as ``tiering`` names them) and raises ValueError with a one-line message naming
the first problem; nothing unchecked is kept. Keys it does not know (a newer worker's, see
:mod:`weightd.compat`) are dropped, not refused: a fleet upgrading its workers before its origin keeps
its view and its rollout slots. :func:`report_bytes` is what a checked report counts against the
origin's budget (:mod:`.view`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import tiering

from ..compat import check_envelope

MAX_HOLDINGS = 1024
MAX_INTENT = 1024
MAX_LABELS = 64
MAX_NODE_NAME = 253
MAX_BYTES = (1 << 63) - 1
MAX_UNIX_TIME = 1e11            # (year 5138: past that a time is garbage)
MAX_MODEL_CHARS = 255 + 1 + 255  # (checked before a name is parsed, so a huge string costs nothing)
MAX_VERSION_CHARS = 255
TIERS = ("hot", "warm")
HOLDING_KEYS = ("model", "version", "tier", "resident", "bytes", "since", "serving")
READY_KEYS = ("model", "version", "tier", "seconds")
MAX_READY = 1024
MAX_READY_S = 1e9                 # (32 years: past that an estimate is garbage)
_READY_BYTES = 170                # a ready estimate besides its model and version: its JSON in the view
                                  # ({"model":,"version":,"tier":"warm","seconds":123456.789}, ~70 B) and the
                                  # held tuple, its float and two interned-string references (~90 B)
_HOST = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?")
_RACK = re.compile(r"[A-Za-z0-9._-]{1,63}")   # (as [p2p] rack)
_LABEL_KEY = re.compile(r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_HOLDING_BYTES = 112              # a holding's JSON besides its model and version (keys, numbers)
_REPORT_BYTES = 256               # a report's JSON besides its node, labels, holdings and intent


def show(v: Any) -> str:
    """A value for a message: its repr (one line), cut to 40 characters."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _checked(v: Any, where: str, what: str, limit: int, validate: Any) -> str:
    """A model name or version, as weightd's own rules have them (``validate``: tiering's check)."""
    if not isinstance(v, str):
        raise ValueError(f"{where}: expected a {what} (a string), got {_kind(v)}")
    if len(v) > limit:
        raise ValueError(f"{where}: {what} longer than {limit} characters")
    try:
        return validate(v)
    except tiering.InvalidName as exc:
        raise ValueError(f"{where}: invalid {what} {show(v)}: {exc.reason}") from None


def _name(v: Any, where: str) -> str:
    return _checked(v, where, "model name", MAX_MODEL_CHARS, tiering.validate_name)


def _version(v: Any, where: str) -> str:
    return _checked(v, where, "version", MAX_VERSION_CHARS, tiering.validate_version)


def _number(v: Any, where: str, lo: float, hi: float, what: str) -> float:
    """A JSON number in [lo, hi]: not a boolean (``true`` is not 1 here), not NaN or infinite."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: expected {what}, got {_kind(v)}")
    if isinstance(v, float) and not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{where}: expected {what}, got {show(v)}")
    return float(v)


def _holding(h: Any, where: str) -> dict[str, Any]:
    if not isinstance(h, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(h)}")
    for k in HOLDING_KEYS:   # (keys besides these are a newer worker's: not kept)
        if k not in h:
            raise ValueError(f"{where}: missing {k!r}")
    tier = h["tier"]
    if not isinstance(tier, str) or tier not in TIERS:
        raise ValueError(f"{where}.tier: expected 'hot' or 'warm', got {show(tier)}")
    size = h["bytes"]
    if isinstance(size, bool) or not isinstance(size, int):
        raise ValueError(f"{where}.bytes: expected a whole number of bytes, got {_kind(size)}")
    if not 0 <= size <= MAX_BYTES:
        raise ValueError(f"{where}.bytes: expected a whole number of bytes from 0 to 2^63-1, got {show(size)}")
    serving = h["serving"]
    if not isinstance(serving, bool):
        raise ValueError(f"{where}.serving: expected true or false, got {show(serving)}")
    return {"model": _name(h["model"], f"{where}.model"),
            "version": _version(h["version"], f"{where}.version"),
            "tier": tier,
            "resident": _number(h["resident"], f"{where}.resident", 0.0, 1.0, "a fraction from 0 to 1"),
            "bytes": size,
            "since": _number(h["since"], f"{where}.since", 0.0, MAX_UNIX_TIME, "a unix time"),
            "serving": serving}


def check_report(body: Any) -> dict[str, Any]:
    """A worker's report, checked and copied (only plain values that were checked are kept):
    ``{"node", "rack", "labels", "holdings", "intent", "ready", "ready_dropped", "weightd", "origins"}``; ValueError naming the first problem.

    Shape: ``v`` (optional) the message revision, an integer >= 1; ``weightd`` (optional) the worker's
    weightd version; ``node`` a host name (at most 253 characters); ``rack`` a rack name or null/absent;
    ``labels`` (optional) at most 64 Kubernetes-style labels; ``holdings`` (optional) at most 1024
    objects with exactly ``model``, ``version``, ``tier`` (``hot``/``warm``), ``resident`` (0..1),
    ``bytes`` (integer >= 0), ``since`` (unix time), ``serving`` (boolean), one per (model, version,
    tier); ``intent`` (optional) at most 1024 entries ``NAME`` or ``NAME@REF`` -> version; ``ready``
    (optional) ready estimates with ``model``, ``version``, ``tier`` (``hot``/``warm``) and ``seconds``
    (0 to 1e9), one per (model, version, tier), each of a version the report holds or of a model its
    intent names: a row that is not (a bad number from a broken worker, a model the node neither
    holds nor intends, past the first 1024) is dropped and counted in ``ready_dropped``, never the
    report (the node stays in the view and keeps its rollout slots). ``origins`` (optional) 16
    lowercase hex digits naming the worker's list of origins (:func:`weightd.fleet.client.origins_hash`;
    anything else is taken as not said).
    Other keys, at the top or in a holding, are a newer worker's: ignored, never kept."""
    if not isinstance(body, dict):
        raise ValueError(f"report: expected a JSON object, got {_kind(body)}")
    try:
        _v, sender = check_envelope(body)
    except ValueError as exc:
        raise ValueError(f"report: {exc}") from None
    node, rack, labels = _node(body), _rack(body.get("rack")), _labels(body.get("labels", {}))
    holdings, intent = _holdings(body.get("holdings", [])), _intent(body.get("intent", {}))
    ready, dropped = _ready(body.get("ready", []), {(h["model"], h["version"]) for h in holdings},
                            {k.partition("@")[0] for k in intent})
    return {"node": node, "rack": rack, "labels": labels, "holdings": holdings, "intent": intent, "ready": ready, "ready_dropped": dropped, "weightd": sender,
            "origins": _origins(body.get("origins"))}


def _origins(v: Any) -> str | None:
    import re
    return v if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{16}", v) else None


def _node(body: dict[str, Any]) -> str:
    if "node" not in body:
        raise ValueError("report: missing 'node'")
    node = body["node"]
    if not isinstance(node, str):
        raise ValueError(f"node: expected a host name (a string), got {_kind(node)}")
    if not _HOST.fullmatch(node):
        raise ValueError(f"node: expected a host name (letters, digits, '-', '_', '.'; at most {MAX_NODE_NAME} "
                         f"characters), got {show(node)}")
    return node


def _rack(rack: Any) -> str | None:
    if rack is not None and (not isinstance(rack, str) or not _RACK.fullmatch(rack)):
        raise ValueError(f"rack: expected null or a rack name (letters, digits, '.', '_', '-'; at most 63), "
                         f"got {show(rack)}")
    return rack


def _labels(labels: Any) -> dict[str, str]:
    if not isinstance(labels, dict):
        raise ValueError(f"labels: expected an object of label -> value, got {_kind(labels)}")
    if len(labels) > MAX_LABELS:
        raise ValueError(f"labels: {len(labels)} entries; at most {MAX_LABELS}")
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_KEY.fullmatch(k):
            raise ValueError(f"labels: {show(k)} is not a label key (like 'pool' or 'example.com/pool')")
        if not isinstance(v, str) or not _LABEL_VALUE.fullmatch(v):
            raise ValueError(f"labels[{k!r}]: {show(v)} is not a label value (at most 63 letters, digits, "
                             "'-', '_', '.')")
    return dict(labels)


def _holdings(holdings: Any) -> list[dict[str, Any]]:
    if not isinstance(holdings, list):
        raise ValueError(f"holdings: expected a list, got {_kind(holdings)}")
    if len(holdings) > MAX_HOLDINGS:
        raise ValueError(f"holdings: {len(holdings)} entries; at most {MAX_HOLDINGS}")
    rows, seen = [], set()
    for i, h in enumerate(holdings):
        row = _holding(h, f"holdings[{i}]")
        key = (row["model"], row["version"], row["tier"])
        if key in seen:
            raise ValueError(f"holdings[{i}]: {row['model']}@{row['version']} in {row['tier']} is listed twice")
        seen.add(key)
        rows.append(row)
    return rows


def _intent(intent: Any) -> dict[str, str]:
    if intent is None:
        intent = {}
    if not isinstance(intent, dict):
        raise ValueError(f"intent: expected an object of model -> version, got {_kind(intent)}")
    if len(intent) > MAX_INTENT:
        raise ValueError(f"intent: {len(intent)} entries; at most {MAX_INTENT}")
    wants = {}
    for m, v in intent.items():
        if not isinstance(m, str):
            raise ValueError(f"intent: expected model names as keys, got {_kind(m)}")
        if len(m) > MAX_MODEL_CHARS + 1 + MAX_VERSION_CHARS:
            raise ValueError("intent: a key longer than NAME@VERSION can be")
        name, at, ref = m.partition("@")
        _name(name, "intent")
        if at:
            _version(ref, f"intent[{show(m)}]")
        wants[m] = _version(v, f"intent[{show(m)}]")
    return wants


def _estimate(e: Any, where: str) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(e)}")
    for k in READY_KEYS:
        if k not in e:
            raise ValueError(f"{where}: missing {k!r}")
    if not isinstance(e["tier"], str) or e["tier"] not in TIERS:
        raise ValueError(f"{where}.tier: expected 'hot' or 'warm', got {show(e['tier'])}")
    return {"model": _name(e["model"], f"{where}.model"), "version": _version(e["version"], f"{where}.version"),
            "tier": e["tier"],
            "seconds": _number(e["seconds"], f"{where}.seconds", 0.0, MAX_READY_S, "seconds from 0 to 1e9")}


def _ready(ready: Any, held: set[tuple[str, str]], intended: set[str]) -> tuple[list[dict[str, Any]], int]:
    """A worker's ready estimates (weightd.node.ready_estimate), each checked as a holding is, and how
    many were dropped: a bad row, a duplicate, one past MAX_READY, or an estimate of a version the
    report neither holds (``held``) nor of a model its intent names (``intended``): the worker's claim
    about a model it has nothing to do with is not kept."""
    if ready is None:
        return [], 0
    if not isinstance(ready, list):
        return [], 1
    rows, seen = [], set()
    for i, e in enumerate(ready[:MAX_READY]):
        try:
            row = _estimate(e, f"ready[{i}]")
        except ValueError:
            continue
        key = (row["model"], row["version"], row["tier"])
        if key in seen or ((row["model"], row["version"]) not in held and row["model"] not in intended):
            continue
        seen.add(key)
        rows.append(row)
    return rows, len(ready) - len(rows)


def report_bytes(r: dict[str, Any]) -> int:
    """What a checked report counts against the budget: about the size of its JSON in the view."""
    return (_REPORT_BYTES + 16 + len(r["node"]) + len(r["rack"] or "") + len(r["weightd"] or "")
            + sum(len(k) + len(v) + 6 for k, v in r["labels"].items())
            + sum(len(k) + len(v) + 6 for k, v in r["intent"].items())
            + sum(_HOLDING_BYTES + len(h["model"]) + len(h["version"]) for h in r["holdings"])
            + sum(_READY_BYTES + len(e["model"]) + len(e["version"]) for e in r.get("ready", ())))
