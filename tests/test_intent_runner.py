"""The daemon's intent loop (the real IntentRunner) around a node and daemon stand-in (the edge:
status, listing, leases, pins and preload recorded in memory), for what a reviewer found: a refused
rollout slot must not spin the loop or hold up the entries after it, a manifest without
published_at must not stop every entry, and a slot release that fails must not stop fetching."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from weightd.daemon import intent as wi


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def inc(self, *a) -> None:
        self.n += 1

    def labels(self, *a) -> "_Counter":
        return self


class _State:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str, str], float] = {}

    def leases(self):
        return [NS(tier=t, name=n, version=v, holder=h) for (t, n, v, h) in self.rows]

    def hold(self, tier, name, version, s, holder) -> None:
        self.rows.pop((tier, name, version, holder), None)
        if s > 0:
            self.rows[(tier, name, version, holder)] = s


class _Node:
    def __init__(self, held, published) -> None:
        self.held, self.published = held, published
        self.state, self.pins, self.listings = _State(), set(), 0

    def status(self):
        return {"checkpoints": [{"name": n, "version": v, "bytes": 1, "pinned": (n, v) in self.pins,
                                 "tiers": {t: {"in_use": [], "resident_percent": 0} for t in ts}}
                                for (n, v), ts in self.held.items()]}

    def listing(self, name):
        self.listings += 1
        return self.published.get(name, [])

    def hold(self, tier, name, version, s, holder) -> bool:
        self.state.hold(tier, name, version, s, holder)
        return True

    def pin(self, n, v):
        new = (n, v) not in self.pins
        self.pins.add((n, v))
        return v, new

    def unpin(self, n, v):
        had = (n, v) in self.pins
        self.pins.discard((n, v))
        return v, had


def make(tmp: Path, intent_text: str, *, held, published, origin=None):
    idir = tmp / "intent.d"
    idir.mkdir(parents=True)
    (idir / "a.toml").write_text(intent_text)
    icfg = NS(dir=idir, labels={}, labels_file=None, node_name="n1", reconcile_s=30.0, poll_s=2.0, jitter_s=0.0,
              max_movers=0, origin=origin, report_s=3600.0, nfd_dir=None, prewarm=None)
    settings = NS(state_dir=tmp, intent=icfg, p2p=NS(trackers=[], listen="0.0.0.0:6881", tls=None, rack=""))
    d = NS(config=NS(settings=settings), loop=None, stopping=asyncio.Event(), role="worker",
           node=_Node(held, published),
           metrics=NS(intent_errors=_Counter(), intent_failures=_Counter(), intent_prewarms=_Counter(),
                      set_model_ready=lambda h: None),
           pools={"misc": ThreadPoolExecutor(2, "misc")}, preloads=[],
           service=NS(selection_for=lambda name, selection=None, whole=False: None))   # (no default patterns)

    async def preload(body, *, holder=None, rate_bytes_per_s=0, joined=None, waited_on=True):
        d.preloads.append(body["ref"])
        await asyncio.sleep(0.01)
        name, _, version = body["ref"].partition("@")
        d.node.held.setdefault((name, version), set()).add(body["tier"])   # (placed)
        return {"version": version, "tier": body["tier"]}
    d.api = NS(inflight={}, preload=preload)

    async def run_blocking(pool, fn, *a, **kw):
        return await asyncio.get_running_loop().run_in_executor(d.pools[pool], lambda: fn(*a, **kw))
    d.run_blocking = run_blocking
    return d, wi.IntentRunner(d)


def run_for(d, r, seconds: float) -> None:
    async def main() -> None:
        d.loop = asyncio.get_running_loop()
        t = asyncio.create_task(r.run())
        await asyncio.sleep(seconds)
        d.stopping.set()
        r.wake.set()
        await asyncio.wait_for(t, 10)
    try:
        asyncio.run(main())
    finally:
        r.close()
        d.pools["misc"].shutdown()


PUB = {"acme/m": [{"version": "v2", "published": True, "published_at": "2026-01-02T00:00:00Z"},
                  {"version": "v1", "published": True, "published_at": "2026-01-01T00:00:00Z"}],
       "acme/embed": [{"version": "v1", "published": True, "published_at": "2026-01-01T00:00:00Z"}]}


def test_a_refused_rollout_slot_neither_spins_nor_holds_up_the_next_entry(tmp_path: Path, monkeypatch) -> None:
    import weightd.fleet.client as oc
    asks = []

    class Refusing:
        def __init__(self, base, cfg) -> None:
            pass

        def call(self, method, path, body=None):
            if path == "/v1/rollout/slot":
                asks.append(time.monotonic())
                return {"granted": False, "movers": 8, "cap": 8}
            return {"ok": True}
    monkeypatch.setattr(oc, "OriginClient", Refusing)
    d, r = make(tmp_path, '[[keep]]\nmodel = "acme/m@latest"\npriority = 5\n[[keep]]\nmodel = "acme/embed@v1"\n',
                held={("acme/m", "v1"): {"warm"}}, published=PUB, origin="http://origin:6969")
    run_for(d, r, 3.0)
    assert r.rounds <= 5 and len(asks) <= 2 and d.node.listings <= 10, (r.rounds, len(asks), d.node.listings)
    assert d.preloads == ["acme/embed@v1"]          # the lower-priority first placement went ahead
    row = {x["model"]: x for x in r.plan.rows}["acme/m@latest"]
    assert row["state"] == "waiting" and "waiting for a rollout slot (8 of 8 nodes" in row["reason"]


def test_a_manifest_without_published_at_does_not_stop_every_entry(tmp_path: Path) -> None:
    pub = {"acme/m": [{"version": "v2", "published": True, "published_at": None},
                      {"version": "v1", "published": True, "published_at": "2026-01-01T00:00:00Z"}]}
    d, r = make(tmp_path, '[[keep]]\nmodel = "acme/m@latest"\n[[keep]]\nmodel = "acme/embed@v1"\n',
                held={}, published={**pub, "acme/embed": PUB["acme/embed"]})
    run_for(d, r, 1.0)
    assert r.plan.rows and d.preloads, r.plan.rows


def test_a_failed_slot_release_does_not_stop_fetching(tmp_path: Path, monkeypatch) -> None:
    import weightd.fleet.client as oc
    holder: list = []

    class Flaky:
        def __init__(self, base, cfg) -> None:
            d = holder[0]
            if "acme/m@v2" in d.preloads and "acme/embed@v1" not in d.preloads:
                raise OSError("certificate being rotated")   # (the release's client, after the move)

        def call(self, method, path, body=None):
            return {"granted": True, "movers": 1, "cap": 1}
    monkeypatch.setattr(oc, "OriginClient", Flaky)
    d, r = make(tmp_path, '[[keep]]\nmodel = "acme/m@latest"\npriority = 5\n[[keep]]\nmodel = "acme/embed@v1"\n',
                held={("acme/m", "v1"): {"warm"}}, published=PUB, origin="http://origin:6969")
    holder.append(d)
    run_for(d, r, 2.0)
    assert "acme/m@v2" in d.preloads and "acme/embed@v1" in d.preloads, d.preloads
    assert not r.fetching
