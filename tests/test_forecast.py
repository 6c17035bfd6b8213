"""The forecaster on small seeded traces (seasonality, decay, no peeking, explanations, a history file
that may be damaged), the prewarm policy the daemon and bench/predict.py share, and the benchmark
itself, run small on the real node code."""

from __future__ import annotations

import calendar
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from weightd.intent.forecast import Forecast, Forecaster, choose_prewarm, hour_of_week, plan_prewarm

ROOT = Path(__file__).resolve().parent.parent


def utc(mo: int, d: int, h: int, mi: int = 0) -> float:
    """A time in November/December 2026 (Mondays: November 2, 9, 16, 23, 30)."""
    return float(calendar.timegm((2026, mo, d, h, mi, 0)))


def weekly_standup(rnd: random.Random) -> Forecaster:
    """Three weeks: acme/standup once every Monday at 09:xx and once on a Wednesday at 09:xx,
    acme/batch every day at 03:xx, acme/noise 40 times at random hours."""
    f = Forecaster()
    for d in (2, 9, 16):
        f.record("acme/standup", utc(11, d, 9, rnd.randrange(60)), "lease")
    f.record("acme/standup", utc(11, 4, 9, rnd.randrange(60)), "preload")
    for d in range(1, 22):
        f.record("acme/batch", utc(11, d, 3, rnd.randrange(60)))
    for _ in range(40):
        f.record("acme/noise", utc(11, rnd.randrange(1, 22), rnd.randrange(24), rnd.randrange(60)))
    return f


def test_hours_of_the_week_start_on_monday_utc() -> None:
    assert hour_of_week(utc(11, 2, 0)) == 0 and hour_of_week(utc(11, 2, 9, 59)) == 9
    assert hour_of_week(utc(11, 8, 23, 30)) == 167 and hour_of_week(utc(11, 9, 0)) == 0


def test_a_monday_morning_pattern_ranks_first_on_monday_morning_only() -> None:
    f = weekly_standup(random.Random(7))
    monday_9 = f.rank(utc(11, 23, 9))                      # Monday 09:00 of week 4
    assert monday_9[0].model == "acme/standup", monday_9
    x = monday_9[0]
    # one load a Monday at 09: the weekly view expects about 1, of which the hour keeps half (a quarter
    # goes to 08 and to 10); the daily view 4 loads in 22 days, halved the same way; blended 0.6/0.4
    assert 0.45 < x.weekly < 0.55 and 0.07 < x.daily < 0.11
    assert math.isclose(x.score, 0.6 * x.weekly + 0.4 * x.daily, rel_tol=1e-9)
    monday_3 = f.rank(utc(11, 23, 3))
    assert monday_3[0].model == "acme/batch" and 0.4 < monday_3[0].score < 0.6
    assert "acme/standup" not in [x.model for x in monday_3]  # never loaded around 03:00: score 0, omitted
    saturday_9 = f.explain("acme/standup", utc(11, 28, 9))  # the weekly view knows Saturday from Monday
    assert saturday_9.score < 0.4 * monday_9[0].score
    assert f.rank(utc(11, 23, 9), top=1) == monday_9[:1]


def test_the_reason_gives_the_counts_behind_the_score() -> None:
    f = weekly_standup(random.Random(7))
    x = f.explain("acme/standup", utc(11, 23, 9))
    assert (x.loads_weekly, x.loads_daily) == (3, 4)
    assert x.reason.startswith(f"expected {x.score:.1f} loads 09:00-10:00 UTC Mon (3 weeks of history): "), x.reason
    assert "3 load(s) on Mondays at this hour and 4 at this hour on any day (half-life 14 d)" in x.reason
    two = f.explain("acme/standup", utc(11, 23, 8, 30))      # a horizon over two hours says so
    assert "08:30-09:30 UTC Mon" in two.reason and "3 load(s) on Mondays at these hours" in two.reason
    assert "\n" not in x.reason and "\n" not in two.reason
    never = f.explain("acme/other", utc(11, 23, 9))
    assert never.score == 0 and "expected 0.0 loads" in never.reason and "0 load(s) on Mondays" in never.reason


