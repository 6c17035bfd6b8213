"""The ``weightd`` command line as click runs it (design §5). Every error ends as one line, with the
next step for the operator where there is one, and the exit code of its type (:mod:`weightd.errors`).

Commands by group: :mod:`.tiers` (publish, preload, path, status, pin, unpin, evict, gc),
:mod:`.content` (manifest, verify), :mod:`.intent` (intent check/status/explain, fleet status), :mod:`.pagecache` (warm, residency, cool), :mod:`.diagnose`
(doctor, bench), :mod:`.system` (config, serve, demo); how results are shown: :mod:`.output`.
"""

from __future__ import annotations

import sys

import click

from ..errors import EXIT_ERROR, UsageError
from .app import cli   # (its commands are imported when run: app.COMMANDS says from where)

__all__ = ["cli", "run"]

#: the example every command's --help ends with (where its docstring has none)
EXAMPLES = {
    "manifest build": "weightd manifest build ./llama-8b --name acme/llama-8b --version v3",
    "manifest diff": "weightd manifest diff /mnt/models/acme/llama-8b/v2 /mnt/models/acme/llama-8b/v3 --plan",
    "verify": "weightd verify /dev/shm/weightd/acme/llama-8b/v3 --key /etc/weightd/signing-key.pub.pem",
    "keygen": "weightd keygen /etc/weightd/signing-key",
    "doctor": "weightd doctor --symptom 'restarts take minutes'",
    "bench disk": "weightd bench disk /var/cache/weightd --json",
    "warm": "weightd warm /var/cache/weightd/acme/llama-8b/v3 --rate 500MB",
    "residency": "weightd residency /dev/shm/weightd/acme/llama-8b/v3",
    "cool": "weightd cool /var/cache/weightd/acme/llama-8b/v2",
    "config show": "weightd --config /etc/weightd/weightd.toml config show",
    "serve": "weightd --config /etc/weightd/weightd.toml serve --role worker --log-format json",
    "demo": "make demo   (or: weightd demo --size 256MiB)",
    "publish": "weightd publish ./llama-8b --name acme/llama-8b --version v3 --sign /etc/weightd/signing-key.pem",
    "preload": "MODEL=$(weightd --daemon-only preload acme/llama-8b@v3 --tier hot --wait --timeout 1800)",
    "path": "weightd path acme/llama-8b@v3",
    "status": "weightd status --json | jq '.checkpoints[] | {name, version}'",
    "pin": "weightd pin acme/llama-8b@v3",
    "unpin": "weightd unpin acme/llama-8b@v3",
    "evict": "weightd evict acme/llama-8b@v1 --tier hot",
    "gc": "weightd gc",
    "completion": "weightd completion bash > /etc/bash_completion.d/weightd",
    "sample": "weightd sample /tmp/sample --size 1GiB",
    "intent": "weightd intent status",
    "fleet": "weightd fleet status",
}
#: help for options that have none, by parameter name
OPTION_HELP = {
    "as_json": "Print exactly one JSON document on stdout.",
    "threads": "Hashing threads (default: one per CPU, at most 16).",
    "tier": "Tier to place the copy in: hot (/dev/shm) or warm (local disk).",
}


def _finish_help(group: click.Group, prefix: str = "") -> None:
    """Every command's --help ends with an example; every option says what it does (for the commands
    imported so far; run again as more are)."""
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            _finish_help(cmd, path + " ")
            continue
        if "Example" not in (cmd.help or "") and path in EXAMPLES:
            cmd.help = (cmd.help or "").rstrip() + f"\n\nExample: {EXAMPLES[path]}"
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.help and p.name in OPTION_HELP:
                p.help = OPTION_HELP[p.name]


cli.after_load = _finish_help


def run(argv: list[str] | None = None) -> int:
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
        from .output import report_error
        return report_error(exc, debug="--debug" in args)
