#!/usr/bin/env python3
"""Where a swarm round's time goes, worker by worker, from the daemons' debug logs: what each worker
took in and from whom (other racks, its own rack, the origins) while it was taking its share across
(a gateway) or downloading (the others), and how busy the senders it took from were meanwhile.

    .venv/bin/python bench/swarm.py --n 16 --size 64MiB --cap 10MB --piece-size 256KiB --racks 4 \\
        --baseline none --rounds 1 --keep-logs /tmp/logs
    .venv/bin/python bench/swarm_peers.py /tmp/logs --cap 10MB

It reads the line every daemon logs once a second at debug level during a download
(``p2p.transfer.peer_rates``: its rates, and per connected peer the kB/s from it and to it, the blocks
asked of it and not yet in, and whether it chokes this node), the gateway and "share is in" lines
and the preload's seconds. A worker's address is in its log's name (``worker-IP-*.log``, as
``--keep-logs`` names them); its rack is in its own lines. Peers without a worker log of their own
(the origins) count as ``origin``. Prints JSON: per worker, then medians over the gateways and over
the other workers. One round's logs: run it once per round kept.

The question it answers is issue 38's first: "why does a gateway take in only ~35% of its cap while
senders idle" (docs/p2p.md, racks: the answer measured with it)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import positive_size_arg  # noqa: E402

RATES = re.compile(r"^(\S+) DEBUG p2p\.transfer: p2p: .+? t=([\d.]+) rack=(\S+) rates down=(\d+) up=(\d+) "
                   r"have=(\d+)(.*)$")
PEER = re.compile(r"(\d+\.\d+\.\d+\.\d+):(\d+)/(\d+)/(\d+)(/choked)?")
PLAN = re.compile(r"^(\S+) DEBUG p2p\.transfer: p2p: .+? t=[\d.]+ workers=\d+ .* crossing=(\d+) ")
GATEWAY = re.compile(r"^(\S+) INFO p2p\.transfer: p2p: .+: this node is rack \S+'s gateway")
SHARE_IN = re.compile(r"^(\S+) INFO p2p\.transfer: p2p: .+: this gateway's share is in")
DONE = re.compile(r"^(\S+) INFO weightd\.node\.service: preloaded .* seconds=([\d.]+)")
NAME = re.compile(r"^worker-(\d+\.\d+\.\d+\.\d+)-")


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def parse_log(path: Path) -> dict:
    """One daemon's log: its samples (wall time, t since its download began, rates, per-peer), rack,
    and when it became a gateway, had its share in, and finished."""
    out: dict = {"samples": [], "crossing": [], "rack": None, "gateway": False, "share_in": None, "done_s": None}
    with path.open(errors="replace") as f:
        for line in f:
            if m := RATES.match(line):
                peers = {p[0]: {"down": int(p[1]), "up": int(p[2]), "queued": int(p[3]), "choked": bool(p[4])}
                         for p in PEER.findall(m.group(7))}
                out["rack"] = m.group(3)
                out["samples"].append({"wall": _ts(m.group(1)), "t": float(m.group(2)), "down": int(m.group(4)),
                                       "up": int(m.group(5)), "have": int(m.group(6)), "peers": peers})
            elif m := PLAN.match(line):
                out["crossing"].append((_ts(m.group(1)), int(m.group(2))))
            elif GATEWAY.match(line):
                out["gateway"] = True
            elif m := SHARE_IN.match(line):
                out["share_in"] = out["share_in"] or _ts(m.group(1))
            elif m := DONE.match(line):
                out["done_s"] = float(m.group(2))
    return out


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def _upload_at(log: dict | None, wall: float) -> int | None:
    """A sender's own total upload (kB/s) at its sample nearest ``wall`` (within 1.5 s)."""
    if not log or not log["samples"]:
        return None
    s = min(log["samples"], key=lambda x: abs(x["wall"] - wall))
    return s["up"] if abs(s["wall"] - wall) <= 1.5 else None


