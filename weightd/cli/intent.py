"""Fleet intent: ``intent check`` (the files, in-process), ``intent status`` and ``intent explain``
(the daemon's reconcile and prewarm decisions), ``fleet status`` (the origin's view of its workers)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from ..errors import DaemonUnavailable
from . import output
from .app import AppContext, cli


@cli.group("intent")
def intent_group() -> None:
    """Fleet intent: desired state in [intent] dir, reconciled by the daemon."""


def _daemon(app: AppContext, what: str) -> Any:
    client = app.daemon_client()
    if not client.available():
        raise DaemonUnavailable(f"{what} is the daemon's view, and no daemon answers on "
                                f"{app.config.settings.api.socket}: start it (weightd serve), or check the files "
                                "with 'weightd intent check'")
    return client


@intent_group.command("check")
@click.argument("directory", required=False, type=click.Path(path_type=Path))
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="A node label to select with "
              "(repeatable; default: [intent] labels and labels_file).")
@click.option("--origin", "as_origin", is_flag=True, help="Select as a daemon run with --role origin would "
              "([[import]] entries without nodes run there).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def check(app: AppContext, directory: Path | None, labels: tuple[str, ...], as_origin: bool, as_json: bool) -> None:
    """Read the intent files as the daemon would and show the entries that select this node.

    Example: weightd intent check /etc/weightd/intent.d --label pool=chat"""
    from ..errors import UsageError
    from ..intent.files import load_intent, read_labels
    cfg = app.config.settings.intent
    d = directory or cfg.dir
    if d is None:
        raise UsageError("no intent directory: give one, or set [intent] dir")
    have = read_labels(cfg.labels_file, cfg.labels)
    for kv in labels:
        k, sep, v = kv.partition("=")
        if not sep:
            raise UsageError(f"--label {kv!r}: expected KEY=VALUE")
        have[k] = v
    intent = load_intent(d.absolute())
    entries = intent.for_node(have)
    from ..intent.imports import not_allowed
    imports, refused = intent.imports_for(have, origin=as_origin)
    allow = cfg.import_allow
    refused += [(e, why) for e in imports if (why := not_allowed(e, allow)) is not None]
    imports = [e for e in imports if not_allowed(e, allow) is None]
    doc = {"dir": str(d), "labels": have, "entries_in_files": len(intent.entries),
           "entries": [e.to_dict() for e in entries], "imports": [e.to_dict() for e in imports],
           "imports_refused": [{**e.to_dict(), "reason": why} for e, why in refused]}
    if as_json:
        return output.emit_json("intent.check", doc)
    click.echo(f"{d}: {len(intent.entries)} entr{'y' if len(intent.entries) == 1 else 'ies'}, "
               f"{len(entries)} for this node (labels: {', '.join(f'{k}={v}' for k, v in sorted(have.items())) or 'none'})")
    for e in entries:
        from tiering import format_rate
        extra = ["pin" if e.pin else "", f"window {e.window}" if e.window else "",
                 f"cap {format_rate(e.bandwidth)}" if e.bandwidth else "", f"versions {e.versions}" if e.versions > 1 else ""]
        click.echo(f"  {e.where:<24} {e.model:<40} {e.tier:<5} priority {e.priority:<6} "
                   + " ".join(x for x in extra if x))
    for i in imports:
        click.echo(f"  {i.where:<24} {i.name:<40} from {i.source} every {output.format_duration(i.every_s)}")
    for i, why in refused:
        click.echo(f"  {i.where:<24} {i.name:<40} REFUSED: {output.printable(why)}")


@intent_group.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(app: AppContext, as_json: bool) -> None:
    """Desired against actual, per entry, with the reason for every difference.

    Example: weightd intent status --json | jq '.entries[] | select(.state != "ready")'"""
    st = _daemon(app, "intent status").call("GET", "intent", timeout=30)
    if as_json:
        return output.emit_json("intent.status", st)
    if st.get("error"):
        output.warn(f"{st['error']['error']} (since {_t(st['error']['at'])}; the previous intent runs)")
    if st.get("dir") is None:
        click.echo("no [intent] dir configured")
    else:
        click.echo(f"intent {st['dir']} on {st['node']} (labels: "
                   f"{', '.join(f'{k}={v}' for k, v in sorted(st['labels'].items())) or 'none'})")
    rows = st.get("entries") or []
    if not rows and st.get("dir") is not None:
        click.echo("  no entry selects this node")
    for r in rows:
        kept = f" kept {','.join(r['kept'])}" if r.get("kept") else ""
        click.echo(f"  {r['entry']:<22} {r['model']:<34} {r['tier']:<5} {r['state'].upper():<12} "
                   f"want {r.get('want') or '-'}{kept}")
        if r.get("reason"):
            click.echo(f"      {output.printable(r['reason'])}")
    for r in st.get("imports") or []:
        click.echo(f"  {r['entry']:<22} {r['name']:<34} {'':<5} {r['state'].upper():<12} from {r['source']}")
        if r.get("reason"):
            click.echo(f"      {output.printable(r['reason'])}")
    if st.get("report_error"):
        output.warn(f"holdings not reported to the origin: {st['report_error']}")


@intent_group.command("explain")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def explain(app: AppContext, as_json: bool) -> None:
    """Why each prewarm happened, and what the forecaster expects next.

    Example: weightd intent explain"""
    doc = _daemon(app, "intent explain").call("GET", "intent/explain", timeout=30)
    if as_json:
        return output.emit_json("intent.explain", doc)
    pw = doc.get("prewarm")
    click.echo("prewarming: off ([intent.prewarm] not set)" if pw is None else
               f"prewarming: window {pw['window']}, top {pw['top']} into {pw['tier']}, min score {pw['min_score']}")
    click.echo("forecast for the next period:" if doc["forecast"] else "forecast: no loads recorded yet")
    for f in doc["forecast"]:
        click.echo(f"  {f['model']:<34} {f['score']:>7.2f}  {output.printable(f['reason'])}")
    if doc["prewarms"]:
        click.echo("prewarms:")
    for p in doc["prewarms"]:
        click.echo(f"  {_t(p['at'])} {p['model']} -> {p['tier']}: {p['outcome']}")
        click.echo(f"      because {output.printable(p['reason'])}")


@cli.group("fleet")
def fleet_group() -> None:
    """What the origin knows of its workers."""


@fleet_group.command("status")
@click.option("--origin", "origins", metavar="URL", multiple=True, help="An origin's tracker URL (repeat for "
              "several; default: [intent] origin, else one per [p2p] trackers host).")
@click.option("--model", metavar="NAME", help="Only the nodes that hold, intend or estimate NAME, soonest ready "
              "first (by each node's ready estimate).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def fleet_status(app: AppContext, origins: tuple[str, ...], model: str | None, as_json: bool) -> None:
    """Per node and version: tier, residency, how soon it could serve, and age of the report (from
    GET /v1/fleet on every origin, merged: a node's newest report wins; an origin that does not
    answer is a warning while another does).

    Example: weightd fleet status --origin https://10.0.0.1:6969 --model acme/llama-70b"""
    from ..config.intent import origin_problem
    from ..errors import UsageError
    from ..fleet.client import origin_urls
    from ..fleet.view import by_readiness, ready_index
    for u in origins:   # (as [intent] origin is checked: a typo is the caller's, not an origin down)
        if (why := origin_problem(u)) is not None:
            raise UsageError(f"--origin {u[:100]!r}: {why}; expected an origin's tracker base URL, like "
                             f"'https://10.0.0.1:6969'")
    bases = list(dict.fromkeys(u.rstrip("/") for u in origins)) or origin_urls(app.config)
    if not bases:
        raise UsageError("no origin: pass --origin URL, or set [intent] origin or [p2p] trackers")
    if model is not None:
        _check_model(model)
    doc = _fleets(app, bases, model)
    from ..fleet.view import origin_list_warning
    if (odd := origin_list_warning(doc.get("nodes") or [])) is not None:
        output.warn(odd)
    if model is not None:
        doc["nodes"] = by_readiness(doc.get("nodes") or [], model)
    if as_json:
        return output.emit_json("fleet.status", doc)
    nodes = doc.get("nodes") or []
    answered = [o for o in doc["origins"] if "error" not in o]
    movers = ", ".join(f"{len(o['movers'])} of {o.get('max_movers') or 'any'}" for o in answered)
    click.echo(f"{len(nodes)} node(s) reporting to " + (bases[0] if len(bases) == 1 else
               f"{len(answered)} of {len(bases)} origins ({', '.join(o['url'] for o in answered)})")
               + f"; rollout movers {movers}")
    runs: dict[str, int] = {}   # (two adjacent versions during a rollout of weightd itself)
    for n in nodes:
        v = n.get("weightd") or "not said"
        runs[v] = runs.get(v, 0) + 1
    if runs:
        click.echo("weightd versions: " + ", ".join(f"{v} ({c} node{'s' if c != 1 else ''})"
                                                    for v, c in sorted(runs.items())))
    click.echo(f"  {'NODE':<24} {'RACK':<8} {'MODEL@VERSION':<40} {'TIER':<5} {'RESIDENT':>8} {'READY IN':>8} "
               f"{'SERVING':<7} AGE")
    for n in nodes:
        held = {(h["model"], h["version"]) for h in n.get("holdings") or []}
        ready = ready_index(n)   # (once per node: a node of 1024 rows is not scanned per row)
        rows = [*(n.get("holdings") or []), *({"model": e["model"], "version": e["version"], "tier": e["tier"]}
                                              for e in n.get("ready") or [] if (e["model"], e["version"]) not in held)]
        for h in rows or [{}]:
            if not h:
                click.echo(f"  {n['node']:<24} {n.get('rack') or '-':<8} (holds nothing)")
                continue
            resident = f"{100 * h['resident']:>7.0f}%" if "resident" in h else f"{'absent':>8}"
            click.echo(f"  {n['node']:<24} {n.get('rack') or '-':<8} {h['model'] + '@' + h['version']:<40} "
                       f"{h['tier']:<5} {resident} {_ready_in(ready.get((h['model'], h['version']))):>8} "
                       f"{'yes' if h.get('serving') else '':<7} {n.get('age_s', 0):.0f}s")


