"""Node diagnosis commands: ``doctor`` and ``bench disk``, and how their results read as text."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tiering import format_bytes, format_rate

from ..errors import EXIT_CRITICAL, UsageError
from . import output
from .app import AppContext, cli
from .output import echo, printable


def _doctor_tiers(app: AppContext):
    from ..doctor import Tier
    from ..node.local import tier_specs
    out = []
    for name, spec in tier_specs(app.config).items():
        try:
            cap = spec.capacity()
        except OSError:
            cap = None
        out.append(Tier(name, str(spec.path), cap))
    cold = app.config.settings.tiers.cold
    if cold.path is not None:  # (an object-store cold tier has no mount to inspect)
        out.append(Tier("cold", str(cold.path), None))
    return out


def _largest_local(tiers) -> int:
    """The largest checkpoint in the hot and warm tiers (else hot's capacity), for ``--lock``."""
    from tiering import TieringError, list_versions, open_tier_root
    sizes = []
    for t in tiers[:2]:
        try:
            root = open_tier_root(Path(t.path), create=False)  # checked, by descriptor
        except TieringError:
            continue
        if root is not None:
            with root:
                sizes += [v.size for v in list_versions(root)]
    return max(sizes, default=0) or (tiers[0].capacity or 0)


def _daemon_history(app: AppContext, sample_s: float):
    if app.no_daemon:
        return None
    from ..errors import DaemonError, SocketDenied
    client = app.daemon_client()
    try:
        if not client.available():
            return None
    except SocketDenied:  # (the doctor works without the daemon's history)
        return None
    try:
        return client.call("GET", f"pressure?window={max(sample_s, 30.0)}", timeout=10)
    except (DaemonError, OSError):
        return None


def _node_facts(app: AppContext, verify: bool) -> dict:
    """weightd itself: the daemon (unless --no-daemon), tier fill, recent fallbacks, cold access, spot checks."""
    from ..doctor.node import gather_node
    from ..node.local import tier_specs
    opened: list = []

    def in_process():
        from ..node.local import open_service
        from ..tally import Tally
        svc = open_service(app.config, Tally(), reconcile=False)  # read-only: nothing is created or removed
        opened.append(svc)
        return svc
    try:
        return gather_node(client=None if app.no_daemon else app.daemon_client(),
                           socket_path=app.config.settings.api.socket, in_process=in_process,
                           tier_paths={n: s.path for n, s in tier_specs(app.config).items()}, verify=verify)
    finally:
        for svc in opened:
            svc.node.close()


def _live_inputs(app: AppContext, sample_s: float, symptom: str | None, lock: bool, log_dir: str, no_probe: bool,
                 verify: bool = True):
    from ..doctor import gather_live
    tiers = _doctor_tiers(app)
    history = _daemon_history(app, sample_s)
    probe = None
    if not no_probe:
        from ..node.diskbench import probe as disk_probe
        probe = disk_probe(Path(tiers[1].path), app.config.settings.state_dir)
        if probe is not None:
            probe["tier"] = "warm"
    inputs = gather_live(tiers, sample_s, history=history, log_dir=log_dir,
                         lock_wanted=_largest_local(tiers) if lock else 0, probe=probe, symptom=symptom)
    source = (f"the daemon's history ({inputs.window_s:.0f} s)" if history else
              f"{inputs.window_s:.1f} s of sampling")
    inputs.node = _node_facts(app, verify)
    return inputs, source


@cli.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema in docs/doctor.md).")
@click.option("--sample-s", type=click.FloatRange(0.1, 600), default=3.0, show_default=True,
              help="How long to sample the node's counters (a running daemon's history is used instead).")
@click.option("--symptom", metavar="TEXT", help="What the operator sees (e.g. 'high TTFT'): with neither the disk "
              "nor the NIC saturated, the verdict points at the GPU side.")
@click.option("--lock", "lock", is_flag=True, help="Check RLIMIT_MEMLOCK for `weightd warm --lock` of the largest "
              "local checkpoint.")
@click.option("--log-dir", default="/var/log", show_default=True, help="Where the node's logs are written.")
@click.option("--no-probe", is_flag=True, help="Skip the 4 KiB O_DIRECT random-read probe of the warm tier.")
@click.option("--no-verify", is_flag=True, help="Skip the spot check of local copies (random parts re-hashed, "
              "256 MiB at most).")
@click.option("--snapshot", metavar="DIR", type=click.Path(file_okay=False),
              help="Diagnose a recorded snapshot (DIR/t0, DIR/t1, DIR/static, DIR/meta.json) instead of this node.")
@click.pass_obj
def doctor_cmd(app: AppContext, as_json: bool, sample_s: float, symptom: str | None, lock: bool, log_dir: str,
               no_probe: bool, no_verify: bool, snapshot: str | None) -> None:
    """Why is model loading slow? A decision tree over disk, network and GPU, with evidence, and weightd's
    own health: the daemon, tier fill, recent fallbacks, cold access, spot checks (exit 7: critical)."""
    from ..doctor import diagnose, gather_snapshot
    if snapshot is not None:
        if not (Path(snapshot) / "t0").is_dir() or not (Path(snapshot) / "t1").is_dir():
            raise UsageError(f"--snapshot {snapshot}: expected t0/ and t1/ directories of /proc files")
        inputs = gather_snapshot(Path(snapshot), [], log_dir=log_dir, symptom=symptom)
        source = f"snapshot {snapshot}"
    else:
        inputs, source = _live_inputs(app, sample_s, symptom, lock, log_dir, no_probe, not no_verify)
    report = diagnose(inputs)
    doc = {**report.to_dict(), "source": source, "window_s": round(inputs.window_s, 3)}
    output.emit_json("doctor", doc) if as_json else _show_doctor(report, doc, source)
    if report.critical:
        sys.exit(EXIT_CRITICAL)


