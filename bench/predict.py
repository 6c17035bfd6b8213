"""Does prediction help? Misses of a tier that holds 5 of 20 models, over a synthetic two-week trace,
for LRU alone, LRU + the forecaster's prewarming, and an oracle that knows the future.

    .venv/bin/python bench/predict.py [--trace diurnal|background] [--seeds 1,2,3,4,5 | --rounds 5] [--days 14] [--models 20] [--slots 5]

This is a simulation, deterministic for a seed: its "rounds" are seeds (--rounds N: seeds 1..N;
default 5). Every mode replays each seed's trace; the JSON is in bench/_rounds.py's common shape with
misses standing for seconds (fewer is better): each mode's median and min-max over the seeds, and
LRU's misses over prediction's as a ratio of medians with the per-seed range (no ratio when a mode's
interquartile range over its median exceeds --max-spread), with the machine's state.

The trace (seeded): each model has a popularity (Zipf-like), a peak hour of the day and a width, a
weekend factor, and day-to-day noise (log-normal); requests per hour are Poisson around that rate,
at uniform times within the hour. Models overlap, so many hours have more than 5 active models.
``--trace background`` adds, for every model, demand at every hour (3% of its peak) and wider peaks:
much of what is asked for then cannot be told from the clock. ``--trace office`` (a helper's design,
kept as written): two thirds of the models peak in office hours, so they overlap heavily, with quiet
weekends, and each day's peaks move by about half an hour.

Every mode replays the same trace on a simulated clock against the real node code: a
``tiering.LocalNode`` over real directories, with 20 tiny published versions, whose warm tier's
capacity holds exactly ``slots`` of them (high = low watermark = 100%: one eviction per miss once
full). A request is ``node.preload(model)``; a miss is a report without ``already_present``.
- ``lru``: the node's own eviction (least recently used by ``last_access``, which a hit updates).
- ``lru_prediction``: the same, plus at every hour the daemon's prewarm policy
  (``weightd.intent.forecast``: ``Forecaster.rank`` over the loads before that hour, then
  ``choose_prewarm`` of the top ``slots``) preloads what it expects, before the hour's requests.
  Prewarm loads are not requests and are not counted as misses; they are counted as ``prewarms``.
- ``rate_oracle_prediction``: the same prewarm policy fed each model's *true* rate for the hour (not
  its requests): what a perfect forecaster of rates would reach. The gap to it is the forecaster's.
- ``oracle``: Belady's MIN on the same node: on a miss with the tier full, the resident model whose
  next request is furthest away is evicted (``node.evict(..., force=True)``) before the preload. It is
  the fewest misses any policy without prefetching can have.
Target (issue 18): prediction removes at least half of LRU's misses above the oracle's:
``removed_of_lru_excess = (lru - lru_prediction) / (lru - oracle) >= 0.5``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOUR = 3600.0
START = 1_796_601_600.0   # Monday 2026-12-07 00:00 UTC


TRACES = {  # (background: demand off-peak as a share of the peak; peak widths in hours)
    "diurnal": (0.0, 1.0, 2.5),   # each model busy around its own hours, idle otherwise
    "background": (0.03, 1.5, 4.0),   # wider peaks and a constant trickle at every hour
    "office": (0.0, 1.0, 3.0),    # two thirds of the models peak in office hours (08-18), quiet weekends,
}                                 # and each day's peak moves by ~30 min (a helper's trace, kept as written)


def trace(seed: int, days: int, models: int, kind: str = "diurnal"
          ) -> tuple[list[tuple[float, str]], dict[tuple[float, str], float]]:
    """Requests (time, model), and each model's true rate per hour (what the rate oracle knows)."""
    background, wlo, whi = TRACES[kind]
    rnd = random.Random(seed)
    names = [f"bench/model-{i:02d}" for i in range(models)]
    popularity = [1.0 / (i + 1) ** (0.9 if kind == "office" else 0.8) for i in range(models)]
    rnd.shuffle(popularity)
    if kind == "office":
        peak, width, weekend = [], [], []
        for _ in range(models):
            office = rnd.random() < 2 / 3
            peak.append(rnd.uniform(8, 18) if office else rnd.uniform(0, 24))
            weekend.append(rnd.uniform(0.1, 0.4) if office else rnd.uniform(0.6, 1.2))
            width.append(rnd.uniform(wlo, whi))
    else:
        peak = [rnd.uniform(0, 24) for _ in range(models)]
        width = [rnd.uniform(wlo, whi) for _ in range(models)]
        weekend = [rnd.choice((0.2, 0.5, 1.0, 1.5)) for _ in range(models)]
    total_rate = 6.0      # requests per hour over all models at their peaks, before noise
    out: list[tuple[float, str]] = []
    rates: dict[tuple[float, str], float] = {}
    for day in range(days):
        noise = [math.exp(rnd.gauss(0, 0.3)) for _ in range(models)]
        shift = [rnd.gauss(0, 0.5) if kind == "office" else 0.0 for _ in range(models)]
        for hour in range(24):
            t0 = START + day * 86400 + hour * HOUR
            is_weekend = (day % 7) >= 5
            for i, name in enumerate(names):
                def at(p: float) -> float:
                    d = abs(hour + 0.5 - p) % 24
                    d = min(d, 24 - d)
                    r = total_rate * popularity[i] * (background + math.exp(-d * d / (2 * width[i] ** 2)))
                    return r * (weekend[i] if is_weekend else 1.0)
                rates[(t0, name)] = at(peak[i])          # (the profile; not the day's noise and shift)
                for _ in range(_poisson(rnd, at(peak[i] + shift[i]) * noise[i])):
                    out.append((t0 + rnd.uniform(0, HOUR), name))
    out.sort()
    return out, rates