def _ready_in(s: float | None) -> str:
    return "-" if s is None else output.ready_in(s)


def _check_model(model: str) -> None:
    import tiering

    from ..errors import UsageError
    try:
        tiering.validate_name(model)
    except tiering.InvalidName as exc:
        raise UsageError(f"--model {output.printable(model)[:80]}: {exc.reason}") from None


def _fleets(app: AppContext, bases: list[str], model: str | None) -> dict[str, Any]:
    """Every origin's view (asked at once), merged (:func:`weightd.fleet.view.merged`); an origin that
    does not answer is a warning, all of them an error (OriginUnavailable)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..errors import OriginUnavailable
    from ..fleet.client import OriginClient, fleet_view
    from ..fleet.view import merged

    def one(base: str) -> Any:
        try:
            return fleet_view(OriginClient(base, app.config, timeout_s=15), model)
        except OriginUnavailable as exc:
            return exc
    with ThreadPoolExecutor(max_workers=len(bases)) as pool:
        answers = list(zip(bases, pool.map(one, bases)))
    failed = [a for _u, a in answers if not isinstance(a, dict)]
    if len(failed) == len(answers):
        raise failed[0]
    for a in failed:
        output.warn(f"{a} (the view is the other origins')")
    if len(answers) == 1:   # (one origin: its document as it is, with the origins list)
        return {**answers[0][1], "origins": merged(answers)["origins"]}
    return merged(answers)


def _t(ts: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(ts))
