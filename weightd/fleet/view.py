"""The origin's view of what its workers hold, from the reports they POST every ``[intent] report_s``
(``POST /v1/fleet/report``, each checked by :func:`weightd.fleet.report.check_report`: nothing of a
refused report is kept), for ``GET /v1/fleet`` and ``weightd fleet status``. A node is (its address,
the name it reports); a node that stops reporting leaves the view ``ttl_s`` after its last report.

Bounded: reports held take at most ``budget_bytes`` (each report counted by :func:`report_bytes`, about
the size of its JSON in the view); a report that does not fit evicts the largest held reports (the
oldest first among equals) that are larger than it, else it is refused (:class:`ReportRefused`, 413). The
cheapest way to fill the view is a few huge reports, and those are what goes first; a node sending a
report of ordinary size keeps its place unless the budget is full of reports as small as its own.
Holdings are kept as tuples of interned strings (one copy of a model's name however many nodes hold
it), so what the budget counts is about what the process holds.

Not thread-safe: a :class:`FleetView` belongs to the origin's asyncio loop, whose handlers call it
without awaiting in between, so it takes no lock (call it from that loop only). :meth:`FleetView.snapshot`
hands the reports (never changed once kept: a new report replaces the record) to :func:`build_view`,
which may run in a thread: a large view is built off the loop.
"""

from __future__ import annotations

import ipaddress
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from ..errors import ReportRefused
from .report import HOLDING_KEYS, READY_KEYS, TIERS, check_report, report_bytes, show

MAX_NODES_PER_IP = 4              # node names one address may report as, within ttl_s
DEFAULT_BUDGET = 64 << 20         # bytes of reports held ([intent] fleet_budget)
PAGE_BYTES = 4 << 20              # a page of GET /v1/fleet holds reports of about this many bytes at most
MAX_PAGE_NODES = 10_000
MAX_VERSIONS = 4096               # versions in one answer (``versions_cut`` counts the rest; ?model= narrows)


def _holding_tuple(h: dict[str, Any]) -> tuple[Any, ...]:
    return (sys.intern(h["model"]), sys.intern(h["version"]), sys.intern(h["tier"]), h["resident"], h["bytes"],
            h["since"], h["serving"])


def _holding_dict(t: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(HOLDING_KEYS, t))


