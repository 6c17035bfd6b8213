"""The member list read from several trackers (one per origin): the union of the fresh answers, the same
whichever tracker is down, None only when none has answered lately."""

from __future__ import annotations

import json
import threading
import time

from p2p.members import Membership

from .test_fleet_client import Server
from .test_tracker import _Tracker

KNOWN = b"k" * 20


def _tracker(rows: list[list[str]]) -> _Tracker:
    """A local ``/swarm`` endpoint answering ``rows`` as the workers downloading; ``close`` makes its
    port refuse."""
    t = _Tracker()
    t.body = json.dumps({"downloading": rows, "others": []}).encode()
    return t


def _until(ok, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_the_list_is_the_union_of_every_trackers_fresh_answer() -> None:
    a = _tracker([["127.0.0.4", "r1"], ["127.0.0.5", "r1"]])
    b = _tracker([["127.0.0.5", "r1"], ["127.0.0.6", "r2"]])
    m = Membership((a.url, b.url), KNOWN, every_s=0.05, timeout_s=1, stale_s=0.5).start()
    try:
        _until(lambda: a.hits >= 2 and b.hits >= 2)   # (every tracker is asked every round, not the first only)
        assert m.members == {"127.0.0.4": "r1", "127.0.0.5": "r1", "127.0.0.6": "r2"}
        a.close()   # one tracker down (its port refusing): its last answer counts until it is stale_s old
        time.sleep(0.7)
        assert m.members == {"127.0.0.5": "r1", "127.0.0.6": "r2"} and m.failures > 0
        b.close()   # every tracker down: no list (the plan falls back to the connected peers)
        _until(lambda: m.members is None)
        assert m.others == {}
    finally:
        m.stop()
        a.close()
        b.close()


def test_a_list_is_settled_only_once_the_union_stops_changing() -> None:
    a = _tracker([["127.0.0.4", ""]])
    b = _tracker([["127.0.0.4", ""]])
    m = Membership((a.url, b.url), KNOWN, every_s=0.05, timeout_s=1).start()
    try:
        _until(lambda: m.members is not None)
        changed = m.changed_at
        b.body = json.dumps({"downloading": [["127.0.0.4", ""], ["127.0.0.7", ""]]}).encode()
        _until(lambda: m.members is not None and "127.0.0.7" in m.members)
        assert m.changed_at > changed and m.settled(5.0) is None
        _until(lambda: m.settled(0.3) is not None)
        assert m.settled(0.3) == {"127.0.0.4": "", "127.0.0.7": ""}
    finally:
        m.stop()
        a.close()
        b.close()


def test_a_tracker_trickling_its_answer_is_cut_at_the_deadline_and_the_others_still_count() -> None:
    """A tracker that sends its answer a byte every 0.2 s (each read within the socket timeout) is cut at
    ``timeout_s`` for the whole request, counted as a failure (asked again, not dropped for good), and
    the other tracker's list is there meanwhile."""
    slow_server = Server(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000, every_s=0.2)
    good = _tracker([["127.0.0.4", "r1"]])
    slow = slow_server.url + "/announce"
    m = Membership((slow, good.url), KNOWN, every_s=0.05, timeout_s=1, stale_s=5)
    try:
        got: list = []

        def ask() -> None:
            try:
                got.append(m._request(m.urls[0], 1.0))
            except TimeoutError as exc:
                got.append(exc)
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(2.5)   # (without the whole-request deadline: 100,000 bytes at 5 a second)
        assert not asking.is_alive() and len(got) == 1 and isinstance(got[0], TimeoutError), got
        m.start()
        _until(lambda: m.members == {"127.0.0.4": "r1"} and m.failures >= 1, timeout_s=8)
        _until(lambda: m.requests >= 4, timeout_s=8)   # (the slow tracker is asked again, round after round)
    finally:
        slow_server.close()
        m.stop()
        good.close()


def test_a_list_keeps_only_addresses_inside_the_allow_list_and_at_most_a_swarms_worth() -> None:
    import p2p.members as members
    rows = [["127.0.0.4", "r1"], ["8.8.8.8", "r1"], ["not an address", "r1"], ["::1", "r2"], [5, "r1"]]
    m = Membership((), KNOWN, allow=("127.0.0.0/8",))
    assert m._rows(rows) == {"127.0.0.4": "r1"}
    assert Membership((), KNOWN)._rows(rows) == {"127.0.0.4": "r1", "8.8.8.8": "r1", "::1": "r2"}
    many = [[f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", ""] for i in range(members.MAX_MEMBERS + 50)]
    assert len(Membership((), KNOWN, allow=("10.0.0.0/8",))._rows(many)) == members.MAX_MEMBERS


def test_owners_dropped_are_said_and_heard_through_every_tracker() -> None:
    """``dropping`` (this node's plan's drops) goes with each request as ``drop=``; ``dropped`` is the
    union of the fresh answers' ``dropped``, only workers of that answer's own list (a rogue tracker
    cannot name others), and empty again once every answer naming them is stale."""
    a, b = _tracker([["127.0.0.4", "r1"], ["127.0.0.5", "r1"]]), _tracker([["127.0.0.6", ""]])
    a.body = json.dumps({"downloading": [["127.0.0.4", "r1"], ["127.0.0.5", "r1"]], "others": [],
                         "dropped": ["127.0.0.5", "10.9.9.9", 7, "127.0.0.6"]}).encode()
    b.body = json.dumps({"downloading": [["127.0.0.6", ""]], "others": [], "dropped": ["127.0.0.6"]}).encode()
    m = Membership((a.url, b.url), KNOWN, every_s=0.05, timeout_s=1, stale_s=0.5).start()
    try:
        _until(lambda: m.dropped == {"127.0.0.5", "127.0.0.6"})
        assert not any("drop=" in p for p in a.paths + b.paths)
        m.dropping = frozenset({"127.0.0.9", "127.0.0.8"})
        _until(lambda: any(p.endswith("&drop=127.0.0.8,127.0.0.9") for p in a.paths)
               and any(p.endswith("&drop=127.0.0.8,127.0.0.9") for p in b.paths))
        a.close()
        b.close()
        _until(lambda: m.dropped is None)   # (no tracker answering: nothing said either way)
    finally:
        m.stop()
        a.close()
        b.close()


def test_a_tracker_naming_over_a_quarter_of_its_list_dropped_is_not_heeded() -> None:
    """A rogue tracker saying most of its list was dropped would make this node plan alone (everything
    from the origin): a tracker of ours never lists more than a quarter per worker that said so."""
    rows = [[f"127.0.0.{10 + i}", ""] for i in range(8)]
    t = _tracker(rows)
    t.body = json.dumps({"downloading": rows, "others": [], "dropped": [r[0] for r in rows[:3]]}).encode()
    m = Membership((t.url,), KNOWN, every_s=0.05, timeout_s=1, stale_s=5).start()
    try:
        _until(lambda: m.members is not None and t.hits >= 2)
        assert m.dropped == frozenset()
        t.body = json.dumps({"downloading": rows, "others": [], "dropped": [r[0] for r in rows[:2]]}).encode()
        _until(lambda: m.dropped == {"127.0.0.10", "127.0.0.11"})
    finally:
        m.stop()
        t.close()


def test_gateways_skipped_are_said_and_heard_and_a_rogue_list_is_not_heeded() -> None:
    """``skipping`` (the gateways this node's plan skipped) goes with each request as ``skip=``, beside
    ``drop=``; ``skipped`` is the union of the fresh answers' ``skipped``, only workers of that
    answer's list; a tracker naming more than half of a rack skipped is not heeded for that rack (a
    tracker of ours lists at most half a rack), nor anything once no answer is fresh."""
    rows = [[f"127.0.0.{10 + i}", f"r{i % 2}"] for i in range(8)]
    t = _tracker(rows)
    # (a nested list or an object is no address: before, one ended the member-list thread in a TypeError)
    t.body = json.dumps({"downloading": rows, "others": [], "dropped": [[1], {"a": 1}],
                         "skipped": ["127.0.0.10", "10.9.9.9", 5, "127.0.0.99", [1], {"a": 1}]}).encode()
    m = Membership((t.url,), KNOWN, every_s=0.05, timeout_s=1, stale_s=0.5).start()
    try:
        _until(lambda: m.skipped == {"127.0.0.10"})
        assert not any("skip=" in p for p in t.paths)
        m.dropping, m.skipping = frozenset({"127.0.0.12"}), frozenset({"127.0.0.11", "127.0.0.13"})
        _until(lambda: any(p.endswith("&drop=127.0.0.12&skip=127.0.0.11,127.0.0.13") for p in t.paths))
        m.skipping = frozenset(f"127.0.{i >> 8}.{i & 255}" for i in range(100))   # (at most MAX_SKIPS said)
        _until(lambda: any(p.count(",") == 15 and "&skip=" in p for p in t.paths))
        # (rows[:5]: three of r0's four, two of r1's: r0's are not heeded, r1's are)
        t.body = json.dumps({"downloading": rows, "others": [], "skipped": [r[0] for r in rows[:5]]}).encode()
        _until(lambda: m.skipped == {"127.0.0.11", "127.0.0.13"})
        t.close()
        _until(lambda: m.skipped is None)
    finally:
        m.stop()
        t.close()
