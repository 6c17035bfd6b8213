"""The node itself: ``config show``, ``serve`` (the daemon) and ``demo``."""

from __future__ import annotations

import click

from . import output
from .app import AppContext, cli


@cli.group("config")
def config_group() -> None:
    """Inspect the configuration."""


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def config_show(app: AppContext, as_json: bool) -> None:
    """Print the effective configuration (file merged over the embedded default)."""
    from ..config import config_to_dict, to_toml
    cfg = app.config
    d = config_to_dict(cfg)
    if as_json:
        return output.emit_json({"source": cfg.source, "config": d})
    click.echo(f"# source: {cfg.source}")
    click.echo(to_toml(d), nl=False)


@cli.command()
@click.option("--role", type=click.Choice(["worker", "origin"]), default="worker", show_default=True,
              help="origin: seed every published version from cold storage and run the tracker.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: a UTC timestamp, level, logger, message with key=value pairs; json: one object per line.")
@click.pass_obj
def serve(app: AppContext, role: str, log_format: str) -> None:
    """Run the node daemon (systemd: Type=notify): admin API on [api] socket, metrics on [metrics] listen.

    Logs at INFO (start, stop, reload, every request with the caller's pid, every preload, publish,
    evict, pin and gc with its outcome); --debug or -vv for DEBUG.

    Example: weightd --config /etc/weightd/weightd.toml serve --role worker --log-format json"""
    import logging

    from ..daemon import run
    from ..logs import configure_daemon_logging
    configure_daemon_logging(log_format, logging.DEBUG if app.debug or logging.getLogger().level == logging.DEBUG
                             else logging.INFO)
    run(app.config_path, role)


@cli.command(hidden=False)
@click.option("--dir", "workdir", metavar="DIR", help="Where to build the sample (default: a new temporary directory).")
@click.option("--size", default="64MiB", show_default=True, help="Size of the sample checkpoint.")
def demo(workdir: str | None, size: str) -> None:
    """Walk through weightd's main job on a generated sample checkpoint."""
    from ..demo import run_demo
    run_demo(workdir, size)
