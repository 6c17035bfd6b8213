#!/usr/bin/env python3
"""A set of LoRA adapters, cold -> hot, as one operation: `weightd preload --set FILE` against a loop
of `cp -r` (one per adapter) and against one `weightd preload` call per adapter.

    .venv/bin/python bench/lora_set.py [--adapters 200] [--size 20MB] [--rounds 5] [--dir /var/tmp]

Every adapter is a real safetensors file (+ adapter_config.json) published to a cold tier on disk.
The cold files stay in the page cache for every contender (written back, then a warm-up read): what
bounds all of them is the first touch of tmpfs pages in /dev/shm. weightd also verifies every byte
against the manifest (xxh3-128 of every tensor) before it renames an adapter into place; cp checks
nothing.
The daemon runs (`weightd serve`) for the set and the single calls, as on a node; the set is also
run in-process (`--no-daemon`). Contenders are interleaved round by round; the JSON has each one's
median and min-max, and the ratios of medians with the per-round min-max.

Targets (issue #19): the set >= 0.9x the speed of the cp loop, and >= 5x the single calls.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import BenchNode, io_between, machine_state, rounds, speedup, stamp, summary  # noqa: E402

from tiering.content.units import parse_size  # noqa: E402
from tiering.sample import SampleTensor, fill_bytes, write_safetensors  # noqa: E402


def make_adapter(root: Path, i: int, size: int) -> None:
    """A LoRA adapter of about ``size`` bytes: A/B matrices for q,k,v,o of every layer (F16, r=16)."""
    root.mkdir(parents=True)
    r, layers = 16, 32
    per = max(256, size // (layers * 4 * 2 * 2 * r)) // 64 * 64   # hidden size giving ~size bytes
    tensors = []
    for j in range(layers):
        for m in "qkvo":
            p = f"base_model.model.model.layers.{j}.self_attn.{m}_proj"
            tensors += [SampleTensor(f"{p}.lora_A.weight", "F16", (r, per)),
                        SampleTensor(f"{p}.lora_B.weight", "F16", (per, r))]
    write_safetensors(root / "adapter_model.safetensors", tensors, lambda t: fill_bytes(f"{i}/{t.name}", t.nbytes))
    (root / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": 32,
                                                          "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
                                                          "base_model_name_or_path": "bench/base", "i": i}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapters", type=int, default=200)
    ap.add_argument("--size", default="20MB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp", help="disk directory for the cold tier and state")
    ap.add_argument("--max-spread", type=float, default=0.5)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-lora-", dir=args.dir))
    tag = uuid.uuid4().hex[:8]
    hot, cp_dest = Path(f"/dev/shm/weightd-bench-lora-{tag}"), Path(f"/dev/shm/weightd-bench-cp-{tag}")
    node_ = BenchNode(base, hot)
    env, wd, run = node_.env, node_.wd, node_.run
    size = parse_size(args.size)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        from tiering import LocalNode, TierSpec
        refs = [f"lora/adapter-{i:04d}@v1" for i in range(args.adapters)]
        with LocalNode(hot=TierSpec("hot", hot, 1 << 40), warm=TierSpec("warm", base / "warm", 1 << 40),
                       cold=base / "cold", state_dir=base / "pubstate") as node:
            for i, ref in enumerate(refs):
                src = base / "src" / str(i)
                make_adapter(src, i, size)
                node.publish(src, ref.split("@")[0], "v1")
                shutil.rmtree(src)
        shutil.rmtree(hot, ignore_errors=True)
        cold_dirs = [base / "cold" / r.split("@")[0] / "v1" for r in refs]
        total = sum(f.stat().st_size for d in cold_dirs for f in d.iterdir() if f.is_file())
        os.sync()   # (the set-up's write-back of the cold tier falls on no contender's first round)
        subprocess.run(["cat", *[str(f) for d in cold_dirs for f in d.iterdir() if f.is_file()]],
                       stdout=subprocess.DEVNULL, check=True)   # (in the page cache, for every contender)
        setfile = base / "adapters.txt"
        setfile.write_text("\n".join(refs) + "\n")
        node_.serve()
        loop = "; ".join(f"mkdir -p {cp_dest}/{r.split('@')[0].rsplit('/', 1)[0]} && cp -r {d} "
                         f"{cp_dest}/{r.split('@')[0]}" for r, d in zip(refs, cold_dirs))

        def singles() -> float:
            t0 = time.perf_counter()
            for ref in refs:
                p = subprocess.run([*wd, "--daemon-only", "preload", ref, "--tier", "hot"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                if p.returncode != 0:
                    raise SystemExit(f"preload {ref}: {p.stderr[-300:]}")
            return time.perf_counter() - t0

        contenders = {
            "set_daemon": lambda: run([*wd, "--daemon-only", "preload", "--set", str(setfile), "--tier", "hot"]),
            "set_in_process": lambda: run([*wd, "--no-daemon", "preload", "--set", str(setfile), "--tier", "hot"]),
            "cp_loop": lambda: run(["bash", "-c", loop]),
            "single_preloads": singles,
        }

        def clean(_name: str) -> None:
            shutil.rmtree(hot / "lora", ignore_errors=True)   # (directories are the truth for presence)
            shutil.rmtree(cp_dest, ignore_errors=True)
        state0 = machine_state()
        times = rounds(contenders, args.rounds, before=clean, log=log)
        state1 = machine_state()
        out = {
            "bench": "lora_set", "at": stamp(), "adapters": args.adapters, "bytes_each": total // args.adapters,
            "bytes": total, "rounds": args.rounds, "cold": "page cache (warm-up read)", "target": "/dev/shm (tmpfs)",
            "contenders": {k: {**summary(v), "gb_per_s": round(total / summary(v)["median_s"] / 1e9, 3)}
                           for k, v in times.items()},
            "set_vs_cp_loop": speedup(times, "set_daemon", "cp_loop", max_spread=args.max_spread, target=0.9),
            "set_in_process_vs_cp_loop": speedup(times, "set_in_process", "cp_loop", max_spread=args.max_spread),
            "set_vs_single_preloads": speedup(times, "set_daemon", "single_preloads", max_spread=args.max_spread,
                                              target=5.0),
            "targets": {"set_vs_cp_loop": ">= 0.9", "set_vs_single_preloads": ">= 5"},
            "machine": {"loadavg_before": state0["loadavg"], "loadavg_after": state1["loadavg"],
                        "cpus": state0["cpus"], "sectors_read_during": io_between(state0, state1)},
        }
        print(json.dumps(out, indent=1))
        return 0
    finally:
        node_.close(cp_dest)


if __name__ == "__main__":
    raise SystemExit(main())
