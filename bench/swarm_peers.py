#!/usr/bin/env python3
"""Where a swarm round's time goes, worker by worker, from the daemons' debug logs: what each worker
took in and from whom (other racks, its own rack, the origins) while it was taking its share across
(a gateway) or downloading (the others), and how busy the senders it took from were meanwhile.

    .venv/bin/python bench/swarm.py --n 16 --size 64MiB --cap 10MB --piece-size 256KiB --racks 4 \\
        --baseline none --rounds 1 --keep-logs /tmp/logs
    .venv/bin/python bench/swarm_peers.py /tmp/logs --cap 10MB

It reads the lines every daemon logs once a second at debug level during a download with the piece
plan on (``p2p.transfer.peer_rates``: its rates, and per connected peer the kB/s from it and to it,
the blocks asked of it and not yet in, and whether it chokes this node; split over ``rates+`` lines
to fit a record), the gateway and "share is in" lines and the preload's seconds, in the text or the
JSON log format. A daemon's address is in its log's name (``worker-IP-*.log``, ``origin-IP-*.log``,
as ``--keep-logs`` names them); a worker's rack is in its own lines. Peers with no log here count
as ``unknown``. Prints JSON: per worker, then medians over the gateways and over the other workers.
One round's logs a directory; a line it cannot read is named (exit 2).

The question it answers is issue 38's first: "why does a gateway take in only ~35% of its cap while
senders idle" (docs/p2p.md, racks: the answer measured with it)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import positive_size_arg  # noqa: E402

from p2p.members import is_ip  # noqa: E402

RATES = re.compile(r"^(\S+) DEBUG p2p\.transfer: p2p: (.+?) t=(\d+(?:\.\d+)?) rack=(\S+) rates down=(\d+) up=(\d+) "
                   r"have=(\d+)(.*)$")
MORE = re.compile(r"^\S+ DEBUG p2p\.transfer: p2p: .+? t=(\d+(?:\.\d+)?) rack=\S+ rates\+ (.*)$")
PEER = re.compile(r"(\S+):(\d+)/(\d+)/(\d+)(/choked)?$")
PLAN = re.compile(r"^(\S+) DEBUG p2p\.transfer: p2p: .+? t=[\d.]+ workers=\d+ .* crossing=(\d+) ")
GATEWAY = re.compile(r"^(\S+) INFO p2p\.transfer: p2p: .+: this node is rack \S+'s gateway")
SHARE_IN = re.compile(r"^(\S+) INFO p2p\.transfer: p2p: .+: this gateway's share is in")
DONE = re.compile(r"^(\S+) INFO weightd\.node\.service: preloaded .* seconds=([\d.]+)")
NAME = re.compile(r"^(worker|origin)-([0-9a-fA-F.:]+)-[^/]*\.log$")


class BadLog(ValueError):
    """A log this reader cannot take (its message names the file and the line)."""


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _text(line: str) -> str:
    """A line as the text format writes it; a JSON-format line (``--log-format json``) made into one."""
    if not line.startswith("{"):
        return line
    obj = json.loads(line)
    return f"{obj['ts']} {str(obj['level']).upper()} {obj['logger']}: {obj['msg']}"


def _peers(text: str, out: dict) -> int:
    """The ``ip:down/up/queued[/choked]`` entries of ``text`` into ``out``; returns 1 if the line was cut
    (a record keeps 512 characters of an argument: its last entry is then dropped), else 0."""
    cut = text.rstrip().endswith("more characters]")
    entries = text.split()
    if cut:
        entries = entries[:-2]   # ("...[N more characters]" is two words, the cut entry before it)
    for e in entries:
        if m := PEER.match(e):
            x = out.setdefault(m.group(1), {"down": 0, "up": 0, "queued": 0, "choked": True})
            x["down"] += int(m.group(2))
            x["up"] += int(m.group(3))
            x["queued"] += int(m.group(4))
            x["choked"] &= bool(m.group(5))
    return int(cut)


def parse_log(path: Path) -> dict:
    """One daemon's log: its samples (wall time, t since its download began, rates, per-peer), rack,
    and when it became a gateway, had its share in, and finished. A line it cannot read: BadLog."""
    out: dict = {"samples": [], "crossing": [], "rack": None, "gateway": False, "share_in": None,
                 "done_s": None, "cut_lines": 0, "torrents": set()}
    with path.open(errors="replace") as f:
        for n, raw in enumerate(f, 1):
            try:
                _line(_text(raw), out)
            except (ValueError, KeyError, TypeError) as exc:
                raise BadLog(f"{path}:{n}: cannot read this line ({type(exc).__name__}: {exc})") from None
    return out


def _line(line: str, out: dict) -> None:
    if m := RATES.match(line):
        peers: dict = {}
        out["cut_lines"] += _peers(m.group(8), peers)
        out["torrents"].add(m.group(2))
        out["rack"] = m.group(4)
        out["samples"].append({"wall": _ts(m.group(1)), "t": float(m.group(3)), "down": int(m.group(5)),
                               "up": int(m.group(6)), "have": int(m.group(7)), "peers": peers})
    elif m := MORE.match(line):
        if out["samples"] and out["samples"][-1]["t"] == float(m.group(1)):
            out["cut_lines"] += _peers(m.group(2), out["samples"][-1]["peers"])
        else:   # (its first part is not the line before: its peers are lost, and counted so)
            out["cut_lines"] += 1
    elif m := PLAN.match(line):
        out["crossing"].append((_ts(m.group(1)), int(m.group(2))))
    elif GATEWAY.match(line):
        out["gateway"] = True
    elif m := SHARE_IN.match(line):
        out["share_in"] = out["share_in"] or _ts(m.group(1))
    elif m := DONE.match(line):
        out["done_s"] = float(m.group(2))


def _median(xs: list[float], digits: int = 1) -> float | None:
    return round(statistics.median(xs), digits) if xs else None


def _upload_at(log: dict | None, wall: float) -> int | None:
    """A sender's own total upload (kB/s) at its sample nearest ``wall`` (within 1.5 s)."""
    if not log or not log["samples"]:
        return None
    s = min(log["samples"], key=lambda x: abs(x["wall"] - wall))
    return s["up"] if abs(s["wall"] - wall) <= 1.5 else None


