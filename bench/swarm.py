#!/usr/bin/env python3
"""A fleet restart over P2P: N worker daemons + an origin on 127.0.0.x, every node capped.

    .venv/bin/python bench/swarm.py [--size 300MiB] [--cap 20MB] [--n 1,2,4,8] [--piece-size 1MiB]
    .venv/bin/python bench/swarm.py --compare plain,tls,signed,tls+signed --n 8 --rounds 5 [--size 128MiB]
    .venv/bin/python bench/swarm.py --origins 2 --kill-origin-at 0.5 --n 4 --rounds 5 [--size 128MiB]
    .venv/bin/python bench/swarm.py --n 1,32 --size 100MiB --piece-size 16KiB --cap 2500KB --trace \
        --baseline none --origin-queue 0 --rounds 3

For each N: all N workers `weightd preload` one version at once (real daemons, real libtorrent,
loopback only); reported: time until all hold the verified version, T(N)/T(1), the origin's upload
as a multiple of the checkpoint size, and the workers' peak RSS. Baseline in the same run: the same
N workers each downloading from the origin alone (workers' allowlists exclude one another), i.e. N
copies through the origin's cap: the weight-loading storm the seed reports describe.

``--compare MODES``: what fleet TLS (``[p2p] tls``: SSL torrents, every peer connection and the
tracker over TLS with certificates from a throwaway fleet CA) and required signatures (``[trust]
require_signature``: every worker checks the publisher's signature and the SHA-256 of every byte)
cost. For each of ``--rounds`` rounds, the modes run one after another (interleaved, so the VM's noise
falls on all of them); reported per mode: T(N) median and range, origin upload, and the ratio of
medians against ``plain`` with the range of the per-round ratios.

``--origins N --kill-origin-at F``: N origins (one tracker each; every worker lists every origin and
every tracker), each round once with every origin up and once with the first origin SIGKILLed when
the workers hold F of the version on average; reported: medians and ranges of the time, of what the
origins sent (x checkpoint), bytes from cold, and the time with the kill over the time without.

Every mode (``--compare``) or contender (the plan and each ``--baseline``) runs once per round at
every N, in a rotating order, for ``--rounds`` rounds (default 5; bench/_rounds.py: up to twice as
many while a spread is wide, no ratio past ``--max-spread``). The JSON is in the common shape
(medians and min-max per "contender N=n", ratios with their per-round spread, the machine's state).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_state, report, rounds, speedup  # noqa: E402
from tiering.content.units import parse_size  # noqa: E402
from tiering.sample import make_checkpoint  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
WARM = {"capacity": "4GiB"}   # (main raises it for checkpoints larger than 3 GiB)
MEMORY_TRACE = False          # --memory-trace: the first worker's resident memory by kind, once a second
KEEP_LOGS: Path | None = None  # --keep-logs DIR: daemons log at debug level, and each log is kept there


_GIVEN: set[tuple[str, int]] = set()   # ports free_port handed out in this run


def free_port(ip: str) -> int:
    """A port free on ``ip`` now and not handed out before in this run: the kernel may give a port
    just closed again (a daemon's P2P and metrics ports were once the same, and it did not start)."""
    while True:
        with socket.socket() as s:
            s.bind((ip, 0))
            port = s.getsockname()[1]
        if (ip, port) not in _GIVEN:
            _GIVEN.add((ip, port))
            return port


class Daemon:
    def __init__(self, base: Path, ip: str, cold: Path, cap: str, role: str, origins: list[str], allow: str,
                 trackers: list[str] = (), p2p_extra: str = "", extra: str = "") -> None:
        self.ip, self.role, self.dir = ip, role, base / f"{ip}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir(parents=True)
        self.hot = Path(f"/dev/shm/weightd-bench-swarm-{uuid.uuid4().hex[:8]}")
        self.port, self.mport, self.tport = free_port(ip), free_port(ip), free_port(ip)
        extra_sections = extra
        extra = f'tracker_listen = "{ip}:{self.tport}"\n' if role == "origin" else \
            (f'trackers = {json.dumps(list(trackers))}\n' if trackers else "")
        self.config = self.dir / "weightd.toml"
        self.config.write_text(
            f'state_dir = "{self.dir}/state"\n[tiers.hot]\npath = "{self.hot}"\ncapacity = "1GiB"\n'
            f'[tiers.warm]\npath = "{self.dir}/warm"\ncapacity = "{WARM["capacity"]}"\n[tiers.cold]\npath = "{cold}"\n'
            f'[api]\nsocket = "{self.dir}/weightd.sock"\n[metrics]\nlisten = "{ip}:{self.mport}"\n'
            f'[p2p]\nthreshold = "1MiB"\nlisten = "{ip}:{self.port}"\nallow = [{allow}]\n'
            f'upload_limit = "{cap}"\ndownload_limit = "{cap}"\nfallback_after_s = 120\n'
            + (f'peers = {json.dumps(origins)}\n' if origins else "") + extra + p2p_extra + extra_sections)
        self.log = open(self.dir / "log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(self.config)]
                                     + ["-vv"] * bool(KEEP_LOGS) + ["serve", "--role", role], stdout=self.log, stderr=subprocess.STDOUT, env=ENV)
        deadline = time.monotonic() + 60
        while not (self.dir / "weightd.sock").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"daemon {ip} did not start: {(self.dir / 'log').read_text()}")
            time.sleep(0.1)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://{self.ip}:{self.mport}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def rss_mb(self) -> float:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:  # exited
            return 0.0
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def memory(self) -> dict[str, float]:
        """Resident memory by kind (MB), from /proc/PID/smaps_rollup."""
        out: dict[str, float] = {}
        try:
            text = Path(f"/proc/{self.proc.pid}/smaps_rollup").read_text()
        except OSError:
            return out
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Anonymous", "Shared_Clean", "Private_Clean", "Private_Dirty", "Shared_Dirty"):
                out[key] = round(int(rest.split()[0]) / 1024, 1)
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.hot, ignore_errors=True)
        if KEEP_LOGS is not None:
            KEEP_LOGS.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.dir / "log", KEEP_LOGS / f"{self.role}-{self.ip}-{self.dir.name[-6:]}.log")