class FleetView:
    """The reports of the nodes heard from within ``ttl_s`` (at most ``max_nodes`` of them, at most
    ``budget_bytes`` of reports), and the aggregate the origin serves. One owner: the origin's asyncio
    loop (see the module docstring)."""

    def __init__(self, *, ttl_s: float = 300.0, max_nodes: int = 10_000, budget_bytes: int = DEFAULT_BUDGET,
                 clock: Callable[[], float] = time.time) -> None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not math.isfinite(ttl_s) or ttl_s <= 0:
            raise ValueError(f"ttl_s: expected a positive number of seconds, got {ttl_s!r}")
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ValueError(f"max_nodes: expected a positive integer, got {max_nodes!r}")
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"budget_bytes: expected a positive integer, got {budget_bytes!r}")
        self.ttl_s, self.max_nodes, self.budget, self._clock = float(ttl_s), max_nodes, budget_bytes, clock
        self._nodes: dict[tuple[str, str], dict[str, Any]] = {}   # (ip, node) -> checked report
        self.held_bytes = 0
        self.evicted = 0          # reports evicted to make room (the largest first)
        self.ready_dropped = 0    # ready estimates dropped from kept reports (weightd.fleet.report._ready)

    def __len__(self) -> int:
        return len(self._nodes)

    def _drop(self, key: tuple[str, str]) -> None:
        self.held_bytes -= self._nodes.pop(key)["size"]

    def _expire(self, now: float) -> None:
        for key in [k for k, r in self._nodes.items() if now - r["received_at"] > self.ttl_s]:
            self._drop(key)

    def member(self, remote_ip: str) -> bool:
        """Whether ``remote_ip`` is a node of this fleet as the origin knows one: it sent a valid report
        that is held (within ``ttl_s``)."""
        try:
            ip = str(ipaddress.ip_address(remote_ip))
        except ValueError:
            return False
        self._expire(self._clock())
        return any(k[0] == ip for k in self._nodes)

    def report(self, remote_ip: str, body: Any) -> None:
        """Keep a worker's report (``body``, decoded JSON from ``remote_ip``) in place of that node's
        previous one; :class:`ReportRefused` (one line, with its HTTP status) if the report is refused, the
        view is full or the report finds no room in the budget."""
        try:
            ip = str(ipaddress.ip_address(remote_ip))
        except ValueError:
            raise ReportRefused(f"remote address {show(remote_ip)} is not an IP address") from None
        try:
            r = check_report(body)
        except ValueError as exc:
            raise ReportRefused(str(exc)) from None
        now = self._clock()
        self._expire(now)
        key = (ip, r["node"])
        if key not in self._nodes:
            if len(self._nodes) >= self.max_nodes:
                raise ReportRefused(f"fleet view full: {self.max_nodes} nodes reported within {self.ttl_s:g} s", 429)
            # a node is an address (hostNetwork, one daemon each); a few names per address allow a
            # rename, not one peer filling the view with invented nodes
            if sum(1 for k in self._nodes if k[0] == ip) >= MAX_NODES_PER_IP:
                raise ReportRefused(f"{MAX_NODES_PER_IP} node names already report from {ip}", 429)
        size = report_bytes(r)
        if size > self.budget:
            raise ReportRefused(f"report of {size} bytes is larger than the fleet view's whole budget ({self.budget} "
                          "bytes, [intent] fleet_budget)", 413)
        old = self._nodes.get(key)
        free = self.budget - self.held_bytes + (old["size"] if old is not None else 0)
        if size > free:
            # room from the largest reports larger than this one (the oldest first among equals)
            victims, room = [], free
            for k, held in sorted(((k, x) for k, x in self._nodes.items() if k != key and x["size"] > size),
                                  key=lambda kx: (-kx[1]["size"], kx[1]["received_at"])):
                if room >= size:
                    break
                victims.append(k)
                room += held["size"]
            if room < size:
                raise ReportRefused(f"fleet view budget full: {self.held_bytes} of {self.budget} bytes held ([intent] "
                              f"fleet_budget) and no held report is larger than this one ({size} bytes)", 413)
            for k in victims:
                self._drop(k)
                self.evicted += 1
        if old is not None:
            self._drop(key)
        self._nodes[key] = {"node": r["node"], "rack": r["rack"], "labels": r["labels"], "intent": r["intent"],
                            "weightd": r["weightd"], "origins": r["origins"], "holdings": tuple(_holding_tuple(h) for h in r["holdings"]),
                            "ready": tuple((sys.intern(e["model"]), sys.intern(e["version"]), e["tier"], e["seconds"])
                                           for e in r["ready"]),
                            "ready_dropped": r["ready_dropped"], "ip": ip, "received_at": now, "size": size}
        self.held_bytes += size
        self.ready_dropped += r["ready_dropped"]

    def origin_lists(self) -> dict[str, int]:
        """How many held reports carry each list of origins (its hash; reports that did not say, left out)."""
        out: dict[str, int] = {}
        self._expire(self._clock())
        for r in self._nodes.values():
            if r.get("origins"):
                out[r["origins"]] = out.get(r["origins"], 0) + 1
        return out

    def snapshot(self) -> tuple[list[dict[str, Any]], float]:
        """The held reports (records never changed once kept) sorted by node then address, and now:
        what :func:`build_view` needs, taken on the loop in one step."""
        now = self._clock()
        self._expire(now)
        return sorted(self._nodes.values(), key=lambda r: (r["node"], r["ip"])), now

    def view(self, *, model: str | None = None, after: str | None = None, limit: int | None = None
             ) -> dict[str, Any]:
        """:func:`build_view` of the held reports (here, on the caller's thread)."""
        records, now = self.snapshot()
        return build_view(records, now, model=model, after=after, limit=limit)

    def rows(self) -> list[dict[str, Any]]:
        """One row per (node, model, version), what ``weightd fleet status`` prints: ``node``, ``ip``,
        ``rack``, ``model``, ``version``, ``tier`` (the best it is in: hot, else warm), ``tiers`` (all),
        ``resident_percent`` (its most resident copy, one decimal), ``bytes``, ``serving`` (any copy),
        ``intended`` (the node's intent names this version), ``ready_s`` (the node's estimate of
        the seconds until a server could read it, null when it sent none), ``age_s`` (since the
        node's report).
        Sorted by node, address, model, version; expired nodes are forgotten as in :meth:`view`."""
        records, now = self.snapshot()
        out = []
        for r in records:
            wanted = {(k.partition("@")[0], v) for k, v in r["intent"].items()}
            ready = ready_index(r)
            age = round(max(0.0, now - r["received_at"]), 1)
            for (model, version), copies in sorted(_by_version([_holding_dict(h) for h in r["holdings"]]).items()):
                tiers = [t for t in TIERS if any(h["tier"] == t for h in copies)]
                out.append({"node": r["node"], "ip": r["ip"], "rack": r["rack"], "model": model,
                            "version": version, "tier": tiers[0], "tiers": tiers,
                            "resident_percent": round(100.0 * max(h["resident"] for h in copies), 1),
                            "bytes": max(h["bytes"] for h in copies),
                            "serving": any(h["serving"] for h in copies),
                            "intended": (model, version) in wanted,
                            "ready_s": ready.get((model, version)), "age_s": age})
        return out


