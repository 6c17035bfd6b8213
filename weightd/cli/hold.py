"""``weightd hold``: preload through the node daemon, write the path, keep the copy leased while it
runs (the logic: :mod:`weightd.node.hold`)."""

from __future__ import annotations

from typing import Any

import click

from ..errors import DaemonUnavailable, UsageError
from . import output
from .app import AppContext, Seconds, cli, split_ref
from .context import checked_path, warn_other_config

DEFAULT_LEASE_S = 300.0
DEFAULT_EVERY_S = 10.0


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--tier", type=click.Choice(["hot", "warm"]), default="hot", show_default=True)
@click.option("--strict", is_flag=True, help="Fail (exit 6) instead of falling back to warm when hot is full.")
@click.option("--path-file", "path_file", metavar="FILE",
              help="Write the path here (atomically) once the copy is ready; removed while it is being "
                   "preloaded again and on exit. A startup probe: test -s FILE.")
@click.option("--lease", "lease_s", type=Seconds(), default=DEFAULT_LEASE_S, show_default=True, metavar="S",
              help="The lease each renewal sets: how long the copy stays protected if this process is killed "
                   "without SIGTERM.")
@click.option("--every", "every_s", type=Seconds(), default=DEFAULT_EVERY_S, show_default=True, metavar="S",
              help="Renew the lease, and check the copy is still there, every S seconds (less than --lease).")
@click.option("--timeout", "timeout_s", type=Seconds(), metavar="S",
              help="Give up on a preload after S seconds (exit 4; at most 7 days).")
@click.option("--wait", is_flag=True, help="If the version is not published yet, wait for it (until --timeout).")
@click.pass_obj
def hold(app: AppContext, ref: str, tier: str, strict: bool, path_file: str | None, lease_s: float, every_s: float,
         timeout_s: float | None, wait: bool) -> None:
    """Keep NAME[@VERSION] local for as long as this runs: preload it through the node daemon, print its
    path (and write --path-file) once ready, then renew a lease on it until SIGTERM, which releases it
    (exit 0). A copy that disappears (evicted, deleted, a daemon restarted without it) is preloaded again
    and the path rewritten. Only through the node daemon: never copies in-process.

    NAME without @VERSION: the latest when hold starts, then that version for as long as it runs.

    Example: weightd hold acme/llama-8b@v3 --tier hot --path-file /weightd/model-path --timeout 1800"""
    from ..node.hold import Holder, Stopped, check_options, on_stop_signals
    split_ref(ref)   # (a bad name: exit 2 before anything)
    if app.no_daemon:
        raise UsageError("hold works through the node daemon only: not with --no-daemon")
    pf = check_options(lease_s, every_s, path_file)
    holder = None
    try:
        on_stop_signals()
        client = app.daemon_client()
        if not client.available():
            sock = app.config.settings.api.socket
            raise DaemonUnavailable(f"hold: the node daemon does not answer on {sock} (hold never copies in-process; "
                                    f"start it: systemctl start weightd, or check the DaemonSet's pod on this node)")
        warn_other_config(app, client.health)
        features = client.health.get("features") if isinstance(client.health, dict) else None
        if not isinstance(features, list) or "hold" not in features:
            raise DaemonUnavailable(f"hold: the node daemon on {app.config.settings.api.socket} is older than this "
                                    f"weightd and cannot renew leases (no 'hold' feature); upgrade the daemon first")

        def preload(r: str) -> dict[str, Any]:
            from .progress import TransferBar
            with TransferBar() as bar:
                return checked_path(app, client.preload(r, tier=tier, strict=strict, lease_s=lease_s,
                                                        timeout_s=timeout_s, wait=wait, on_progress=bar.update))

        holder = Holder(client, ref, tier=tier, lease_s=lease_s, every_s=every_s, path_file=pf, preload=preload,
                        say=output.note, emit=output.emit_path)
        holder.run()
    except Stopped:
        pass
    finally:
        if holder is not None:
            try:
                holder.release()
            except Stopped:  # (signals are ignored by now; never a traceback on the way out)
                pass
