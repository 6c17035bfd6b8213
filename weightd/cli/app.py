"""The ``weightd`` command group, its global options and the context every command gets."""

from __future__ import annotations

import importlib
import logging
import math
from typing import Any, Callable

import click

from .. import __version__
from ..errors import UsageError
from .context import AppContext  # noqa: F401  (the commands' context; its home is context.py)
from .output import log_to_stderr


#: every command and the module of this package that defines it (imported when the command is run)
COMMANDS = {
    "publish": "transfer", "preload": "transfer", "path": "tiers", "status": "tiers", "ls": "tiers",
    "pin": "tiers", "unpin": "tiers", "evict": "tiers", "gc": "tiers", "hold": "hold",
    "manifest": "content", "verify": "content", "keygen": "content",
    "intent": "intent", "fleet": "intent",
    "warm": "pagecache", "residency": "pagecache", "cool": "pagecache",
    "doctor": "diagnose", "bench": "diagnose",
    "config": "system", "serve": "system", "demo": "system", "completion": "system", "sample": "system",
}


class LazyGroup(click.Group):
    """The command group whose commands are imported when first asked for: ``weightd warm`` does not
    import what ``publish`` or ``doctor`` need (all of them together cost ~50 ms of every start).
    ``--help`` and completion list every command, and so import them all."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lazy = lazy
        self.loaded: set[str] = set()
        self.after_load: Callable[[click.Group], None] | None = None   # (the help examples, set by the package)

    def load(self, module: str) -> None:
        if module not in self.loaded:
            self.loaded.add(module)
            importlib.import_module(f"{__package__}.{module}")   # (its decorators add its commands)
            if self.after_load is not None:
                self.after_load(self)

    def load_all(self) -> None:
        for module in sorted(set(self.lazy.values())):
            self.load(module)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            self.load(self.lazy[name])
        return self.commands.get(name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.lazy) | set(self.commands))

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """click (8.4+) suggests from the commands already loaded, which here is none: ``weightd prelod``
        said only "No such command". Suggest from every command's name."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            no_such = getattr(click.exceptions, "NoSuchCommand", None)
            if no_such is None or not isinstance(exc, no_such):
                raise
            raise no_such(exc.command_name, possibilities=self.list_commands(ctx), ctx=exc.ctx) from None


@click.group(cls=LazyGroup, lazy=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_path", metavar="FILE", help="TOML config (else $WEIGHTD_CONFIG, "
              "/etc/weightd/weightd.toml, or the embedded default).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--no-daemon", is_flag=True, help="Work in-process even when the node daemon's socket answers.")
@click.option("--daemon-only", is_flag=True, help="Fail (exit 1) instead of working in-process when the node "
              "daemon does not answer (an init-container must not copy into its own filesystem).")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr (no progress, no warnings).")
@click.version_option(__version__, "-V", "--version", prog_name="weightd")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool, verbose: int, no_daemon: bool,
        daemon_only: bool, quiet: bool) -> None:
    """weightd keeps model weights local, verified and warm on every inference node.

    Example: MODEL=$(weightd preload acme/llama-8b@v3 --tier hot)"""
    level = logging.DEBUG if debug or verbose > 1 else logging.INFO if verbose else \
        logging.ERROR if quiet else logging.WARNING
    if quiet:
        from .progress import set_quiet
        set_quiet()
    log_to_stderr(level)
    if no_daemon and daemon_only:
        raise UsageError("--no-daemon and --daemon-only contradict each other")
    ctx.obj = AppContext(config_path, debug, no_daemon, daemon_only)


class Seconds(click.ParamType):
    """A finite number of seconds from 0 to 7 days (NaN and Infinity are not durations)."""
    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        from tiering import MAX_SECONDS   # (tiering.content.units; weightd.client would load http.client)
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(v) or not 0 <= v <= MAX_SECONDS:
            self.fail(f"{value!r} is not a number of seconds from 0 to {MAX_SECONDS} (7 days)", param, ctx)
        return v


class LeaseOption(click.Option):
    """``--lease``: its default is ``tiering.DEFAULT_LEASE_S`` (the one home), shown in --help only
    (reading it loads the tier code, which a command that talks to the daemon never needs)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from tiering import DEFAULT_LEASE_S
        record = super().get_help_record(ctx)
        return None if record is None else (record[0], f"{record[1]}  [default: {DEFAULT_LEASE_S:g}]")


def split_ref(ref: str, *, local: bool = False) -> tuple[str, str | None]:
    """NAME[@VERSION] (``local``: VERSION may be a partial copy's or companion's label, V~...)."""
    from tiering import parse_ref
    return parse_ref(ref, local=local)