def summarize_worker(ip: str, logs: dict[str, dict], origins: set[str], cap_kb: float | None) -> dict | None:
    """One worker: its intake by where it came from (other racks, its own rack, the origins, peers with
    no log here), while it took its share across (a gateway: from its first bytes to its share in) or
    downloaded (the others: first bytes to the last sample)."""
    me = logs[ip]
    samples = me["samples"]
    first = next((s for s in samples if s["down"] > 0), None)
    if first is None:
        return None
    end = me["share_in"] if me["gateway"] and me["share_in"] else samples[-1]["wall"]
    window = [s for s in samples if first["wall"] <= s["wall"] <= end]
    rack_of = {w: lg["rack"] for w, lg in logs.items() if lg["rack"] is not None}
    cols: dict[str, list[float]] = {k: [] for k in ("down", "outside", "rack", "origin", "unknown", "queued")}
    senders_up, choked = [], []
    for s in window:
        cols["down"].append(s["down"])
        by = dict.fromkeys(("outside", "rack", "origin", "unknown", "queued"), 0)
        for peer, p in s["peers"].items():
            where = ("origin" if peer in origins else "unknown" if peer not in rack_of
                     else "rack" if rack_of[peer] == me["rack"] else "outside")
            by[where] += p["down"]
            if where == "outside":
                by["queued"] += p["queued"]
                choked.append(p["choked"])
                if p["down"] > 0 and (u := _upload_at(logs.get(peer), s["wall"])) is not None:
                    senders_up.append(u)
        for k, v in by.items():
            cols[k].append(v)
    backlog = [c for w, c in me["crossing"] if first["wall"] <= w <= end]
    row = {"ip": ip, "rack": me["rack"], "gateway": me["gateway"], "first_bytes_t": first["t"],
           "share_in_t": round(first["t"] + me["share_in"] - first["wall"], 1) if me["share_in"] else None,
           "done_s": me["done_s"], "samples": len(window), "cut_lines": me["cut_lines"],
           "down_kBps": _median(cols["down"]), "from_other_racks_kBps": _median(cols["outside"]),
           "from_own_rack_kBps": _median(cols["rack"]), "from_origins_kBps": _median(cols["origin"]),
           "from_unknown_kBps": _median(cols["unknown"]),
           "outside_senders_upload_kBps": _median(senders_up),
           "outside_blocks_queued": _median(cols["queued"]),
           "crossing_backlog_pieces": _median(backlog) if me["gateway"] else None,
           "outside_choked_share": round(sum(choked) / len(choked), 2) if choked else None}
    if cap_kb:
        for key, of in (("down_of_cap", "down_kBps"), ("outside_senders_upload_of_cap", "outside_senders_upload_kBps")):
            row[key] = round(row[of] / cap_kb, 3) if row[of] is not None else None
    return row


