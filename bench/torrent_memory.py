#!/usr/bin/env python3
"""libtorrent's memory in checkpoint size, and whether one torrent per shard bounds it (issue #38).

    .venv/bin/python bench/torrent_memory.py [--size 8GiB] [--shards 8] [--piece-size 16MiB] [--rounds 5]
                                             [--dir /var/tmp]

A checkpoint of ``--shards`` files is seeded by one process and downloaded, once per contender and
round, by a fresh process (libtorrent sessions on 127.0.0.61 and .62 with the daemon's settings pack
and its posix disk back-end, no rate cap, BitTorrent v2 torrents as the daemon makes them):

- ``one``: the checkpoint as one torrent of all its files (what the daemon does);
- ``per-shard``: one torrent per shard, one after another, each removed once it is in (a torrent
  loaded only while it transfers);
- ``per-shard-all``: one torrent per shard, all at once.

Reported per contender: the downloader's peak anonymous memory (``RssAnon`` of ``/proc/self/status``,
every 50 ms; file pages are the page cache's, reclaimable) and its growth over the idle session, in
MB; beside them (``downloads``) the idle figure and each round's time until every shard is in. The ratios: how many times smaller the peak growth is with a
torrent per shard than with one torrent. The swarm-time cost of per-shard torrents is not measured
here (one seed, one downloader): in a swarm each shard's torrent would have its own start and tail.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import machine_state, positive_size_arg, report, rounds, speedup  # noqa: E402

SEED_IP, FETCH_IP = "127.0.0.61", "127.0.0.62"
CONTENDERS = ("one", "per-shard", "per-shard-all")


def _session(ip: str):
    import libtorrent as lt

    from p2p.config import P2PConfig
    from p2p.settings import session_settings
    params = lt.session_params()
    settings = session_settings(P2PConfig(), ip, 0)
    settings["alert_mask"] = 0
    params.settings = settings
    params.disk_io_constructor = "posix_disk_io_constructor"
    return lt.session(params)


def _anon_kb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def make_data(root: Path, size: int, shards: int) -> list[Path]:
    """``shards`` files of ``size / shards`` bytes under ``root/ckpt`` (every 1 MiB block distinct)."""
    out = []
    block = bytearray(os.urandom(1 << 20))
    per = size // shards
    for i in range(shards):
        p = root / "ckpt" / f"shard-{i:05d}.safetensors"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as fh:
            left, n = per, 0
            while left > 0:
                block[:16] = f"{i:07d}/{n:08d}".encode()
                fh.write(block[:min(left, len(block))])
                left -= len(block)
                n += 1
        out.append(p)
    return out


def make_torrents(root: Path, files: list[Path], piece_size: int) -> dict[str, list[bytes]]:
    """The checkpoint as one v2 torrent, and as one v2 torrent per shard (bencoded)."""
    import libtorrent as lt

    def build(path: Path) -> bytes:
        with warnings.catch_warnings():   # (the 2.0 binding's file_storage API: what it offers)
            warnings.simplefilter("ignore", DeprecationWarning)
            fs = lt.file_storage()
            lt.add_files(fs, str(path))
            ct = lt.create_torrent(fs, piece_size, flags=lt.create_torrent.v2_only)
        lt.set_piece_hashes(ct, str(path.parent))
        return lt.bencode(ct.generate())
    return {"one": [build(root / "ckpt")], "per-shard": [build(f) for f in files]}


def seed(root: Path, torrents: Path) -> None:
    """Seed every torrent in ``torrents`` (JSON: name -> list of hex-encoded torrents) until stdin closes."""
    import libtorrent as lt
    ses = _session(SEED_IP)
    spec = json.loads(torrents.read_text())
    for kind, items in spec.items():
        for data in items:
            atp = lt.add_torrent_params()
            atp.ti = lt.torrent_info(bytes.fromhex(data))
            atp.save_path = str(root if kind == "one" else root / "ckpt")
            atp.flags |= lt.torrent_flags.seed_mode
            ses.add_torrent(atp)
    print(ses.listen_port(), flush=True)
    sys.stdin.read()


def fetch(mode: str, port: int, torrents: Path, dest: Path) -> None:
    """Download as ``mode`` says; print {"idle_kb", "peak_kb", "seconds"}."""
    import libtorrent as lt
    spec = json.loads(torrents.read_text())
    ses = _session(FETCH_IP)
    idle = _anon_kb()
    peak = [idle]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _anon_kb())
            time.sleep(0.05)
    threading.Thread(target=sample, daemon=True).start()
    items = spec["one"] if mode == "one" else spec["per-shard"]
    groups = [items] if mode in ("one", "per-shard-all") else [[t] for t in items]
    t0 = time.monotonic()
    for group in groups:
        handles = []
        for data in group:
            atp = lt.add_torrent_params()
            atp.ti = lt.torrent_info(bytes.fromhex(data))
            atp.save_path = str(dest)
            h = ses.add_torrent(atp)
            h.connect_peer((SEED_IP, port))
            handles.append(h)
        deadline = time.monotonic() + 1800
        while not all(h.status().is_seeding for h in handles):
            if time.monotonic() > deadline:
                raise SystemExit(f"torrent_memory: {mode}: not in after 1800 s")
            for h in handles:
                if not h.status().num_peers:
                    h.connect_peer((SEED_IP, port))
            time.sleep(0.05)
        if mode == "per-shard":
            for h in handles:
                ses.remove_torrent(h)
    took = time.monotonic() - t0
    time.sleep(0.2)
    stop.set()
    print(json.dumps({"idle_kb": idle, "peak_kb": peak[0], "seconds": took}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=positive_size_arg, default=positive_size_arg("8GiB"))
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--piece-size", type=positive_size_arg, default=positive_size_arg("16MiB"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--role", choices=("seed", "fetch"), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=CONTENDERS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shards < 1 or args.rounds < 1:
        ap.error("--shards and --rounds: at least 1")
    if args.role == "seed":
        seed(Path(args.root), Path(args.root) / "torrents.json")
        return 0
    if args.role == "fetch":
        fetch(args.mode, args.port, Path(args.root) / "torrents.json", Path(args.root) / "dest")
        return 0
    piece = args.piece_size
    if piece < 16 << 10 or piece & (piece - 1):
        ap.error(f"--piece-size: a power of two of at least 16 KiB, got {piece}")
    if args.size // args.shards < piece:
        ap.error(f"--size {args.size} over {args.shards} shards leaves under one piece ({piece} bytes) a shard")

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        work = Path(tempfile.mkdtemp(prefix="weightd-bench-tmem-", dir=args.dir))
    except OSError as exc:
        print(json.dumps({"benchmark": "torrent_memory", "error": f"--dir {args.dir}: {exc.strerror or exc}"}))
        return 2
    seeders: list[subprocess.Popen] = []
    try:
        return _run(args, work, seeders)
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
        # (a full disk, a seeder gone, libtorrent refusing, a signal: one line, and the work directory goes)
        print(json.dumps({"benchmark": "torrent_memory", "error": f"{type(exc).__name__}: {exc}"}))
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        try:
            for seeder in seeders:
                seeder.stdin.close()
                try:
                    seeder.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    seeder.kill()
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path, seeders: list) -> int:
    """Make the checkpoint and its torrents under ``work``, seed them, run the rounds, print the JSON
    (``work`` needs twice ``--size`` free: the checkpoint and one download of it)."""
    files = make_data(work, args.size, args.shards)
    built = make_torrents(work, files, args.piece_size)
    (work / "torrents.json").write_text(json.dumps({k: [t.hex() for t in v] for k, v in built.items()}))
    me = [sys.executable, str(Path(__file__).resolve())]
    seeder = subprocess.Popen([*me, "--role", "seed", "--root", str(work)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    seeders.append(seeder)
    ready = select.select([seeder.stdout], [], [], 120)[0]
    line = seeder.stdout.readline() if ready else ""
    if not line.strip().isdigit():
        raise RuntimeError("the seeder did not start (no port in 120 s)")
    port = int(line)
    got: dict[str, dict] = {}

    def contender(mode: str):
        def run() -> dict[str, float]:
            shutil.rmtree(work / "dest", ignore_errors=True)
            out = subprocess.run([*me, "--role", "fetch", "--mode", mode, "--port", str(port),
                                  "--root", str(work)], capture_output=True, text=True, timeout=2400)
            if out.returncode != 0:
                raise RuntimeError(f"{mode}: {(out.stderr.strip().splitlines() or ['exit %d' % out.returncode])[-1]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            got.setdefault(mode, {"idle_mb": [], "seconds": []})
            got[mode]["idle_mb"].append(round(r["idle_kb"] / 1024, 1))
            got[mode]["seconds"].append(round(r["seconds"], 2))
            return {f"{mode} growth": (r["peak_kb"] - r["idle_kb"]) / 1024, f"{mode} peak": r["peak_kb"] / 1024}
        return run
    m0 = machine_state()
    times = rounds({m: contender(m) for m in CONTENDERS}, args.rounds,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    m1 = machine_state()
    ratios = [speedup(times, f"{m} growth", "one growth") for m in CONTENDERS[1:]]
    print(json.dumps(report("torrent_memory", times, ratios, rounds=args.rounds, max_spread=0.5,
                            machine=(m0, m1), unit="MB", bytes=args.size // args.shards * args.shards,
                            shards=args.shards, piece_size=args.piece_size, downloads=got), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
