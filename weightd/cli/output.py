"""How the CLI shows things: one JSON document with ``--json``, else text (tables on stdout, notes
and warnings on stderr), progress on a terminal, one line for an error. No logic of the commands lives
here. Besides the shared pieces it holds the text of the tier and page-cache commands (the fast path
prints those without click); the content and diagnosis commands' text lives beside them
(:mod:`.content`, :mod:`.diagnose`).

The contract (design §5): with ``--json`` stdout is exactly one JSON document for every command;
without it, a command that makes something local ends with its path as the last stdout line. Every
such document says what it is first: ``"schema": "weightd.<command>/v<N>"`` (:func:`emit_json`, the
one place it is added; the promise is docs/commands.md "JSON output").
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from typing import Any

from tiering import format_bytes, format_duration, format_rate


def log_to_stderr(level: int) -> None:
    """The CLI's log lines on stderr at ``level``, as ``weightd: LEVEL logger: message`` (the click CLI
    and the fast path alike)."""
    import logging
    logging.basicConfig(level=level, stream=sys.stderr, format="weightd: %(levelname)s %(name)s: %(message)s")

__all__ = ["JSON_MAJOR", "echo", "emit_json", "emit_path", "json_schema", "rate", "ago", "progress_bar", "warn",
           "note", "format_bytes"]


def __getattr__(name: str) -> Any:
    if name == "progress_bar":   # (imported when a command shows progress: path, status and residency never do)
        from .progress import progress_bar
        return progress_bar
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """One line (or ``nl=False``: text) on stdout or stderr, flushed (what click.echo does for our plain
    text, without importing click: the fast commands never do)."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    stream.write(f"{message}\n" if nl else message)
    stream.flush()


JSON_MAJOR = 1   # within it, documents only gain fields; a removed, renamed or re-meant one is 2


def json_schema(command: str) -> str:
    """What a ``--json`` document is, and which promise it keeps: ``weightd.status/v1``,
    ``weightd.fleet.status/v1`` (a subcommand's path joined by dots; a variant of one command's
    output after a dash: ``weightd.preload-set/v1``)."""
    return f"weightd.{command}/v{JSON_MAJOR}"


def emit_json(command: str, obj: dict[str, Any], *, compact: bool = False) -> None:
    """The one JSON document a ``--json`` command prints, its ``schema`` (:func:`json_schema` of
    ``command``) first (``compact``: on one line, for commands whose callers read a line: ``preload``,
    ``warm --lock``, ``status --watch``). A ``schema`` in ``obj`` (a daemon's answer) is replaced: the
    document is this CLI's."""
    doc = {"schema": json_schema(command)}
    doc.update((k, v) for k, v in obj.items() if k != "schema")
    echo(json.dumps(doc) if compact else json.dumps(doc, indent=2, sort_keys=False))


def emit_path(path: str) -> None:
    echo(path)


def warn(message: str) -> None:
    """A warning on stderr (not with -q: only errors then)."""
    from .progress import quiet
    if not quiet():
        echo(f"weightd: warning: {message}", err=True)


def note(message: str) -> None:
    """A note on stderr (not with -q)."""
    from .progress import quiet
    if not quiet():
        echo(message, err=True)


def rate(nbytes: int, seconds: float) -> str:
    return format_rate(nbytes / seconds) if seconds > 0 else "-"


def ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = max(0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def error_line(exc: BaseException, hint: str | None) -> str:
    """The one stderr line an error ends as."""
    if isinstance(exc, OSError) and not hasattr(exc, "exit_code"):
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{exc.strerror or exc}"
    else:
        text = str(exc)
    line = f"weightd: {text}" + (f" ({hint})" if hint and hint not in text else "")
    return printable(line)


def report_error(exc: BaseException, *, debug: bool) -> int:
    """Any error a command ends with: one line on stderr (a traceback only with --debug), and the
    exit code of its type."""
    from ..errors import rule_for
    if debug:
        import traceback
        traceback.print_exc()
    rule = rule_for(exc)
    known = isinstance(exc, OSError) or hasattr(exc, "exit_code")
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        # a broken install, not a bug of this run: say which package and how to mend it
        echo(f"weightd: this installation is incomplete: Python module '{exc.name}' is missing (reinstall weightd "
             f"with its dependencies: pip install --force-reinstall weightd, or make install)", err=True)
    elif not known:
        echo(f"weightd: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True)
    else:
        echo(error_line(exc, rule.hint), err=True)
    return rule.code


def printable(text: str) -> str:
    """Text from outside (a file name in cold storage, a peer's or a store's message) on its way to a
    terminal: control characters are shown escaped, never interpreted, and a line stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# -- tiers ------------------------------------------------------------------------------------------

def show_published(r: dict[str, Any], name: str, version: str) -> None:
    what = "already published with the same content" if r["unchanged"] else f"published in {r['seconds']:.2f} s"
    signed = f", signed by {r['signed_by']}" if r.get("signed_by") else ""
    echo(f"{name}@{version}: {what} ({format_bytes(r['bytes'])}, digest {r['digest']}{signed})")
    emit_path(r["path"])


def warn_fallbacks(r: dict[str, Any]) -> None:
    who = f"{r['name']}@{r['version']}"
    tf = r.get("tier_fallback")
    if tf:
        warn(f"{who} went to the {tf['to']} tier: {tf['reason']}")
    for sf in r.get("source_fallbacks") or []:
        warn(f"{who}: {sf['from']} gave up ({sf['reason']}); copied from {sf['to']} instead")


def show_preloaded(r: dict[str, Any]) -> None:
    """A summary on stderr, then the path as the last stdout line."""
    who = f"{r['name']}@{r['version']}"
    if r["already_present"]:
        note(f"{who}: already in {r['tier']}, 0 bytes moved")
    else:
        moved = ", ".join(f"{format_bytes(v)} from {k}" for k, v in r["bytes_by_source"].items() if v)
        delta = r.get("delta")
        net = r["bytes_moved"] - r["bytes_by_source"]["local_reuse"]
        note(f"{who}: {moved} into {r['tier']} in {r['seconds']:.2f} s"
             + (f"; delta update from {', '.join(delta['donors'])}: {format_bytes(net)} moved of "
                f"{format_bytes(r['bytes'])} ({100 * net / max(1, r['bytes']):.1f}%)" if delta else "")
             + (f"; resumed: {format_bytes(r['resumed_bytes'])} kept from an interrupted transfer"
                if r.get("resumed_bytes") else "")
             + (f"; evicted {', '.join(r['evicted'])}" if r["evicted"] else ""))
        for why in (delta or {}).get("refetched", []):
            warn(f"donor bytes failed their check and were fetched instead: {why}")
    emit_path(r["path"])


def left(ts: float | None) -> str:
    """Time left until ``ts`` (a wall-clock expiry): ``9m58s``, ``2h05m``, ``expired``."""
    if not ts:
        return "-"
    s = ts - time.time()
    return "expired" if s <= 0 else format_duration(s)


def show_status(st: dict[str, Any], *, wide: bool = False) -> None:
    """Tiers, then transfers in flight, checkpoints, and what holds each copy (pins, leases with
    holder and time left, processes using it). ``wide``: watermarks, digests, paths, pids.
    Storage problems (cold storage absent or unmounted, ...) first, on stderr."""
    for p in st.get("problems") or []:
        echo(f"weightd: storage problem: {printable(p['reason'])}", err=True)
    echo(f"{'TIER':<5} {'USED':>10} {'CAPACITY':>10} {'USE%':>5} {'CKPTS':>5} {'IN FLIGHT':>9}"
               + (f" {'HIGH/LOW':>9}" if wide else "") + "  PATH")
    for t, info in st["tiers"].items():
        cap = info["capacity_bytes"]
        pct = f"{100 * info['used_bytes'] / cap:.0f}%" if cap else "-"
        marks = f" {info['high_watermark']:.0%}/{info['low_watermark']:.0%}".rjust(10) if wide else ""
        echo(f"{t:<5} {format_bytes(info['used_bytes']):>10} {format_bytes(cap):>10} {pct:>5} "
                   f"{info['checkpoints']:>5} {info['transfers_in_flight']:>9}{marks}  {info['path']}")
    from .progress import network_note
    if network_note(st.get("network")):   # ([network] holds weightd back: others use the link)
        echo(f"\n{network_note(st.get('network'))}")
    transfers = st.get("transfers") or []
    if transfers:
        from .progress import figures
        echo(f"\n{'TRANSFER':<40} {'TIER':<5} {'PHASE':<16} {'%':>4}  {'BYTES, RATE, ETA':<36} WAITERS")
        for t in transfers:
            phase = t["phase"] + (f" ({t['source']})" if t["phase"] == "copy" and t.get("source") else "")
            pct = f"{100 * t['done'] / t['total']:.0f}" if t.get("total") else "-"
            echo(f"{t['name'] + '@' + t['version']:<40} {(t.get('tier') or t['requested_tier']):<5} "
                       f"{phase:<16} {pct:>4}  {figures(t):<36} {t.get('waiters', 0)}")
    if not st["checkpoints"]:
        echo("\nno checkpoints on this node")
        return
    echo(f"\n{'CHECKPOINT':<40} {'SIZE':>10}  {'HOT':<5} {'WARM':<5} {'READY IN':<8} {'PIN':<3}  {'LEASES':<6} "
               f"{'IN USE':<6} {'LAST USE':<10} SIGNED BY" + ("  DIGEST" if wide else ""))
    echo("(hot/warm: % resident in the page cache; '-': not in that tier; ready in: estimated time until a server "
         "could read it; signed by: the key whose signature was checked here)")
    held: list[tuple[str, str, str, str]] = []
    ready = {(e["model"], e["version"]): e["seconds"] for e in st.get("ready_estimates") or []}
    for c in st["checkpoints"]:
        ref = f"{c['name']}@{c['version']}"
        leases = [le for t in c["tiers"].values() for le in t["leases"]]
        users = {u["pid"] for t in c["tiers"].values() for u in t.get("in_use", ())}
        last = max((t["last_access"] or 0) for t in c["tiers"].values())
        cols = [f"{c['tiers'][t]['resident_percent']:.0f}%" if t in c["tiers"] else "-" for t in ("hot", "warm")]
        signers = sorted({t["signature"]["signed_by"] for t in c["tiers"].values() if t.get("signature")})
        echo(f"{ref:<40} {format_bytes(c['bytes']):>10}  "
                   f"{cols[0]:<5} {cols[1]:<5} {ready_in(ready.get((c['name'], c['version']))):<8} "
                   f"{'yes' if c['pinned'] else '-':<3}  {len(leases) or '-':<6} "
                   f"{len(users) or '-':<6} {ago(last) + ' ago':<10} {', '.join(signers) or '-'}"
                   + (f"  {c['digest']}" if wide else ""))
        if c["pinned"]:
            held.append((ref, "-", "pinned", "-"))
        for tier, info in c["tiers"].items():
            for le in info["leases"]:
                held.append((ref, tier, f"lease, {le['holder'] or '?'}", left(le["expires_at"])))
            for u in info.get("in_use", ()):
                held.append((ref, tier, f"in use, pid {u['pid']}" + (f" ({u['process']})" if u["process"] else ""), "-"))
            if wide:
                held.append((ref, tier, f"path {info['path']}", "-"))
    if held:
        echo(f"\n{'HELD':<40} {'TIER':<5} {'BY':<44} LEFT")
        for ref, tier, by, time_left in held:
            echo(printable(f"{ref:<40} {tier:<5} {by:<44} {time_left}"))


def show_versions(rows: list[dict[str, Any]]) -> None:
    if not rows:
        echo("nothing published")
        return
    echo(f"{'CHECKPOINT':<40} {'SIZE':>10}  {'PUBLISHED':<20} {'LOCAL':<10} {'READY IN':<8} SIGNED")
    for r in rows:
        echo(f"{r['name'] + '@' + r['version']:<40} {format_bytes(r['bytes']):>10}  "
                   f"{(r['published_at'] or '-')[:19]:<20} {','.join(r['local']) or '-':<10} "
                   f"{ready_in(r.get('ready_in_s')) if 'ready_in_s' in r else '-':<8} {'yes' if r['signed'] else '-'}")


def ready_in(seconds: float | None) -> str:
    """A ready estimate for a column: ``now`` (under a second), ``42s``, ``3m10s``; ``?`` unknown."""
    if seconds is None:
        return "?"
    return "now" if seconds < 1 else format_duration(seconds)


def show_gc(r: dict[str, Any]) -> None:
    for t, info in r["reconcile"].items():
        echo(f"{t}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in info.items() if k != "not_ours"))
        if info.get("not_ours"):
            echo(f"{t}: {info['not_ours']}")
    for line in r["evicted"]:
        echo(f"evicted {line}")
    imports = r.get("imports") or {}
    for i in imports.get("removed", ()):
        echo(f"removed the abandoned download of hf://{i['repo']} ({format_bytes(i['bytes'])}, idle "
             f"{format_duration(i['idle_s'])}): {i['path']}")
    for line in [*r.get("refused", ()), *imports.get("refused", ())]:
        echo(f"refused {line}")


def show_set(r: dict[str, Any], what: str) -> None:
    """A set's summary on stderr, then ``NAME@VERSION PATH`` per model on stdout; failures as warnings."""
    moved = r["bytes_moved"]
    note(f"{what}: {r['ready']} of {r['models']} ready in {r['tier']} ({r['already_present']} already there), "
         f"{format_bytes(moved)} moved of {format_bytes(r['bytes'])} in {r['seconds']:.2f} s"
         + (f" ({rate(moved, r['seconds'])})" if moved else "")
         + (f"; {len(r['failed'])} failed" if r["failed"] else ""))
    for f in r["failed"][:20]:
        warn(f"{f['ref']}: {f['error']}")
    if len(r["failed"]) > 20:
        warn(f"... and {len(r['failed']) - 20} more (--json lists them all)")
    for i in r["items"]:
        echo(f"{i['name']}@{i['version']} {i['path']}")


def companion_line(c: dict[str, Any]) -> str:
    part = c.get("part_of") or {}
    where = c.get("installed")
    return (f"{c['name']}@{part.get('version', '?')}: {part.get('kind', 'companion')} {part.get('key', '')} "
            f"({part.get('files', '?')} files, {format_bytes(c['bytes'])}) in {c['tier']}"
            + ("" if not c.get("bytes_moved") or c.get("already_present") else f", {c['seconds']:.2f} s")
            + (f"; copied into {where['dir']} ({where['copied']} new, {where['unchanged']} unchanged)" if where else ""))


# -- page cache -------------------------------------------------------------------------------------

def show_warmed(r: Any) -> None:
    for n in r.notes:
        note(f"note: {n}")
    echo(f"{r.files} files, {format_bytes(r.bytes)}: {format_bytes(r.warmed_bytes)} read in {r.seconds:.2f} s "
               f"({rate(r.warmed_bytes, r.seconds)}), {format_bytes(r.already_resident_bytes)} already resident; "
               f"now {format_bytes(r.resident_bytes)} resident")


def show_residency(r: Any) -> None:
    for f in r.files:
        flag = "" if f.reliable else "  (unreliable: mincore on a file you cannot write)"
        echo(f"{format_bytes(f.resident_bytes):>10} / {format_bytes(f.size):>10} {f.percent:6.1f}%  {f.path}{flag}")
    methods = sorted({f.method for f in r.files}) or ["-"]
    echo(f"total: {format_bytes(r.resident_bytes)} of {format_bytes(r.size)} resident ({r.percent:.1f}%) "
               f"in {len(r.files)} files [{', '.join(methods)}]")


def skip_exit(skipped: list) -> None:
    """One warning line per skipped path; then PathsSkipped with the worst problem's exit code
    (3 if a path is missing, 2 if one is unreadable or not a regular file). Decided from the paths
    themselves, never from the text of the reasons."""
    for sk in skipped:
        warn(f"{sk.path}: {sk.reason}")
    if not skipped:
        return
    kinds = [_skip_kind(sk.path) for sk in skipped]
    from ..errors import PathsSkipped
    raise PathsSkipped(len(skipped), missing="missing" in kinds, unreadable="unreadable" in kinds)


def _skip_kind(path: str) -> str:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "unreadable"
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) or not os.access(path, os.R_OK):
        return "unreadable"
    return "other"
