"""weightd.fleet.view.FleetView: the origin's view of its workers' reports, with an injected clock and
hostile report bodies (each refused with a message that names the problem)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from weightd.fleet.report import check_report
from weightd.fleet.view import FleetView

IP_A, IP_B = "10.0.0.1", "10.0.0.2"


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def holding(model: str = "acme/llama-70b", version: str = "v3", tier: str = "warm", **kw: Any) -> dict[str, Any]:
    return {"model": model, "version": version, "tier": tier, "resident": 0.5, "bytes": 140_000_000_000,
            "since": 1_699_990_000.0, "serving": False, **kw}


def estimate(model: str = "acme/llama-70b", version: str = "v3", tier: str = "hot", seconds: Any = 12.5
             ) -> dict[str, Any]:
    return {"model": model, "version": version, "tier": tier, "seconds": seconds}


def report(node: str = "gpu-1", *holdings: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"node": node, "rack": "r1", "labels": {"pool": "chat", "example.com/gpu": "h100"},
            "holdings": list(holdings) or [holding()], "intent": {"acme/llama-70b@latest": "v3"}, **kw}


def test_good_report_then_view() -> None:
    clock = Clock()
    fv = FleetView(clock=clock)
    fv.report(IP_A, report("gpu-1", holding(tier="hot", resident=1.0, serving=True), holding(resident=0.25),
                           holding(model="acme/embed", version="2024-05-01", resident=1.0)))
    fv.report(IP_B, report("gpu-0", holding(resident=0.75), rack=None))
    clock.t += 12.34
    view = fv.view()
    assert view["generated_at"] == clock.t
    assert [(n["node"], n["ip"], n["rack"], n["age_s"]) for n in view["nodes"]] == [
        ("gpu-0", IP_B, None, 12.3), ("gpu-1", IP_A, "r1", 12.3)]
    gpu1 = view["nodes"][1]
    assert [(h["model"], h["version"], h["tier"]) for h in gpu1["holdings"]] == [
        ("acme/embed", "2024-05-01", "warm"), ("acme/llama-70b", "v3", "hot"), ("acme/llama-70b", "v3", "warm")]
    assert gpu1["holdings"][1] == {"model": "acme/llama-70b", "version": "v3", "tier": "hot", "resident": 1.0,
                                   "bytes": 140_000_000_000, "since": 1_699_990_000.0, "serving": True}
    assert gpu1["labels"] == {"pool": "chat", "example.com/gpu": "h100"}
    assert gpu1["intent"] == {"acme/llama-70b@latest": "v3"}
    assert view["versions"] == [
        {"model": "acme/embed", "version": "2024-05-01", "nodes": {"hot": 0, "warm": 1, "total": 1},
         "serving": 0, "resident_avg": 1.0},
        {"model": "acme/llama-70b", "version": "v3", "nodes": {"hot": 1, "warm": 2, "total": 2},
         "serving": 1, "resident_avg": 0.875},   # (gpu-1 by its most resident copy: 1.0; gpu-0: 0.75)
    ]
    json.dumps(view)   # what GET /v1/fleet answers


def test_rows_one_per_node_model_version() -> None:
    clock = Clock()
    fv = FleetView(clock=clock)
    fv.report(IP_A, report("gpu-1", holding(tier="hot", resident=1.0, serving=True), holding(resident=0.25),
                           holding(version="v2", resident=0.123)))
    clock.t += 5
    assert fv.rows() == [
        {"node": "gpu-1", "ip": IP_A, "rack": "r1", "model": "acme/llama-70b", "version": "v2", "tier": "warm",
         "tiers": ["warm"], "resident_percent": 12.3, "bytes": 140_000_000_000, "serving": False,
         "intended": False, "ready_s": None, "age_s": 5.0},
        {"node": "gpu-1", "ip": IP_A, "rack": "r1", "model": "acme/llama-70b", "version": "v3", "tier": "hot",
         "tiers": ["hot", "warm"], "resident_percent": 100.0, "bytes": 140_000_000_000, "serving": True,
         "intended": True, "ready_s": None, "age_s": 5.0},
    ]


def test_a_report_replaces_that_nodes_last_one() -> None:
    clock = Clock()
    fv = FleetView(clock=clock)
    fv.report(IP_A, report("gpu-1", holding(version="v2")))
    clock.t += 60
    fv.report(IP_A, report("gpu-1", holding(version="v3")))
    fv.report(IP_B, report("gpu-1", holding(version="v1")))   # same name, another address: another node
    view = fv.view()
    assert [(n["ip"], n["age_s"], [h["version"] for h in n["holdings"]]) for n in view["nodes"]] == [
        (IP_A, 0.0, ["v3"]), (IP_B, 0.0, ["v1"])]
    assert [v["version"] for v in view["versions"]] == ["v1", "v3"]


def test_the_report_is_copied_not_referenced() -> None:
    fv = FleetView(clock=Clock())
    body = report()
    fv.report(IP_A, body)
    body["holdings"][0]["tier"] = "cold"
    body["labels"]["pool"] = "evil"
    assert fv.view()["nodes"][0]["holdings"][0]["tier"] == "warm"
    assert fv.view()["nodes"][0]["labels"]["pool"] == "chat"
    fv.view()["nodes"][0]["holdings"][0]["tier"] = "cold"   # nor is the view a reference to the state
    assert fv.rows()[0]["tier"] == "warm"


def test_nodes_expire_after_ttl() -> None:
    clock = Clock()
    fv = FleetView(ttl_s=300, clock=clock)
    fv.report(IP_A, report("gpu-1"))
    clock.t += 200
    fv.report(IP_B, report("gpu-2"))
    clock.t += 100            # gpu-1 exactly ttl_s old: still there
    assert [n["node"] for n in fv.view()["nodes"]] == ["gpu-1", "gpu-2"]
    clock.t += 0.5
    assert [(n["node"], n["age_s"]) for n in fv.view()["nodes"]] == [("gpu-2", 100.5)]
    assert len(fv) == 1       # forgotten, not only hidden
    assert [r["node"] for r in fv.rows()] == ["gpu-2"]
    clock.t += 1000
    assert fv.view() == {"nodes": [], "versions": [], "generated_at": clock.t}
    assert len(fv) == 0


def test_max_nodes() -> None:
    clock = Clock()
    fv = FleetView(ttl_s=300, max_nodes=2, clock=clock)
    fv.report(IP_A, report("gpu-1"))
    fv.report(IP_A, report("gpu-2"))
    with pytest.raises(ValueError, match=r"^fleet view full: 2 nodes reported within 300 s$"):
        fv.report(IP_B, report("gpu-1"))
    fv.report(IP_A, report("gpu-2", holding(version="v9")))    # a known node still reports
    clock.t += 301
    fv.report(IP_B, report("gpu-3"))                           # room again once the others expired
    assert [n["node"] for n in fv.view()["nodes"]] == ["gpu-3"]


def test_ipv6_address_is_normalised_and_junk_refused() -> None:
    fv = FleetView(clock=Clock())
    fv.report("fd00:0:0::1", report())
    assert fv.view()["nodes"][0]["ip"] == "fd00::1"
    for bad in ("", "gpu-1", "10.0.0.1:6969"):
        with pytest.raises(ValueError, match="is not an IP address"):
            fv.report(bad, report())


def test_optional_parts_may_be_left_out() -> None:
    fv = FleetView(clock=Clock())
    fv.report(IP_A, {"node": "gpu-1"})
    [n] = fv.view()["nodes"]
    assert (n["rack"], n["labels"], n["holdings"], n["intent"]) == (None, {}, [], {})
    assert fv.rows() == []


def test_a_newer_workers_keys_are_ignored_and_not_kept() -> None:
    """Mixed versions during a rollout: a newer worker (a higher message version, keys this version
    does not know, at the top and in a holding) and an older one (no version, only the required
    keys) are both in the view; nothing unknown is kept or shown to others."""
    fv = FleetView(clock=Clock())
    fv.report(IP_A, {**report("gpu-new", holding(numa_node=0, engine={"name": "vllm"})), "v": 7,
                     "weightd": "0.2.0+g1234", "admin": True, "gpus": [{"uuid": "GPU-0"}] * 3})
    fv.report(IP_B, {"node": "gpu-old", "holdings": [holding()]})
    new, old = sorted(fv.view()["nodes"], key=lambda n: n["node"])
    assert set(new) == set(old) == {"node", "ip", "rack", "labels", "intent", "weightd", "age_s", "holdings", "ready", "origins"}
    assert new["holdings"] == old["holdings"] == [holding()]
    assert (new["weightd"], old["weightd"]) == ("0.2.0+g1234", None)
    assert check_report({"node": "n", "v": 1, "weightd": "0.1.0"})["weightd"] == "0.1.0"


def _h(**kw: Any) -> dict[str, Any]:
    return report("gpu-1", holding(**kw))


HOSTILE: list[tuple[str, Any, str]] = [
    ("not a dict", [report()], "report: expected a JSON object, got a list"),
    ("a string", "gpu-1", "report: expected a JSON object, got a string"),
    ("version not an integer", {**report(), "v": "2"}, "report: 'v': expected the message version, an integer"),
    ("version a boolean", {**report(), "v": True}, "report: 'v': expected the message version"),
    ("version 0", {**report(), "v": 0}, "report: 'v': expected the message version"),
    ("version a float", {**report(), "v": 1.5}, "report: 'v': expected the message version"),
    ("sender not a string", {**report(), "weightd": 1}, "report: 'weightd': expected the sender's weightd version"),
    ("sender with a newline", {**report(), "weightd": "0.1\nx"}, "report: 'weightd': expected the sender's"),
    ("sender too long", {**report(), "weightd": "1" * 65}, "report: 'weightd': expected the sender's"),
    ("no node", {"holdings": []}, "report: missing 'node'"),
    ("node not a string", report(node=7), "node: expected a host name (a string), got an integer"),
    ("node with a slash", report(node="../etc"), "node: expected a host name"),
    ("node too long", report(node="a" * 254), "node: expected a host name"),
    ("node with a newline", report(node="gpu-1\nFAKE"), "node: expected a host name"),
    ("rack not a string", {**report(), "rack": ["r1"]}, "rack: expected null or a rack name"),
    ("labels a list", {**report(), "labels": ["pool=chat"]}, "labels: expected an object of label -> value, got a list"),
    ("too many labels", {**report(), "labels": {f"k{i}": "v" for i in range(65)}}, "labels: 65 entries; at most 64"),
    ("label value a number", {**report(), "labels": {"pool": 3}}, "labels['pool']: 3 is not a label value"),
    ("huge label value", {**report(), "labels": {"pool": "x" * 100_000}}, "labels['pool']: 'xxxxxxxxx"),
    ("bad label key", {**report(), "labels": {"a b": "c"}}, "labels: 'a b' is not a label key"),
    ("holdings an object", {**report(), "holdings": {"model": "acme/x"}}, "holdings: expected a list, got an object"),
    ("2000 holdings", {**report(), "holdings": [holding(version=f"v{i}") for i in range(2000)]},
     "holdings: 2000 entries; at most 1024"),
    ("holding a string", {**report(), "holdings": ["acme/x"]}, "holdings[0]: expected an object, got a string"),
    ("holding without bytes", report("gpu-1", {k: v for k, v in holding().items() if k != "bytes"}),
     "holdings[0]: missing 'bytes'"),
    ("newer holding, known key of the wrong type", _h(numa_node=1, bytes="1GiB"), "holdings[0].bytes: expected"),
    ("model ../etc", _h(model="../etc"), "holdings[0].model: invalid model name '../etc': '.' and '..' are not names"),
    ("model with two slashes", _h(model="a/b/c"), "holdings[0].model: invalid model name 'a/b/c': expected"),
    ("model not a string", _h(model=["acme/x"]), "holdings[0].model: expected a model name (a string), got a list"),
    ("huge model name", _h(model="a" * 1_000_000), "holdings[0].model: model name longer than 511 characters"),
    ("long component", _h(model="a" * 300), "holdings[0].model: invalid model name 'aaaaaaaa"),
    ("version with a slash", _h(version="v1/../../x"), "holdings[0].version: invalid version 'v1/../../x'"),
    ("version a number", _h(version=3), "holdings[0].version: expected a version (a string), got an integer"),
    ("tier cold", _h(tier="cold"), "holdings[0].tier: expected 'hot' or 'warm', got 'cold'"),
    ("tier a list", _h(tier=["hot"]), "holdings[0].tier: expected 'hot' or 'warm', got ['hot']"),
    ("NaN resident", _h(resident=float("nan")), "holdings[0].resident: expected a fraction from 0 to 1, got nan"),
    ("infinite resident", _h(resident=float("inf")), "holdings[0].resident: expected a fraction from 0 to 1, got inf"),
    ("resident above 1", _h(resident=1.5), "holdings[0].resident: expected a fraction from 0 to 1, got 1.5"),
    ("resident as a boolean", _h(resident=True), "holdings[0].resident: expected a fraction from 0 to 1, got a boolean"),
    ("resident as a string", _h(resident="1"), "holdings[0].resident: expected a fraction from 0 to 1, got a string"),
    ("negative bytes", _h(bytes=-1), "holdings[0].bytes: expected a whole number of bytes from 0 to 2^63-1, got -1"),
    ("bytes as a boolean", _h(bytes=True), "holdings[0].bytes: expected a whole number of bytes, got a boolean"),
    ("bytes as a float", _h(bytes=1.5), "holdings[0].bytes: expected a whole number of bytes, got a number"),
    ("bytes past 2^63", _h(bytes=1 << 63), "holdings[0].bytes: expected a whole number of bytes from 0 to 2^63-1"),
    ("since as a boolean", _h(since=False), "holdings[0].since: expected a unix time, got a boolean"),
    ("negative since", _h(since=-5.0), "holdings[0].since: expected a unix time, got -5.0"),
    ("serving as an int", _h(serving=1), "holdings[0].serving: expected true or false, got 1"),
    ("the same copy twice", report("gpu-1", holding(), holding()),
     "holdings[1]: acme/llama-70b@v3 in warm is listed twice"),
    ("intent a list", {**report(), "intent": ["acme/x"]}, "intent: expected an object of model -> version, got a list"),
    ("intent too long", {**report(), "intent": {f"acme/m{i}": "v1" for i in range(1025)}},
     "intent: 1025 entries; at most 1024"),
    ("intent bad model", {**report(), "intent": {"../x": "v1"}}, "intent: invalid model name '../x'"),
    ("intent bad ref", {**report(), "intent": {"acme/x@../v": "v1"}}, "intent['acme/x@../v']: invalid version '../v'"),
    ("intent bad version", {**report(), "intent": {"acme/x": None}},
     "intent['acme/x']: expected a version (a string), got null"),
]


@pytest.mark.parametrize("body, message", [(b, m) for _, b, m in HOSTILE], ids=[i for i, _, _ in HOSTILE])
def test_hostile_reports_are_refused(body: Any, message: str) -> None:
    clock = Clock()
    fv = FleetView(clock=clock)
    fv.report(IP_A, report("gpu-1", holding(version="v1")))
    before = copy.deepcopy(fv.view())
    with pytest.raises(ValueError) as exc:
        fv.report(IP_A, body)
    text = str(exc.value)
    assert text.startswith(message), text
    assert "\n" not in text and len(text) < 300, text   # one line, whatever the body held
    assert fv.view() == before                            # nothing of it kept, the last report stands


def test_check_report_alone() -> None:
    r = check_report(json.loads(json.dumps(report())))
    assert r["node"] == "gpu-1" and r["holdings"][0]["resident"] == 0.5
    with pytest.raises(ValueError, match="NaN|nan"):
        check_report(json.loads('{"node": "gpu-1", "holdings": [{"model": "a/b", "version": "v1", "tier": "hot",'
                                ' "resident": NaN, "bytes": 1, "since": 0, "serving": true}]}'))


@pytest.mark.parametrize("kw, message", [({"ttl_s": 0}, "ttl_s: expected a positive number"),
                                         ({"max_nodes": 0}, "max_nodes: expected a positive integer")])
def test_bad_construction(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FleetView(**kw)


def test_one_address_cannot_fill_the_view_with_invented_nodes() -> None:
    from weightd.fleet.view import MAX_NODES_PER_IP
    f = FleetView()
    body = {"node": "n0", "holdings": []}
    for i in range(MAX_NODES_PER_IP):
        f.report("10.0.0.9", {**body, "node": f"n{i}"})
    with pytest.raises(ValueError, match=f"{MAX_NODES_PER_IP} node names already report from 10.0.0.9"):
        f.report("10.0.0.9", {**body, "node": "n-extra"})
    f.report("10.0.0.9", {**body, "node": "n0"})          # (a known one reports again)
    f.report("10.0.0.10", {**body, "node": "n-extra"})    # (another address is another node)


def test_ready_estimates_are_kept_shown_and_sort_nodes() -> None:
    """A worker's ready estimates (issue 37): kept per node, narrowed by model like holdings, in
    rows() as ready_s, and ``fleet status --model`` order: soonest first, nodes without one last."""
    from weightd.fleet.view import by_readiness
    clock = Clock()
    fv = FleetView(clock=clock)
    fv.report(IP_A, report("gpu-a", holding(resident=0.1), ready=[estimate(tier="warm", seconds=95.0),
                                                                estimate(model="acme/embed", seconds=0.0)]))
    fv.report(IP_B, report("gpu-b", holding(tier="hot", resident=1.0), ready=[estimate(seconds=0.0)]))
    fv.report("10.0.0.3", report("gpu-c", holding(version="v2")))        # (an older worker: no estimates)
    fv.report("10.0.0.4", report("gpu-d", holding(model="acme/other"),
                                 ready=[estimate(version="v4", seconds=40.0)]))   # (intends it, holds none)
    view = fv.view(model="acme/llama-70b")
    assert [n["node"] for n in by_readiness(view["nodes"], "acme/llama-70b")] == ["gpu-b", "gpu-d", "gpu-a", "gpu-c"]
    gpu_a = next(n for n in view["nodes"] if n["node"] == "gpu-a")
    assert gpu_a["ready"] == [{"model": "acme/llama-70b", "version": "v3", "tier": "warm", "seconds": 95.0}]
    assert {(r["node"], r["version"], r["ready_s"]) for r in fv.rows() if r["model"] == "acme/llama-70b"} == {
        ("gpu-a", "v3", 95.0), ("gpu-b", "v3", 0.0), ("gpu-c", "v2", None)}
    json.dumps(view)


BAD_READY = [
    ("an object", {"model": "acme/x"}),
    ("a string", ["acme/x"]),
    ("without seconds", [{"model": "acme/llama-70b", "version": "v3", "tier": "hot"}]),
    ("NaN", [estimate(seconds=float("nan"))]),
    ("infinite", [estimate(seconds=float("inf"))]),
    ("negative", [estimate(seconds=-1)]),
    ("huge", [estimate(seconds=6.2e9)]),
    ("a boolean", [estimate(seconds=True)]),
    ("tier cold", [estimate(tier="cold")]),
    ("model ../etc", [estimate(model="../etc")]),
    ("huge model", [estimate(model="a" * 1_000_000)]),
    ("twice", [estimate(seconds=1.0), estimate(seconds=3)]),      # (the second is dropped)
    ("neither held nor intended", [estimate(model="acme/unrelated", seconds=1.0)]),
]


@pytest.mark.parametrize("ready", [r for _, r in BAD_READY], ids=[i for i, _ in BAD_READY])
def test_bad_ready_rows_are_dropped_and_counted_never_the_report(ready: Any) -> None:
    """A broken or hostile worker's estimate costs that estimate, not the node's place in the view
    (nor its rollout slots): the report is kept, the bad rows dropped and counted."""
    fv = FleetView(clock=Clock())
    good = estimate(version="v3", tier="warm", seconds=7.0)
    fv.report(IP_A, report("gpu-1", ready=[good, *ready] if isinstance(ready, list) else ready))
    node = fv.view()["nodes"][0]
    kept = [e for e in node["ready"]]
    assert node["node"] == "gpu-1" and node["holdings"]
    dropped = 1 if not isinstance(ready, list) else 1 if len(ready) == 2 else len(ready)
    assert node["ready_dropped"] == dropped == fv.ready_dropped
    assert (good in kept) == isinstance(ready, list)
    assert all(e["model"] == "acme/llama-70b" and 0 <= e["seconds"] <= 1e9 for e in kept)


def test_too_many_estimates_keep_the_first_1024() -> None:
    fv = FleetView(clock=Clock())
    fv.report(IP_A, report("gpu-1", *(holding(version=f"v{i}") for i in range(1024)),
                           ready=[estimate(version=f"v{i}") for i in range(2000)]))
    node = fv.view()["nodes"][0]
    assert len(node["ready"]) == 1024 and node["ready_dropped"] == 976


def test_an_estimate_of_an_intended_model_not_held_is_kept() -> None:
    """A rollout's target: intended (any version of the model), not held yet."""
    fv = FleetView(clock=Clock())
    fv.report(IP_A, report("gpu-1", holding(model="acme/other"), ready=[estimate(version="v9", seconds=40.0)]))
    assert fv.view()["nodes"][0]["ready"] == [estimate(version="v9", seconds=40.0)]
    assert "ready_dropped" not in fv.view()["nodes"][0]


