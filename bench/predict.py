"""Does prediction help? Misses of a tier that holds ``--slots`` of ``--models`` models over a
synthetic trace, for LRU alone, LRU + the forecaster's prewarming, and an oracle that knows the future.

    .venv/bin/python bench/predict.py [--seed 1 | --seeds 1,2,3,4,5] [--days 14] [--models 20] [--slots 5]
                                      [--policy plan|place] [--min-score 0.5]

Prints one JSON document. The trace (seeded) stands for a fleet's working week: each model has a
popularity (Zipf-like, s = 0.9), a peak hour (two thirds of the models in office hours, 08-18 UTC,
the rest at any hour, like batch jobs) with a width of 1-3 h, a weekend factor (office models drop
to 10-40 % on Saturdays and Sundays, the others stay at 60-120 %), and day-to-day noise (each day
its rate is scaled log-normally, sigma 0.3, and its peak moves by about half an hour); requests per
hour are Poisson around that rate, at uniform times within the hour. Peaks overlap, so many hours ask
for more models than the tier holds (``busy_hours`` counts them).

Every mode replays the same trace on a simulated clock (the node's ``now`` and ``monotonic``) against the
real node code: a ``tiering.LocalNode`` over real temporary directories, ``--models`` published
versions of one 128 KiB file each, and a warm tier whose capacity holds exactly ``--slots`` of them
(high = low watermark = 100 %: one eviction per miss once full; checked after every operation). A
request is ``node.preload(model, tier="warm", lease_s=0)``; a miss is a report without
``already_present``.

- ``lru``: the node's own eviction (least recently used by ``last_access``; the bench checks after
  every hit that the hit moved ``last_access`` to the simulated now, ``hit_touches_last_access``).
- ``lru_prediction``: the same, and at every hour boundary a prewarm round: the forecaster
  (:mod:`weightd.intent.forecast`, fed every request before that hour) ranks the models for the hour
  and the prewarm policy of that module says what to preload (``lease_s=0``, evicting by LRU), one
  after the other (1 ms apart on the simulated clock, as a daemon's preloads follow each other).
  ``--policy plan`` (default): ``plan_prewarm``: of the top ``--slots`` scoring at least
  ``--min-score``, those held are preloaded again (``refreshes``: their recency moves to now) and the
  others placed, the least expected first. ``--policy place``: ``choose_prewarm`` alone, with room =
  how many of the top ``--slots`` the tier does not hold, best first, nothing refreshed. Prewarms are
  neither requests nor misses; placements are counted (``prewarms``).
- ``oracle``: Belady's MIN on the same node: on a miss with the tier full, the resident model whose
  next request is furthest away is evicted (``node.evict(..., force=True)``) before the preload, so
  the node never evicts by itself (checked). The fewest misses any policy without prefetching has.

Target: prediction removes at least half of LRU's misses above the oracle's,
``removed_of_lru_excess = (lru - lru_prediction) / (lru - oracle) >= 0.5`` (null when LRU has no
excess to remove). With ``--seeds``, each seed's document and the median and range of that ratio.

What the replays found (seeds 1-5, default settings; see the JSON for the figures): a hit does move
``last_access``, so the node's LRU is real LRU. ``--policy place`` removes far less of LRU's excess
than ``plan``: without a refresh, what a placement evicts is often a model the forecaster expects but
that was last used longest ago, and a model placed first is the first a request for an unexpected one
evicts. The first days are spent learning (no history yet: nothing is prewarmed on day one).
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOUR_S = 3600.0
START = 1_796_601_600.0        # Monday 2026-12-07 00:00 UTC
MODEL_BYTES = 128 << 10
TIER = "warm"
TARGET = 0.5
PREWARM_STEP_S = 0.001         # simulated time between a round's preloads
PEAK_RATE_PER_H = 6.0          # requests per hour of the most popular model at its peak, before noise
ORACLE_KIND = ("Belady MIN on the same LocalNode: before a miss with the tier full, the resident model whose "
               "next request is furthest away is evicted with node.evict(force=True)")
MODES = ("lru", "lru_prediction", "oracle")


@dataclass(frozen=True)
class Profile:
    name: str
    popularity: float
    peak_h: float
    width_h: float
    weekend: float


def profiles(rnd: random.Random, models: int) -> list[Profile]:
    popularity = [1.0 / (i + 1) ** 0.9 for i in range(models)]
    rnd.shuffle(popularity)
    out = []
    for i, pop in enumerate(popularity):
        office = rnd.random() < 2 / 3
        peak = rnd.uniform(8, 18) if office else rnd.uniform(0, 24)
        weekend = rnd.uniform(0.1, 0.4) if office else rnd.uniform(0.6, 1.2)
        out.append(Profile(f"bench/model-{i:02d}", pop, peak, rnd.uniform(1.0, 3.0), weekend))
    return out


def trace(seed: int, days: int, models: int) -> list[tuple[float, str]]:
    """Requests (unix time, model), in time order."""
    rnd = random.Random(seed)
    profs = profiles(rnd, models)
    out: list[tuple[float, str]] = []
    for day in range(days):
        weekend = day % 7 >= 5
        today = [(math.exp(rnd.gauss(0, 0.3)), rnd.gauss(0, 0.5)) for _ in profs]   # (rate scale, peak shift)
        for hour in range(24):
            t0 = START + day * 86400 + hour * HOUR_S
            for p, (scale, shift) in zip(profs, today):
                d = abs(hour + 0.5 - p.peak_h - shift) % 24
                d = min(d, 24 - d)
                rate = PEAK_RATE_PER_H * p.popularity * math.exp(-d * d / (2 * p.width_h ** 2)) * scale
                rate *= p.weekend if weekend else 1.0
                out.extend((t0 + rnd.uniform(0, HOUR_S), p.name) for _ in range(_poisson(rnd, rate)))
    out.sort()
    return out


def _poisson(rnd: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rnd.random()
        if p <= limit:
            return n
        n += 1


def busy_hours(reqs: list[tuple[float, str]], slots: int) -> int:
    """Hours in which more distinct models were asked for than the tier holds."""
    by_hour: dict[int, set[str]] = {}
    for t, m in reqs:
        by_hour.setdefault(int(t // HOUR_S), set()).add(m)
    return sum(len(s) > slots for s in by_hour.values())


class Clock:
    """The simulated wall clock the node reads (``now``)."""

    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t


def publish(base: Path, names: list[str]) -> tuple[Path, int]:
    """Cold storage with one version of each model (one 128 KiB file each); the size of a version."""
    from tiering import LocalNode, TierSpec
    cold = base / "cold"
    cold.mkdir()
    sizes = set()
    with LocalNode(hot=TierSpec("hot", base / "pub-hot", 1 << 30), warm=TierSpec("warm", base / "pub-warm", 1 << 30),
                   cold=cold, state_dir=base / "pub-state") as node:
        for i, name in enumerate(names):
            src = base / "src" / str(i)
            src.mkdir(parents=True)
            (src / "weights.bin").write_bytes(random.Random(f"{name}").randbytes(MODEL_BYTES))
            node.publish(src, name, "v1")
            sizes.add(node.resolve(name, "v1").size)
    shutil.rmtree(base / "src")
    if len(sizes) != 1:
        raise AssertionError(f"published versions differ in size: {sorted(sizes)}")
    return cold, sizes.pop()


class Tier:
    """One mode's node: a LocalNode whose warm tier holds exactly ``slots`` versions."""

    def __init__(self, base: Path, cold: Path, size: int, slots: int) -> None:
        from tiering import LocalNode, TierSpec
        self.clock = Clock()
        self.slots = slots
        cap = slots * size + size // 2
        self.dir = base / "warm"
        self.node = LocalNode(hot=TierSpec("hot", base / "hot", cap, None, 1.0, 1.0),
                              warm=TierSpec(TIER, self.dir, cap, None, 1.0, 1.0),
                              cold=cold, state_dir=base / "state", now=self.clock, monotonic=self.clock,
                              copy_threads=1)
        self.most = 0

    def held(self) -> set[str]:
        """The models in the tier (a directory listing: cheap, and what is actually there)."""
        try:
            names = {f"bench/{n}" for n in os.listdir(self.dir / "bench")}
        except FileNotFoundError:
            names = set()
        self.most = max(self.most, len(names))
        if len(names) > self.slots:
            raise AssertionError(f"the tier holds {len(names)} models, more than {self.slots}")
        return names

    def preload(self, model: str, at: float):
        self.clock.t = max(at, self.clock.t)   # (a request in the first milliseconds of a prewarm round waits)
        r = self.node.preload(model, "v1", tier=TIER, lease_s=0)
        self.held()
        return r

    def close(self) -> None:
        self.node.close()