KEYS = ("down_kBps", "down_of_cap", "from_other_racks_kBps", "from_own_rack_kBps", "from_origins_kBps",
        "from_unknown_kBps", "outside_blocks_queued", "crossing_backlog_pieces", "outside_senders_upload_kBps",
        "outside_senders_upload_of_cap", "done_s")


def summarize(logs: dict[str, dict], origins: set[str], cap_kb: float | None) -> dict:
    rows = [r for ip in sorted(logs, key=lambda x: ipaddress.get_mixed_type_key(ipaddress.ip_address(x)))
            if (r := summarize_worker(ip, logs, origins, cap_kb)) is not None]
    groups = {}
    for name, pick in (("gateways", True), ("others", False)):
        g = [r for r in rows if r["gateway"] == pick]
        groups[name] = {"workers": len(g), **{k: _median([r[k] for r in g if r.get(k) is not None],
                                                         3 if k.endswith("_of_cap") else 1) for k in KEYS}}
    return {"benchmark": "swarm-peers", "cap_kBps": cap_kb, "medians": groups, "workers": rows,
            "cut_lines": sum(r["cut_lines"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", type=Path, help="a directory of daemon logs (bench/swarm.py --keep-logs DIR)")
    ap.add_argument("--cap", type=positive_size_arg, default=None,
                    help="the round's per-node cap in bytes/s, as bench/swarm.py's --cap (10MB): shares of it too")
    args = ap.parse_args()
    if not args.logs.is_dir():
        print(f"swarm_peers: {args.logs}: no such directory", file=sys.stderr)
        return 2
    try:
        named = [(m.group(1), m.group(2), p) for p in sorted(args.logs.iterdir())
                 if (m := NAME.match(p.name)) and p.is_file() and is_ip(m.group(2))]
        workers = [(ip, p) for kind, ip, p in named if kind == "worker"]
        twice = sorted({ip for ip, _ in workers if sum(ip == x for x, _ in workers) > 1})
        if twice:
            raise BadLog(f"{args.logs}: logs of more than one round ({twice[0]} has "
                         f"{sum(ip == twice[0] for ip, _ in workers)}): keep one round's logs a directory "
                         "(bench/swarm.py with one --n, --baseline none, --rounds 1 --keep-logs DIR)")
        logs = {ip: parse_log(p) for ip, p in workers}
        for ip, lg in logs.items():
            if len(lg["torrents"]) > 1:
                raise BadLog(f"{args.logs}: {ip}'s log has the downloads of {len(lg['torrents'])} torrents "
                             f"({', '.join(sorted(lg['torrents']))}): one download a log, as a bench/swarm.py round")
    except (BadLog, OSError) as exc:
        print(f"swarm_peers: {exc}", file=sys.stderr)
        return 2
    if not any(lg["samples"] for lg in logs.values()):
        print(f"swarm_peers: {args.logs}: no worker log with per-peer rates (the daemons log them at debug "
              "level with the piece plan on: bench/swarm.py --keep-logs)", file=sys.stderr)
        return 2
    origins = {ip for kind, ip, _ in named if kind == "origin"}
    try:
        print(json.dumps(summarize(logs, origins, args.cap / 1000 if args.cap else None), indent=2), flush=True)
    except BrokenPipeError:   # (piped into head: the rest is not wanted)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
