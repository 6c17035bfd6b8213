#!/usr/bin/env python3
"""Checkpoints of real MoE shape (issue 40): what ~90,000 tensors cost weightd, against the same bytes
in few tensors, and what holding such versions costs the daemon.

    .venv/bin/python bench/moe.py [--pad 8MiB] [--rounds 5] [--dir DIR]
                                  [--part all|speed|build|build-speed|memory|experts]
                                  [--expert-dim 128] [--ranks 8] [--shards 163]

speed: a DeepSeek-V3-shaped checkpoint (tiering/sample_moe.py: 90,427 tensors in 163 shards, each shard
padded with ``--pad`` real bytes) and a "flat" one with the same shards and bytes, one tensor each.
Interleaved rounds of `weightd manifest build` (files cached), `weightd preload` from a path cold tier
into warm (the warm copy evicted before each), and `weightd verify` of the warm copy, each as the real
CLI. The per-tensor overhead is (median MoE - median flat) / (tensors MoE - tensors flat), in us
(issue 40's target: <= 3 us), and the ratio flat/MoE is the speed on this shape against few tensors
(target for build: >= 0.9).

build (not in "all"): speed's `manifest build` contenders alone (the same checkpoints, the same
per-tensor overhead and ratio).

build-speed (not in "all"): issue 40's build target as it is worded: `manifest build` of the MoE shape
with ``--pad`` real bytes per shard (64MiB by default here) against the same bytes in one tensor a
shard, the ratio flat/MoE (target >= 0.9). ``--shards K`` writes only the first K of the 163 shards,
each exactly as in the whole checkpoint (its ~555 tensors and its pad): the same tensors per byte, K/163
of the disk (163 x 64 MiB twice is 21 GiB).

memory: four MoE versions (different bytes) published; a daemon started with none, one and four of
them in warm (and the first also in hot), its RSS after start-up and after a `status`; `weightd status`
through the daemon (median of 7, target <= 100 ms) once the daemon's start-up work is done (its CPU
time still; how long that took is ``start_up_work_s``), and the same right after it first answers
(``status_right_after_start_s``, while it may still read its versions' manifests), and in-process
`weightd path` (median of 5, target <= 300 ms), against the same with a small llama-shaped model.

experts (not in "all"): the same 90,427-tensor shape with real bytes in every tensor (``--expert-dim``
D: each FP8 expert weight D x D bytes; 128 gives 0.74 GB, 437 about 8 GiB), published into a path cold
tier; interleaved rounds of `weightd --no-daemon preload --tier warm` of the whole version and of rank
``--ranks - 1`` of ``--ranks`` (`--experts R/N`), each evicted before its run. Per contender: seconds,
bytes read (the report's bytes_by_source: from cold), bytes placed, and the peak RSS of the process
(wait4's ru_maxrss); ratios whole/rank of each. The cold files are in the page cache for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import machine_state, process_cpu_s, report, rounds, run_timed, size_arg, speedup  # noqa: E402

from tiering.sample import SampleTensor, fill_bytes, make_checkpoint, write_safetensors  # noqa: E402
from tiering.sample_moe import make_moe_checkpoint, moe_tensors  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
WD = [sys.executable, "-m", "weightd"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def config(base: Path, tag: str) -> Path:
    (base / "cold").mkdir(exist_ok=True)
    (base / "cold" / ".weightd-cold").touch()
    cfg = base / f"{tag}.toml"
    cfg.write_text(f'state_dir = "{base}/state-{tag}"\n[tiers.hot]\npath = "/dev/shm/weightd-moe-{os.getpid()}-{tag}"\n'
                   f'capacity = "2GiB"\n[tiers.warm]\npath = "{base}/warm-{tag}"\ncapacity = "64GiB"\n'
                   f'[tiers.cold]\npath = "{base}/cold"\n[api]\nsocket = "{base}/{tag}.sock"\n'
                   f'[metrics]\nlisten = "127.0.0.1:0"\n')
    return cfg


def wd(cfg: Path, *args: str) -> list[str]:
    return [*WD, "--config", str(cfg), "-q", *args]


def flat_like(moe: Path, dst: Path) -> Path:
    """The MoE checkpoint's shards with their bytes in one tensor each (same files, same sizes give or
    take a header), its index and config."""
    dst.mkdir(parents=True)
    for shard in sorted(moe.glob("*.safetensors")):
        n = shard.stat().st_size - 4096
        write_safetensors(dst / shard.name, [SampleTensor("w", "U8", (n,))], lambda t: fill_bytes(shard.name, t.nbytes))
    for f in ("config.json", "model.safetensors.index.json"):
        shutil.copy(moe / f, dst / f)
    return dst


def tensors_of(ckpt: Path) -> int:
    from tiering.content.safetensors_header import read_header
    return sum(len(read_header(p).tensors) for p in ckpt.glob("*.safetensors"))


def moe_shards(root: Path, pad: int, keep: int, shards: int = 163) -> Path:
    """The first ``keep`` shards of make_moe_checkpoint(root, pad_bytes=pad) (same names, tensors and
    bytes; without its index json and config)."""
    root.mkdir(parents=True)
    tensors = moe_tensors()
    per = -(-len(tensors) // shards)
    for s in range(keep):
        chunk = tensors[s * per:(s + 1) * per] + [SampleTensor(f"model.pad.{s}", "BF16", (max(1, pad // 2),))]
        write_safetensors(root / f"model-{s + 1:05d}-of-{shards:05d}.safetensors", chunk,
                          lambda t: fill_bytes(f"v1:{t.name}", t.nbytes))
    for f in ("config.json", "model.safetensors.index.json"):   # (flat_like copies them)
        (root / f).write_text("{}")
    return root


def speed(base: Path, pad: int, n: int, ops: tuple[str, ...] = ("build", "preload", "verify"),
          shards: int = 163) -> dict:
    moe = moe_shards(base / "moe", pad, shards) if shards < 163 else make_moe_checkpoint(base / "moe", pad_bytes=pad)
    flat = flat_like(moe, base / "flat")
    counts = {"moe": tensors_of(moe), "flat": tensors_of(flat)}
    cfg = config(base, "speed")
    for k, d in (("moe", moe), ("flat", flat)):
        if ops != ("build",):
            subprocess.run(wd(cfg, "--no-daemon", "publish", str(d), "--name", f"bench/{k}", "--version", "v1"),
                           env=ENV, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cat", *map(str, d.glob("*"))], stdout=subprocess.DEVNULL, check=True)  # (cached)
    contenders = {}
    for k, d in (("moe", moe), ("flat", flat)):
        contenders[f"build_{k}"] = (lambda d=d: run_timed(wd(cfg, "--no-daemon", "manifest", "build", str(d),
                                                             "-o", os.devnull), ENV))
        if "preload" in ops:
            contenders[f"preload_{k}"] = (lambda k=k: run_timed(wd(cfg, "--no-daemon", "preload", f"bench/{k}@v1",
                                                                   "--tier", "warm"), ENV))
        if "verify" in ops:
            contenders[f"verify_{k}"] = (lambda k=k: run_timed(wd(cfg, "--no-daemon", "verify", f"bench/{k}@v1"),
                                                               ENV))

    def before(name: str) -> None:
        if name.startswith("preload_"):
            subprocess.run(wd(cfg, "--no-daemon", "evict", f"bench/{name.split('_')[1]}@v1", "--tier", "warm"),
                           env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    order = sorted(contenders, key=lambda c: (c.split("_")[0] != "build", c.split("_")[0] == "verify"))
    times = rounds({k: contenders[k] for k in order}, n, before=before, log=log)
    extra = counts["moe"] - counts["flat"]
    per_tensor = {op: round((statistics.median(times[f"{op}_moe"]) - statistics.median(times[f"{op}_flat"]))
                            / extra * 1e6, 2) for op in ops}
    ratios = [speedup(times, f"{op}_moe", f"{op}_flat", target=0.9 if op == "build" else None) for op in ops]
    size = sum(p.stat().st_size for p in moe.glob("*"))
    flat_s = statistics.median(times["build_flat"])
    return {"tensors": counts, "shards": shards, "bytes": size, "pad_per_shard": pad,
            "per_tensor_overhead_us": per_tensor, "per_tensor_target_us": 3.0,
            # what the flat build reads and hashes a second (its start-up included), and the overhead a
            # tensor may have for build to reach 0.9 of it on this machine
            "build_flat_bytes_per_s": round(size / flat_s), "build_per_tensor_us_for_0.9": round(
                flat_s * (1 / 0.9 - 1) / extra * 1e6, 2), "times": times, "ratios": ratios}


def run_measured(cmd: list[str]) -> tuple[float, float, dict]:
    """Seconds, peak RSS (MB, the process's own: wait4) and the --json report of one CLI run."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=ENV, stdout=out, stderr=subprocess.PIPE)
        _, status, ru = os.wait4(p.pid, 0)
        s = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)[:200]}: exit {p.returncode}: {err[-500:]}")
        out.seek(0)
        return s, ru.ru_maxrss / 1024, json.loads(out.read())


