#!/usr/bin/env python3
"""Weight traffic yields the link to serving traffic (issue 37 part 1): a time series, as JSON.

    flock /tmp/heavy.lock .venv/bin/python bench/nic.py [--size 768MiB] [--rate-mbit 200] [--ask 0.7]
                                                        [--phases 8,12,10] [--dir /var/tmp]

Root only (network namespaces, tc). Two namespaces joined by a veth pair whose A -> B side is shaped
with ``tc tbf`` at --rate-mbit (bench/_netns.py); an origin daemon in A seeds a published checkpoint
of --size, a worker daemon in B preloads it (``weightd preload --tier warm``), both with ``[network]
capacity`` = the tbf rate. A serving-like flow (a paced Python socket stream A -> B, the same way as
the weights) asks --ask of the link. Phases, from the moment the transfer runs: (a) the transfer alone,
(b) the flow joins, (c) the flow stops. Every 0.5 s: the link's rate (B's rx bytes), the flow's
(bytes its receiver read) and weightd's (the link's minus the flow's: both counted at B's interface,
so weightd's includes a few percent of TCP/IP headers the flow's payload count does not).

Two runs in one process tree: ``yield`` (``[network]`` on, the defaults: ceiling 0.8, floor 0.05) and
the baseline ``fixed`` (``[network] enabled = false``: only the fixed caps, here none). Figures:

- a_share: weightd's mean rate over phase (a) after its first 2 s / the link rate (target >= 0.85);
- b_flow_over_ask: the flow's mean rate over phase (b) after its first 2 s (the time the rule takes to
  yield) / its ask (target >= 0.90, issue 37's figure; tests/test_network_yield.py bounds its shorter
  run at 0.85); b_flow_over_ask_first_2s: those first 2 s;
- b_weightd_share: weightd's mean share of the link in (b), settled (the floor holds: > 0);
- c_recovery_s: seconds from the flow's stop to the first 0.5 s sample from which weightd runs at
  >= 0.85 of the link for 2 s (target: a few seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._netns import A_IP, B_IP, Daemon, Flow, Link, exit_on_sigterm, publish, sampler, tear_down, usable  # noqa: E402
from tiering import parse_size  # noqa: E402

STEP_S = 0.5


def series(sample: Any, until: float, phase: str, out: list[dict[str, Any]], prev: list[Any]) -> None:
    """Samples every STEP_S into ``out`` until ``until`` (monotonic), each tagged with ``phase``."""
    while time.monotonic() < until:
        time.sleep(max(0.0, prev[0][0] + STEP_S - time.monotonic()))
        now = sample()
        dt = now[0] - prev[0][0]
        link, flow = (now[1] - prev[0][1]) / dt, (now[2] - prev[0][2]) / dt
        out.append({"t": round(now[0] - prev[1], 2), "phase": phase, "link_Bps": round(link),
                    "flow_Bps": round(flow), "weightd_Bps": round(max(0.0, link - flow))})
        prev[0] = now


def wait_transfer(sample: Any, rate: int, timeout: float = 60) -> tuple[float, int, int]:
    """Until the link carries the transfer (over 30% of the link over 0.5 s); the sample then."""
    prev = sample()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(STEP_S)
        now = sample()
        if (now[1] - prev[1]) / (now[0] - prev[0]) > 0.3 * rate:
            return now
        prev = now
    raise RuntimeError("the transfer never started on the link")


def one_run(base: Path, args: argparse.Namespace, network: str, src_size: int) -> dict[str, Any]:
    """One run of the three phases; the time series and the figures."""
    link = Link(args.rate_mbit)
    daemons: list[Daemon] = []
    preload = None
    try:
        cold = base / "cold"
        origin = Daemon(link, base, link.a, A_IP, cold, role="origin", capacity=link.rate_bytes, network=network)
        daemons.append(origin)
        ref = publish(origin, base, src_size)
        worker = Daemon(link, base, link.b, B_IP, cold, role="worker", capacity=link.rate_bytes, network=network)
        daemons.append(worker)
        flow = Flow(link, base)
        sample = sampler(link, flow)
        preload = worker.popen("preload", ref, "--tier", "warm", "--json", "--timeout", "900")
        t0 = wait_transfer(sample, link.rate_bytes)
        out: list[dict[str, Any]] = []
        prev = [t0, t0[0]]
        a, b, c = args.phases
        series(sample, t0[0] + a, "a", out, prev)
        flow.start(args.ask * link.rate_bytes)
        series(sample, t0[0] + a + b, "b", out, prev)
        state_b = worker.network()
        flow.stop_sending()
        series(sample, t0[0] + a + b + c, "c", out, prev)
        done = preload.poll() is not None
        return {"series": out, "figures": figures(out, link.rate_bytes, args.ask, a + b),
                "worker_network_in_b": state_b, "transfer_done_before_c_ended": done,
                "limits_set": {d.dir.name: limit_lines(d) for d in daemons}}
    finally:
        tear_down(preload, daemons, link)


def limit_lines(d: Daemon) -> list[str]:
    """The daemon's log lines saying which limits it set (time and limits)."""
    d.log.flush()
    return [line[11:23] + " " + line.split("limits ", 1)[1].split(" bytes/s")[0]
            for line in (d.dir / "daemon.log").read_text().splitlines() if "network: weightd's limits" in line]