def build_view(records: list[dict[str, Any]], now: float, *, model: str | None = None, after: str | None = None,
               limit: int | None = None, page_bytes: int = PAGE_BYTES) -> dict[str, Any]:
    """``{"nodes": [...], "versions": [...], "generated_at": t}`` of ``records`` (from
    :meth:`FleetView.snapshot`; pure, so it may run in a thread). A node: ``node``, ``ip``, ``rack``,
    ``labels``, ``intent``, ``weightd`` (the version it runs, null when its report did not say),
    ``origins`` (the hash of the origins it lists, null when not said),
    ``age_s`` (since its report), ``holdings`` (as reported, sorted), ``ready`` (its ready estimates:
    ``model``, ``version``, ``tier``, ``seconds``, sorted; the worker's own claim, of versions it holds
    or models its intent names), ``ready_dropped`` (only when its last report had estimates dropped). A version: ``model``,
    ``version``, ``nodes`` (``hot``, ``warm``: nodes with a copy in that tier; ``total``: nodes with
    any copy), ``serving`` (nodes serving it), ``resident_avg`` (over those nodes, each by its most
    resident copy). Nodes sorted by name then address; versions by model then version.

    ``model``: only nodes that hold or intend that model, with only its holdings and versions.
    ``limit`` (or ``page_bytes`` of reports, whichever comes first; at least one node): a page of the
    nodes after the node ``after`` (``NODE@IP``, as the last page's ``next`` says); ``next`` is there
    when more nodes follow. ``versions`` count every node the filter keeps, on the first page only."""
    if model is not None:
        records = _narrowed(records, model)
    doc: dict[str, Any] = {"nodes": [], "generated_at": now}
    if after is None:
        doc.update(versions_of([_holding_dict(h) for h in r["holdings"]] for r in records))
    else:
        node, _, ip = after.partition("@")
        records = [r for r in records if (r["node"], r["ip"]) > (node, ip)]
        doc["versions"] = []
    nodes, size = doc["nodes"], 0
    for i, r in enumerate(records):
        if nodes and (limit is not None and len(nodes) >= limit or size + r["size"] > page_bytes):
            last = nodes[-1]
            doc["next"] = f"{last['node']}@{last['ip']}"
            break
        size += r["size"]
        holdings = sorted((_holding_dict(h) for h in r["holdings"]), key=lambda h: (h["model"], h["version"], h["tier"]))
        nodes.append({"node": r["node"], "ip": r["ip"], "rack": r["rack"], "labels": dict(r["labels"]),
                      "intent": dict(r["intent"]), "weightd": r["weightd"], "origins": r.get("origins"),
                      "age_s": round(max(0.0, now - r["received_at"]), 1), "holdings": holdings,
                      "ready": [dict(zip(READY_KEYS, e)) for e in sorted(r.get("ready", ()))],
                      **({"ready_dropped": r["ready_dropped"]} if r.get("ready_dropped") else {})})
    return {"nodes": doc["nodes"], "versions": doc["versions"], "generated_at": now,
            **{k: doc[k] for k in ("versions_cut", "next") if k in doc}}


