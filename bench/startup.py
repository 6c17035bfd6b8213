#!/usr/bin/env python3
"""Commands that answer in vmtouch time: wall time of `weightd residency`, `path`, `status` and a `warm`
with nothing to read, against `vmtouch` on the same sets and `python -c pass` as the floor.

    .venv/bin/python bench/startup.py [--rounds 15] [--size 2GiB] [--sparse 100GiB] [--dir /var/tmp]
                                      [--only daemon,pass] [--baseline-tree DIR]

Every contender is a real subprocess, interleaved round by round (rotating order). Sets: --size in 4
real files, read into the page cache first; and --sparse in 4 sparse files (`truncate`: no disk used,
say so when quoting it) with their first 64 MiB read, so the kernel has pages to count. `path` and
`status` run against a real node with a published, preloaded model: through its daemon (`weightd
serve`, the default when it answers) and in-process (`--no-daemon`). Bytecode is compiled first, as
an installed package has it. Targets (issue #20): each command <= 40 ms; residency >= 1.0x vmtouch on
the 2 GiB set and >= 5x on the sparse 100 GiB set.

``--only`` keeps the contenders whose name has one of its words (``daemon,pass``: path and status
through the daemon, and the floor; the sets are then made only when a contender reads them).
``--baseline-tree DIR`` (another checkout, e.g. ``git worktree add DIR HEAD~1``) also times `path` and
`status` (through the same daemon and in-process) and the in-process `preload` of a copy already in
hot with DIR's code, in the same rounds, and gives the ratio of each against it: a change's effect on
start-up, measured under the same load. Each in-process command is also given as a ratio to
`python -c pass` (how many interpreter starts it costs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import BenchNode, io_between, machine_state, rounds, size_arg, speedup, stamp, summary, timer  # noqa: E402

from tiering.content.units import parse_size  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402

TARGET_MS = 40.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--size", type=size_arg, default="2GiB")
    ap.add_argument("--sparse", type=size_arg, default="100GiB")
    ap.add_argument("--max-spread", type=float, default=0.25)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--only", type=lambda t: [w for w in t.split(",") if w], default=None,
                    help="time only the contenders whose name has one of these comma-separated words")
    ap.add_argument("--baseline-tree", type=Path, default=None,
                    help="another checkout whose path and status through the same daemon are timed beside")
    args = ap.parse_args()
    if args.baseline_tree is not None and not (args.baseline_tree / "weightd" / "__init__.py").is_file():
        ap.error(f"--baseline-tree {args.baseline_tree}: no weightd package there")
    if not shutil.which("vmtouch"):
        print(json.dumps({"error": "vmtouch is needed (make tools)"}))
        return 1
    for tree in (REPO, args.baseline_tree):
        if tree is not None:
            subprocess.run([sys.executable, "-m", "compileall", "-q", "weightd", "tiering", "p2p"], cwd=tree,
                           check=True)
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-startup-", dir=args.dir))
    hot = Path(f"/dev/shm/weightd-bench-startup-{uuid.uuid4().hex[:8]}")
    (base / "node").mkdir()
    node = BenchNode(base / "node", hot)
    try:
        real = [base / f"real-{i}.bin" for i in range(4)]
        sparse = [base / f"sparse-{i}.bin" for i in range(4)]
        src = make_checkpoint(base / "src", total_bytes=8 << 20, shards=2, layers=2, seed="startup")
        node.run([*node.wd, "publish", str(src), "--name", "bench/startup", "--version", "v1"])
        node.run([*node.wd, "--no-daemon", "preload", "bench/startup@v1", "--tier", "hot", "--lease", "0"])
        node.serve()
        env = node.env
        wd = [str(Path(sys.executable).parent / "weightd"), "--config", str(node.cfg)]
        if not Path(wd[0]).exists():
            wd = [sys.executable, "-m", "weightd", "--config", str(node.cfg)]
        rs, ss = [str(f) for f in real], [str(f) for f in sparse]
        through_daemon = {"weightd path (daemon)": ["path", "bench/startup@v1"], "weightd status (daemon)": ["status"]}
        in_process = {"weightd path (--no-daemon)": ["--no-daemon", "path", "bench/startup@v1"],
                      "weightd status (--no-daemon)": ["--no-daemon", "status"],
                      # (a preload of a copy that is there: the command's start, the node's opening and checks)
                      "weightd preload (--no-daemon, present)": ["--no-daemon", "preload", "bench/startup@v1",
                                                                  "--tier", "hot", "--lease", "0"]}
        compared = {**through_daemon, **in_process}   # (timed with --baseline-tree's code too)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "vmtouch (2 GiB set)": ["vmtouch", *rs],
            "weightd residency (2 GiB set)": [*wd, "residency", *rs],
            "vmtouch (sparse set)": ["vmtouch", *ss],
            "weightd residency (sparse set)": [*wd, "residency", *ss],
            "weightd warm (2 GiB set, resident)": [*wd, "warm", *rs],
            "weightd path (daemon)": [*wd, *through_daemon["weightd path (daemon)"]],
            "weightd status (daemon)": [*wd, *through_daemon["weightd status (daemon)"]],
            **{k: [*wd, *argv] for k, argv in in_process.items()},
        }
        if args.only:
            def words(name: str) -> set[str]:
                return set(name.replace("(", " ").replace(")", " ").replace(",", " ").split())
            commands = {k: c for k, c in commands.items() if set(args.only) & words(k)}
        contenders = {k: timer(c, env) for k, c in commands.items()}
        pairs = []   # (this tree's contender, the baseline tree's)
        if args.baseline_tree is not None:
            old = {**env, "PYTHONPATH": str(args.baseline_tree.resolve())}
            for k, argv in compared.items():
                if k in commands:
                    pairs.append((k, k.replace(")", ", baseline tree)")))
                    contenders[pairs[-1][1]] = timer([*wd, *argv], old)
        if any(set(c) & set(rs) for c in commands.values()):
            block = os.urandom(1 << 20)
            for f in real:
                with open(f, "wb") as fh:
                    for _ in range(parse_size(args.size) // 4 >> 20):
                        fh.write(block)
        if any(set(c) & set(ss) for c in commands.values()):
            for f in sparse:
                with open(f, "wb") as fh:
                    fh.truncate(parse_size(args.sparse) // 4)
        for f in [*real, *sparse]:
            if f.exists():
                with open(f, "rb") as fh:
                    left = 64 << 20 if f in sparse else f.stat().st_size
                    while left > 0 and fh.read(min(left, 8 << 20)):
                        left -= 8 << 20
        wanted = [("weightd residency (2 GiB set)", "vmtouch (2 GiB set)", 1.0),
                  ("weightd residency (sparse set)", "vmtouch (sparse set)", 5.0),
                  *((new, old_k, None) for new, old_k in pairs),   # (a faster than b; the baseline tree: b)
                  *((k, "python -c pass", None) for k in in_process)]   # (how far from the interpreter's own start)
        m0 = machine_state()
        times = rounds(contenders, args.rounds, widen=args.max_spread, warmup=True)
        m1 = machine_state()
        rows = {k: {**summary(v), "median_ms": round(1000 * summary(v)["median_s"], 1),
                    "min_ms": round(1000 * min(v), 1), "max_ms": round(1000 * max(v), 1)}
                for k, v in times.items()}
        for k, r in rows.items():
            if k.startswith("weightd"):
                r["target_ms"], r["met"] = TARGET_MS, r["median_ms"] <= TARGET_MS
        print(json.dumps({
            "benchmark": "startup", "date": stamp(), "rounds": args.rounds, "max_spread": args.max_spread,
            "only": args.only, "baseline_tree": None if args.baseline_tree is None else str(args.baseline_tree),
            "sets": {"real_bytes": sum(f.stat().st_size for f in real if f.exists()),
                     "sparse_bytes": sum(f.stat().st_size for f in sparse if f.exists()),
                     "sparse_resident_bytes": 4 * (64 << 20) if sparse[0].exists() else 0},
            "commands": rows,
            "ratios": [{**speedup(times, a, b, max_spread=args.max_spread), **({} if t is None else {"target": t})}
                       for a, b, t in wanted if a in times and b in times],
            "samples_s": times,
            "machine": {"before": m0, "after": m1, "other_io_sectors": io_between(m0, m1)},
        }, indent=2))
        return 0
    finally:
        node.close(base)


if __name__ == "__main__":
    sys.exit(main())
