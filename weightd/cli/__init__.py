"""The ``weightd`` command line (design §5). Every error ends as one line, with the next step for
the operator where there is one, and the exit code of its type (:mod:`weightd.errors`).

Commands by group: :mod:`.tiers` (publish, preload, path, status, pin, unpin, evict, gc),
:mod:`.content` (manifest, verify), :mod:`.pagecache` (warm, residency, cool), :mod:`.diagnose`
(doctor, bench), :mod:`.system` (config, serve, demo); how results are shown: :mod:`.output`.
"""

from __future__ import annotations

import sys

import click

from ..errors import EXIT_ERROR, UsageError, rule_for
from . import content, diagnose, pagecache, system, tiers  # noqa: F401 (each registers its commands)
from .app import cli
from .output import error_line

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        cli.main(args=args, prog_name="weightd", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        return 2
    except click.ClickException as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if getattr(exc, "ctx", None) else ""
        click.echo(f"weightd: error: {exc.format_message()}{hint}", err=True)
        return UsageError.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("weightd: interrupted", err=True)
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return EXIT_ERROR
    except Exception as exc:  # every error ends here: one line, the exit code of its type
        return _report(exc, debug="--debug" in args)


def _report(exc: Exception, *, debug: bool) -> int:
    if debug:
        import traceback
        traceback.print_exc()
    rule = rule_for(exc)
    known = isinstance(exc, OSError) or hasattr(exc, "exit_code")
    if not known:
        click.echo(f"weightd: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                   err=True)
    else:
        click.echo(error_line(exc, rule.hint), err=True)
    return rule.code
