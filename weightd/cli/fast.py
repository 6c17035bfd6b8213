"""Commands that answer in vmtouch time: the few invocations parsed here, without click, the config
or the tier code, and everything else handed to the click CLI (:mod:`.full`) untouched.

Only an invocation this parser recognises completely runs here: ``weightd [-q] [--config FILE]
[--no-daemon | --daemon-only] residency [--json] PATH...`` (residency reads no config and asks no
daemon, with click as here). Any other option, a ``-``-prefixed path, ``--help``, or ``WEIGHTD_NO_FAST_PATH=1`` goes to
click, which then gives the same output, errors and exit codes (tests/test_fast_path.py runs a
matrix of invocations both ways and compares them byte for byte).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if os.environ.get("WEIGHTD_NO_FAST_PATH") != "1":
        job = _recognise(args)
        if job is not None:
            return _run(*job)
    from .full import run
    return run(args)


def _recognise(args: list[str]) -> tuple[str, bool, bool, list[str]] | None:
    """(command, quiet, as_json, paths), or None: not one of ours, click decides."""
    quiet, daemon_flags = False, set()
    i = 0
    while i < len(args) and args[i] != "residency":
        a = args[i]
        if a in ("-q", "--quiet"):
            quiet = True
        elif a == "--config" and i + 1 < len(args) and args[i + 1] and not args[i + 1].startswith("-"):
            i += 1   # (residency reads no config: click takes the value and ignores it too)
        elif a.startswith("--config=") and len(a) > len("--config="):
            pass
        elif a in ("--no-daemon", "--daemon-only"):
            daemon_flags.add(a)
        else:
            return None
        i += 1
    if i >= len(args) or len(daemon_flags) > 1:   # (both: click's error)
        return None
    rest = args[i + 1:]
    as_json = "--json" in rest
    paths = [a for a in rest if a != "--json"]
    if not paths or rest.count("--json") > 1 or any(p.startswith("-") or not p for p in paths):
        return None
    return "residency", quiet, as_json, paths


def _run(command: str, quiet: bool, as_json: bool, paths: list[str]) -> int:
    from . import output
    try:
        if quiet:
            from .. import progress
            progress.QUIET = True
        from tiering import residency
        r = residency(paths)
        output.emit_json(r.to_dict()) if as_json else output.show_residency(r)
        output.skip_exit(r.skipped)
        return 0
    except BrokenPipeError:
        sys.stderr.close()
        from ..errors import EXIT_ERROR
        return EXIT_ERROR
    except KeyboardInterrupt:
        output.echo("weightd: interrupted", err=True)
        return 130
    except Exception as exc:  # one line, the exit code of its type (as the click CLI ends)
        return output.report_error(exc, debug=False)
