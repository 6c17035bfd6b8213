"""A worker's (and ``fleet status``'s) calls to the origins against real loopback sockets: a server
that trickles its answer a byte at a time must not hold a call past its total deadline (a per-read
timeout never fires on it), the origins are asked together (a slow one does not delay the answer of
another beyond that deadline), and the intent round is not held by a report send."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Callable

import pytest

from weightd.errors import OriginUnavailable
from weightd.fleet.client import OriginClient, Origins

CFG = NS(settings=NS(p2p=NS(listen="127.0.0.1:0", tls=None)))


class Server:
    """A loopback HTTP/1.1 server answering every connection with ``answer`` (bytes), ``every_s``
    seconds a byte (0: at once), until stopped; a callable ``answer`` is given the request."""

    def __init__(self, answer: "bytes | Callable[[bytes], bytes]", every_s: float = 0.0) -> None:
        self.answer, self.every_s, self.stop = answer, every_s, threading.Event()
        self.accepted = 0   # connections taken
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _a = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = conn.recv(65536)   # (the request: small, in one piece on loopback)
                out = self.answer(request) if callable(self.answer) else self.answer
                if not self.every_s:
                    conn.sendall(out)
                    return
                for i in range(len(out)):
                    if self.stop.wait(self.every_s):
                        return
                    conn.sendall(out[i:i + 1])
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def answer(doc: object) -> bytes:
    body = json.dumps(doc).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.fixture
def servers():
    made: list[Server] = []
    yield lambda *a, **kw: made.append(Server(*a, **kw)) or made[-1]
    for s in made:
        s.close()


def timed(fn, bound_s: float):
    """fn() in a thread: (its result or exception, seconds taken); None if still running after bound_s."""
    out: list = []

    def run() -> None:
        t0 = time.monotonic()
        try:
            out.append((fn(), time.monotonic() - t0))
        except Exception as exc:  # noqa: BLE001 (returned to the test)
            out.append((exc, time.monotonic() - t0))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound_s)
    return out[0] if out else None


def test_a_trickling_origin_is_cut_at_the_total_deadline(servers) -> None:
    # a byte every 0.2 s: never a second without one, so only a deadline on the whole request stops it
    slow = servers(answer({"ok": True, "pad": "x" * 400}), every_s=0.2)
    got = timed(lambda: OriginClient(slow.url, CFG, timeout_s=1.0).call("GET", "/v1/fleet"), 8)
    assert got is not None, "the call was still running 8 s after its 1 s deadline"
    exc, took = got
    assert isinstance(exc, OriginUnavailable) and "within 1 s" in str(exc), exc
    assert took < 2.5, took


def test_the_deadline_also_bounds_the_headers(servers) -> None:
    slow = servers(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"y" * 400 + b"\r\n\r\n{}", every_s=0.2)
    got = timed(lambda: OriginClient(slow.url, CFG, timeout_s=1.0).call("GET", "/v1/fleet"), 8)
    assert got is not None and isinstance(got[0], OriginUnavailable) and got[1] < 2.5, got


def test_an_overall_deadline_shortens_a_call(servers) -> None:
    slow = servers(answer({"ok": True, "pad": "x" * 400}), every_s=0.2)
    c = OriginClient(slow.url, CFG, timeout_s=30.0)
    got = timed(lambda: c.call("GET", "/v1/fleet", deadline=time.monotonic() + 0.8), 8)
    assert got is not None and isinstance(got[0], OriginUnavailable) and got[1] < 2.0, got


def test_one_slow_origin_does_not_hold_the_others_answer(servers) -> None:
    good = servers(answer({"ok": True}))
    slow = servers(answer({"ok": True, "pad": "x" * 400}), every_s=0.2)
    origins = Origins([slow.url, good.url], CFG, timeout_s=1.0)
    got = timed(lambda: origins.each("POST", "/v1/fleet/report", {"node": "n1"}), 8)
    assert got is not None, "Origins.each was still running 8 s after its 1 s deadline"
    answers, took = got
    assert took < 2.5, took
    assert answers[1] == (good.url, {"ok": True}), answers
    assert answers[0][0] == slow.url and isinstance(answers[0][1], OriginUnavailable), answers


def test_a_good_origin_still_answers_whole(servers) -> None:
    good = servers(answer({"nodes": [], "pad": "z" * 200_000}))
    assert OriginClient(good.url, CFG, timeout_s=2.0).call("GET", "/v1/fleet")["pad"] == "z" * 200_000


def test_the_intent_round_is_not_held_by_a_report_send(tmp_path: Path, monkeypatch) -> None:
    import weightd.fleet.client as oc

    from .test_intent_runner import PUB, make
    released = threading.Event()
    sends: list[float] = []

    class Stuck:
        def __init__(self, base, cfg, **kw) -> None:
            pass

        def call(self, method, path, body=None, **kw):
            if path == "/v1/fleet/report":
                sends.append(time.monotonic())
                released.wait(10)
            return {"granted": True, "movers": 1, "cap": 1}
    monkeypatch.setattr(oc, "OriginClient", Stuck)
    d, r = make(tmp_path, '[[keep]]\nmodel = "acme/embed@v1"\n', held={}, published=PUB,
                origin="http://origin:6969")
    done: list[float] = []
    plain = r.round

    async def round_(fp=None) -> None:
        await plain(fp)
        done.append(time.monotonic())
    r.round = round_

    async def main() -> None:
        d.loop = asyncio.get_running_loop()
        t = asyncio.create_task(r.run())
        await asyncio.sleep(1.5)
        finished = list(done)
        released.set()
        d.stopping.set()
        r.wake.set()
        await asyncio.wait_for(t, 10)
        assert sends and finished, (sends, finished)   # the report was sent, and the round ended while it hung
    try:
        asyncio.run(main())
    finally:
        released.set()
        r.close()
        d.pools["misc"].shutdown()


# -- fleet status over several origins, one of them answering nonsense ---------------------------------

def node(name: str, ip: str = "10.0.0.5", **kw: object) -> dict:
    return {"node": name, "ip": ip, "rack": None, "labels": {}, "intent": {}, "weightd": "1.0", "age_s": 2.0,
            "holdings": [{"model": "acme/m", "version": "v1", "tier": "warm", "resident": 1.0, "bytes": 10,
                          "since": 1.0, "serving": True}], "ready": [], **kw}


GOOD = {"nodes": [node("good-node")], "versions": [], "generated_at": 1.0, "movers": [], "max_movers": 1}


@pytest.mark.parametrize("bad", [
    {"nodes": [1]},
    {"nodes": [node("bad-node", age_s="old")]},
    {"nodes": [node("bad-node")], "movers": 5},
    {"nodes": "many"},
    {"nodes": [node("bad-node", holdings=[{"model": "acme/m"}])]},
    {"nodes": [node("bad-node", ready=[{"model": "acme/m", "version": "v1", "tier": "warm", "seconds": "x"}])]},
    {"nodes": [node(7)]},
], ids=["node-not-object", "age-not-number", "movers-not-list", "nodes-not-list", "holding-short",
        "ready-seconds", "node-name-not-str"])
def test_one_origin_answering_malformed_json_is_its_warning(servers, weightd, bad) -> None:
    good, evil = servers(answer(GOOD)), servers(answer(bad))
    for extra in ((), ("--json",)):
        p = weightd("fleet", "status", "--origin", evil.url, "--origin", good.url, *extra, timeout=60)
        assert p.returncode == 0, (p.returncode, p.stderr)
        assert "good-node" in p.stdout and "bad-node" not in p.stdout, p.stdout
        assert evil.url in p.stderr and "not a fleet view" in p.stderr and "Traceback" not in p.stderr, p.stderr


def pages(next_of: Callable[[int], str], nodes_each: int = 1, pad: int = 0) -> Callable[[bytes], bytes]:
    """An origin whose every page has ``nodes_each`` nodes (``pad`` bytes of labels each) and ``next``
    = next_of(how many pages it served), forever."""
    served = [0]

    def one(request: bytes) -> bytes:
        served[0] += 1
        ns = [node(f"bad-{served[0]}-{i}", labels={"pad": "p" * pad}) for i in range(nodes_each)]
        return answer({"nodes": ns, "versions": [], "movers": [], "next": next_of(served[0])})
    return one


def test_pages_whose_next_does_not_advance_stop_at_once(servers, weightd) -> None:
    good, evil = servers(answer(GOOD)), servers(pages(lambda n: "same@10.0.0.9"))
    t0 = time.monotonic()
    p = weightd("fleet", "status", "--origin", evil.url, "--origin", good.url, timeout=60)
    assert p.returncode == 0 and "good-node" in p.stdout and "bad-" not in p.stdout, (p.stdout, p.stderr)
    assert "next page" in p.stderr and evil.url in p.stderr, p.stderr
    assert time.monotonic() - t0 < 20


def test_endless_advancing_pages_stop_at_the_byte_cap(servers, weightd) -> None:
    # 1 MiB pages whose cursor always moves on: the whole view is capped at 64 MiB
    good = servers(answer(GOOD))
    evil = servers(pages(lambda n: f"bad-{n:09d}@10.0.0.5", nodes_each=4, pad=256 << 10))
    t0 = time.monotonic()
    p = weightd("fleet", "status", "--origin", evil.url, "--origin", good.url, timeout=120)
    assert p.returncode == 0 and "good-node" in p.stdout and "bad-" not in p.stdout, (p.stdout[:300], p.stderr)
    assert "MiB" in p.stderr and evil.url in p.stderr, p.stderr
    assert time.monotonic() - t0 < 60


# -- every worker must list the same origins (docs/origins.md): a hash of the list travels ---------------

def test_the_origin_list_hash_ignores_order_and_trailing_slashes() -> None:
    from weightd.fleet.client import origins_hash
    a = origins_hash(["http://10.0.0.1:6969", "http://10.0.0.2:6969/"])
    assert a == origins_hash(["http://10.0.0.2:6969", "http://10.0.0.1:6969"]) and len(a) == 16
    assert a != origins_hash(["http://10.0.0.1:6969"])
    assert Origins(["http://10.0.0.2:6969", "http://10.0.0.1:6969"], CFG).hash == a


def test_reports_carry_the_origin_list_and_an_odd_one_is_refused_a_slot() -> None:
    from weightd.fleet.rollout import origins_refusal
    from weightd.fleet.view import FleetView
    v = FleetView(ttl_s=300, budget_bytes=64 << 20)
    for i, h in enumerate(["aaaaaaaaaaaaaaaa"] * 3 + ["bbbbbbbbbbbbbbbb", None, "not hex!"]):
        v.report(f"10.0.0.{i + 1}", {"node": f"n{i}", **({"origins": h} if h else {})})
    assert v.origin_lists() == {"aaaaaaaaaaaaaaaa": 3, "bbbbbbbbbbbbbbbb": 1}
    assert [n.get("origins") for n in v.view()["nodes"]][:4] == ["aaaaaaaaaaaaaaaa"] * 3 + ["bbbbbbbbbbbbbbbb"]
    assert origins_refusal("aaaaaaaaaaaaaaaa", v.origin_lists()) is None
    assert origins_refusal(None, v.origin_lists()) is None          # (a worker that does not say: as before)
    why = origins_refusal("bbbbbbbbbbbbbbbb", v.origin_lists())
    assert why and "3 of 4" in why and "[intent] origin" in why, why
    assert origins_refusal("bbbbbbbbbbbbbbbb", {}) is None            # (nothing known yet)
    assert origins_refusal("bbbbbbbbbbbbbbbb", {"aaaaaaaaaaaaaaaa": 1, "bbbbbbbbbbbbbbbb": 1}) is None   # (a tie)


def test_merged_status_warns_when_nodes_list_different_origins() -> None:
    from weightd.fleet.view import merged, origin_list_warning
    doc = merged([("http://a", {"nodes": [node("n1", origins="aaaaaaaaaaaaaaaa"), node("n2", ip="10.0.0.6",
                                                                                        origins="bbbbbbbbbbbbbbbb")],
                                "movers": []})])
    w = origin_list_warning(doc["nodes"])
    assert w and "2 different origin lists" in w and "n2" in w, w
    assert origin_list_warning([node("n1", origins="aaaaaaaaaaaaaaaa"), node("n2", origins=None)]) is None


@pytest.mark.parametrize("url, why", [
    ("ftp://10.0.0.1:6969", "not an http:// or https:// URL"),
    ("10.0.0.1:6969", "not an http:// or https:// URL"),
    ("http://10.0.0.1:99999", "the port must be 1-65535"),
    ("http://10.0.0.1:6969/announce", "a path"),
    ("http://10.0.0.1:6969/?x=1", "query"),
    ("http://:6969", "no host"),
    ("http://10.0.0.1:6969?", "query"),
    ("http://10.0.0.1:6969/#", "fragment"),
    ("http://[::1]x:1", "not a host name"),
    ("http://h;p:1", "not a host name"),
])
def test_fleet_status_refuses_a_url_that_is_no_origin_before_asking_anyone(servers, weightd, url, why) -> None:
    """An --origin typo is the caller's (exit 2, naming it), as in [intent] origin, not an origin down (exit 1),
    and no origin is asked: the good one beside it never sees a request."""
    good = servers(answer(GOOD))
    p = weightd("fleet", "status", "--origin", good.url, "--origin", url, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    line = p.stderr.strip()
    assert "\n" not in line and "--origin" in line and url[:40] in line and why in line, line
    assert good.accepted == 0
