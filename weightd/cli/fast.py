"""Commands that answer in vmtouch time: the few invocations parsed here, without click, the config
or the tier code, and everything else handed to the click CLI (:mod:`.full`) untouched.

Only an invocation this parser recognises completely runs here: ``weightd [-q] residency [--json]
PATH...``. Any other option, a ``-``-prefixed path, ``--help``, or ``WEIGHTD_NO_FAST_PATH=1`` goes to
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
    quiet = False
    i = 0
    while i < len(args) and args[i] in ("-q", "--quiet"):
        quiet, i = True, i + 1
    if i >= len(args) or args[i] != "residency":
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