def figures(out: list[dict[str, Any]], rate: int, ask: float, c_start: float) -> dict[str, Any]:
    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.fmean(r[key] for r in rows) if rows else 0.0
    a = [r for r in out if r["phase"] == "a" and r["t"] > 2]
    b_all = [r for r in out if r["phase"] == "b"]
    b0 = b_all[0]["t"] - STEP_S if b_all else 0
    b = [r for r in b_all if r["t"] > b0 + 2]
    first = [r for r in b_all if r["t"] <= b0 + 2]
    c = [r for r in out if r["phase"] == "c"]
    recovery = None
    for i, r in enumerate(c):
        if all(x["weightd_Bps"] >= 0.85 * rate for x in c[i:i + 4]) and len(c[i:i + 4]) == 4:
            recovery = round(r["t"] - c_start, 2)
            break
    return {"a_share": round(mean(a, "weightd_Bps") / rate, 3),
            "b_flow_over_ask": round(mean(b, "flow_Bps") / (ask * rate), 3),
            "b_flow_over_ask_first_2s": round(mean(first, "flow_Bps") / (ask * rate), 3),
            "b_weightd_share": round(mean(b, "weightd_Bps") / rate, 3),
            "c_recovery_s": recovery}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="768MiB")
    ap.add_argument("--rate-mbit", type=int, default=200)
    ap.add_argument("--ask", type=float, default=0.7)
    ap.add_argument("--phases", default="8,12,10", help="seconds of (a),(b),(c)")
    ap.add_argument("--dir", default="/var/tmp")
    args = ap.parse_args(argv)
    args.phases = [float(x) for x in args.phases.split(",")]
    why = usable()
    if why is not None:
        print(json.dumps({"skipped": why}))
        return 0
    exit_on_sigterm()   # (killed by timeout or a CI runner: namespaces, daemons, /dev/shm removed all the same)
    runs = {}
    for name, network in (("yield", ""), ("fixed", "enabled = false\n")):
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="weightd-nic-") as tmp:
            runs[name] = one_run(Path(tmp), args, network, parse_size(args.size))
    summary = {"link_bytes_per_s": args.rate_mbit * 125_000, "ask": args.ask, "size": args.size,
               "phases_s": args.phases, "yield": runs["yield"]["figures"], "fixed": runs["fixed"]["figures"],
               "ratio_flow_over_ask_yield_vs_fixed": _ratio(runs)}
    print(json.dumps({"summary": summary, "runs": runs}))
    print(json.dumps(summary, indent=1), file=sys.stderr)
    return 0


def _ratio(runs: dict[str, Any]) -> float | None:
    f = runs["fixed"]["figures"]["b_flow_over_ask"]
    return round(runs["yield"]["figures"]["b_flow_over_ask"] / f, 3) if f else None


if __name__ == "__main__":
    sys.exit(main())
