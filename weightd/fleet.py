"""The origin's view of what its workers hold, from their reports (``POST /v1/fleet/report``), for
``GET /v1/fleet`` and ``weightd fleet status``. A report comes from the network: everything in it is
checked (types, sizes, names as weightd names them) before it is kept, and a node that stops
reporting leaves the view after ``ttl_s``. Owned by the origin's asyncio loop (no lock)."""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable

MAX_HOLDINGS = 1024
MAX_LABELS = 64
_NODE = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,252}")
_SHORT = re.compile(r"[-A-Za-z0-9_./]{0,63}")
TIERS = ("hot", "warm")


def _checked(v: Any, what: str, kind: str) -> str:
    """A model name (``kind="name"``) or version, as weightd's own rules have them."""
    import tiering
    if not isinstance(v, str) or len(v) > 300:
        raise ValueError(f"{what}: expected a model {kind}")
    try:
        (tiering.validate_name if kind == "name" else tiering.validate_version)(v)
    except tiering.InvalidName as exc:
        raise ValueError(f"{what}: {exc}") from None
    return v


def _name(v: Any, what: str) -> str:
    return _checked(v, what, "name")


def _version(v: Any, what: str) -> str:
    return _checked(v, what, "version")


def _number(v: Any, what: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{what}: expected a number from {lo:g} to {hi:g}")
    return float(v)


def check_report(body: Any) -> dict[str, Any]:
    """A worker's report, checked; ValueError naming the first problem."""
    if not isinstance(body, dict):
        raise ValueError("report: expected a JSON object")
    unknown = set(body) - {"node", "rack", "labels", "holdings", "intent"}
    if unknown:
        raise ValueError(f"report: unknown key {sorted(unknown)[0][:40]!r}")
    node = body.get("node")
    if not isinstance(node, str) or not _NODE.fullmatch(node):
        raise ValueError("node: expected a host name (letters, digits, '-', '_', '.'; at most 253)")
    rack = body.get("rack")
    if rack is not None and (not isinstance(rack, str) or not _SHORT.fullmatch(rack)):
        raise ValueError("rack: expected a rack name")
    labels = body.get("labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 317 and len(v) <= 63 for k, v in labels.items()):
        raise ValueError(f"labels: expected at most {MAX_LABELS} short string labels")
    holdings = body.get("holdings", [])
    if not isinstance(holdings, list):
        raise ValueError("holdings: expected a list")
    if len(holdings) > MAX_HOLDINGS:
        raise ValueError(f"holdings: {len(holdings)} rows; at most {MAX_HOLDINGS}")
    rows = []
    for i, h in enumerate(holdings):
        where = f"holdings[{i}]"
        if not isinstance(h, dict):
            raise ValueError(f"{where}: expected an object")
        tier = h.get("tier")
        if tier not in TIERS:
            raise ValueError(f"{where}.tier: expected hot or warm")
        serving = h.get("serving", False)
        if not isinstance(serving, bool):
            raise ValueError(f"{where}.serving: expected true or false")
        b = h.get("bytes", 0)
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < 1 << 60:
            raise ValueError(f"{where}.bytes: expected a byte count")
        rows.append({"model": _name(h.get("model"), f"{where}.model"),
                     "version": _version(h.get("version"), f"{where}.version"), "tier": tier,
                     "resident": _number(h.get("resident", 0.0), f"{where}.resident", 0, 1), "bytes": b,
                     "since": _number(h.get("since", 0.0), f"{where}.since", 0, 1e11), "serving": serving})
    intent = body.get("intent", {})
    if not isinstance(intent, dict) or len(intent) > MAX_HOLDINGS:
        raise ValueError("intent: expected an object of model -> version")
    for m, v in intent.items():
        _name(m.partition("@")[0] if isinstance(m, str) else m, "intent")
        _version(v, f"intent[{m[:60]!r}]")
    return {"node": node, "rack": rack, "labels": dict(labels), "holdings": rows, "intent": dict(intent)}


class FleetView:
    def __init__(self, *, ttl_s: float = 300.0, max_nodes: int = 10_000, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s, self.max_nodes, self.clock = ttl_s, max_nodes, clock
        self.nodes: dict[tuple[str, str], dict[str, Any]] = {}

    def _expire(self) -> None:
        now = self.clock()
        for key in [k for k, n in self.nodes.items() if now - n["received_at"] > self.ttl_s]:
            del self.nodes[key]

    def report(self, remote_ip: str, body: Any) -> None:
        r = check_report(body)
        self._expire()
        key = (remote_ip, r["node"])
        if key not in self.nodes and len(self.nodes) >= self.max_nodes:
            raise ValueError(f"fleet view full ({self.max_nodes} nodes)")
        self.nodes[key] = {**r, "ip": remote_ip, "received_at": self.clock()}

    def view(self) -> dict[str, Any]:
        self._expire()
        now = self.clock()
        nodes = [{"node": n["node"], "ip": n["ip"], "rack": n["rack"], "labels": n["labels"],
                  "age_s": round(now - n["received_at"], 1), "holdings": n["holdings"], "intent": n["intent"]}
                 for _, n in sorted(self.nodes.items())]
        versions: dict[tuple[str, str], dict[str, Any]] = {}
        for n in nodes:
            for h in n["holdings"]:
                v = versions.setdefault((h["model"], h["version"]), {"model": h["model"], "version": h["version"],
                                                                     "nodes": {"hot": 0, "warm": 0, "total": 0},
                                                                     "serving": 0, "_res": []})
                v["nodes"][h["tier"]] += 1
                v["serving"] += h["serving"]
                v["_res"].append(h["resident"])
        out = []
        for _, v in sorted(versions.items()):
            res = v.pop("_res")
            v["nodes"]["total"] = len({n["node"] for n in nodes for h in n["holdings"]
                                       if (h["model"], h["version"]) == (v["model"], v["version"])})
            v["resident_avg"] = round(sum(res) / len(res), 4)
            out.append(v)
        return {"generated_at": now, "nodes": nodes, "versions": out}

    def rows(self) -> list[dict[str, Any]]:
        return [{"node": n["node"], "rack": n["rack"], "model": h["model"], "version": h["version"], "tier": h["tier"],
                 "resident_percent": round(100 * h["resident"], 1), "serving": h["serving"], "age_s": n["age_s"]}
                for n in self.view()["nodes"] for h in n["holdings"]]