def summarize_worker(ip: str, logs: dict[str, dict], cap_kb: float | None) -> dict | None:
    """One worker: its intake by where it came from, while it took its share across (a gateway:
    from its first bytes to its share in) or downloaded (the others: first bytes to the last sample)."""
    me = logs[ip]
    samples = me["samples"]
    first = next((s for s in samples if s["down"] > 0), None)
    if first is None:
        return None
    end = me["share_in"] if me["gateway"] and me["share_in"] else samples[-1]["wall"]
    window = [s for s in samples if first["wall"] <= s["wall"] <= end]
    rack_of = {w: lg["rack"] for w, lg in logs.items()}
    down, outside, inside, origin, senders_up, queued, choked = [], [], [], [], [], [], []
    backlog = [c for w, c in me["crossing"] if first["wall"] <= w <= end]
    for s in window:
        down.append(s["down"])
        by = {"outside": 0, "rack": 0, "origin": 0}
        for peer, p in s["peers"].items():
            where = "origin" if peer not in rack_of else "rack" if rack_of[peer] == me["rack"] else "outside"
            by[where] += p["down"]
            if where == "outside":
                choked.append(p["choked"])
                if p["down"] > 0 and (u := _upload_at(logs.get(peer), s["wall"])) is not None:
                    senders_up.append(u)
        queued.append(sum(p["queued"] for peer, p in s["peers"].items()
                          if peer in rack_of and rack_of[peer] != me["rack"]))
        outside.append(by["outside"])
        inside.append(by["rack"])
        origin.append(by["origin"])
    row = {"ip": ip, "rack": me["rack"], "gateway": me["gateway"], "first_bytes_t": first["t"],
           "share_in_t": round(first["t"] + me["share_in"] - first["wall"], 1) if me["share_in"] else None,
           "done_s": me["done_s"], "samples": len(window),
           "down_kBps": _median(down), "from_other_racks_kBps": _median(outside),
           "from_own_rack_kBps": _median(inside), "from_origins_kBps": _median(origin),
           "outside_senders_upload_kBps": _median(senders_up),
           "outside_blocks_queued": _median(queued),
           "crossing_backlog_pieces": _median(backlog) if me["gateway"] else None,
           "outside_choked_share": round(sum(choked) / len(choked), 2) if choked else None}
    if cap_kb:
        row["down_of_cap"] = round(row["down_kBps"] / cap_kb, 2)
        if row["outside_senders_upload_kBps"] is not None:
            row["outside_senders_upload_of_cap"] = round(row["outside_senders_upload_kBps"] / cap_kb, 2)
    return row


def summarize(logs: dict[str, dict], cap_kb: float | None) -> dict:
    rows = [r for ip in sorted(logs, key=lambda x: tuple(map(int, x.split("."))))
            if (r := summarize_worker(ip, logs, cap_kb)) is not None]
    keys = ("down_kBps", "from_other_racks_kBps", "outside_blocks_queued", "crossing_backlog_pieces", "from_own_rack_kBps", "from_origins_kBps",
            "outside_senders_upload_kBps", "down_of_cap", "outside_senders_upload_of_cap", "done_s")
    groups = {}
    for name, pick in (("gateways", True), ("others", False)):
        g = [r for r in rows if r["gateway"] == pick]
        groups[name] = {"workers": len(g), **{k: _median([r[k] for r in g if r.get(k) is not None])
                                              for k in keys}}
    return {"benchmark": "swarm-peers", "cap_kBps": cap_kb, "medians": groups, "workers": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", type=Path, help="a directory of daemon logs (bench/swarm.py --keep-logs DIR)")
    ap.add_argument("--cap", type=positive_size_arg, default=None,
                    help="the round's per-node cap in bytes/s, as bench/swarm.py's --cap (10MB): shares of it too")
    args = ap.parse_args()
    if not args.logs.is_dir():
        print(f"swarm_peers: {args.logs}: no such directory", file=sys.stderr)
        return 2
    named = [(m.group(1), p) for p in sorted(args.logs.glob("worker-*.log")) if (m := NAME.match(p.name))]
    twice = sorted({ip for ip, _ in named if sum(ip == x for x, _ in named) > 1})
    if twice:
        print(f"swarm_peers: {args.logs}: logs of more than one round ({twice[0]} has "
              f"{sum(ip == twice[0] for ip, _ in named)}): keep one round's logs a directory "
              "(bench/swarm.py --rounds 1 --keep-logs DIR)", file=sys.stderr)
        return 2
    logs = {ip: parse_log(p) for ip, p in named}
    if not any(lg["samples"] for lg in logs.values()):
        print(f"swarm_peers: {args.logs}: no worker log with per-peer rates (the daemons log them at debug "
              "level: bench/swarm.py --keep-logs)", file=sys.stderr)
        return 2
    print(json.dumps(summarize(logs, args.cap / 1000 if args.cap else None), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
