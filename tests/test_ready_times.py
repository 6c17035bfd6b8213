"""The window behind ``status --json`` ``time_to_ready``: exact nearest-rank quantiles, bounded."""

from __future__ import annotations

from weightd.node.ready_times import ReadyTimes, quantile


def test_nearest_rank_quantiles() -> None:
    v = sorted(float(i) for i in range(1, 101))
    assert quantile(v, 0.5) == 50.0 and quantile(v, 0.95) == 95.0 and quantile([3.0], 0.95) == 3.0


def test_summary_per_model_and_tier() -> None:
    r = ReadyTimes()
    for s in (1.0, 2.0, 3.0, 10.0):
        r.observe("a/m", "hot", s)
    r.observe("a/m", "warm", 0.5)
    rows = {(x["model"], x["tier"]): x for x in r.summary()}
    hot = rows[("a/m", "hot")]
    assert (hot["requests"], hot["p50_s"], hot["p95_s"], hot["max_s"], hot["last_s"]) == (4, 2.0, 10.0, 10.0, 10.0)
    assert rows[("a/m", "warm")]["requests"] == 1


def test_bounded_window_and_keys() -> None:
    r = ReadyTimes(window=4, max_keys=2)
    for i in range(10):
        r.observe("a/m", "hot", float(i))
    assert r.summary()[0]["requests"] == 4 and r.summary()[0]["p50_s"] == 7.0   # only the last 4: 6..9
    r.observe("b/m", "hot", 1.0)
    r.observe("a/m", "hot", 1.0)       # a/m seen again: b/m is now the least recent
    r.observe("c/m", "hot", 1.0)
    assert {x["model"] for x in r.summary()} == {"a/m", "c/m"}