def replay_lru(tier: Tier, reqs: list[tuple[float, str]]) -> dict:
    misses = hits = touched = 0
    for t, m in reqs:
        r = tier.preload(m, t)
        if r.already_present:
            hits += 1
            row = tier.node.state.copy(TIER, m, "v1")
            touched += row is not None and row.last_access == tier.clock.t
        else:
            misses += 1
    return {"misses": misses, "hit_touches_last_access": hits > 0 and touched == hits,
            "hits_checked": hits, "hits_that_touched": touched}


def replay_prediction(tier: Tier, reqs: list[tuple[float, str]], policy: str, min_score: float) -> dict:
    from weightd.intent.forecast import Forecaster, choose_prewarm, plan_prewarm
    forecaster = Forecaster()
    misses = prewarms = refreshes = 0
    hour = START
    for t, m in reqs:
        while hour + HOUR_S <= t:        # every hour boundary up to this request: a prewarm round
            hour += HOUR_S
            ranked = forecaster.rank(hour, HOUR_S)
            held = tier.held()
            if policy == "plan":
                todo = plan_prewarm(ranked, held, tier.slots, min_score=min_score)
            else:
                room = sum(f.model not in held for f in ranked[:tier.slots])
                todo = choose_prewarm(ranked, held, room, min_score=min_score)
            for i, f in enumerate(todo):
                placed = not tier.preload(f.model, hour + i * PREWARM_STEP_S).already_present
                prewarms += placed
                refreshes += not placed
        misses += not tier.preload(m, t).already_present
        forecaster.record(m, t, "load")
    return {"misses": misses, "prewarms": prewarms, "refreshes": refreshes}