def test_the_horizon_sums_the_hours_it_covers() -> None:
    f = Forecaster()
    for d in range(1, 15):
        f.record("acme/x", utc(11, d, 10, 5))
        f.record("acme/x", utc(11, d, 11, 5))
    one = f.explain("acme/x", utc(11, 15, 10)).score
    # 10:00-12:00: the hour at 10 (1/2 + 1/4 from 11) and the hour at 11 (1/2 + 1/4 from 10)
    assert math.isclose(f.explain("acme/x", utc(11, 15, 10), 7200).score, 2 * one, rel_tol=1e-3)
    assert math.isclose(f.explain("acme/x", utc(11, 15, 10), 3 * 3600).score, 7 / 3 * one, rel_tol=1e-3)   # (+1/4 at 12)
    assert math.isclose(f.explain("acme/x", utc(11, 15, 10), 5400).score, 1.5 * one, rel_tol=1e-3)  # (half of 11)
    assert 0.7 < one < 0.8     # one load an hour at 10 and at 11, none at 09: 1/2 + 1/4 (from 11)


def test_an_old_pattern_fades_and_a_new_one_takes_over() -> None:
    def history(half_life_s: float) -> Forecaster:
        f = Forecaster(half_life_s=half_life_s)
        for d in range(1, 8):
            f.record("acme/old", utc(11, d, 14, 10))       # the first week of November
        for d in range(22, 29):
            f.record("acme/new", utc(11, d, 14, 10))       # three weeks later, the same hour
        return f
    fading = history(3 * 86400.0).rank(utc(11, 29, 14))
    assert [x.model for x in fading] == ["acme/new", "acme/old"] and fading[0].score > 20 * fading[1].score
    # without decay to speak of, both weigh about the same: the decay is what makes the difference
    flat = {x.model: x.score for x in history(1000 * 86400.0).rank(utc(11, 29, 14))}
    assert math.isclose(flat["acme/new"], flat["acme/old"], rel_tol=0.05)


def test_only_loads_before_the_time_asked_about_count() -> None:
    past = weekly_standup(random.Random(3))
    with_future = weekly_standup(random.Random(3))
    for d in (23, 24, 25):                                 # loads after `at`: the forecast must not see them
        with_future.record("acme/standup", utc(11, d, 9, 30))
        with_future.record("acme/late", utc(11, d, 9, 30))
    at = utc(11, 23, 9, 20)
    assert with_future.rank(at) == past.rank(at)
    only_future = Forecaster()
    only_future.record("acme/late", utc(12, 1, 9, 30))
    assert only_future.rank(utc(11, 30, 9)) == [] and only_future.rank(utc(12, 8, 9))[0].model == "acme/late"


def test_the_history_round_trips_through_json() -> None:
    f = weekly_standup(random.Random(11))
    g = Forecaster.from_json(json.loads(json.dumps(f.to_json())))
    assert len(g) == len(f) == 3 + 1 + 21 + 40
    for at in (utc(11, 23, 9), utc(11, 23, 3, 30), utc(11, 28, 17)):
        assert g.rank(at, 7200) == f.rank(at, 7200)