def versions_of(per_node: Any) -> dict[str, Any]:
    """``{"versions": [...]}`` (and ``versions_cut`` past MAX_VERSIONS) of the nodes' holdings, one
    list of holding dicts per node: how many nodes hold each version in each tier, serve it, and its
    average residency (each node by its most resident copy)."""
    per_version: dict[tuple[str, str], dict[str, Any]] = {}
    for holdings in per_node:
        for (m, version), copies in _by_version(holdings).items():
            v = per_version.setdefault((m, version), {"hot": 0, "warm": 0, "total": 0, "serving": 0, "resident": []})
            for tier in TIERS:
                v[tier] += any(h["tier"] == tier for h in copies)
            v["total"] += 1
            v["serving"] += any(h["serving"] for h in copies)
            v["resident"].append(max(h["resident"] for h in copies))
    ordered = sorted(per_version.items())
    out: dict[str, Any] = {"versions": [
        {"model": m, "version": version, "nodes": {"hot": v["hot"], "warm": v["warm"], "total": v["total"]},
         "serving": v["serving"], "resident_avg": round(sum(v["resident"]) / len(v["resident"]), 4)}
        for (m, version), v in ordered[:MAX_VERSIONS]]}
    if len(ordered) > MAX_VERSIONS:
        out["versions_cut"] = len(ordered) - MAX_VERSIONS
    return out


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def view_problem(doc: Any) -> str | None:
    """Why ``doc`` (an origin's GET /v1/fleet, pages joined) is not a fleet view that ``fleet status``
    can merge and print, else None: ``nodes`` a list of objects with a string ``node`` and ``ip``, a
    number ``age_s``, ``holdings`` (string model, version, tier; number resident) and ``ready`` (string
    model, version, tier; number or null seconds) lists; ``movers`` a list; ``max_movers`` an integer
    or null. One origin's nonsense is then that origin's error, not the whole command's."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        return "'nodes' is not a list"
    if not isinstance(doc.get("movers", []), list):
        return "'movers' is not a list"
    if doc.get("max_movers") is not None and (not isinstance(doc["max_movers"], int) or isinstance(doc["max_movers"], bool)):
        return "'max_movers' is not an integer"
    for i, n in enumerate(nodes):
        if not isinstance(n, dict):
            return f"node {i} is not an object"
        if not (isinstance(n.get("node"), str) and isinstance(n.get("ip"), str) and _num(n.get("age_s", 0))):
            return f"node {i}: 'node' and 'ip' must be strings, 'age_s' a number"
        if not all(isinstance(n.get(k), (str, type(None))) for k in ("rack", "weightd")):
            return f"node {i}: 'rack' and 'weightd' must be strings or null"
        holdings, ready = n.get("holdings") or [], n.get("ready") or []
        if not isinstance(holdings, list) or not isinstance(ready, list):
            return f"node {i}: 'holdings' and 'ready' must be lists"
        for h in holdings:
            if not (isinstance(h, dict) and all(isinstance(h.get(k), str) for k in ("model", "version", "tier"))
                    and _num(h.get("resident", 0))):
                return f"node {i}: a holding without string model, version, tier and a number resident"
        for e in ready:
            if not (isinstance(e, dict) and all(isinstance(e.get(k), str) for k in ("model", "version", "tier"))
                    and (e.get("seconds") is None or _num(e.get("seconds")))):
                return f"node {i}: a ready estimate without string model, version, tier and number seconds"
    return None


def merged(answers: list[tuple[str, Any]]) -> dict[str, Any]:
    """One view of the views several origins answered (``(url, doc)``; a doc that is not a dict is
    that origin's error): each node as the origin with its newest report has it (the smallest
    ``age_s``), versions counted again over those nodes, and ``origins``: per origin its url and
    either ``nodes`` and ``movers`` (with ``max_movers``) or ``error``. Each origin counts its own
    slots: a worker moves while a majority of them grant it one (:mod:`.rollout`)."""
    nodes: dict[tuple[str, str], dict[str, Any]] = {}
    origins = []
    for url, doc in answers:
        if not isinstance(doc, dict):
            origins.append({"url": url, "error": str(doc)[:300]})
            continue
        origins.append({"url": url, "nodes": len(doc.get("nodes") or []), "movers": doc.get("movers") or [],
                        "max_movers": doc.get("max_movers")})
        for n in doc.get("nodes") or []:
            key = (str(n.get("node")), str(n.get("ip")))
            if key not in nodes or n.get("age_s", 0.0) < nodes[key].get("age_s", 0.0):
                nodes[key] = n
    kept = [nodes[k] for k in sorted(nodes)]
    return {"nodes": kept, **versions_of(n.get("holdings") or [] for n in kept), "origins": origins}


def origin_list_warning(nodes: list[dict[str, Any]]) -> str | None:
    """One line when the nodes' reports carry different lists of origins (each worker counts its slot
    majority over its own list, so the rollout cap is not kept: docs/origins.md), naming a few nodes
    off the most common list; else None."""
    lists: dict[str, list[str]] = {}
    for n in nodes:
        if isinstance(n.get("origins"), str):
            lists.setdefault(n["origins"], []).append(str(n.get("node")))
    if len(lists) < 2:
        return None
    usual = max(lists, key=lambda h: len(lists[h]))
    odd = sorted(x for h, ns in lists.items() if h != usual for x in ns)
    return (f"the nodes list {len(lists)} different origin lists ({len(lists[usual])} node(s) share the most "
            f"common); not on it: {', '.join(odd[:5])}{' ...' if len(odd) > 5 else ''}: the rollout cap holds "
            "only when every worker lists the same origins")


def _narrowed(records: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The records of nodes that hold, intend or estimate ``model``, with only what concerns it."""
    kept = []
    for r in records:
        hs = tuple(h for h in r["holdings"] if h[0] == model)
        wants = {k: v for k, v in r["intent"].items() if k.partition("@")[0] == model}
        ready = tuple(e for e in r.get("ready", ()) if e[0] == model)
        if hs or wants or ready:
            kept.append({**r, "holdings": hs, "intent": wants, "ready": ready})
    return kept