def replay_oracle(tier: Tier, reqs: list[tuple[float, str]]) -> dict:
    uses: dict[str, list[int]] = {}
    for i, (_t, m) in enumerate(reqs):
        uses.setdefault(m, []).append(i)
    pos = dict.fromkeys(uses, 0)

    def next_use(model: str) -> float:
        p, ix = pos.get(model, 0), uses.get(model, [])
        return ix[p] if p < len(ix) else math.inf

    misses = 0
    for t, m in reqs:
        pos[m] += 1
        held = tier.held()
        if m not in held and len(held) >= tier.slots:
            victim = max(sorted(held), key=next_use)
            tier.clock.t = t
            tier.node.evict(victim, "v1", TIER, force=True)
        r = tier.preload(m, t)
        if r.evicted:
            raise AssertionError(f"oracle: the node evicted {r.evicted} itself")
        misses += not r.already_present
    return {"misses": misses}


REPLAYS = {"lru": replay_lru, "oracle": replay_oracle}


def run_seed(seed: int, days: int, models: int, slots: int, policy: str = "plan", min_score: float = 0.5) -> dict:
    t0 = time.monotonic()
    reqs = trace(seed, days, models)
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-predict-"))
    try:
        cold, size = publish(base, [f"bench/model-{i:02d}" for i in range(models)])
        out = {}
        for mode in MODES:
            tier = Tier(base / mode, cold, size, slots)
            try:
                out[mode] = (replay_prediction(tier, reqs, policy, min_score) if mode == "lru_prediction"
                             else REPLAYS[mode](tier, reqs))
            finally:
                tier.close()
            out[mode]["most_held"] = tier.most
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lru, pred, orc = (out[m]["misses"] for m in MODES)
    removed = round((lru - pred) / (lru - orc), 3) if lru > orc else None
    return {"bench": "predict", "seed": seed, "days": days, "models": models, "slots": slots,
            "requests": len(reqs), "busy_hours": busy_hours(reqs, slots), "hours": days * 24,
            "misses": {m: out[m]["misses"] for m in MODES},
            "removed_of_lru_excess": removed, "target": TARGET, "met": removed is not None and removed >= TARGET,
            "prewarms": out["lru_prediction"]["prewarms"], "refreshes": out["lru_prediction"]["refreshes"],
            "policy": policy, "min_score": min_score,
            "most_held": max(out[m]["most_held"] for m in MODES),
            "hit_touches_last_access": out["lru"]["hit_touches_last_access"],
            "hits_checked": out["lru"]["hits_checked"], "hits_that_touched": out["lru"]["hits_that_touched"],
            "oracle_kind": ORACLE_KIND, "seconds": round(time.monotonic() - t0, 1)}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:   # one line, exit 2 (argparse prints the usage too)
        print(f"bench/predict.py: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", default=None, help="several seeds, e.g. 1,2,3,4,5 (overrides --seed)")
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--slots", type=int, default=5)
    ap.add_argument("--policy", choices=("plan", "place"), default="plan",
                    help="plan: plan_prewarm (refresh held, place the rest, least expected first); "
                         "place: choose_prewarm alone")
    ap.add_argument("--min-score", type=float, default=0.5, help="expected loads in the hour to prewarm (the daemon's default)")
    a = ap.parse_args(argv)
    if a.seeds is not None:
        try:
            a.seed_list = [int(s) for s in a.seeds.split(",")]
        except ValueError:
            ap.error(f"--seeds: expected whole numbers separated by commas, got {a.seeds[:40]!r}")
        if not 1 <= len(a.seed_list) <= 20:
            ap.error("--seeds: 1 to 20 seeds")
    else:
        a.seed_list = None
    if not 1 <= a.days <= 60:
        ap.error("--days: 1 to 60")
    if not 2 <= a.models <= 100:
        ap.error("--models: 2 to 100")
    if not 1 <= a.slots < a.models:
        ap.error("--slots: 1 to models - 1")
    if not 0 <= a.min_score <= 1000:   # (NaN fails too)
        ap.error("--min-score: 0 to 1000 expected loads")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.seed_list is None:
        print(json.dumps(run_seed(a.seed, a.days, a.models, a.slots, a.policy, a.min_score), indent=2))
        return 0
    t0 = time.monotonic()
    runs = [run_seed(s, a.days, a.models, a.slots, a.policy, a.min_score) for s in a.seed_list]
    removed = [r["removed_of_lru_excess"] for r in runs if r["removed_of_lru_excess"] is not None]
    median = statistics.median(removed) if removed else None
    print(json.dumps({
        "bench": "predict", "seeds": a.seed_list, "days": a.days, "models": a.models, "slots": a.slots,
        "policy": a.policy, "min_score": a.min_score, "target": TARGET, "oracle_kind": ORACLE_KIND,
        "removed_of_lru_excess": {"median": median, "min": min(removed, default=None),
                                  "max": max(removed, default=None)},
        "met": median is not None and median >= TARGET, "met_by_every_seed": all(r["met"] for r in runs),
        "seconds": round(time.monotonic() - t0, 1), "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