class Mode:
    """How the fleet runs: plain, with fleet TLS, with required signatures, or both."""

    def __init__(self, name: str, pki: dict[str, Path] | None = None, pubkey: Path | None = None) -> None:
        self.name, self.tls, self.signed = name, "tls" in name, "signed" in name
        self.pki, self.pubkey = pki, pubkey

    @property
    def ref(self) -> str:  # (a TLS fleet's torrents carry its CA: its own published version)
        return "bench/swarm-tls@v1" if self.tls else "bench/swarm@v1"

    def p2p(self, ip: str) -> str:
        if not self.tls:
            return ""
        assert self.pki is not None
        return f'tls = {{ ca = "{self.pki["ca"]}", cert = "{self.pki[ip]}", key = "{self.pki[ip + ".key"]}" }}\n'

    def sections(self) -> str:
        return f'[trust]\nrequire_signature = true\npublic_keys = ["{self.pubkey}"]\n' if self.signed else ""


PLAIN = Mode("plain")


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return sum(f) - idle, sum(f)


def _preload(w: Daemon, ref: str) -> dict:
    """One worker's preload through its daemon's socket (a thread of the bench: starting 64 CLI
    interpreters at once would cost the 2-core machine seconds of CPU inside the measured window)."""
    from weightd.client import DaemonClient
    return DaemonClient(w.dir / "weightd.sock").preload(ref, tier="warm", strict=False, timeout_s=1800, wait=False)


def _swarm_sums(reports: list[dict]) -> dict:
    """The piece plan's counters over all workers (``swarm`` in each preload report)."""
    sw = [r.get("swarm") or {} for r in reports]
    total = {k: sum(s.get(k) or 0 for s in sw) for k in ("origin_bytes", "origin_outside_slice_bytes",
                                                         "origin_held_bytes", "origin_held_after_own_bytes",
                                                         "duplicate_bytes", "redundant_bytes", "failed_bytes",
                                                         "slice_changes")}
    total["open_all_events"] = sum(1 for s in sw if s.get("open_all_after_s") is not None)
    total["owners_planned_without"] = sum(s.get("stalled_owners") or 0 for s in sw)
    total["late_owners"] = sum(s.get("late_owners") or 0 for s in sw)
    total["alone_s_max"] = max((s.get("alone_s") or 0 for s in sw), default=0)
    total["workers_seen_min"] = min((s.get("workers_max") or 0 for s in sw), default=0)
    if any(s.get("crossing_bytes_in") for s in sw):   # ([p2p] crossing)
        total["crossing_bytes_in"] = sum(s.get("crossing_bytes_in") or 0 for s in sw)
        total["crossing_bytes_out"] = sum(s.get("crossing_bytes_out") or 0 for s in sw)
        total["crossing_peak_max"] = max(s.get("crossing_peak") or 0.0 for s in sw)
    return total