@pytest.mark.parametrize("doc, message", [
    ([], "expected a JSON object, got list"),
    ("{}", "expected a JSON object, got str"),
    (None, "expected a JSON object, got NoneType"),
    ({"events": {}}, "format None is not 1"),
    ({"format": 2, "events": {}}, "format 2 is not 1"),
    ({"format": True, "events": {}}, "format True is not 1"),
    ({"format": 1, "events": {}, "extra": 1}, "unknown key 'extra'"),
    ({"format": 1, "events": {}, "half_life_s": "14d"}, "half_life_s '14d' is not a number"),
    ({"format": 1, "events": {}, "weekly_weight": float("nan")}, "weekly_weight nan is not a number"),
    ({"format": 1}, "'events' must map model names to lists of times, got NoneType"),
    ({"format": 1, "events": [["a/x", 1.0]]}, "'events' must map model names to lists of times, got list"),
    ({"format": 1, "events": {"a/x": "1.0"}}, r"events\['a/x'\]: expected a list of times, got str"),
    ({"format": 1, "events": {"a/x": {"t": 1.0}}}, r"events\['a/x'\]: expected a list of times, got dict"),
    ({"format": 1, "events": {"a/x": [1.0, float("nan")]}}, r"events\['a/x'\]\[1\]: nan is not a unix time"),
    ({"format": 1, "events": {"a/x": [float("inf")]}}, r"\[0\]: inf is not a unix time"),
    ({"format": 1, "events": {"a/x": [-5.0]}}, r"\[0\]: -5.0 is not a unix time"),
    ({"format": 1, "events": {"a/x": [1e300]}}, r"\[0\]: 1e\+300 is not a unix time"),
    ({"format": 1, "events": {"a/x": [True]}}, r"\[0\]: True is not a unix time"),
    ({"format": 1, "events": {"a/x": ["1700000000"]}}, r"\[0\]: '1700000000' is not a unix time"),
    ({"format": 1, "events": {"a/x": [[1.0]]}}, r"\[0\]: \[1.0\] is not a unix time"),
    ({"format": 1, "events": {"x" * 301: [1.0]}}, "a model name must be a printable string of 1 to 300"),
    ({"format": 1, "events": {"": [1.0]}}, "a model name must be a printable string"),
    ({"format": 1, "events": {"a/x\nb": [1.0]}}, "a model name must be a printable string"),
    ({"format": 1, "events": {7: [1.0]}}, "a model name must be a printable string of 1 to 300 characters, got 7"),
    ({"format": 1, "events": {"a/x": [1.0] * 41}}, "more than 40 load times"),
    ({"format": 1, "events": {f"a/{i}": [] for i in range(41)}}, "41 models, more than 40"),
])
def test_a_damaged_history_is_refused_with_one_line_naming_the_damage(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        Forecaster.from_json(doc, max_events=10)
    assert "\n" not in str(e.value) and str(e.value).startswith("load history: ")


def test_a_history_larger_than_allowed_keeps_its_newest_loads() -> None:
    doc = {"format": 1, "events": {"a/x": [1_700_000_000.0 + i for i in range(30)],
                                   "a/y": [1_700_000_000.5 + i for i in range(5)]}}
    f = Forecaster.from_json(doc, max_events=10)
    assert len(f) == 10 and f.models == ["a/x"] and f.loads("a/x") == [1_700_000_000.0 + i for i in range(20, 30)]


def test_the_history_is_bounded_and_old_loads_are_dropped() -> None:
    f = Forecaster(max_events=1000)
    for i in range(5000):
        f.record(f"acme/m{i % 7}", 1_700_000_000.0 + i * 60)
    assert len(f) <= 1000
    assert min(min(f.loads(m)) for m in f.models) >= 1_700_000_000.0 + 4000 * 60   # the oldest went first
    g = Forecaster(half_life_s=86400.0)
    g.record("acme/a", utc(11, 1, 12))
    g.record("acme/b", utc(11, 2, 11))
    g.record("acme/a", utc(11, 10, 12))                    # 9 days later: the first load weighs < 0.4 %
    assert g.loads("acme/a") == [utc(11, 10, 12)]
    assert g.to_json()["events"] == {"acme/a": [utc(11, 10, 12)]}   # (acme/b's only load: also too old)


def test_bad_loads_and_settings_are_refused() -> None:
    f = Forecaster()
    for model, at in [("", 1e9), ("x" * 301, 1e9), ("a/x", float("nan")), ("a/x", -1.0), (None, 1e9)]:
        with pytest.raises(ValueError):
            f.record(model, at)                             # type: ignore[arg-type]
    assert len(f) == 0
    for kw in [{"half_life_s": 0}, {"half_life_s": float("inf")}, {"weekly_weight": 1.5}, {"max_events": 0},
               {"neighbour_weight": 0.5}]:
        with pytest.raises(ValueError):
            Forecaster(**kw)
    with pytest.raises(ValueError, match="horizon_s"):
        f.rank(1e9, 0)


def fc(model: str, score: float) -> Forecast:
    return Forecast(model, score, f"expected {score}")


def test_choose_prewarm_skips_what_is_held_and_what_is_unlikely() -> None:
    ranked = [fc("a/1", 3.0), fc("a/2", 2.0), fc("a/3", 0.6), fc("a/4", 0.2)]
    assert [f.model for f in choose_prewarm(ranked, {"a/2"}, 2)] == ["a/1", "a/3"]
    assert [f.model for f in choose_prewarm(ranked, set(), 10)] == ["a/1", "a/2", "a/3"]   # (a/4: unlikely)
    assert [f.model for f in choose_prewarm(ranked, set(), 10, min_score=0.1)] == ["a/1", "a/2", "a/3", "a/4"]
    assert [f.model for f in choose_prewarm(ranked[::-1], {"a/1"}, 1)] == ["a/2"]   # (best first, however given)
    assert choose_prewarm(ranked, set(), 0) == [] and choose_prewarm(ranked, {"a/1", "a/2", "a/3"}, 3) == []


def test_plan_prewarm_refreshes_what_is_held_and_places_the_rest_least_expected_first() -> None:
    ranked = [fc("a/1", 3.0), fc("a/2", 2.0), fc("a/3", 1.0), fc("a/4", 0.9), fc("a/5", 0.2)]
    # top 3: a/2 held (refreshed), a/1 and a/3 placed; a/4 is below the top, a/5 unlikely
    assert [f.model for f in plan_prewarm(ranked, {"a/2", "a/4"}, 3)] == ["a/3", "a/2", "a/1"]
    assert [f.model for f in plan_prewarm(ranked, {"a/5"}, 5)] == ["a/4", "a/3", "a/2", "a/1"]
    assert plan_prewarm(ranked, set(), 0) == [] and plan_prewarm([], {"a/1"}, 3) == []


def run_bench(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "bench/predict.py", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)


def test_the_prediction_benchmark_runs_small_on_the_real_node_code() -> None:
    p = run_bench("--days", "3", "--models", "8", "--slots", "3", timeout_s=45)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {"bench", "seed", "days", "models", "slots", "requests", "misses", "removed_of_lru_excess", "target",
            "met", "prewarms", "oracle_kind", "seconds"} <= set(doc)
    assert (doc["bench"], doc["seed"], doc["days"], doc["models"], doc["slots"]) == ("predict", 1, 3, 8, 3)
    m = doc["misses"]
    assert set(m) == {"lru", "lru_prediction", "oracle"} and doc["requests"] > 50
    assert 0 < m["oracle"] <= m["lru"] <= doc["requests"] and 0 <= m["lru_prediction"] <= doc["requests"]
    assert doc["most_held"] == 3 and doc["hit_touches_last_access"] is True and doc["prewarms"] > 0
    assert isinstance(doc["met"], bool) and doc["target"] == 0.5
    if m["lru"] > m["oracle"]:
        assert math.isclose(doc["removed_of_lru_excess"],
                            (m["lru"] - m["lru_prediction"]) / (m["lru"] - m["oracle"]), abs_tol=1e-3)


@pytest.mark.parametrize("args", [["--slots", "8", "--models", "8"], ["--seeds", "1,x"], ["--days", "0"],
                                  ["--min-score", "nan"], ["--policy", "magic"], ["--unknown"]])
def test_the_benchmark_refuses_bad_arguments_in_one_line(args: list[str]) -> None:
    p = run_bench(*args, timeout_s=30)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