def experts(base: Path, dim: int, ranks: int, n: int) -> dict:
    """A rank's expert-parallel copy against the whole version (see the module's docstring)."""
    moe = make_moe_checkpoint(base / "moe", d=dim)
    cfg = config(base, "experts")
    subprocess.run(wd(cfg, "--no-daemon", "publish", str(moe), "--name", "bench/moe", "--version", "v1"),
                   env=ENV, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cat", *map(str, moe.glob("*"))], stdout=subprocess.DEVNULL, check=True)  # (cached)
    rank = f"{ranks - 1}/{ranks}"
    args = {"whole": [], "rank": ["--experts", rank]}
    figures: dict[str, dict[str, list[float]]] = {k: {"read_bytes": [], "placed_bytes": [], "rss_mb": []} for k in args}
    labels: dict[str, str] = {}

    def contender(k: str):
        def run() -> float:
            s, rss, r = run_measured(wd(cfg, "--no-daemon", "preload", "bench/moe@v1", "--tier", "warm", "--json",
                                        *args[k]))
            labels[k] = r["version"]
            for key, v in (("read_bytes", sum(r["bytes_by_source"].values())), ("placed_bytes", r["bytes"]),
                           ("rss_mb", rss)):
                figures[k][key].append(v)
            return s
        return run

    def before(_: str) -> None:   # (both evicted: the rank's copy would read a local whole copy instead of cold)
        for label in labels.values():
            subprocess.run(wd(cfg, "--no-daemon", "evict", f"bench/moe@{label}", "--tier", "warm", "--force"),
                           env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    times = rounds({f"preload_{k}": contender(k) for k in args}, n, before=before, log=log)
    med = {k: {f: statistics.median(v) for f, v in figs.items()} for k, figs in figures.items()}
    return {"tensors": tensors_of(moe), "bytes": sum(p.stat().st_size for p in moe.glob("*")), "expert_dim": dim,
            "rank": rank, "figures": {k: {f: {"median": round(statistics.median(v), 1), "min": round(min(v), 1),
                                               "max": round(max(v), 1)} for f, v in figs.items()}
                                      for k, figs in figures.items()},
            "ratios_whole_over_rank": {f: round(med["whole"][f] / med["rank"][f], 3) for f in med["rank"]},
            "times": times, "ratios": [speedup(times, "preload_rank", "preload_whole")]}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def daemon(cfg: Path) -> subprocess.Popen:
    p = subprocess.Popen(wd(cfg, "serve"), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if subprocess.run(wd(cfg, "--daemon-only", "status", "--json"), env=ENV, capture_output=True).returncode == 0:
            return p
        time.sleep(0.3)
    p.kill()
    raise SystemExit("the daemon did not answer in 60 s")


def settle(pid: int, quiet_s: float = 0.5, most_s: float = 30.0) -> float:
    """Seconds until a started daemon's own start-up work is done: its CPU time grows by under 10 ms in
    ``quiet_s`` (it reads its versions' manifests, scans /proc and makes its first estimates on threads
    of its own after it first answers); ``status`` is then timed as a running daemon answers it."""
    t0 = time.monotonic()
    last = process_cpu_s(pid)
    while time.monotonic() - t0 < most_s:
        time.sleep(quiet_s)
        now = process_cpu_s(pid)
        if now - last < 0.01:
            break
        last = now
    return time.monotonic() - t0


def median_run(cmd: list[str], k: int) -> float:
    return statistics.median(run_timed(cmd, ENV) for _ in range(k))


def holding(base: Path, tag: str, refs: list[str], hot: str | None) -> dict:
    """A daemon over a node holding ``refs`` in warm (and ``hot`` in hot): its RSS, status and path."""
    cfg = config(base, tag)
    for r in refs:
        subprocess.run(wd(cfg, "--no-daemon", "preload", r, "--tier", "warm"), env=ENV, check=True,
                       stdout=subprocess.DEVNULL)
    if hot:
        subprocess.run(wd(cfg, "--no-daemon", "preload", hot, "--tier", "hot"), env=ENV, check=True,
                       stdout=subprocess.DEVNULL)
    p = daemon(cfg)
    try:
        started = rss_mb(p.pid)
        early = median_run(wd(cfg, "--daemon-only", "status"), 7)   # (while its start-up work may still run)
        settled = settle(p.pid)
        status = median_run(wd(cfg, "--daemon-only", "status"), 7)
        out = {"copies": len(refs) + bool(hot), "rss_after_start_mb": round(started, 1),
               "rss_after_status_mb": round(rss_mb(p.pid), 1), "status_via_daemon_s": round(status, 4),
               "status_right_after_start_s": round(early, 4), "start_up_work_s": round(settled, 2)}
    finally:
        p.terminate()
        p.wait(30)
    if refs:
        out["path_in_process_s"] = round(median_run(wd(cfg, "--no-daemon", "path", refs[0]), 5), 4)
    shutil.rmtree(f"/dev/shm/weightd-moe-{os.getpid()}-{tag}", ignore_errors=True)
    return out


def memory(base: Path) -> dict:
    cfg = config(base, "pub")
    refs = []
    for i in range(1, 5):
        d = make_moe_checkpoint(base / f"m{i}", seed=f"v{i}")
        subprocess.run(wd(cfg, "--no-daemon", "publish", str(d), "--name", "ds/v3", "--version", f"v{i}"),
                       env=ENV, check=True, stdout=subprocess.DEVNULL)
        refs.append(f"ds/v3@v{i}")
        shutil.rmtree(d)
    small = make_checkpoint(base / "small", total_bytes=64 << 20, shards=2)
    subprocess.run(wd(cfg, "--no-daemon", "publish", str(small), "--name", "acme/small", "--version", "v1"),
                   env=ENV, check=True, stdout=subprocess.DEVNULL)
    rows = {"none": holding(base, "none", [], None), "small_model": holding(base, "small", ["acme/small@v1"], None),
            "one_moe": holding(base, "one", refs[:1], None), "four_moe": holding(base, "four", refs, refs[0])}
    per_version = (rows["four_moe"]["rss_after_status_mb"] - rows["one_moe"]["rss_after_status_mb"]) / 3
    return {"daemon": rows, "rss_per_further_version_mb": round(per_version, 1),
            "first_version_mb": round(rows["one_moe"]["rss_after_status_mb"] - rows["none"]["rss_after_status_mb"], 1),
            "targets": {"per_version_mb": 25, "four_versions_daemon_mb": 250, "status_s": 0.1, "path_s": 0.3}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pad", type=size_arg, help="real bytes added to each shard (8MiB; build-speed: 64MiB)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--part", choices=("all", "speed", "build", "build-speed", "memory", "experts"), default="all")
    ap.add_argument("--shards", type=int, default=163, help="build-speed: the first K of the 163 shards (1-163)")
    ap.add_argument("--expert-dim", type=int, default=128, help="experts: each FP8 expert weight D x D bytes "
                    "(128: 0.74 GB in all; 437: about 8 GiB)")
    ap.add_argument("--ranks", type=int, default=8, help="experts: N of --experts R/N (R = N - 1)")
    ap.add_argument("--dir", help="where to generate (a disk, not tmpfs; default /var/tmp)")
    args = ap.parse_args()
    if not 1 <= args.shards <= 163:
        ap.error("--shards must be 1-163")
    if args.pad is None:
        args.pad = (64 if args.part == "build-speed" else 8) << 20
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-moe-", dir=args.dir or "/var/tmp"))
    m0 = machine_state()
    try:
        out: dict = {}
        if args.part in ("all", "speed"):
            out["speed"] = speed(base / "speed", args.pad, args.rounds)
        if args.part == "build":
            out["speed"] = speed(base / "speed", args.pad, args.rounds, ("build",))
        if args.part == "build-speed":
            out["speed"] = speed(base / "speed", args.pad, args.rounds, ("build",), args.shards)
        if args.part in ("all", "memory"):
            (base / "memory").mkdir()
            out["memory"] = memory(base / "memory")
        if args.part == "experts":
            (base / "experts").mkdir()
            out["experts"] = experts(base / "experts", args.expert_dim, args.ranks, args.rounds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    part = out.get("speed") or out.get("experts") or {}
    times = part.pop("times", {})
    ratios = part.pop("ratios", [])
    print(json.dumps(report("moe", times, ratios, rounds=args.rounds, max_spread=0.5, machine=(m0, machine_state()),
                            command=" ".join(sys.argv), **out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
