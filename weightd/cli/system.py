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
    """Print the effective configuration (file merged over the embedded default): sizes in binary
    units, and after each key where its value came from (the file, the environment, or the default).
    --json: raw values (sizes in bytes), with "sources" by dotted key."""
    from ..config import config_sources, config_to_dict, describe_source, show_config
    cfg = app.config
    d = config_to_dict(cfg)
    if as_json:
        return output.emit_json("config.show", {"source": cfg.source, "config": d, "sources": config_sources(cfg)})
    click.echo(f"# source: {describe_source(cfg)}")
    click.echo(show_config(cfg), nl=False)


@cli.command()
@click.option("--role", type=click.Choice(["worker", "origin"]), default="worker", show_default=True,
              help="origin: seed every published version from cold storage and run the tracker.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: a UTC timestamp, level, logger, message with key=value pairs; json: one object per line.")
@click.option("--check", "check", type=click.Choice(["all", "install"]), default=None, is_flag=False,
              flag_value="all", help="Check instead of serving, exit 0 if all is well, else 2: install = the config "
              "and every module and dependency (an image build, ExecStartPre=); all (the default) = also the "
              "tier roots and cold storage as this user sees them.")
@click.pass_obj
def serve(app: AppContext, role: str, log_format: str, check: str | None) -> None:
    """Run the node daemon (systemd: Type=notify): admin API on [api] socket, metrics on [metrics] listen.

    Logs at INFO (start, stop, reload, every request with the caller's pid, every preload, publish,
    evict, pin and gc with its outcome); --debug or -vv for DEBUG.

    Example: weightd --config /etc/weightd/weightd.toml serve --role worker --log-format json
    Example: weightd --config /etc/weightd/weightd.toml serve --check"""
    if check is not None:
        from ..daemon.selfcheck import run_checks
        checks = run_checks(app.config, check)
        for c in checks:
            click.echo(f"{'ok' if c.ok else 'FAIL':<4}  {c.what:<14} {output.printable(c.detail)}")
        failed = [c for c in checks if not c.ok]
        if failed:
            output.echo(f"weightd serve --check: {len(failed)} of {len(checks)} checks failed; the first: "
                        f"{failed[0].what}: {output.printable(failed[0].detail)}", err=True)
            raise SystemExit(2)
        return
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
    from .demo import run_demo
    run_demo(workdir, size)


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, choices)."""
    from click.shell_completion import get_completion_class
    cls = get_completion_class(shell)
    assert cls is not None  # (click ships all three)
    click.echo(cls(cli, {}, "weightd", "_WEIGHTD_COMPLETE").source())


@cli.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--size", default="1GiB", show_default=True, help="Total size of the checkpoint.")
@click.option("--shards", default=4, show_default=True, type=click.IntRange(1, 256), help="safetensors shards.")
@click.option("--seed", default="sample", show_default=True, help="Content seed: the same seed, the same bytes.")
def sample(directory: str, size: str, shards: int, seed: str) -> None:
    """Make a test checkpoint in DIR: safetensors shards with realistic tensor names
    (model.layers.N.*), an index json and a config, for trying weightd or a benchmark."""
    from pathlib import Path

    from tiering import make_checkpoint, parse_size

    from ..errors import UsageError
    try:
        total = parse_size(size)
    except ValueError as exc:
        raise UsageError(f"--size: {exc}") from None
    if Path(directory).exists() and any(Path(directory).iterdir()):
        raise UsageError(f"{directory}: exists and is not empty; choose a new directory")
    out = make_checkpoint(Path(directory), total_bytes=total, shards=shards, seed=seed)
    click.echo(str(out))