def _cross_rack(reports: list[dict], racks: list[str], size: int) -> dict:
    """Bytes each rack received from outside itself (the origin counts as outside), x checkpoint."""
    per: dict[str, int] = {}
    for r, rack in zip(reports, racks):
        for sender, n in ((r.get("swarm") or {}).get("bytes_by_rack") or {}).items():
            if sender != rack:
                per[rack] = per.get(rack, 0) + n
    xs = {k: round(v / size, 2) for k, v in sorted(per.items())}
    return {"per_rack_x": xs, "max_x": max(xs.values(), default=0.0)}


def _copied(w: Daemon) -> float:
    """How far a worker's copy from the swarm is (0-1: its transfer's "copy" phase; 0 outside it)."""
    try:
        with urllib.request.urlopen(f"http://{w.ip}:{w.mport}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("weightd_transfer_progress_ratio{") and 'phase="copy"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _killer(origin: Daemon, workers: list[Daemon], at: float, stop: threading.Event, out: dict) -> threading.Thread:
    """A thread that SIGKILLs ``origin`` once the workers hold ``at`` of the version on average; ``out``
    gets when (s after the start), the workers' mean progress then, and the origin's upload counter
    just before (bytes)."""
    t0 = time.perf_counter()

    def watch() -> None:
        while not stop.is_set():
            mean = sum(_copied(w) for w in workers) / len(workers)
            if mean >= at:
                out["upload_before"] = origin.metric("weightd_p2p_upload_bytes_total")
                origin.proc.kill()
                origin.proc.wait()
                out.update(at_s=round(time.perf_counter() - t0, 2), progress=round(mean, 3))
                return
            time.sleep(0.1)
    t = threading.Thread(target=watch)
    t.start()
    return t


def _settled_upload(origins: list[Daemon]) -> float:
    """The live origins' upload counters (libtorrent updates them once a second: read until two agree)."""
    def read() -> float:
        return sum(o.metric("weightd_p2p_upload_bytes_total") for o in origins if o.proc.poll() is None)
    up, prev = read(), -1.0
    while up != prev:
        time.sleep(1.5)
        up, prev = read(), up
    return up


def run(base: Path, cold: Path, n: int, cap: str, storm: bool, size: int, mode: Mode = PLAIN, *,
        plan: bool = True, trace: bool = False, racks: int = 0, origins_n: int = 1,
        kill_at: float | None = None, choke: bool | None = None, gateways: int | None = None,
        crossing: bool = False, origin_queue: int | None = None) -> dict:
    """One preload storm: ``origins_n`` origins (127.0.0.2, .3, ...; one tracker each, every worker lists
    them all), ``n`` workers; ``kill_at``: SIGKILL the first origin once the workers hold that much;
    ``origin_queue``: the origins' ``[p2p] origin_request_queue`` (None: the daemon's default)."""
    knobs = ("" if plan else "plan = false\n") + ("trace = true\n" if trace else "")
    oq = "" if origin_queue is None else f"origin_request_queue = {origin_queue}\n"
    origins = [Daemon(base, f"127.0.0.{2 + i}", cold, cap, "origin", [], '"127.0.0.0/8"',
                      p2p_extra=mode.p2p(f"127.0.0.{2 + i}") + knobs + oq) for i in range(origins_n)]
    scheme = "https" if mode.tls else "http"
    workers = []
    rack_of = [f"r{i % racks}" if racks else "" for i in range(n)]
    stop = threading.Event()
    try:
        for i in range(n):
            ip = f"127.0.0.{10 + i}"
            # storm: nobody but the origins
            allow = ", ".join(f'"{o.ip}/32"' for o in origins) if storm else '"127.0.0.0/8"'
            rack = (f'rack = "{rack_of[i]}"\n' + (f"gateways = {gateways}\n" if gateways else "")
                    + ("" if choke is None else f"choke_other_racks = {str(choke).lower()}\n")
                    + (f"crossing = true\ncrossing_port = {free_port(ip)}\n" if crossing else "")) if racks else ""
            workers.append(Daemon(base, ip, cold, cap, "worker", [f"{o.ip}:{o.port}" for o in origins], allow,
                                  [] if storm else [f"{scheme}://{o.ip}:{o.tport}/announce" for o in origins],
                                  p2p_extra=mode.p2p(ip) + knobs + rack, extra=mode.sections()))
        up0 = sum(o.metric("weightd_p2p_upload_bytes_total") for o in origins)
        peak = [0.0]

        timeline: list[dict] = []
        t_start = time.perf_counter()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max([peak[0], *(w.rss_mb() for w in workers)])
                if MEMORY_TRACE and workers:
                    timeline.append({"t": round(time.perf_counter() - t_start, 1), **workers[0].memory()})
                time.sleep(0.2)

        sampler = threading.Thread(target=sample)
        sampler.start()
        killed: dict = {}
        killer = _killer(origins[0], workers, kill_at, stop, killed) if kill_at is not None else None
        from concurrent.futures import ThreadPoolExecutor
        cpu0 = _cpu_ticks()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(_preload, w, mode.ref) for w in workers]
            reports = [f.result() for f in futures]
        wall = time.perf_counter() - t0
        cpu1 = _cpu_ticks()
        stop.set()
        sampler.join()
        if killer is not None:
            killer.join()
        up = _settled_upload(origins) + killed.get("upload_before", 0) - up0
        from_origins = sum(r["bytes_by_source"]["origin"] for r in reports)
        return {"n": n, "seconds": round(wall, 2), "origin_upload_x": round(up / size, 2),
                "from_origins_x": round(from_origins / size, 3), "killed": killed or None,
                "cpu_busy": round((cpu1[0] - cpu0[0]) / max(1, cpu1[1] - cpu0[1]), 3),
                "worker_peak_rss_mb": round(peak[0], 1),
                "worker_seconds": sorted(round(r.get("seconds", 0), 1) for r in reports),
                "from_peers_bytes": sum(r["bytes_by_source"]["peer"] for r in reports),
                "origin_each": [round(r["bytes_by_source"]["origin"] / size, 2) for r in reports],
                "from_cold_bytes": sum(r["bytes_by_source"]["cold"] for r in reports),
                "fallbacks": sum(len(r.get("source_fallbacks") or ()) for r in reports),
                "cross_rack": _cross_rack(reports, rack_of, size) if racks else None,
                "memory_timeline": timeline[::5] if MEMORY_TRACE else None,
                "plan": _swarm_sums(reports), "swarm_each": [r.get("swarm") for r in reports],
                "signature_checked": all((r.get("signature") or {}).get("checked") for r in reports)}
    finally:
        stop.set()
        for d in [*workers, *origins]:
            d.stop()


def _median_range(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def compare(base: Path, cold: Path, src: Path, cfg: Path, args: argparse.Namespace, ns: list[int], size: int) -> dict:
    """Every mode once per round, interleaved; medians, ranges, and ratios against plain."""
    from p2p import write_fleet
    names = ["plain", *[m for m in args.compare.split(",") if m != "plain"]]
    ips = ["127.0.0.2", *[f"127.0.0.{10 + i}" for i in range(max(ns))]]
    pki = write_fleet(base / "pki", ips, ips={"127.0.0.2": ["127.0.0.2"]})
    if any("tls" in m for m in names):  # the TLS fleet's torrent carries its CA: publish it once more
        tls_cfg = base / "publish-tls.toml"
        tls_cfg.write_text(cfg.read_text() + f'tls = {{ ca = "{pki["ca"]}", cert = "{pki["127.0.0.2"]}", '
                           f'key = "{pki["127.0.0.2.key"]}" }}\n')
        subprocess.run([sys.executable, "-m", "weightd", "--config", str(tls_cfg), "--no-daemon", "publish", str(src),
                        "--name", "bench/swarm-tls", "--version", "v1", "--sign", str(base / "signing.pem")],
                       capture_output=True, text=True, env=ENV, check=True)
    modes = [Mode(m, pki, base / "signing.pub.pem") for m in names]
    runs: dict[tuple[str, int], list[dict]] = {}

    def one(mode: Mode, n: int) -> float:
        r = run(base, cold, n, args.cap, False, size, mode)
        if mode.signed and not r["signature_checked"]:
            raise SystemExit(f"{mode.name}: a worker did not check the signature: {r}")
        runs.setdefault((mode.name, n), []).append(r)
        print(f"n={n} {mode.name}: {r['seconds']} s, origin {r['origin_upload_x']}x", file=sys.stderr, flush=True)
        return r["seconds"]

    # every mode at every N once per round, the order rotating (no mode always first)
    m0 = machine_state()
    sec = rounds({f"{mode.name} N={n}": (lambda mode=mode, n=n: one(mode, n)) for n in ns for mode in modes},
                 args.rounds, widen=args.max_spread, log=lambda m: print(m, file=sys.stderr, flush=True))
    m1 = machine_state()
    out: dict = {"bytes": size, "cap_bytes_per_s": parse_size(args.cap), "load_avg": os.getloadavg(),
                 "results": []}
    for n in ns:
        base_t = [r["seconds"] for r in runs[("plain", n)]]
        for mode in modes:
            ts = [r["seconds"] for r in runs[(mode.name, n)]]
            entry = {"mode": mode.name, "n": n, "seconds": _median_range(ts),
                     "origin_upload_x": _median_range([r["origin_upload_x"] for r in runs[(mode.name, n)]]),
                     "from_cold_bytes": sum(r["from_cold_bytes"] for r in runs[(mode.name, n)])}
            if mode.name != "plain":
                entry["t_over_plain"] = round(statistics.median(ts) / statistics.median(base_t), 3)
                entry["t_over_plain_per_round"] = _median_range([a / b for a, b in zip(ts, base_t)])
            out["results"].append(entry)
    out["targets"] = {"tls_t_over_plain": 1.15}
    ratios = [speedup(sec, f"plain N={n}", f"{m.name} N={n}", max_spread=args.max_spread, target_at_most=1.15)
              for n in ns for m in modes if m.name != "plain"]
    return report("swarm-compare", sec, ratios, rounds=args.rounds, max_spread=args.max_spread, machine=(m0, m1),
                  **out)


def several_origins(base: Path, cold: Path, args: argparse.Namespace, ns: list[int], size: int) -> dict:
    """``--origins N`` (and ``--kill-origin-at F``): the same storm with every origin up, and with the
    first origin SIGKILLed once the workers hold F of the version, once each per round, interleaved;
    medians and ranges of the time, the bytes the origins sent (x checkpoint: what the workers received
    from origins, and the origins' own counters, the killed one's read just before), bytes from cold,
    and the time with the kill over the time without (target: at most 1.3)."""
    contenders = [("all-up", None)] + [("kill", args.kill_origin_at)] * (args.kill_origin_at is not None)
    runs: dict[tuple[str, int], list[dict]] = {}

    def one(name: str, kill_at: float | None, n: int) -> float:
        r = run(base, cold, n, args.cap, False, size, trace=args.trace, origins_n=args.origins, kill_at=kill_at)
        runs.setdefault((name, n), []).append(r)
        print(f"n={n} origins={args.origins} {name}: {r['seconds']} s, from origins {r['from_origins_x']}x, "
              f"origins' counters {r['origin_upload_x']}x, cold {r['from_cold_bytes']}, killed {r['killed']}",
              file=sys.stderr, flush=True)
        return r["seconds"]

    m0 = machine_state()
    sec = rounds({f"{name} N={n}": (lambda c=(name, at, n): one(*c)) for n in ns for name, at in contenders},
                 args.rounds, widen=args.max_spread, log=lambda m: print(m, file=sys.stderr, flush=True))
    m1 = machine_state()
    out: dict = {"bytes": size, "origins": args.origins, "kill_origin_at": args.kill_origin_at,
                 "cap_bytes_per_s": parse_size(args.cap), "results": []}
    for n in ns:
        for name, _ in contenders:
            rs = runs[(name, n)]
            out["results"].append({
                "contender": name, "n": n, "seconds": _median_range([r["seconds"] for r in rs]),
                "from_origins_x": _median_range([r["from_origins_x"] for r in rs]),
                "origin_upload_x": _median_range([r["origin_upload_x"] for r in rs]),
                "from_cold_bytes": sum(r["from_cold_bytes"] for r in rs),
                "fallbacks": sum(r["fallbacks"] for r in rs),
                "killed_at_progress": [r["killed"]["progress"] for r in rs if r["killed"]],
                "plan": rs[len(rs) // 2]["plan"], "runs": rs if args.verbose else None})
    out["targets"] = {"kill_t_over_all_up": 1.3, "from_origins_x": 1.3, "from_cold_bytes": 0}
    ratios = [speedup(sec, f"all-up N={n}", f"kill N={n}", max_spread=args.max_spread, target_at_most=1.3)
              for n in ns if f"kill N={n}" in sec]
    return report("swarm-origins", sec, ratios, rounds=args.rounds, max_spread=args.max_spread, machine=(m0, m1),
                  **out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="300MiB")
    ap.add_argument("--cap", default="20MB", help="upload and download cap of every node (bytes/s)")
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--piece-size", default="1MiB",
                    help="as many pieces per worker as a 100 GB checkpoint (16 MiB pieces) has on a 100-node fleet")
    ap.add_argument("--compare", default="", help="modes to run side by side: plain,tls,signed,tls+signed")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds, every contender once per round (default 5)")
    ap.add_argument("--max-spread", type=float, default=0.5)
    ap.add_argument("--baseline", default="storm",
                    help="contenders beside the plan: storm (every worker from the origin alone), stock "
                         "(libtorrent's own piece picking: [p2p] plan = false), both (storm,stock) or none")
    ap.add_argument("--storm-max", type=int, default=16, help="largest N for the storm baseline (N copies "
                    "through the origin's cap: slow)")
    ap.add_argument("--trace", action="store_true",
                    help="[p2p] trace on every node: attribute every block (origin bytes outside a slice, duplicates)")
    ap.add_argument("--verbose", action="store_true", help="every run's figures, not only medians")
    ap.add_argument("--racks", type=int, default=0,
                    help="racks emulated on loopback: worker i in rack r{i %% R} ([p2p] rack); reported: "
                         "bytes each rack received from outside it (x checkpoint). Add no-racks to "
                         "--baseline for the plan without racks in the same run")
    ap.add_argument("--choke-other-racks", action=argparse.BooleanOptionalAction, default=None,
                    help="with --racks: [p2p] choke_other_racks on every worker (on: other racks are served only "
                         "through their gateways; the daemon's default, on, when not given)")
    ap.add_argument("--gateways", default="", metavar="K[,K...]",
                    help="with --racks: [p2p] gateways on every worker (the daemon's default, 2, when not given); "
                         "several: each K after the first is a contender of its own (plan-gwK), interleaved")
    ap.add_argument("--crossing", action="store_true",
                    help="with --racks: also a contender with [p2p] crossing on every worker (plan-crossing: every "
                         "worker takes its share across racks in a second session), interleaved")
    ap.add_argument("--origin-queue", default="", metavar="Q[,Q...]",
                    help="also a contender per Q with [p2p] origin_request_queue = Q on the origin (plan-oqQ: "
                         "the blocks one worker may have asked of it at once; 0: libtorrent's 2,000), "
                         "interleaved with the plan as shipped (128)")
    ap.add_argument("--origins", type=int, default=1,
                    help="origins (127.0.0.2, .3, ...), each with its tracker; every worker lists them all")
    ap.add_argument("--kill-origin-at", type=float, default=None, metavar="F",
                    help="with --origins: also run each round with the first origin SIGKILLed once the workers "
                         "hold F (0-1) of the version on average; reported: time with over without the kill")
    ap.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                    help="daemons log at debug level; every daemon's log is copied to DIR when it stops")
    ap.add_argument("--memory-trace", action="store_true",
                    help="record the first worker's resident memory by kind (smaps_rollup) once a second")
    ap.add_argument("--drop-source", action="store_true",
                    help="delete the generated checkpoint once it is published (the origin seeds from its cold "
                         "tier's copy): two copies on --dir's disk instead of three (a checkpoint near its free space)")
    args = ap.parse_args()
    global MEMORY_TRACE, KEEP_LOGS
    MEMORY_TRACE, KEEP_LOGS = args.memory_trace, args.keep_logs
    args.baseline = "storm,stock" if args.baseline == "both" else args.baseline
    if args.rounds is None:
        args.rounds = 5
    if args.origins < 1 or (args.kill_origin_at is not None and not (0 < args.kill_origin_at < 1 and args.origins > 1)):
        ap.error("--origins: at least 1; --kill-origin-at: between 0 and 1, with --origins 2 or more")
    if args.compare and not set(args.compare.split(",")) <= {"plain", "tls", "signed", "tls+signed"}:
        ap.error("--compare: modes are plain, tls, signed, tls+signed")
    if args.compare and args.drop_source:   # (a TLS fleet publishes the source once more)
        ap.error("--drop-source: not with --compare")
    ks = [int(k) for k in args.gateways.split(",") if k.isdigit()] if args.gateways else [0]
    if args.gateways and (len(ks) != len(args.gateways.split(",")) or min(ks) < 1 or len(set(ks)) < len(ks)
                          or not args.racks):
        ap.error("--gateways: distinct whole numbers of at least 1, with --racks")
    if args.crossing and not args.racks:
        ap.error("--crossing: with --racks")
    from weightd.config.p2p import P2PSettings   # (the daemon's default: what the plan contender runs)
    shipped = P2PSettings.model_fields["origin_request_queue"].default
    oqs = [int(q) for q in args.origin_queue.split(",") if q.isascii() and q.isdigit()] if args.origin_queue else []
    if args.origin_queue and (len(oqs) != len(args.origin_queue.split(",")) or len({q or 2000 for q in oqs}) < len(oqs)
                              or any(0 < q < 16 or q > 2000 for q in oqs) or shipped in oqs):
        ap.error(f"--origin-queue: distinct values, 0 or from 16 to 2000 (what [p2p] origin_request_queue takes; "
                 f"0 is 2000), not {shipped} (the daemon's default: the plan contender)")
    if oqs and (args.compare or args.origins > 1 or args.kill_origin_at is not None):
        ap.error("--origin-queue: not with --compare, --origins or --kill-origin-at")
    base = Path(tempfile.mkdtemp(prefix="weightd-bench-swarm-", dir=args.dir))
    try:
        cold = base / "cold"
        if args.compare:
            subprocess.run([sys.executable, "-m", "weightd", "keygen", str(base / "signing")], env=ENV, check=True,
                           capture_output=True)
        src = make_checkpoint(base / "src", total_bytes=parse_size(args.size), shards=4, layers=8, seed="swarm")
        cfg = base / "publish.toml"
        cfg.write_text(f'state_dir = "{base}/pubstate"\n[tiers.cold]\npath = "{cold}"\n'
                       f'[tiers.hot]\npath = "/dev/shm/weightd-bench-pub-{os.getpid()}"\n'
                       f'[tiers.warm]\npath = "{base}/pubwarm"\n[p2p]\nthreshold = "1MiB"\n'
                       f'piece_size = "{args.piece_size}"\n')
        pub = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "--no-daemon", "publish", str(src),
                              "--name", "bench/swarm", "--version", "v1", "--json"]
                             + (["--sign", str(base / "signing.pem")] if args.compare else []),
                             capture_output=True, text=True, env=ENV, check=True)
        size = json.loads(pub.stdout)["bytes"]
        if args.drop_source:
            shutil.rmtree(src)
        WARM["capacity"] = str(max(4 << 30, size + (1 << 30)))
        ns = [int(x) for x in args.n.split(",")]
        if args.compare:
            print(json.dumps(compare(base, cold, src, cfg, args, ns, size), indent=2))
            return 0
        if args.origins > 1 or args.kill_origin_at is not None:
            print(json.dumps(several_origins(base, cold, args, ns, size), indent=2))
            return 0
        # every contender once per round, the order alternating (the VM's noise falls on all of them)
        contenders = [("plan", False, True)] + [("stock", False, False)] * ("stock" in args.baseline) \
            + [("storm", True, True)] * ("storm" in args.baseline) \
            + [("plan-no-racks", False, True)] * bool(args.racks and "no-racks" in args.baseline) \
            + [(f"plan-gw{k}", False, True) for k in ks[1:]] + [("plan-crossing", False, True)] * args.crossing \
            + [(f"plan-oq{q}", False, True) for q in oqs]
        runs: dict[tuple[str, int], list[dict]] = {}

        def one(name: str, storm: bool, plan: bool, n: int) -> float:
            r = run(base, cold, n, args.cap, storm, size, plan=plan, trace=args.trace or bool(args.racks),
                    racks=0 if name in ("storm", "plan-no-racks") else args.racks, choke=args.choke_other_racks,
                    gateways=int(name[7:]) if name.startswith("plan-gw") else ks[0], crossing=name == "plan-crossing",
                    origin_queue=int(name[7:]) if name.startswith("plan-oq") else None)
            runs.setdefault((name, n), []).append(r)
            print(f"n={n} {name}: {r['seconds']} s, origin {r['origin_upload_x']}x, cpu {r['cpu_busy']:.0%}, "
                  f"cross-rack {r['cross_rack']}, plan {r['plan']}", file=sys.stderr, flush=True)
            return r["seconds"]

        m0 = machine_state()
        sec = rounds({f"{name} N={n}": (lambda c=(name, storm, plan, n): one(*c))
                      for n in ns for name, storm, plan in contenders
                      if not (name == "storm" and n > args.storm_max)},
                     args.rounds, widen=args.max_spread, log=lambda m: print(m, file=sys.stderr, flush=True))
        m1 = machine_state()
        out: dict = {"bytes": size, "piece_size": args.piece_size, "cap_bytes_per_s": parse_size(args.cap),
                     "load_avg": os.getloadavg(), "results": []}
        for name, _, _ in dict.fromkeys(contenders):
            t1 = statistics.median(r["seconds"] for r in runs.get((name, ns[0]), [{"seconds": 0}]))
            for n in ns:
                rs = runs.get((name, n))
                if not rs:
                    continue
                t = statistics.median(r["seconds"] for r in rs)
                out["results"].append({
                    "contender": name, "n": n, "seconds": _median_range([r["seconds"] for r in rs]),
                    "t_over_t1": round(t / t1, 2) if t1 else None,
                    "origin_upload_x": _median_range([r["origin_upload_x"] for r in rs]),
                    "cpu_busy": _median_range([r["cpu_busy"] for r in rs]),
                    "worker_peak_rss_mb": max(r["worker_peak_rss_mb"] for r in rs),
                    "from_cold_bytes": sum(r["from_cold_bytes"] for r in rs),
                    "cross_rack_max_x": _median_range([r["cross_rack"]["max_x"] for r in rs])
                    if rs[0].get("cross_rack") else None,
                    "plan": rs[len(rs) // 2]["plan"], "runs": rs if args.verbose else None})
        out["targets"] = {"t_over_t1_up_to_32": 1.3, "origin_upload_x_up_to_32": 1.2, "worker_rss_mb": 200}
        # in the common shape: the plan against each baseline at every N, and the plan's T(N) against its T(1)
        ratios = [speedup(sec, f"plan N={n}", f"{b} N={n}", max_spread=args.max_spread)
                  for n in ns for b in ("storm", "stock", "plan-no-racks") if f"{b} N={n}" in sec]
        ratios += [speedup(sec, f"plan-gw{k} N={n}", f"{b} N={n}", max_spread=args.max_spread)
                   for k in ks[1:] for n in ns for b in ("plan", "plan-no-racks") if f"{b} N={n}" in sec]
        # (crossing sessions: how much faster than the racks as shipped, and their time over no racks')
        ratios += [r for n in ns if f"plan-crossing N={n}" in sec for r in (
            speedup(sec, f"plan-crossing N={n}", f"plan N={n}", max_spread=args.max_spread),
            *([speedup(sec, f"plan-no-racks N={n}", f"plan-crossing N={n}", max_spread=args.max_spread,
                       target_at_most=1.2)] if f"plan-no-racks N={n}" in sec else []))]
        # (the origin's request queue: the shipped plan's time against each other value's)
        ratios += [speedup(sec, f"plan N={n}", f"plan-oq{q} N={n}", max_spread=args.max_spread) for q in oqs for n in ns]
        ratios += [speedup(sec, f"plan N={n}", f"plan N={ns[0]}", max_spread=args.max_spread,
                           target=round(1 / 1.3, 3)) for n in ns[1:]]   # T(1)/T(N) >= 1/1.3
        print(json.dumps(report("swarm", sec, ratios, rounds=args.rounds, max_spread=args.max_spread,
                                machine=(m0, m1), **out), indent=2))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(f"/dev/shm/weightd-bench-pub-{os.getpid()}", ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
