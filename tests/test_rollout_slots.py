"""Rollout slots with several origins (#39): an origin's numbered slots (weightd.fleet.rollout), kept
across a restart in its state dir; the worker's majority rule and its choice of the next number
(weightd.daemon.intent_fleet); the merged fleet view of several origins (weightd.fleet.view.merged)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from weightd.daemon.intent_fleet import majority, next_number, refusal
from weightd.fleet.rollout import MoverSlots
from weightd.fleet.view import merged


def test_numbered_slots_one_node_each() -> None:
    s = MoverSlots(2, clock=lambda: 0.0)
    assert s.ask("10.0.0.1", "w1", 1) == {"granted": True, "slot": 1, "movers": 1, "cap": 2, "free": [0, 1]}
    assert s.ask("10.0.0.2", "w2", 1)["granted"] is False          # number 1 is held by another node
    assert s.ask("10.0.0.2", "w2", 1)["free"] == [0]
    assert s.ask("10.0.0.2", "w2", 5)["granted"] is False          # past the cap (a cap lowered by a reload)
    assert s.ask("10.0.0.2", "w2")["slot"] == 0                    # any: the lowest free (an older worker)
    assert s.ask("10.0.0.3", "w3")["granted"] is False
    assert s.ask("10.0.0.1", "w1")["slot"] == 1                    # any, when it holds one: that one
    assert [m["slot"] for m in s.movers()] == [1, 0]


def test_held_slots_survive_an_origin_restart_and_expire(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "rollout-slots.json"
    s = MoverSlots(1, ttl_s=120, clock=lambda: now[0], path=path)
    assert s.ask("10.0.0.1", "w1: a/x@v2", 0)["granted"]
    again = MoverSlots(1, ttl_s=120, clock=lambda: now[0], path=path)   # (a restart: the file read back)
    assert again.ask("10.0.0.2", "w2: a/x@v2", 0)["granted"] is False
    assert [m["node"] for m in again.movers()] == ["10.0.0.1"]
    assert again.restored_holder("10.0.0.1") and not again.restored_holder("10.0.0.2")
    now[0] += 121                                                    # (only within a slot's life of the start)
    assert not again.restored_holder("10.0.0.1")
    now[0] -= 121
    again.release("10.0.0.1")
    assert json.loads(path.read_text())["held"] == []
    assert s.ask("10.0.0.1", "w1", 0)["granted"]
    now[0] += 121                                                    # down longer than a slot lives
    assert MoverSlots(1, ttl_s=120, clock=lambda: now[0], path=path).held == {}
    path.write_text("{not json")
    assert MoverSlots(1, clock=lambda: now[0], path=path).held == {}   # (said in the log, none held)


def test_two_majorities_share_an_origin_so_at_most_cap_nodes_move() -> None:
    """Every way three origins (cap 2) answer four nodes asking in turn, each for the number it was
    told was free: never more than two nodes hold a majority for one number each."""
    for order in itertools.permutations(range(4)):
        origins = [MoverSlots(2, clock=lambda: 0.0) for _ in range(3)]
        numbers = dict.fromkeys(range(4), 0)
        movers = set()
        for _round in range(3):
            for node in order:
                if node in movers:
                    continue
                answers = [o.ask(f"n{node}", "x", numbers[node]) for o in origins]
                if sum(a["granted"] for a in answers) >= majority(3):
                    movers.add(node)
                    continue
                for o, a in zip(origins, answers):
                    if a["granted"]:
                        o.release(f"n{node}")
                numbers[node] = next_number(answers, majority(3), numbers[node])
        assert len(movers) == 2, (order, movers)
        held = {numbers[n] for n in movers}
        assert len(held) == 2, (order, numbers, movers)


def test_majority_and_next_number() -> None:
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    answers = [{"granted": False, "free": [1, 2]}, {"granted": True, "slot": 0, "free": [0, 2]},
               OSError("down"), {"granted": False, "free": [2]}]
    assert next_number(answers, 3, 0) == 2
    assert next_number(answers, 4, 0) == 0                           # none free at enough: as it was
    said = refusal([("http://a", {"granted": True}), ("http://b", OSError("refused"))], 1, 2)
    assert "granted by 1 of 2 origins, 2 needed" in said and "http://b: unreachable (refused)" in said
    assert refusal([("http://a", {"granted": False, "movers": 1, "cap": 1})], 0, 1) == \
        "waiting for a rollout slot (1 of 1 nodes are moving fleet-wide)"


def _node(name: str, ip: str, age: float, version: str) -> dict:
    return {"node": name, "ip": ip, "age_s": age, "holdings": [
        {"model": "a/x", "version": version, "tier": "warm", "resident": 1.0, "bytes": 1, "since": 0.0,
         "serving": True}]}


def test_merged_views_keep_each_nodes_newest_report_and_say_which_origin_is_down() -> None:
    a = {"nodes": [_node("w1", "10.0.0.1", 5.0, "v1"), _node("w2", "10.0.0.2", 1.0, "v2")],
         "movers": [{"node": "10.0.0.2"}], "max_movers": 1}
    b = {"nodes": [_node("w1", "10.0.0.1", 0.5, "v2"), _node("w3", "10.0.0.3", 2.0, "v1")], "movers": [],
         "max_movers": 1}
    doc = merged([("http://a", a), ("http://b", b), ("http://c", OSError("connection refused"))])
    assert [(n["node"], n["holdings"][0]["version"]) for n in doc["nodes"]] == [("w1", "v2"), ("w2", "v2"),
                                                                                ("w3", "v1")]
    assert [(v["version"], v["nodes"]["total"]) for v in doc["versions"]] == [("v1", 1), ("v2", 2)]
    assert doc["origins"] == [{"url": "http://a", "nodes": 2, "movers": [{"node": "10.0.0.2"}], "max_movers": 1},
                              {"url": "http://b", "nodes": 2, "movers": [], "max_movers": 1},
                              {"url": "http://c", "error": "connection refused"}]
