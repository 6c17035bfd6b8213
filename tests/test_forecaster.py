"""The forecaster on small seeded traces: seasonality, decay, no peeking, explanations, persistence
of a (possibly damaged) history, and the prewarm choice the daemon and bench/predict.py share."""

from __future__ import annotations

import calendar
import math
import random

import pytest

from weightd.intent.forecast import Forecast, Forecaster, choose_prewarm


def utc(mo: int, d: int, h: int, mi: int = 0) -> float:
    return float(calendar.timegm((2026, mo, d, h, mi, 0)))


def test_a_weekly_pattern_ranks_first_at_its_hour_and_not_elsewhere() -> None:
    rnd = random.Random(7)
    f = Forecaster()
    mondays = (2, 9, 16)                                   # November 2026
    for d in mondays:
        for _ in range(3):
            f.record("acme/standup", utc(11, d, 9, rnd.randrange(60)))
    for d in range(1, 22):                                  # a daily job at 03:xx, once a day
        f.record("acme/batch", utc(11, d, 3, rnd.randrange(60)))
    for _ in range(40):                                     # noise at random hours
        f.record("acme/noise", utc(11, rnd.randrange(1, 22), rnd.randrange(24), rnd.randrange(60)))
    top = f.rank(utc(11, 23, 9))                            # Monday 09:00 of week 4
    assert top[0].model == "acme/standup" and top[0].score > 0.8, top   # (3 a Monday, half of it spread to 08 and 10)
    assert "9 load(s) on Mons at these hours" in top[0].reason and "09:00-10:00 UTC Mon" in top[0].reason
    at3 = f.rank(utc(11, 23, 3))
    assert at3[0].model == "acme/batch" and 0.4 < at3[0].score < 1.2
    assert all(x.model != "acme/standup" for x in at3)      # nothing at 03:00 on Mondays
    saturday = f.explain("acme/standup", utc(11, 28, 9))    # weekly knows Saturday is not Monday
    assert saturday.score < 0.3 * top[0].score


def test_old_patterns_fade_and_only_the_past_counts() -> None:
    f = Forecaster(half_life_s=3 * 86400)
    for d in range(1, 8):
        f.record("acme/old", utc(11, d, 14, 10))          # first week of November
    for d in range(22, 29):
        f.record("acme/new", utc(11, d, 14, 10))          # a month later, same hour
    top = f.rank(utc(11, 29, 14))
    assert [x.model for x in top[:2]] == ["acme/new", "acme/old"] and top[0].score > 5 * top[1].score
    g = Forecaster()
    g.record("acme/future", utc(12, 1, 14, 10))
    assert g.rank(utc(11, 30, 14)) == []                   # no peeking at loads after `at`


def test_the_horizon_sums_the_hours_it_covers() -> None:
    f = Forecaster()
    for d in range(1, 15):
        f.record("acme/x", utc(11, d, 10, 5))
        f.record("acme/x", utc(11, d, 11, 5))
    one = f.explain("acme/x", utc(11, 15, 10)).score
    two = f.explain("acme/x", utc(11, 15, 10), 2 * 3600).score
    half = f.explain("acme/x", utc(11, 15, 10, 30), 1800).score
    assert math.isclose(two, 2 * one, rel_tol=0.05) and math.isclose(half, one / 2, rel_tol=0.05)


def test_history_round_trips_and_damage_is_refused_with_a_reason() -> None:
    f = Forecaster()
    for i in range(10):
        f.record("acme/x", utc(11, 1 + i, 9))
    g = Forecaster.from_json(f.to_json())
    assert g.rank(utc(11, 12, 9)) == f.rank(utc(11, 12, 9))
    for bad, msg in [([], "expected a JSON object"), ({"format": 2}, "unknown format"),
                     ({"format": 1, "events": []}, "'events' must map"),
                     ({"format": 1, "events": {"a/x": "t"}}, "expected a list of times"),
                     ({"format": 1, "events": {"a/x": [float("nan")]}}, "is not a unix time"),
                     ({"format": 1, "events": {"a/x": [True]}}, "is not a unix time"),
                     ({"format": 1, "events": {"x" * 600: [1.0]}}, "not a short string"),
                     ({"format": 1, "events": {"a/x": [1.0] * 500_000}}, "more than 400000 events")]:
        with pytest.raises(ValueError, match=msg):
            Forecaster.from_json(bad)


def test_the_history_is_bounded() -> None:
    f = Forecaster(max_events=1000)
    for i in range(5000):
        f.record(f"acme/m{i % 7}", 1_700_000_000.0 + i * 60)
    assert sum(len(v) for v in f.events.values()) <= 1000
    assert min(min(v) for v in f.events.values()) >= 1_700_000_000.0 + 3999 * 60   # the oldest went first


def test_choose_prewarm_orders_least_expected_first_and_skips_the_unlikely() -> None:
    ranked = [Forecast("a/1", 3.0, ""), Forecast("a/2", 2.0, ""), Forecast("a/3", 0.6, ""), Forecast("a/4", 0.2, "")]
    # least expected first (held or not: a held one is refreshed); never a/3 when only the top 2 count
    assert [f.model for f in choose_prewarm(ranked, {"a/2"}, 2)] == ["a/2", "a/1"]
    assert [f.model for f in choose_prewarm(ranked, {"a/1"}, 3)] == ["a/3", "a/2", "a/1"]
    assert [f.model for f in choose_prewarm(ranked, set(), 10)] == ["a/3", "a/2", "a/1"]   # (a/4: unlikely)
    assert choose_prewarm(ranked, set(), 0) == []


def test_the_prediction_benchmark_runs_on_the_real_node_code() -> None:
    """bench/predict.py, small: JSON with the four contenders, the tier never over its slots (the
    bench asserts it), and the oracle never worse than LRU (it is optimal for demand misses)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "bench/predict.py", "--seeds", "1", "--days", "2", "--models", "8",
                        "--slots", "3"], capture_output=True, text=True, timeout=120, cwd=root)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    run = doc["runs"][0]
    m = run["misses"]
    assert set(m) == {"lru", "lru_prediction", "rate_oracle_prediction", "oracle"} and run["requests"] > 20
    assert m["oracle"] <= m["lru"] and 0 < m["oracle"]
    bad = subprocess.run([sys.executable, "bench/predict.py", "--slots", "30"], capture_output=True, text=True,
                         timeout=60, cwd=root)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
