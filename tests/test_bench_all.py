"""bench/all.py's table from canned bench output (the benchmarks themselves are run by hand: they take
minutes and want an idle machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load():
    spec = importlib.util.spec_from_file_location("bench_all", ROOT / "bench/all.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_per_ratio_with_targets_and_refusals() -> None:
    m = load()
    s = {"median_s": 2.0, "min_s": 1.9, "max_s": 2.2, "spread": 0.15}
    doc = {"contenders": {"weightd": s, "cat": {**s, "median_s": 2.1}},
           "ratios": [{"of": "weightd", "vs": "cat", "rounds": 5, "per_round_min": 0.9, "per_round_max": 1.1,
                       "ratio": 1.05, "target": 0.95},
                      {"of": "weightd", "vs": "dd", "rounds": 5, "per_round_min": 0.5, "per_round_max": 1.5,
                       "ratio": None, "refused": "spread of dd above 0.5"}],
           "results": {"N=8": {"ratios": {"c": {"of": "a", "vs": "c", "rounds": 5, "per_round_min": 1.1,
                                                "per_round_max": 1.3, "ratio": 1.2, "target_at_most": 1.1}}}},
           "samples_s": {"weightd": [9.0]}}
    text = m.table({"warm": doc, "broken": {"error": "exit 1: boom"}, "old": {"x": 1}},
                   {"warm": ["bench/warm.py"], "broken": ["bench/b.py"], "old": ["bench/o.py"]}, "2026-12-05")
    rows = [line for line in text.splitlines() if line.startswith("| warm")]
    assert len(rows) == 3
    assert "**1.05×** [0.9-1.1]" in rows[0] and "≥ 0.95" in rows[0] and rows[0].endswith("| yes |")
    assert "2.00 s (1.90 s-2.20 s)" in rows[0]
    assert "withheld" in rows[1] and rows[1].endswith("| - |")
    assert "N=8" in rows[2] and "≤ 1.1" in rows[2] and rows[2].endswith("| no |")
    assert "failed: exit 1: boom" in text and "no ratio in the common shape" in text


def test_readme_markers(tmp_path: Path, monkeypatch) -> None:
    m = load()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks.md").write_text(f"a\n{m.BEGIN}\nold\n{m.END}\nb\n")
    monkeypatch.setattr(m, "REPO", tmp_path)
    m.write_readme("new table")
    assert (tmp_path / "docs" / "benchmarks.md").read_text() == f"a\n{m.BEGIN}\nnew table\n{m.END}\nb\n"


def test_a_band_target_and_microseconds() -> None:
    m = load()
    lat = {"median_s": 4.9e-05, "min_s": 4.5e-05, "max_s": 5.7e-05}
    doc = {"contenders": {"measured": lat, "model": lat},
           "ratios": [{"of": "measured", "vs": "model", "rounds": 5, "per_round_min": 0.9, "per_round_max": 0.95,
                       "ratio": 0.92, "target": 0.85, "target_at_most": 1.15, "met": True},
                      {"of": "measured", "vs": "model", "rounds": 5, "per_round_min": 1.2, "per_round_max": 1.3,
                       "ratio": 1.25, "target": 0.85, "target_at_most": 1.15, "met": False}],
           "date": "2026-12-05T03:00:00Z"}
    rows = [x for x in m.table({"sim": doc}, {"sim": ["bench/s.py"]}, "d").splitlines() if x.startswith("| sim")]
    assert "| 0.85-1.15 | yes |" in rows[0] and "| 0.85-1.15 | no |" in rows[1]
    assert "49.0 µs (45.0 µs-57.0 µs)" in rows[0] and "2026-12-05 03:00" in rows[0]


def test_a_missing_bench_is_a_row_and_the_others_still_run(tmp_path: Path, monkeypatch, capsys) -> None:
    m = load()
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench/ok.py").write_text(
        "import json\nprint(json.dumps({'date': 'x', 'contenders': {}, 'ratios': [{'of': 'a', 'vs': 'b', "
        "'rounds': 5, 'per_round_min': 1, 'per_round_max': 1, 'ratio': 1.0}]}))\n")
    (tmp_path / "bench/boom.py").write_text("raise SystemExit('boom')\n")
    monkeypatch.setattr(m, "REPO", tmp_path)
    monkeypatch.setattr(m, "BENCHES", {n: ([f"bench/{n}.py"], [f"bench/{n}.py"]) for n in ("gone", "boom", "ok")})
    monkeypatch.setattr("sys.argv", ["all.py", "--quick"])
    assert m.main() == 0
    out = capsys.readouterr()
    assert "gone: failed: bench/gone.py is missing" in out.err and "boom: failed" in out.err
    assert "ok: ok" in out.err
    table = next((tmp_path / "bench/results/quick").glob("*/table.md")).read_text()   # (never beside full runs)
    assert "bench/gone.py is missing" in table and "failed: exit 1: boom" in table and "**1×**" in table


def test_figures_that_are_not_seconds_keep_their_unit() -> None:
    m = load()
    doc = {"unit": "misses", "contenders": {"lru": {"median_s": 33.0, "min_s": 28.0, "max_s": 50.0},
                                            "pred": {"median_s": 26.0, "min_s": 18.0, "max_s": 39.0}},
           "ratios": [{"of": "pred", "vs": "lru", "rounds": 5, "per_round_min": 1.2, "per_round_max": 1.7,
                       "ratio": 1.27}]}
    row = m.table({"predict": doc}, {"predict": ["bench/predict.py"]}, "d").splitlines()[-1]
    assert "26 misses (18-39)" in row and "33 misses (28-50)" in row and " s (" not in row