def _poisson(rnd: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rnd.random()
        if p <= limit:
            return n
        n += 1


class Clock:
    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t


def make_cold(base: Path, models: int) -> tuple[Path, int]:
    from tiering import LocalNode, TierSpec
    from tiering.sample import make_checkpoint
    cold = base / "cold"   # (made by the first publish, with its store marker)
    with LocalNode(hot=TierSpec("hot", base / "pub-hot", 1 << 30), warm=TierSpec("warm", base / "pub-warm", 1 << 30),
                   cold=cold, state_dir=base / "pub-state") as node:
        sizes = []
        for i in range(models):
            src = make_checkpoint(base / f"src-{i}", total_bytes=96 << 10, shards=1, layers=1, seed=f"m{i}")
            node.publish(src, f"bench/model-{i:02d}", "v1")
            sizes.append(node.resolve(f"bench/model-{i:02d}", "v1").size)
            shutil.rmtree(src)
    assert max(sizes) - min(sizes) < min(sizes) // 10, sizes
    return cold, max(sizes)


class RateOracle:
    """Knows each model's true rate for every hour (not the requests): the best any forecaster of
    rates could do, with the same prewarm policy."""

    def __init__(self, rates: dict[tuple[float, str], float]) -> None:
        self.by_hour: dict[float, list[tuple[str, float]]] = {}
        for (t, m), r in rates.items():
            self.by_hour.setdefault(t, []).append((m, r))

    def record(self, model: str, at: float) -> None:
        pass

    def rank(self, at: float, horizon_s: float):
        from weightd.intent.forecast import Forecast
        out = [Forecast(m, r, "true rate") for m, r in self.by_hour.get(at, [])]
        return sorted(out, key=lambda f: (-f.score, f.model))


def replay(mode: str, base: Path, cold: Path, size: int, slots: int, reqs: list[tuple[float, str]],
           top: int, rates: dict[tuple[float, str], float]) -> dict:
    from tiering import LocalNode, TierSpec
    from weightd.intent.forecast import Forecaster, choose_prewarm
    clock = Clock()
    cap = slots * size + size // 2            # exactly `slots` fit
    d = base / mode
    node = LocalNode(hot=TierSpec("hot", d / "hot", cap, None, 1.0, 1.0), warm=TierSpec("warm", d / "warm", cap, None,
                                                                                        1.0, 1.0),
                     cold=cold, state_dir=d / "state", now=clock)
    misses = prewarms = 0
    most = 0
    forecaster = RateOracle(rates) if mode == "rate_oracle_prediction" else Forecaster()
    next_use: dict[str, list[float]] = {}
    if mode == "oracle":
        for t, m in reqs:
            next_use.setdefault(m, []).append(t)
        pos = {m: 0 for m in next_use}
    hour = None
    try:
        for t, m in reqs:
            if mode in ("lru_prediction", "rate_oracle_prediction"):
                h = math.floor(t / HOUR) * HOUR
                while hour is None or hour < h:
                    hour = h if hour is None else hour + HOUR
                    clock.t = hour
                    held = _resident(node)
                    for k, f in enumerate(choose_prewarm(forecaster.rank(hour, HOUR), held, top)):
                        clock.t = hour + k        # (one after the other, a second apart, as a daemon does)
                        node.preload(f.model, "v1", tier="warm", lease_s=0)   # (held: a refresh)
                        prewarms += f.model not in held
            clock.t = t
            if mode == "oracle":
                pos[m] += 1
                held = _resident(node)
                if m not in held and len(held) >= slots:
                    def nxt(name: str) -> float:
                        p, ts = pos.get(name, 0), next_use.get(name, [])
                        return ts[p] if p < len(ts) else math.inf
                    victim = max(held, key=lambda n: (nxt(n), n))
                    node.evict(victim, "v1", "warm", force=True)
            r = node.preload(m, "v1", tier="warm", lease_s=0)
            if not r.to_dict().get("already_present"):
                misses += 1
            forecaster.record(m, t)
            most = max(most, len(_resident(node)))
    finally:
        node.close()
    assert most <= slots, f"{mode}: the tier held {most} > {slots}"
    return {"misses": misses, "prewarms": prewarms}


def _resident(node) -> set[str]:
    """The models in the warm tier (a directory listing: the bench's own bookkeeping stays cheap)."""
    try:
        return {f"bench/{n}" for n in os.listdir(node.tiers["warm"].path / "bench")}
    except FileNotFoundError:
        return set()


MODES = ("lru", "lru_prediction", "rate_oracle_prediction", "oracle")


def run_seed(seed: int, days: int, models: int, slots: int, top: int, kind: str) -> dict:
    reqs, rates = trace(seed, days, models, kind)
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-predict-"))
    try:
        cold, size = make_cold(base, models)
        t0 = time.monotonic()
        out = {m: replay(m, base, cold, size, slots, reqs, top, rates) for m in MODES}
        lru, pred, rate, orc = (out[m]["misses"] for m in MODES)
        excess = lru - orc
        return {"seed": seed, "requests": len(reqs), "misses": {m: out[m]["misses"] for m in MODES},
                "prewarms": out["lru_prediction"]["prewarms"],
                "removed_of_lru_excess": round((lru - pred) / excess, 3) if excess > 0 else None,
                "rate_oracle_removed_of_lru_excess": round((lru - rate) / excess, 3) if excess > 0 else None,
                "seconds": round(time.monotonic() - t0, 1)}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3,4,5", help="the traces' seeds: this simulation's rounds (>= 5)")
    ap.add_argument("--rounds", type=int, default=None, help="seeds 1..N (instead of --seeds)")
    ap.add_argument("--max-spread", type=float, default=1.0,
                    help="no ratio when a mode's misses vary more than this over the seeds (IQR over median)")
    ap.add_argument("--trace", choices=sorted(TRACES), default="diurnal")
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--slots", type=int, default=5)
    ap.add_argument("--top", type=int, default=None, help="models prewarmed per hour at most (default: --slots)")
    a = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in a.seeds.split(",")] if a.rounds is None else list(range(1, a.rounds + 1))
        if not seeds or not 1 <= a.days <= 60 or not 2 <= a.models <= 200 or not 1 <= a.slots < a.models:
            raise ValueError
    except ValueError:
        print("bench/predict.py: error: --seeds N,N,...; --days 1-60; --models 2-200; --slots 1 to models-1",
              file=sys.stderr)
        return 2
    top = a.top if a.top is not None else a.slots
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _rounds import machine_state, report, speedup
    m0 = machine_state()
    runs = [run_seed(s, a.days, a.models, a.slots, top, a.trace) for s in seeds]
    m1 = machine_state()
    removed = [r["removed_of_lru_excess"] for r in runs if r["removed_of_lru_excess"] is not None]
    # in the common shape (misses stand for seconds: fewer is better): LRU's misses over prediction's,
    # the median over seeds with the per-seed range (the rounds of a simulation are its seeds)
    misses = {m: [r["misses"][m] for r in runs] for m in runs[0]["misses"]}
    doc = report(
        "predict", misses, [speedup(misses, "lru_prediction", "lru", max_spread=a.max_spread)],
        rounds=len(seeds), max_spread=a.max_spread, machine=(m0, m1), unit="misses", **{
            "bench": "predict", "seeds": seeds, "figure": "misses (the rounds are seeds)",
            "trace": a.trace, "days": a.days, "models": a.models, "slots": a.slots, "top": top,
            "oracle_kind": "Belady MIN on the same LocalNode (forced eviction of the furthest next request)",
            "baseline": "lru (the node's own eviction, same run)", "runs": runs,
            "removed_of_lru_excess": {"median": statistics.median(removed) if removed else None,
                                      "min": min(removed, default=None), "max": max(removed, default=None)},
            "rate_oracle_removed_of_lru_excess": statistics.median(
                [r["rate_oracle_removed_of_lru_excess"] for r in runs
                 if r["rate_oracle_removed_of_lru_excess"] is not None] or [math.nan]),
            "target": 0.5})
    doc["met"] = bool(removed) and statistics.median(removed) >= 0.5 and min(removed) >= 0.5
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