@cli.group("bench")
def bench_group() -> None:
    """Measure this node."""


@bench_group.command("disk")
@click.argument("path", required=False, type=click.Path())
@click.option("--size", default="256MiB", show_default=True, help="Size of the test file made in a directory.")
@click.option("--seconds", type=click.FloatRange(0.2, 120), default=3.0, show_default=True,
              help="Duration of each random-read test.")
@click.option("--depths", default="1,4,16", show_default=True, help="Queue depths (concurrent readers).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-record", is_flag=True, help="Do not store the result as the device's baseline.")
@click.pass_obj
def bench_disk_cmd(app: AppContext, path: str | None, size: str, seconds: float, depths: str, as_json: bool,
                   no_record: bool) -> None:
    """4 KiB O_DIRECT random-read latency and 16 MiB sequential throughput of PATH's device (default:
    the warm tier); recorded as the baseline `weightd doctor` compares against."""
    from tiering import parse_size

    from ..node.diskbench import bench_disk, save_baseline
    try:
        nbytes = parse_size(size)
        qd = tuple(int(x) for x in depths.split(","))
    except ValueError as exc:
        raise UsageError(f"--size/--depths: {exc}") from None
    if not qd or any(d < 1 or d > 256 for d in qd) or nbytes < (1 << 20):
        raise UsageError("--depths: 1 to 256 each; --size: at least 1MiB")
    target = Path(path) if path else app.config.settings.tiers.warm.path
    if not path:
        target.mkdir(parents=True, exist_ok=True)
    r = bench_disk(target, size=nbytes, seconds=seconds, depths=qd)  # BenchError: exit 2 (weightd.errors)
    if not no_record:
        r["baseline_file"] = str(save_baseline(app.config.settings.state_dir, r))
    output.emit_json("bench.disk", r) if as_json else _show_bench(r, target, not no_record)


# -- how the results read as text ------------------------------------------------------------------

_VERDICTS = {"disk": "the DISK is the bottleneck", "network": "the NETWORK is the bottleneck",
             "gpu": "neither disk nor network: look at the GPU side", "healthy": "no bottleneck found"}


def _show_doctor(report: Any, doc: dict[str, Any], source: str) -> None:
    echo(f"verdict: {_VERDICTS[report.verdict]}  (from {source})")
    for f in doc["findings"]:
        echo()
        echo(printable(f"[{f['severity'].upper()}] {f['summary']}"))
        ev = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if not isinstance(v, (dict, list)))
        echo(printable(f"  evidence: {ev}"))
        echo(printable(f"  do: {f['recommendation']}"))
    disks = report.measurements.get("disks", {})
    if disks:
        echo("\ndisks: " + "; ".join(
            f"{n} await {d['read_await_ms']} ms util {d['util']:.0%} {format_rate(d['read_bytes_per_s'])}"
            + (f" ({', '.join(d['tiers'])})" if d["tiers"] else "") for n, d in disks.items()))
    nics = report.measurements.get("nics", {})
    if nics:
        echo("nics: " + "; ".join(
            f"{n} {format_rate(d['bytes_per_s'])}" + (f" = {d['util']:.1%} of link" if d["util"] is not None else "")
            + (f" mtu {d['mtu']}" if d["mtu"] else "") for n, d in nics.items()))
    if "probe" in report.measurements:
        pr = report.measurements["probe"]
        echo(f"warm tier 4K random read: p50 {pr['p50_us']} µs, p99 {pr['p99_us']} µs"
                   + (f" (baseline p50 {pr['baseline_p50_us']} µs)" if pr.get("baseline_p50_us") else
                      " (no baseline: run `weightd bench disk`)"))
    w = report.measurements.get("weightd")
    if w:
        checked = w["spot_checked"]
        bad = [c for c in checked if not c["ok"]]
        skipped = [c for c in checked if c.get("skipped")]
        echo(f"weightd: daemon {w['daemon']}; cold storage: {w['cold_checked_versions']} version(s) opened; "
                   f"spot check: {len(checked) - len(skipped)} local cop{'y' if len(checked) == 1 else 'ies'}, "
                   f"{format_bytes(sum(c['bytes'] for c in checked))} re-hashed, "
                   + (f"{len(bad)} damaged" if bad else "all match")
                   + (f" ({len(skipped)} not readable by this user)" if skipped else ""))


def _show_bench(r: dict[str, Any], target: Any, recorded: bool) -> None:
    echo(f"{target} (device {r['device']}, {format_bytes(r['file_bytes'])} test file)")
    for d, x in r["randread_4k"].items():
        echo(f"  4K random read QD{d:<3} p50 {x['p50_us']:>8} µs  p99 {x['p99_us']:>8} µs  {x['iops']:>7} IOPS")
    echo(f"  16M sequential read  {format_rate(r['seqread_16m']['bytes_per_s'])}")
    if recorded:
        echo(f"recorded as the baseline in {r['baseline_file']}")
