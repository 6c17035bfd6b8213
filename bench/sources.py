#!/usr/bin/env python3
"""Checkpoints from where they live (issue 36): weightd's import against the tools a user would chain.

    .venv/bin/python bench/sources.py [--sources hf,oci] [--size 256MiB] [--oci-size 1GiB] [--rounds 5]
                                      [--dir /var/tmp]

One half per source, each a function in ``HALVES`` that starts its server on loopback and returns its
contenders, what to clean before each, and its ratios; the selected halves' contenders run together in
interleaved rounds, each timed end to end as a command (interpreter start-up included).

Hugging Face Hub (``hf``): a real Hub-protocol server, olah offline over a git-lfs repository
(``tiering.sample.local_hub``), serving ``--size`` of safetensors shards plus small files.

- ``hf_import``: ``weightd --no-daemon publish hf://org/repo@main --name bench/hf --version rN`` (a fresh
  label each round, and the import removes its download once published, so every round downloads
  everything; resolve, list, download, every file checked against the Hub's hash, publish);
- ``hf_two_step``: ``snapshot_download('org/repo', revision='main', cache_dir=FRESH)`` as a command,
  then ``weightd --no-daemon publish SNAPSHOT --name bench/hf2 --version rN`` of the directory it
  printed (no Hub hash checked); the two commands' times summed;
- ``hf_download``: that ``snapshot_download`` command alone: what any client spends, the server's
  ceiling for this client library.

Ratios (of medians, with the per-round min-max): ``hf_import`` against ``hf_two_step`` (issue 36's
target: at least 1.3x) and against ``hf_download`` (at most 1: the share of the import that is the
download). ``parts`` has the pieces the rounds measured on the way (each publish's own ``seconds`` from
its ``--json`` report: the copy into cold with its xxh3 pass; the two-step's download step), and
``hub_hash_check_s``, the Hub-hash pass (sha256 of each LFS file, git sha1 of the rest) timed
in-process over a downloaded snapshot after the rounds (its bytes in the page cache, as the import's
are when it checks them), with ``hub_rate_bytes_per_s``, the download's median rate.

OCI registry (``oci``): Debian's ``docker-registry`` started on 127.0.0.1 (filesystem storage under the
scratch directory, no auth), ``--oci-size`` of checkpoint published into it once (untimed) with
``weightd --no-daemon publish`` from a node whose ``[tiers.cold]`` is ``url = "oci://HOST/bench"``,
``insecure = true`` (the tier's defaults otherwise: 64 MiB ranges, 4 in flight).

- ``oci_preload``: ``weightd --no-daemon preload bench/oci@v1 --tier warm --json`` (every part and blob
  checked), the warm copy evicted before each round (untimed);
- ``oci_ranged_get``: a minimal reader as a command, checking nothing: the OCI manifest's blob digests,
  http.client, 4 threads, 64 MiB ranged GETs, pwrite + fsync into a fresh directory (the registry's
  ceiling);
- ``oras pull`` + ``weightd verify``: only with an oras client (``import oras`` or ``oras`` on PATH);
  without one it is listed under ``oci.skipped`` with the reason.

Ratios: ``oci_preload`` against ``oci_ranged_get`` (issue 36's target: at least 0.9x); against the two
tools (target 1.3x) when they can run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import (BenchNode, machine_state, positive_size_arg, report, rounds, speedup,  # noqa: E402
                     summary)


@dataclass
class Half:
    """One source's share of the benchmark: its contenders (each returns the seconds it took), what to
    clean before each (untimed), its ratios as (fast, slow, target or None), figures measured on the way
    (``parts``: name -> samples) and anything else for the JSON (``info``), computed after the rounds."""
    contenders: dict[str, Callable[[], float]]
    before: Callable[[str], None] = lambda name: None
    ratios: list[tuple[str, str, float | None]] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    info: Callable[[dict[str, list[float]]], dict[str, Any]] = lambda times: {}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds ``cmd`` took, and its stdout; a failure ends the benchmark, saying why."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    s = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)[:200]}: exit {p.returncode}: {p.stderr[-500:]}")
    return s, p.stdout


SNAPSHOT_DOWNLOAD = ("import sys\nfrom huggingface_hub import snapshot_download\n"
                     "print(snapshot_download(sys.argv[1], revision=sys.argv[2], cache_dir=sys.argv[3]))")


def hf_half(args: argparse.Namespace, base: Path, node: BenchNode, stack: contextlib.ExitStack,
            log: Callable[[str], None]) -> Half:
    """The Hugging Face Hub half (see the module's docstring)."""
    from tiering.sample import local_hub
    hub = stack.enter_context(local_hub(base / "hub", total_bytes=args.size))
    log(f"hf: olah on {hub.endpoint}, commit {hub.commit()}")
    # (no progress bars from the baseline either: weightd shows none when stderr is not a terminal)
    env = {**node.env, **hub.env(), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    scratch = base / "hf-scratch"
    label = {"hf_import": 0, "hf_two_step": 0}
    parts: dict[str, list[float]] = {"hf_import.publish_s": [], "hf_two_step.download_s": [],
                                     "hf_two_step.publish_s": []}
    snapshots: list[Path] = []

    def download() -> tuple[float, Path]:
        cache = scratch / uuid.uuid4().hex[:8]   # (fresh: nothing to reuse)
        s, out = timed([sys.executable, "-c", SNAPSHOT_DOWNLOAD, "org/repo", "main", str(cache)], env)
        return s, Path(out.strip().splitlines()[-1])

    def publish(source: str, name: str, key: str) -> tuple[float, dict[str, Any]]:
        label[key] += 1
        s, out = timed([*node.wd, "--no-daemon", "publish", source, "--name", name, "--version", f"r{label[key]}",
                        "--json"], env)
        return s, json.loads(out)

    def hf_import() -> float:
        s, doc = publish("hf://org/repo@main", "bench/hf", "hf_import")
        if doc["source"]["bytes"] != doc["bytes"] or doc.get("unchanged"):
            raise SystemExit(f"hf_import: not a full import: {doc}")
        parts["hf_import.publish_s"].append(doc["seconds"])
        return s

    def hf_two_step() -> float:
        d, snap = download()
        p, doc = publish(str(snap), "bench/hf2", "hf_two_step")
        parts["hf_two_step.download_s"].append(d)
        parts["hf_two_step.publish_s"].append(doc["seconds"])
        return d + p

    def hf_download() -> float:
        s, snap = download()
        snapshots[:] = [snap]
        return s

    def before(name: str) -> None:
        # every download cache goes (removed before write-back, its dirty pages cost the next one nothing)
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        snapshots.clear()

    def info(times: dict[str, list[float]]) -> dict[str, Any]:
        """The Hub-hash pass over a fresh download (the rounds' last scratch is gone: one more, untimed)."""
        from huggingface_hub import HfApi
        from tiering.sources.hf import list_files, parse_hub_ref
        from tiering.sources.hf_files import verify
        before("hf_download")
        _, snap = download()
        files = list_files(HfApi(endpoint=hub.endpoint), parse_hub_ref("hf://org/repo@main"), hub.commit())
        total = sum(f.size for f in files)
        checks = []
        for _ in range(3):
            t0 = time.perf_counter()
            verify(snap, files, workers=4)   # (as fetch_snapshot calls it: min(8 workers, 4))
            checks.append(time.perf_counter() - t0)
        before("hf_download")
        med = summary(times["hf_download"])["median_s"]
        return {"hf": {"endpoint": "olah offline, loopback", "files": len(files), "bytes": total,
                       "hub_hash_check_s": summary(checks),
                       "hub_rate_bytes_per_s": round(total / med) if med else None,
                       "two_step_downloads_and_publishes": "separate commands, times summed"}}

    return Half(contenders={"hf_import": hf_import, "hf_two_step": hf_two_step, "hf_download": hf_download},
                before=before, ratios=[("hf_import", "hf_two_step", 1.3), ("hf_import", "hf_download", None)],
                parts=parts, info=info)


RANGED_READER = r'''
import http.client, json, os, sys, threading
host, repo, ref, dst = sys.argv[1:5]
threads, rng = int(sys.argv[5]), int(sys.argv[6])
c = http.client.HTTPConnection(host, timeout=60)
c.request("GET", f"/v2/{repo}/manifests/{ref}", headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
r = c.getresponse()
if r.status != 200:
    sys.exit(f"manifest: HTTP {r.status}")
doc = json.loads(r.read())
c.close()
os.makedirs(dst)
blobs, jobs = {}, []
for b in [doc["config"], *doc["layers"]]:
    if b["digest"] in blobs:
        continue
    fd = os.open(os.path.join(dst, b["digest"].split(":", 1)[1]), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    blobs[b["digest"]] = fd
    os.ftruncate(fd, b["size"])
    jobs += [(b["digest"], fd, o, min(rng, b["size"] - o)) for o in range(0, b["size"], rng)]
jobs.sort(key=lambda j: -j[3])
lock, errors, total = threading.Lock(), [], [0]
def work():
    conn = http.client.HTTPConnection(host, timeout=60)
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    try:
        while True:
            with lock:
                if not jobs or errors:
                    return
                digest, fd, off, n = jobs.pop(0)
            conn.request("GET", f"/v2/{repo}/blobs/{digest}", headers={"Range": f"bytes={off}-{off + n - 1}"})
            resp = conn.getresponse()
            if resp.status not in (200, 206) or (resp.status == 200 and off):
                raise RuntimeError(f"{digest} {off}: HTTP {resp.status}")
            pos, end = off, off + n
            while pos < end:
                k = resp.readinto(view[:min(len(buf), end - pos)])
                if not k:
                    raise RuntimeError(f"{digest} {off}: short body at {pos}")
                os.pwrite(fd, view[:k], pos)
                pos += k
            resp.read()
            with lock:
                total[0] += n
    except Exception as e:
        errors.append(repr(e))
    finally:
        conn.close()
ts = [threading.Thread(target=work) for _ in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    sys.exit("; ".join(errors[:3]))
for fd in blobs.values():
    os.fsync(fd)
    os.close(fd)
d = os.open(dst, os.O_RDONLY)
os.fsync(d)
os.close(d)
print(json.dumps({"blobs": len(blobs), "bytes": total[0]}))
'''


def start_registry(d: Path, stack: contextlib.ExitStack, log: Callable[[str], None]) -> str:
    """Debian's docker-registry on 127.0.0.1:<free port> (tiering.sample.local_registry: filesystem
    storage under ``d``, no auth), stopped when ``stack`` closes, whatever happens. Returns HOST:PORT."""
    from tiering.sample import local_registry
    try:
        host = stack.enter_context(local_registry(d))
    except (FileNotFoundError, RuntimeError) as exc:
        raise SystemExit(f"docker-registry: {exc}") from None
    log(f"oci: docker-registry on {host}")
    return host


def oci_half(args: argparse.Namespace, base: Path, node: BenchNode, stack: contextlib.ExitStack,
             log: Callable[[str], None]) -> Half:
    """The OCI registry half (see the module's docstring)."""
    from tiering.sample import make_checkpoint
    oras_skip = _oras_skip()
    if oras_skip is None:
        raise SystemExit("oci: an oras client is installed, but this bench has no oras pull + weightd verify "
                         "contender yet (written without a client to run it against)")
    host = start_registry(base / "registry", stack, log)
    prefix = "bench"
    # a node of its own whose cold tier is the registry (the tier's defaults: 64 MiB ranges, 4 in flight)
    (base / "oci-node").mkdir()
    onode = BenchNode(base / "oci-node", Path(f"/dev/shm/weightd-bench-sources-oci-{uuid.uuid4().hex[:8]}"))
    stack.callback(onode.close)
    text = onode.cfg.read_text()
    cold = f'[tiers.cold]\npath = "{onode.base}/cold"\n'
    assert cold in text, text
    onode.cfg.write_text(text.replace(cold, f'[tiers.cold]\nurl = "oci://{host}/{prefix}"\ninsecure = true\n'))
    env = onode.env
    src = make_checkpoint(base / "oci-src", total_bytes=args.oci_size, shards=4, layers=16, seed="ocibench")
    s, out = timed([*onode.wd, "--no-daemon", "publish", str(src), "--name", "bench/oci", "--version", "v1",
                    "--json"], env)
    pub = json.loads(out)
    total = pub["bytes"]
    shutil.rmtree(base / "oci-src")   # (the registry holds the only copy now)
    log(f"oci: published {total} bytes to {pub['path']} in {s:.1f}s")
    repo = f"{prefix}/bench/oci"
    scratch = base / "oci-scratch"
    parts: dict[str, list[float]] = {"oci_preload.report_s": []}
    got: dict[str, Any] = {}

    def oci_preload() -> float:
        s, out = timed([*onode.wd, "--no-daemon", "preload", "bench/oci@v1", "--tier", "warm", "--json"], env)
        rep = json.loads(out)
        if rep.get("bytes") != total or rep.get("bytes_by_source", {}).get("cold") != total:
            raise SystemExit(f"oci_preload: not a full preload from the registry: {out[:1000]}")
        if "seconds" in rep:
            parts["oci_preload.report_s"].append(rep["seconds"])
        got["preload_report"] = rep
        return s

    def oci_ranged_get() -> float:
        s, out = timed([sys.executable, "-c", RANGED_READER, host, repo, "v1", str(scratch / "blobs"), "4",
                        str(64 << 20)], env)
        doc = json.loads(out)
        if doc["bytes"] < total:
            raise SystemExit(f"oci_ranged_get: {doc['bytes']} bytes, the version has {total}")
        got["ranged_get"] = doc
        return s

    def before(name: str) -> None:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        if name == "oci_preload":
            ev = subprocess.run([*onode.wd, "--no-daemon", "-q", "evict", "bench/oci@v1", "--force"], env=env,
                                capture_output=True, text=True)
            warm = onode.base / "warm"
            left = [f for f in warm.rglob("*") if f.is_file() and f.stat().st_size > (1 << 20)] \
                if warm.exists() else []
            if left:
                raise SystemExit(f"oci: the warm copy is still there after evict ({ev.stderr.strip()[-300:]}): "
                                 f"{left[:3]}")

    def info(times: dict[str, list[float]]) -> dict[str, Any]:
        med = summary(times["oci_ranged_get"])["median_s"]
        rep = got.get("preload_report", {})
        return {"oci": {"registry": "Debian docker-registry (distribution), filesystem storage, loopback, no auth",
                        "bytes": total, "blobs": got.get("ranged_get", {}).get("blobs"),
                        "tier": "oci:// cold tier, insecure, range_size 64MiB, concurrency 4 (defaults)",
                        "ceiling": "http.client, 4 threads, 64 MiB ranged GETs of the manifest's blobs, pwrite + "
                                   "fsync into a fresh directory, nothing checked",
                        "ceiling_rate_bytes_per_s": round(total / med) if med else None,
                        "preload_store": rep.get("store"), "preload_seconds_own": rep.get("seconds"),
                        "publish_s": round(s, 3),
                        "skipped": {"oras_two_step": oras_skip}}}

    contenders: dict[str, Callable[[], float]] = {"oci_preload": oci_preload, "oci_ranged_get": oci_ranged_get}
    ratios: list[tuple[str, str, float | None]] = [("oci_preload", "oci_ranged_get", 0.9)]
    return Half(contenders=contenders, before=before, ratios=ratios, parts=parts, info=info)


def _oras_skip() -> str | None:
    """Why ``oras pull`` + ``weightd verify`` cannot run here (None when an oras client exists)."""
    py = subprocess.run([sys.executable, "-c", "import oras"], capture_output=True).returncode == 0
    cli = shutil.which("oras")
    if py or cli:
        return None
    return ("no oras client: `import oras` fails in this venv and no `oras` on PATH (not installed, per the "
            "brief: nothing pip-installed)")


# Each source's half: NAME -> function(args, base, node, stack, log) -> Half.
HALVES: dict[str, Callable[..., Half]] = {"hf": hf_half, "oci": oci_half}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", default=",".join(HALVES),
                    help=f"comma-separated halves to run, of: {', '.join(HALVES)} (default: all)")
    ap.add_argument("--size", type=positive_size_arg, default="256MiB", help="bytes of shards to serve (hf)")
    ap.add_argument("--oci-size", type=positive_size_arg, default="1GiB",
                    help="bytes of the version published to the registry (oci)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp", help="disk directory for the servers, caches, cold tier and state")
    ap.add_argument("--max-spread", type=float, default=0.5)
    args = ap.parse_args()
    chosen = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in HALVES]
    if not chosen or unknown:
        ap.error(f"--sources: {', '.join(unknown) or 'none given'}: choose from {', '.join(HALVES)}")
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-sources-", dir=args.dir))
    node = BenchNode(base, Path(f"/dev/shm/weightd-bench-sources-{uuid.uuid4().hex[:8]}"))
    try:
        with contextlib.ExitStack() as stack:
            halves = {s: HALVES[s](args, base, node, stack, log) for s in chosen}
            owner = {name: h for h in halves.values() for name in h.contenders}
            contenders = {name: fn for h in halves.values() for name, fn in h.contenders.items()}
            # one untimed round first (olah's first answers, the interpreters' files in the page cache),
            # its parts dropped
            for name, fn in contenders.items():
                owner[name].before(name)
                fn()
            for h in halves.values():
                for v in h.parts.values():
                    v.clear()
            state0 = machine_state()
            times = rounds(contenders, args.rounds, before=lambda name: owner[name].before(name), log=log)
            state1 = machine_state()
            ratios = [speedup(times, fast, slow, max_spread=args.max_spread, target=target)
                      for h in halves.values() for fast, slow, target in h.ratios]
            parts = {k: summary(v) for h in halves.values() for k, v in h.parts.items() if v}
            extra: dict[str, Any] = {}
            for h in halves.values():
                extra.update(h.info(times))
            out = report("sources", times, ratios, rounds=args.rounds, max_spread=args.max_spread,
                         machine=(state0, state1), size_bytes=args.size if "hf" in chosen else None,
                         sources=chosen, parts=parts,
                         note="ratio = the slower contender's median time / the faster's (above 1: 'of' is "
                              "faster than 'vs'); each contender is timed as a command, interpreter start-up "
                              "included; a part's figure is that step's own, inside its contender",
                         **extra)
        print(json.dumps(out, indent=1))
        return 0
    finally:
        node.close()


if __name__ == "__main__":
    raise SystemExit(main())