def test_a_ready_estimate_counts_what_it_holds() -> None:
    """report_bytes counts an estimate near what it takes in the view's JSON and the held tuple."""
    import sys

    from weightd.fleet.report import check_report, report_bytes
    base = check_report(report("gpu-1"))
    many = check_report(report("gpu-1", *(holding(version=f"v{i:04d}") for i in range(1000)),
                               ready=[estimate(version=f"v{i:04d}", tier="warm", seconds=123456.789)
                                      for i in range(1000)]))
    held = check_report(report("gpu-1", *(holding(version=f"v{i:04d}") for i in range(1000))))
    per = (report_bytes(many) - report_bytes(held)) / 1000
    json_per = len(json.dumps(many["ready"])) / 1000
    tuple_per = sys.getsizeof(("m", "v", "warm", 1.0)) + sys.getsizeof(1.0)
    assert per >= json_per + tuple_per, (per, json_per, tuple_per)
    assert base["ready_dropped"] == 0


def test_rows_build_each_nodes_ready_index_once() -> None:
    """fleet status prints a row per holding: the node's estimates are indexed once, not scanned per row."""
    class Counted(tuple):
        iterations = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            Counted.iterations += 1
            return super().__iter__()

    fv = FleetView(clock=Clock())
    fv.report(IP_A, report("gpu-1", *(holding(version=f"v{i}") for i in range(200)),
                           ready=[estimate(version=f"v{i}") for i in range(200)]))
    rec = next(iter(fv._nodes.values()))
    rec["ready"] = Counted(rec["ready"])
    rows = fv.rows()
    assert len(rows) == 200 and rows[5]["ready_s"] == 12.5
    assert Counted.iterations == 1
