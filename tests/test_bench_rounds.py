"""bench/_rounds.py: the interleaving, the extra rounds while a contender's spread is wide, the refusal
of a ratio, and the common JSON shape. The contenders are plain functions returning figures (no
benchmark runs here: the benches are run by hand, on an idle machine)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load():
    spec = importlib.util.spec_from_file_location("bench_rounds", ROOT / "bench/_rounds.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_rounds"] = mod
    spec.loader.exec_module(mod)
    return mod


def series(*xs: float):
    it = iter(xs)
    return lambda: next(it)


def test_every_contender_once_per_round_in_a_rotating_order() -> None:
    m = load()
    calls: list[str] = []
    out = m.rounds({k: (lambda k=k: calls.append(k) or 1.0) for k in "abc"}, 3, before=lambda k: calls.append("-"))
    assert [c for c in calls if c != "-"] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert calls.count("-") == 9
    assert out == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


def test_extra_rounds_while_a_spread_is_wide_then_stop() -> None:
    m = load()
    # b is wide in the first 5 rounds (iqr/median 1.0); 3 more steady rounds narrow its quartiles
    out = m.rounds({"a": series(*[1.0] * 10), "b": series(1, 3, 1, 3, 2, 2, 2, 2, 2, 2)}, 5, widen=0.25)
    assert m.summary([1, 3, 1, 3, 2])["iqr_spread"] > 0.25
    assert len(out["a"]) == len(out["b"]) == 8
    assert m.summary(out["b"])["iqr_spread"] <= 0.25


def test_extra_rounds_stop_at_max_n_and_the_ratio_is_refused() -> None:
    m = load()
    wild = series(*[1, 5] * 20)
    out = m.rounds({"steady": lambda: 1.0, "wild": wild}, 5, widen=0.25)
    assert len(out["wild"]) == 10          # (2 x 5: then it gives up)
    assert len(m.rounds({"steady": lambda: 1.0, "wild": wild}, 5, widen=0.25, max_n=7)["wild"]) == 7
    r = m.speedup(out, "steady", "wild", max_spread=0.5, target=1.0)
    assert r["ratio"] is None and "wild" in r["refused"] and r["met"] is None
    assert r["per_round_min"] == 1.0 and r["per_round_max"] == 5.0


def test_without_widen_exactly_n_rounds() -> None:
    m = load()
    out = m.rounds({"wild": series(*[1, 5] * 5)}, 5)
    assert len(out["wild"]) == 5


def test_a_contender_may_measure_several_figures_in_one_run() -> None:
    m = load()
    out = m.rounds({"fio": lambda: {"fio_qd1": 1e-4, "fio_qd4": 2e-4}, "w": lambda: {"w_qd1": 1.1e-4}}, 5)
    assert set(out) == {"fio_qd1", "fio_qd4", "w_qd1"} and all(len(v) == 5 for v in out.values())
    assert m.summary(out["fio_qd1"])["median_s"] == 1e-4   # (significant digits: microseconds survive)


def test_ratio_of_medians_with_targets() -> None:
    m = load()
    t = {"fast": [1.0, 1.1, 0.9, 1.0, 1.0], "slow": [2.0, 2.0, 2.2, 1.8, 2.0]}
    r = m.speedup(t, "fast", "slow", target=1.5)
    assert r["ratio"] == 2.0 and r["met"] is True and r["target"] == 1.5
    assert r["per_round_min"] == round(1.8, 3) and r["per_round_max"] == round(2.2 / 0.9, 3)
    assert m.speedup(t, "fast", "slow", target_at_most=1.2)["met"] is False
    assert "met" not in m.speedup(t, "fast", "slow")


def test_report_has_the_common_shape() -> None:
    m = load()
    s0 = m.machine_state()
    t = {"a": [1.0, 1.0, 1.0, 1.0, 1.0], "b": [2.0] * 5}
    doc = m.report("x", t, [m.speedup(t, "a", "b", target=1.5)], rounds=5, max_spread=0.5, machine=(s0, s0),
                   bytes=10)
    json.dumps(doc)
    assert {"benchmark", "date", "rounds", "rounds_run", "max_spread", "contenders", "ratios", "machine",
            "samples_s", "bytes"} <= doc.keys()
    assert set(doc["machine"]) == {"before", "after", "other_io_sectors"}
    assert "loadavg" in doc["machine"]["before"]
    assert doc["contenders"]["b"]["median_s"] == 2.0 and doc["samples_s"] == t
    assert doc["ratios"][0]["ratio"] == 2.0 and doc["rounds_run"] == 5 and doc["unit"] == "s"
    try:
        m.report("x", t, [], rounds=5, max_spread=0.5, machine=(s0, s0), date="no")
    except ValueError as e:
        assert "date" in str(e)
    else:
        raise AssertionError("a bench's key replaced a common one")


def test_a_warmup_round_runs_each_contender_untimed_first() -> None:
    r = load()
    calls: list[str] = []
    seen: list[str] = []
    times = r.rounds({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}, 5,
                     before=seen.append, warmup=True)
    assert calls[:2] == ["a", "b"] and len(calls) == 12 and len(seen) == 12   # (before() runs for it too)
    assert times == {"a": [1.0] * 5, "b": [2.0] * 5}
