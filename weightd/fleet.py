"""The origin's view of what its workers hold, from the reports they POST every ``[intent] report_s``
(``POST /v1/fleet/report``), for ``GET /v1/fleet`` and ``weightd fleet status``.

A report comes from the network, from a worker that may be broken or hostile: :func:`check_report`
checks every field it knows (types, sizes, ranges, names as ``tiering`` names them) and raises
ValueError with a one-line message naming the first problem; nothing unchecked is kept, and nothing of
a refused report. Keys it does not know (a newer worker's, see :mod:`weightd.compat`) are dropped, not
refused: a fleet upgrading its workers before its origin keeps its view and its rollout slots. A node is (its address, the name it reports); a node that stops reporting leaves the view
``ttl_s`` after its last report.

Not thread-safe: a :class:`FleetView` belongs to the origin's asyncio loop, whose handlers call it
without awaiting in between, so it takes no lock (call it from that loop only).
"""

from __future__ import annotations

import ipaddress
import math
import re
import time
from collections.abc import Callable
from typing import Any

import tiering

from .compat import check_envelope

MAX_HOLDINGS = 1024
MAX_INTENT = 1024
MAX_LABELS = 64
MAX_NODE_NAME = 253
MAX_BYTES = (1 << 63) - 1
MAX_UNIX_TIME = 1e11            # (year 5138: past that a time is garbage)
MAX_MODEL_CHARS = 255 + 1 + 255  # (checked before a name is parsed, so a huge string costs nothing)
MAX_VERSION_CHARS = 255
TIERS = ("hot", "warm")
_HOLDING_KEYS = ("model", "version", "tier", "resident", "bytes", "since", "serving")
_HOST = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?")
_RACK = re.compile(r"[A-Za-z0-9._-]{1,63}")   # (as [p2p] rack)
_LABEL_KEY = re.compile(r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
MAX_NODES_PER_IP = 4              # node names one address may report as, within ttl_s


def _show(v: Any) -> str:
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
        raise ValueError(f"{where}: invalid {what} {_show(v)}: {exc.reason}") from None


def _name(v: Any, where: str) -> str:
    return _checked(v, where, "model name", MAX_MODEL_CHARS, tiering.validate_name)


def _version(v: Any, where: str) -> str:
    return _checked(v, where, "version", MAX_VERSION_CHARS, tiering.validate_version)


def _number(v: Any, where: str, lo: float, hi: float, what: str) -> float:
    """A JSON number in [lo, hi]: not a boolean (``true`` is not 1 here), not NaN or infinite."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: expected {what}, got {_kind(v)}")
    if isinstance(v, float) and not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{where}: expected {what}, got {_show(v)}")
    return float(v)


def _holding(h: Any, where: str) -> dict[str, Any]:
    if not isinstance(h, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(h)}")
    for k in _HOLDING_KEYS:   # (keys besides these are a newer worker's: not kept)
        if k not in h:
            raise ValueError(f"{where}: missing {k!r}")
    tier = h["tier"]
    if not isinstance(tier, str) or tier not in TIERS:
        raise ValueError(f"{where}.tier: expected 'hot' or 'warm', got {_show(tier)}")
    size = h["bytes"]
    if isinstance(size, bool) or not isinstance(size, int):
        raise ValueError(f"{where}.bytes: expected a whole number of bytes, got {_kind(size)}")
    if not 0 <= size <= MAX_BYTES:
        raise ValueError(f"{where}.bytes: expected a whole number of bytes from 0 to 2^63-1, got {_show(size)}")
    serving = h["serving"]
    if not isinstance(serving, bool):
        raise ValueError(f"{where}.serving: expected true or false, got {_show(serving)}")
    return {"model": _name(h["model"], f"{where}.model"),
            "version": _version(h["version"], f"{where}.version"),
            "tier": tier,
            "resident": _number(h["resident"], f"{where}.resident", 0.0, 1.0, "a fraction from 0 to 1"),
            "bytes": size,
            "since": _number(h["since"], f"{where}.since", 0.0, MAX_UNIX_TIME, "a unix time"),
            "serving": serving}


def check_report(body: Any) -> dict[str, Any]:
    """A worker's report, checked and copied (only plain values that were checked are kept):
    ``{"node", "rack", "labels", "holdings", "intent", "weightd"}``; ValueError naming the first problem.

    Shape: ``v`` (optional) the message revision, an integer >= 1; ``weightd`` (optional) the worker's
    weightd version; ``node`` a host name (at most 253 characters); ``rack`` a rack name or null/absent;
    ``labels`` (optional) at most 64 Kubernetes-style labels; ``holdings`` (optional) at most 1024
    objects with exactly ``model``, ``version``, ``tier`` (``hot``/``warm``), ``resident`` (0..1),
    ``bytes`` (integer >= 0), ``since`` (unix time), ``serving`` (boolean), one per (model, version,
    tier); ``intent`` (optional) at most 1024 entries ``NAME`` or ``NAME@REF`` -> version.
    Other keys, at the top or in a holding, are a newer worker's: ignored, never kept."""
    if not isinstance(body, dict):
        raise ValueError(f"report: expected a JSON object, got {_kind(body)}")
    try:
        _v, sender = check_envelope(body)
    except ValueError as exc:
        raise ValueError(f"report: {exc}") from None
    if "node" not in body:
        raise ValueError("report: missing 'node'")
    node = body["node"]
    if not isinstance(node, str):
        raise ValueError(f"node: expected a host name (a string), got {_kind(node)}")
    if not _HOST.fullmatch(node):
        raise ValueError(f"node: expected a host name (letters, digits, '-', '_', '.'; at most {MAX_NODE_NAME} "
                         f"characters), got {_show(node)}")
    rack = body.get("rack")
    if rack is not None and (not isinstance(rack, str) or not _RACK.fullmatch(rack)):
        raise ValueError(f"rack: expected null or a rack name (letters, digits, '.', '_', '-'; at most 63), "
                         f"got {_show(rack)}")

    labels = body.get("labels", {})
    if not isinstance(labels, dict):
        raise ValueError(f"labels: expected an object of label -> value, got {_kind(labels)}")
    if len(labels) > MAX_LABELS:
        raise ValueError(f"labels: {len(labels)} entries; at most {MAX_LABELS}")
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_KEY.fullmatch(k):
            raise ValueError(f"labels: {_show(k)} is not a label key (like 'pool' or 'example.com/pool')")
        if not isinstance(v, str) or not _LABEL_VALUE.fullmatch(v):
            raise ValueError(f"labels[{k!r}]: {_show(v)} is not a label value (at most 63 letters, digits, "
                             "'-', '_', '.')")

    holdings = body.get("holdings", [])
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

    intent = body.get("intent", {})
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
            _version(ref, f"intent[{_show(m)}]")
        wants[m] = _version(v, f"intent[{_show(m)}]")
    return {"node": node, "rack": rack, "labels": dict(labels), "holdings": rows, "intent": wants,
            "weightd": sender}


class FleetView:
    """The reports of the nodes heard from within ``ttl_s`` (at most ``max_nodes`` of them), and the
    aggregate the origin serves. One owner: the origin's asyncio loop (see the module docstring)."""

    def __init__(self, *, ttl_s: float = 300.0, max_nodes: int = 10_000,
                 clock: Callable[[], float] = time.time) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) or ttl_s <= 0:
            raise ValueError(f"ttl_s: expected a positive number of seconds, got {ttl_s!r}")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ValueError(f"max_nodes: expected a positive integer, got {max_nodes!r}")
        self.ttl_s, self.max_nodes, self._clock = float(ttl_s), max_nodes, clock
        self._nodes: dict[tuple[str, str], dict[str, Any]] = {}   # (ip, node) -> checked report

    def __len__(self) -> int:
        return len(self._nodes)

    def _expire(self, now: float) -> None:
        for key in [k for k, r in self._nodes.items() if now - r["received_at"] > self.ttl_s]:
            del self._nodes[key]

    def report(self, remote_ip: str, body: Any) -> None:
        """Keep a worker's report (``body``, decoded JSON from ``remote_ip``) in place of that node's
        previous one; ValueError (one line) if the report is refused or the view is full."""
        try:
            ip = str(ipaddress.ip_address(remote_ip))
        except ValueError:
            raise ValueError(f"remote address {_show(remote_ip)} is not an IP address") from None
        r = check_report(body)
        now = self._clock()
        self._expire(now)
        key = (ip, r["node"])
        if key not in self._nodes:
            if len(self._nodes) >= self.max_nodes:
                raise ValueError(f"fleet view full: {self.max_nodes} nodes reported within {self.ttl_s:g} s")
            # a node is an address (hostNetwork, one daemon each); a few names per address allow a
            # rename, not one peer filling the view with invented nodes
            if sum(1 for k in self._nodes if k[0] == ip) >= MAX_NODES_PER_IP:
                raise ValueError(f"{MAX_NODES_PER_IP} node names already report from {ip}")
        self._nodes[key] = {**r, "ip": ip, "received_at": now}

    def _sorted(self) -> list[dict[str, Any]]:
        return sorted(self._nodes.values(), key=lambda r: (r["node"], r["ip"]))

    def view(self) -> dict[str, Any]:
        """``{"nodes": [...], "versions": [...], "generated_at": t}`` of the nodes heard from within
        ``ttl_s`` (older ones are forgotten here). A node: ``node``, ``ip``, ``rack``, ``labels``,
        ``intent``, ``weightd`` (the version it runs, null when its report did not say), ``age_s``
        (since its report), ``holdings`` (as reported, sorted). A version:
        ``model``, ``version``, ``nodes`` (``hot``, ``warm``: nodes with a copy in that tier; ``total``:
        nodes with any copy), ``serving`` (nodes serving it), ``resident_avg`` (over those nodes, each
        by its most resident copy). Nodes sorted by name then address; versions by model then version."""
        now = self._clock()
        self._expire(now)
        nodes, per_version = [], {}
        for r in self._sorted():
            holdings = sorted((dict(h) for h in r["holdings"]), key=lambda h: (h["model"], h["version"], h["tier"]))
            nodes.append({"node": r["node"], "ip": r["ip"], "rack": r["rack"], "labels": dict(r["labels"]),
                          "intent": dict(r["intent"]), "weightd": r["weightd"],
                          "age_s": round(max(0.0, now - r["received_at"]), 1), "holdings": holdings})
            for (model, version), copies in _by_version(r["holdings"]).items():
                v = per_version.setdefault((model, version), {"hot": 0, "warm": 0, "total": 0, "serving": 0,
                                                              "resident": []})
                for tier in TIERS:
                    v[tier] += any(h["tier"] == tier for h in copies)
                v["total"] += 1
                v["serving"] += any(h["serving"] for h in copies)
                v["resident"].append(max(h["resident"] for h in copies))
        versions = [{"model": model, "version": version,
                     "nodes": {"hot": v["hot"], "warm": v["warm"], "total": v["total"]},
                     "serving": v["serving"], "resident_avg": round(sum(v["resident"]) / len(v["resident"]), 4)}
                    for (model, version), v in sorted(per_version.items())]
        return {"nodes": nodes, "versions": versions, "generated_at": now}

    def rows(self) -> list[dict[str, Any]]:
        """One row per (node, model, version), what ``weightd fleet status`` prints: ``node``, ``ip``,
        ``rack``, ``model``, ``version``, ``tier`` (the best it is in: hot, else warm), ``tiers`` (all),
        ``resident_percent`` (its most resident copy, one decimal), ``bytes``, ``serving`` (any copy),
        ``intended`` (the node's intent names this version), ``age_s`` (since the node's report).
        Sorted by node, address, model, version; expired nodes are forgotten as in :meth:`view`."""
        now = self._clock()
        self._expire(now)
        out = []
        for r in self._sorted():
            wanted = {(k.partition("@")[0], v) for k, v in r["intent"].items()}
            age = round(max(0.0, now - r["received_at"]), 1)
            for (model, version), copies in sorted(_by_version(r["holdings"]).items()):
                tiers = [t for t in TIERS if any(h["tier"] == t for h in copies)]
                out.append({"node": r["node"], "ip": r["ip"], "rack": r["rack"], "model": model,
                            "version": version, "tier": tiers[0], "tiers": tiers,
                            "resident_percent": round(100.0 * max(h["resident"] for h in copies), 1),
                            "bytes": max(h["bytes"] for h in copies),
                            "serving": any(h["serving"] for h in copies),
                            "intended": (model, version) in wanted, "age_s": age})
        return out


def _by_version(holdings: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for h in holdings:
        out.setdefault((h["model"], h["version"]), []).append(h)
    return out
