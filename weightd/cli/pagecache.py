"""Page-cache commands: ``warm``, ``residency``, ``cool``."""

from __future__ import annotations

import os
import sys

import click

from . import output
from .output import skip_exit
from .app import AppContext, cli


def _parse_rate(value: str | None) -> int | None:
    if value is None:
        return None
    from tiering import parse_size
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rate") from None


@cli.command("warm")
# (readable=False: an unreadable path is skipped with its warning, exit 2, and the rest is still done; click's
# default refused the whole command at parsing)
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--rate", "rate_opt", metavar="BYTES_PER_S",
              help="Cap bandwidth, e.g. 500MB (default: [warm] bandwidth, 0 = none).")
@click.option("--concurrency", type=click.IntRange(1, 64), help="Files in flight (default: [warm] concurrency).")
@click.option("--lock", "lock_", is_flag=True, help="Keep them resident with mlock while this process runs.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def warm_cmd(app: AppContext, paths: tuple[str, ...], rate_opt: str | None, concurrency: int | None, lock_: bool,
             as_json: bool) -> None:
    """Bring files or whole checkpoints into the page cache (like vmtouch -t, faster and gentler)."""
    from tiering import LockedFiles, check_memlock, collect_files, warm
    w = app.config.settings.warm
    rate_bps = _parse_rate(rate_opt)
    files, skipped = collect_files(paths)
    if lock_:
        check_memlock(sum(f.size for f in files))  # before any work: explain the fix, do not fail obscurely
    with output.progress_bar("warming", sum(f.size for f in files)) as advance:
        r = warm(paths, files=files, concurrency=concurrency or w.concurrency,
                 rate_bytes_per_s=w.bandwidth if rate_bps is None else rate_bps,
                 await_threshold_ms=w.await_threshold_ms, progress=advance)
    r.skipped[:0] = skipped
    locked = None
    stop = None
    if lock_:
        locked = LockedFiles()
        r.skipped += locked.lock(files)
        stop = _release_on_signal()  # before the result is printed: whoever reads it may signal at once
    if as_json:
        d = r.to_dict()
        if locked is not None:
            d["locked_bytes"], d["lock_holder_pid"] = locked.bytes, os.getpid()
        output.emit_json("warm", d, compact=True)
    else:
        output.show_warmed(r)
    if locked is not None and stop is not None:
        _hold_lock(locked, stop)
    skip_exit(r.skipped)


def _release_on_signal():
    """An event set by SIGTERM, SIGINT or SIGHUP (installed before anything is announced)."""
    import signal
    import threading
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _hold_lock(locked, stop) -> None:
    output.note(f"locked {locked.bytes} bytes in pid {os.getpid()}; the lock lasts while this process runs "
                f"(SIGTERM or Ctrl-C releases it)")
    sys.stdout.flush()
    while not stop.wait(3600):
        pass
    locked.release()


@cli.command("residency")
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--json", "as_json", is_flag=True)
def residency_cmd(paths: tuple[str, ...], as_json: bool) -> None:
    """How much of each file is in the page cache (cachestat, else mincore)."""
    from tiering import residency
    r = residency(paths)
    output.emit_json("residency", r.to_dict()) if as_json else output.show_residency(r)
    skip_exit(r.skipped)


@cli.command("cool")
@click.argument("paths", nargs=-1, required=True, type=click.Path(readable=False))
@click.option("--json", "as_json", is_flag=True)
def cool_cmd(paths: tuple[str, ...], as_json: bool) -> None:
    """Drop files from the page cache (POSIX_FADV_DONTNEED; no root needed)."""
    from tiering import cool
    dropped, skipped = cool(paths)
    if as_json:
        output.emit_json("cool", {"dropped_bytes": dropped,
                                  "skipped": [{"path": s.path, "reason": s.reason} for s in skipped]})
    else:
        click.echo(f"dropped {output.format_bytes(dropped)} from the page cache")
    skip_exit(skipped)
