"""Commands that answer in vmtouch time: the few invocations parsed here, without click or the tier
code, and everything else handed to the click CLI (:mod:`.full`) untouched.

Only an invocation this parser recognises completely runs here, after the global options ``-q``,
``--config FILE`` and one of ``--no-daemon``/``--daemon-only``:

- ``residency [--json] PATH...`` (it reads no config and asks no daemon, with click as here);
- ``path NAME[@VERSION] [--json]`` and ``status [--json | -o table|wide|json]``, when the node's daemon
  answers (not with ``--no-daemon``): the same client, the same checks of its answer and the same
  rendering as the click commands. When it does not answer (or the socket refuses us), click runs
  the command in-process as before;
- the same two with ``--no-daemon``: the node's service opened in-process as the click commands open
  it (nothing reconciled, no P2P), the same rendering and exit codes, without click's ~25 ms.

Any other option, a ``-``-prefixed argument, ``--help``, or ``WEIGHTD_NO_FAST_PATH=1`` goes to click,
which then gives the same output, errors and exit codes (tests/test_fast_path.py runs a matrix of
invocations both ways and compares them byte for byte).
"""

from __future__ import annotations

import os
import sys

_FALLBACK = -1000   # (not an exit code: "let click run it")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if os.environ.get("WEIGHTD_NO_FAST_PATH") != "1":
        job = _recognise(args)
        if job is not None:
            rc = _run(job)
            if rc != _FALLBACK:
                return rc
    from .full import run
    return run(args)


class _Job:
    __slots__ = ("command", "quiet", "config_path", "no_daemon", "daemon_only", "as_json", "operands", "fmt")

    def __init__(self) -> None:
        self.command, self.quiet, self.config_path = "", False, None
        self.no_daemon = self.daemon_only = self.as_json = False
        self.operands: list[str] = []
        self.fmt = "table"


def _recognise(args: list[str]) -> _Job | None:
    """The job, or None: not one of ours, click decides."""
    job = _Job()
    i = 0
    while i < len(args) and args[i] not in ("residency", "path", "status"):
        a = args[i]
        if a in ("-q", "--quiet"):
            job.quiet = True
        elif a == "--config" and i + 1 < len(args) and args[i + 1] and not args[i + 1].startswith("-"):
            job.config_path = args[i + 1]
            i += 1
        elif a.startswith("--config=") and len(a) > len("--config="):
            job.config_path = a[len("--config="):]
        elif a == "--no-daemon":
            job.no_daemon = True
        elif a == "--daemon-only":
            job.daemon_only = True
        else:
            return None
        i += 1
    if i >= len(args) or (job.no_daemon and job.daemon_only):   # (both: click's error)
        return None
    job.command, rest = args[i], args[i + 1:]
    if job.command == "status":
        as_json = False   # (--json wins over any -o, as in the click command)
        while rest:
            a = rest.pop(0)
            if a == "--json":
                as_json = True
            elif a in ("-o", "--output") and rest and rest[0] in ("table", "wide", "json"):
                job.fmt = rest.pop(0)
            elif a.startswith("--output=") and a[len("--output="):] in ("table", "wide", "json"):
                job.fmt = a[len("--output="):]
            else:
                return None
        job.fmt = "json" if as_json else job.fmt
        return job
    job.as_json = "--json" in rest
    job.operands = [a for a in rest if a != "--json"]
    if rest.count("--json") > 1 or any(p.startswith("-") or not p for p in job.operands):
        return None
    if job.command == "residency":
        return job if job.operands else None
    return job if len(job.operands) == 1 else None   # path NAME[@VERSION]


def _run(job: _Job) -> int:
    from .output import echo, emit_json, report_error, show_residency, skip_exit
    try:
        if job.quiet:
            from .progress import set_quiet
            set_quiet()
        if job.command == "residency":
            from tiering import residency
            r = residency(job.operands)
            emit_json("residency", r.to_dict()) if job.as_json else show_residency(r)
            skip_exit(r.skipped)
            return 0
        return _in_process(job) if job.no_daemon else _through_daemon(job)
    except BrokenPipeError:
        sys.stderr.close()
        from ..errors import EXIT_ERROR
        return EXIT_ERROR
    except KeyboardInterrupt:
        echo("weightd: interrupted", err=True)
        return 130
    except Exception as exc:  # one line, the exit code of its type (as the click CLI ends)
        return report_error(exc, debug=False)


def _in_process(job: _Job) -> int:
    """``--no-daemon path`` or ``status``: what the click commands do with ``--no-daemon`` (a query
    ``Backend``: the service opened without reconciling, creating or removing anything, and no P2P
    fetcher), the same output and exit codes."""
    import logging
    from .output import emit_json, emit_path, log_to_stderr, show_status
    from .context import AppContext
    log_to_stderr(logging.ERROR if job.quiet else logging.WARNING)   # (the node's warnings as click logs them)
    if job.command == "path":
        from tiering import parse_ref
        parse_ref(job.operands[0], local=True)   # (a bad name: exit 2 before anything, as click's command)
    app = AppContext(job.config_path, False, True, False)
    from ..node.local import open_service
    from ..tally import Tally
    svc = open_service(app.config, Tally(), reconcile=False, fetchers=[])
    try:
        if job.command == "path":
            r = svc.path(job.operands[0])
            emit_json("path", r) if job.as_json else emit_path(r["path"])
            return 0
        st = svc.status()
    finally:
        svc.node.close()
    emit_json("status", st, compact=False) if job.fmt == "json" else show_status(st, wide=job.fmt == "wide")
    return 2 if st.get("problems") else 0


def _through_daemon(job: _Job) -> int:
    """``path`` or ``status`` answered by the node's daemon; _FALLBACK when it does not answer (click
    then works in-process, or says why it cannot, exactly as it would have)."""
    from ..errors import SocketDenied
    from .output import emit_json, emit_path, show_status
    from .context import AppContext, checked_path, warn_other_config
    if job.command == "path":
        from tiering import parse_ref
        parse_ref(job.operands[0], local=True)   # (a bad name: exit 2 before anything, as click's command)
    app = AppContext(job.config_path, False, job.no_daemon, job.daemon_only)
    client = app.daemon_client()
    try:
        if not client.available():
            return _FALLBACK
    except SocketDenied:
        return _FALLBACK
    warn_other_config(app, client.health)
    if job.command == "path":
        r = checked_path(app, client.path(job.operands[0]))
        emit_json("path", r) if job.as_json else emit_path(r["path"])
        return 0
    st = client.status()
    if job.fmt == "json":
        emit_json("status", st, compact=False)
    else:
        show_status(st, wide=job.fmt == "wide")
    return 2 if st.get("problems") else 0   # (storage not there as configured, as the click command)
