#!/usr/bin/env python3
"""Every benchmark, one after another, and the table of figures in docs/benchmarks.md regenerated from the run.

    .venv/bin/python bench/all.py [--only warm,manifest,...] [--skip swarm,...] [--quick] [--no-readme]

Each bench runs with the command the table prints beside its figures (docs/benchmarks.md's own, sized so the
whole run takes about 40 minutes on this 2-core VM: the run of 2026-12-05 02:01 UTC took 36 minutes,
swarm_sim's calibration adds under one, preload_cgroup two and a half, torrent_memory about ten and 16 GiB
of free disk; a bench whose spread is wide runs up to twice its rounds,
so a noisy machine can stretch that towards an hour; `--quick` uses tiny sizes to check that all of
them run, in about 10 minutes). Each bench's JSON goes to bench/results/<date>/<name>.json. The table (between the
markers `<!-- bench:all:begin -->` and `<!-- bench:all:end -->` in docs/benchmarks.md) has one row per ratio a
bench reports in the common shape of bench/_rounds.py's `speedup()` (`of`, `vs`, `ratio`,
`per_round_min`, `per_round_max`, and `target` and/or `target_at_most`): the ratio of medians, the
spread of the per-round ratios, and whether the target is met. A bench that fails, or whose JSON has
no ratio in that shape, is listed as such; the run goes on with the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
BEGIN, END = "<!-- bench:all:begin -->", "<!-- bench:all:end -->"

#: name -> (full command, quick command); every one prints one JSON document on stdout
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "startup": (["bench/startup.py", "--rounds", "15"],
                ["bench/startup.py", "--rounds", "5", "--size", "64MiB", "--sparse", "1GiB"]),
    "warm": (["bench/warm.py", "--explore"],
             ["bench/warm.py", "--size", "128MiB", "--caps", "0,200MB", "--cap-seconds", "0.3", "--rss-size", "0"]),
    "manifest": (["bench/manifest.py"], ["bench/manifest.py", "--size", "128MiB", "--shards", "2"]),
    "restart_storm": (["bench/restart_storm.py"],
                      ["bench/restart_storm.py", "--size", "64MiB", "--n", "2", "--rounds", "5", "--tiers", "hot"]),
    "promote": (["bench/promote.py", "--size", "1GiB"], ["bench/promote.py", "--size", "64MiB"]),
    "preload_cgroup": (["bench/preload_cgroup.py", "--size", "2GiB", "--memory", "384MiB", "--rss-sizes", "1GiB,8GiB"],
                       ["bench/preload_cgroup.py", "--size", "256MiB", "--memory", "160MiB", "--rounds", "2"]),
    "p2p_cgroup": (["bench/p2p_cgroup.py", "--size", "1GiB", "--memory", "256MiB", "--rounds", "5"],
                   ["bench/p2p_cgroup.py", "--size", "256MiB", "--memory", "160MiB", "--rounds", "2"]),
    "sources_io": (["bench/sources_io.py", "--rounds", "5"],
                   ["bench/sources_io.py", "--size", "256MiB", "--memory", "128MiB", "--rounds", "2"]),
    "daemon": (["bench/daemon.py"], ["bench/daemon.py", "--size", "64MiB", "--clients", "8"]),
    "stream": (["bench/stream.py", "--size", "1GiB"], ["bench/stream.py", "--size", "64MiB"]),
    "lora_set": (["bench/lora_set.py", "--adapters", "200", "--size", "20MB"],
                 ["bench/lora_set.py", "--adapters", "10", "--size", "1MB"]),
    "companion": (["bench/companion.py", "--files", "10000"], ["bench/companion.py", "--files", "200"]),
    "objstore": (["bench/objstore.py", "--size", "1GiB"], ["bench/objstore.py", "--size", "64MiB"]),
    "delta": (["bench/delta.py", "--skip-p2p"], ["bench/delta.py", "--size", "128MiB", "--skip-p2p"]),
    "disk": (["bench/disk.py"], ["bench/disk.py", "--size", "64MiB", "--seconds", "0.5"]),
    "swarm": (["bench/swarm.py", "--n", "1,8", "--size", "64MiB", "--cap", "20MB", "--piece-size", "256KiB"],
              ["bench/swarm.py", "--n", "1,2", "--size", "8MiB", "--cap", "50MB", "--piece-size", "256KiB"]),
    "predict": (["bench/predict.py", "--trace", "diurnal"],
                ["bench/predict.py", "--days", "3", "--models", "8", "--slots", "3"]),
    "swarm_sim": (["bench/swarm_sim.py", "calibrate"], ["bench/swarm_sim.py", "predict", "--nodes", "8", "--pieces", "64"]),
    "torrent_memory": (["bench/torrent_memory.py"],
                       ["bench/torrent_memory.py", "--size", "64MiB", "--shards", "4", "--piece-size", "1MiB", "--rounds", "1"]),
}


def ratios(doc: Any, path: tuple[str, ...] = (), meds: dict[str, Any] | None = None
           ) -> Iterator[tuple[tuple[str, ...], dict[str, Any], dict[str, Any]]]:
    """Every speedup() dict in a bench's JSON, with where it was found (the keys above it) and the
    contenders' summaries nearest to it (a ``contenders``, ``cases`` or ``commands`` table beside it or
    above it)."""
    meds = meds or {}
    if isinstance(doc, dict):
        if {"of", "vs", "ratio", "per_round_min", "per_round_max"} <= doc.keys():
            yield path, doc, meds
            return
        for key in ("contenders", "cases", "commands"):
            if isinstance(doc.get(key), dict):
                meds = {**meds, **{k: v for k, v in doc[key].items() if isinstance(v, dict) and "median_s" in v}}
        for k, v in doc.items():
            if k in ("samples_s", "machine", "per_loader_s", "explore"):
                continue
            yield from ratios(v, (*path, str(k)), meds)
    elif isinstance(doc, list):
        for v in doc:
            yield from ratios(v, path, meds)


def _fmt_s(s: dict[str, float] | None, unit: str = "s") -> str:
    if not s:
        return "-"
    if unit != "s":   # (a simulation's misses, a ratio: the figure as it is)
        return f"{s['median_s']:g} {unit} ({s['min_s']:g}-{s['max_s']:g})"
    f = (lambda x: f"{x * 1e6:.1f} µs") if s["median_s"] < 1e-3 else \
        (lambda x: f"{x * 1000:.1f} ms") if s["median_s"] < 1 else (lambda x: f"{x:.2f} s")
    return f"{f(s['median_s'])} ({f(s['min_s'])}-{f(s['max_s'])})"


def table(results: dict[str, dict[str, Any]], commands: dict[str, list[str]], date: str) -> str:
    """The benchmarks page's table: one row per ratio (what, the two medians with min-max, the ratio of medians
    with the per-round spread, the target, met or not)."""
    lines = [f"Regenerated by `.venv/bin/python bench/all.py` on {date}; each row's bench ran on the date in its "
             "`date` column (this 2-core VM; each bench's rounds "
             "interleave its contenders; medians with min-max; the ratio is of medians, with the range of the "
             "per-round ratios in brackets; a ratio is withheld when a contender's interquartile range over its median "
             "is above the bench's bound).", "",
             "| bench (command) | date | where | contender | median (min-max) | baseline | median (min-max) | ratio "
             "[per round] | target | met |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, doc in results.items():
        cmd = "`" + " ".join(commands[name]) + "`"
        when = str(doc.get("date", "-"))[:16].replace("T", " ")
        if "error" in doc:
            lines.append(f"| {name} ({cmd}) | {when} | | failed: {doc['error'][:120]} | | | | | | |")
            continue
        found = list(ratios(doc))
        if not found:
            lines.append(f"| {name} ({cmd}) | {when} | | no ratio in the common shape | | | | | | |")
            continue
        unit = str(doc.get("unit", "s"))
        for where, r, meds in found:
            ratio = "withheld: " + r.get("refused", "") if r["ratio"] is None else \
                f"**{r['ratio']:.3g}×** [{r['per_round_min']:.3g}-{r['per_round_max']:.3g}]"
            if "target" in r and "target_at_most" in r:
                target = f"{r['target']}-{r['target_at_most']}"
                met = None if r["ratio"] is None else r["target"] <= r["ratio"] <= r["target_at_most"]
            elif "target" in r:
                target, met = f"≥ {r['target']}", None if r["ratio"] is None else r["ratio"] >= r["target"]
            elif "target_at_most" in r:
                target = f"≤ {r['target_at_most']}"
                met = None if r["ratio"] is None else r["ratio"] <= r["target_at_most"]
            else:
                target, met = "-", None
            w = " / ".join(p for p in where if p not in ("ratios", "results", "conditions", "cold", "cached")) \
                or "-"
            lines.append(f"| {name} ({cmd}) | {when} | {w} | {r['of']} | {_fmt_s(meds.get(r['of']), unit)} | {r['vs']} | "
                         f"{_fmt_s(meds.get(r['vs']), unit)} | {ratio} | {target} | "
                         f"{'yes' if met else 'no' if met is False else '-'} |")
    return "\n".join(lines)


PAGE = "docs/benchmarks.md"


def write_readme(text: str) -> None:
    """Put the table between the markers of docs/benchmarks.md (the README links there)."""
    readme = REPO / PAGE
    s = readme.read_text()
    if BEGIN not in s or END not in s:
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} markers")
    i, j = s.index(BEGIN) + len(BEGIN), s.index(END)
    readme.write_text(s[:i] + "\n" + text + "\n" + s[j:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated bench names")
    ap.add_argument("--skip", default="")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: check that every bench runs")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the table in docs/benchmarks.md")
    ap.add_argument("--render", action="store_true", help="run nothing: the table from the newest results")
    args = ap.parse_args()
    names = [n for n in (args.only.split(",") if args.only else BENCHES) if n and n not in args.skip.split(",")]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(json.dumps({"error": f"unknown bench {unknown[0]!r}: one of {', '.join(BENCHES)}"}))
        return 2
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # (a quick run's tiny figures under quick/: never taken for the newest result of a full run)
    outdir = REPO / "bench/results" / ("quick" if args.quick else "") / time.strftime("%Y-%m-%dT%H%M", time.gmtime())
    if not args.render:
        outdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    commands: dict[str, list[str]] = {}
    for n in ([] if args.render else names):
        cmd = BENCHES[n][1 if args.quick else 0]
        commands[n] = [".venv/bin/python", *cmd]
        t0 = time.monotonic()
        print(f"bench/all.py: {n}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        if not (REPO / cmd[0]).is_file():   # (a bench still being written)
            results[n] = {"error": f"{cmd[0]} is missing"}
            print(f"bench/all.py: {n}: failed: {cmd[0]} is missing", file=sys.stderr, flush=True)
            continue
        p = subprocess.run([PY, *cmd], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        (outdir / f"{n}.log").write_text(p.stderr)
        try:
            doc = json.loads(p.stdout)
            if p.returncode != 0 and "error" not in doc:
                doc = {"error": f"exit {p.returncode}"}
        except ValueError:
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
            doc = {"error": f"exit {p.returncode}: {tail}"}
        (outdir / f"{n}.json").write_text(json.dumps(doc, indent=2))
        results[n] = doc
        print(f"bench/all.py: {n}: {'failed: ' + doc['error'][:200] if 'error' in doc else 'ok'} "
              f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    if (args.only or args.render) and not args.quick:   # the table: this run's benches, and the newest result of the others
        for n, (full, _q) in BENCHES.items():
            if n in results:
                continue
            for old in sorted((REPO / "bench/results").glob(f"*/{n}.json"), reverse=True):
                doc = json.loads(old.read_text())
                if "error" not in doc:
                    results[n] = {**doc, "from_run": old.parent.name}
                    commands[n] = [".venv/bin/python", *full]
                    break
        results = {n: results[n] for n in BENCHES if n in results}
    text = table(results, commands, date)
    if not args.render:
        (outdir / "table.md").write_text(text + "\n")
    if not args.no_readme and not args.quick:
        write_readme(text)
    print(json.dumps({"benchmark": "all", "date": date,
                      "results_dir": None if args.render else str(outdir.relative_to(REPO)),
                      "failed": [n for n, d in results.items() if "error" in d]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