def encode(doc: dict[str, Any]) -> bytes:
    """``doc`` as compact JSON, a node at a time: from a thread, the encoder never holds the GIL (and so
    the loop) longer than one node's report takes."""
    rest = {k: v for k, v in doc.items() if k != "nodes"}
    parts = [json.dumps(n, separators=(",", ":")).encode() for n in doc.get("nodes", [])]
    head = json.dumps(rest, separators=(",", ":")).encode()
    return b'{"nodes":[' + b",".join(parts) + b"]," + head[1:] if rest else b'{"nodes":[' + b",".join(parts) + b"]}"


def _by_version(holdings: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for h in holdings:
        out.setdefault((h["model"], h["version"]), []).append(h)
    return out


def ready_index(node: dict[str, Any]) -> dict[tuple[str, str | None], float]:
    """A node's (a held record or a view's node) least ready estimate per (model, version) and per
    (model, None) (any version): built once per node, looked up per printed row."""
    out: dict[tuple[str, str | None], float] = {}
    for e in node.get("ready", ()):
        m, v, sec = (e["model"], e["version"], e["seconds"]) if isinstance(e, dict) else (e[0], e[1], e[3])
        for key in ((m, v), (m, None)):
            if key not in out or sec < out[key]:
                out[key] = sec
    return out


def by_readiness(nodes: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """The view's ``nodes`` sorted by how soon each could serve ``model`` (its least ready estimate;
    nodes without one last), then by name: ``weightd fleet status --model``."""
    def key(n: dict[str, Any]) -> tuple[bool, float, str]:
        s = ready_index(n).get((model, None))
        return (s is None, s or 0.0, str(n.get("node")))
    return sorted(nodes, key=key)
