"""Tier commands: path, status, ls, pin, unpin, evict, gc, and what every tier command shares: the
:class:`Backend` they run on and the flags that choose a partial copy or a companion (publish and
preload, the commands that move a checkpoint, are :mod:`.transfer`'s).

Each runs one operation of :class:`weightd.node.service.NodeService`: through the node daemon when its
socket answers (``DaemonClient`` offers the same method names), else on an in-process service. Both
return the same plain dicts, so output and exit codes are the same either way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import DaemonUnavailable, SocketDenied
from . import output
from .app import AppContext, cli, split_ref
from .context import checked_path, warn_other_config


class Backend:
    """The daemon's client, or an in-process service opened on first use (``query``: for ``status``
    and ``path``, nothing is reconciled, created, locked or removed in any tier)."""

    def __init__(self, app: AppContext, *, query: bool = False) -> None:
        self.app, self.query = app, query
        self.client = None
        self._service = None
        self._fetcher = None
        if not app.no_daemon:
            client = app.daemon_client()
            try:
                answered = client.available()
            except SocketDenied as exc:
                if app.daemon_only:
                    raise
                answered = False
                click.echo(f"weightd: {exc}; working in-process instead", err=True)
            if answered:
                self.client = client
                warn_other_config(app, client.health)
        if self.client is None and app.daemon_only:
            sock = app.config.settings.api.socket
            why = ("nothing listens there (a stale socket: the daemon stopped or crashed; systemctl status weightd)"
                   if os.path.exists(sock) else
                   "no socket there: the daemon is not running, or it uses another [api] socket (weightd config show)")
            raise DaemonUnavailable(f"--daemon-only: the node daemon does not answer on {sock}: {why}")

    @property
    def service(self):
        if self._service is None:
            from ..node.local import open_service
            from ..tally import Tally
            if self.app.config.settings.p2p.peers and not self.query:
                # a P2P session only if a download needs one; without origins ([p2p] peers) the swarm
                # has nowhere to start and the fetcher would decline every request: not even imported
                # (p2p.fetch loads libtorrent, ~15 ms of every in-process command)
                from ..node.swarm import P2PFetcher
                self._fetcher = P2PFetcher(self.app.config)
            # the same counting as the daemon's, into a Tally: nothing scrapes a CLI process, and
            # prometheus_client would add ~50 ms to every in-process command
            self._service = open_service(self.app.config, Tally(), reconcile=not self.query,
                                         fetchers=[] if self._fetcher is None else [self._fetcher])
        return self._service

    @property
    def ops(self):
        """Whatever runs the operations: the daemon's client or the in-process service."""
        return self.client if self.client is not None else self.service

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
        if self._service is not None:
            self._service.node.close()

    def checked_path(self, r: Any) -> dict[str, Any]:
        return checked_path(self.app, r)

    def publish(self, directory: str, name: str, version: str, sign_key: str | None = None,
                signature: str | None = None, companion: dict[str, str] | None = None) -> dict[str, Any]:
        if self.client:
            return self.client.publish(directory, name, version, sign_key=sign_key, signature=signature,
                                       companion=companion)
        if companion is not None:
            return self.service.publish_companion(Path(directory), f"{name}@{version}", companion["kind"],
                                                  companion["key"], sign_key=Path(sign_key) if sign_key else None)
        from tiering import plan_size, scan_checkpoint
        files = scan_checkpoint(directory)
        with output.progress_bar(f"publishing {name}@{version}", plan_size(files)) as advance:
            return self.service.publish(Path(directory), name, version, progress=advance,
                                        sign_key=Path(sign_key) if sign_key else None,
                                        signature=Path(signature) if signature else None)

    def preload(self, ref: str, **kw: Any) -> dict[str, Any]:
        """The same bar either way: drawn from the daemon's progress stream, or from this process."""
        from .progress import TransferBar, follow
        if self.client:
            with TransferBar() as bar:
                return self.checked_path(self.client.preload(ref, on_progress=bar.update, **kw))
        from tiering import Progress
        svc = self.service
        kw.setdefault("holder", f"pid {os.getpid()} (weightd) uid {os.geteuid()}")  # (as the daemon names callers)
        req = svc.resolve(svc.preload_request(ref, **kw))  # not published: exit 3 (or wait, if asked)
        progress = Progress(f"{req.name}@{req.version}", svc.size(req))
        with follow(progress):
            return svc.load(req, progress=progress)

    def path(self, ref: str, **kw: Any) -> dict[str, Any]:
        r = self.ops.path(ref, **kw)
        return self.checked_path(r) if self.client else r

    def preload_set(self, refs: list[str], **kw: Any) -> dict[str, Any]:
        """Every model of a set as one operation: one request to the daemon (or one thread pool here)."""
        if self.client:
            r = self.client.preload_set(refs, **kw)
            for item in r.get("items", []):
                self.checked_path(item)
            return r
        kw.setdefault("holder", f"pid {os.getpid()} (weightd) uid {os.geteuid()}")
        return self.service.preload_set(refs, **kw)


def selection_options(f: Any) -> Any:
    """--include/--exclude/--layers/--tp-rank/--experts/--all: which files of the version (a partial copy)."""
    for opt in reversed([
        click.option("--include", multiple=True, metavar="GLOB",
                     help="Only files matching GLOB (repeatable; huggingface_hub allow_patterns: fnmatch on the "
                          "path, '*' crosses '/', 'dir/' is everything beneath). A partial copy of its own."),
        click.option("--exclude", multiple=True, metavar="GLOB",
                     help="Not files matching GLOB (repeatable; huggingface_hub ignore_patterns)."),
        click.option("--layers", metavar="A-B", help="A pipeline stage: the shards holding model.layers.A-B "
                     "(with the embeddings for the first stage, the final norm and head for the last)."),
        click.option("--tp-rank", "tp_rank", metavar="R/N", help="Rank R of N of a checkpoint laid out per rank "
                     "(vLLM sharded_state: model-rank-R-part-K.safetensors)."),
        click.option("--experts", metavar="R/N", help="Expert-parallel rank R of N of a mixture of experts: every "
                     "tensor but the other ranks' routed experts, repacked into shards of the same names "
                     "(vLLM's split: n_routed_experts from config.json in contiguous blocks)."),
        click.option("--all", "whole", is_flag=True, help="Every file, ignoring the model's default patterns "
                     "([models.\"NAME\"] in the config)."),
        click.option("--with", "with_kind", metavar="KIND", help="Also bring the version's companion artefact of "
                     "KIND (e.g. compile-cache) for --key."),
        click.option("--key", "companion_key", metavar="KEY", help="The companion's key (engine, GPU, TP size...)."),
    ]):
        f = opt(f)
    return f


def selection_body(include: tuple[str, ...], exclude: tuple[str, ...], layers: str | None, tp_rank: str | None,
                   whole: bool, experts: str | None = None) -> dict[str, Any]:
    """The request's ``selection`` / ``whole`` from the flags, checked here (exit 2 before anything runs)."""
    if not include and not exclude and layers is None and tp_rank is None and experts is None:
        return {"whole": True} if whole else {}   # (no flag: nothing to parse, the selection code not imported)
    from tiering import selection_from
    sel = selection_from(list(include) or None, list(exclude) or None, layers, tp_rank, experts=experts)
    if whole and not sel.whole:
        raise click.UsageError("--all moves every file: not with --include, --exclude, --layers, --tp-rank or "
                               "--experts")
    out: dict[str, Any] = {}
    if not sel.whole:
        out["selection"] = {k: v for k, v in {"include": list(include), "exclude": list(exclude), "layers": layers,
                                              "tp_rank": tp_rank, "experts": experts}.items() if v}
    if whole:
        out["whole"] = True
    return out


def companion_of(with_kind: str | None, key: str | None) -> dict[str, str] | None:
    if (with_kind is None) != (key is None):
        raise click.UsageError("--with KIND and --key KEY go together")
    if with_kind is None:
        return None
    from ..node.requests import check_companion
    check_companion({"kind": with_kind, "key": key})
    return {"kind": with_kind, "key": key or ""}


@cli.command("path")
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--json", "as_json", is_flag=True, help="Print {tier, path} as JSON.")
@selection_options
@click.pass_obj
def path_cmd(app: AppContext, ref: str, as_json: bool, include: tuple[str, ...], exclude: tuple[str, ...],
             layers: str | None, tp_rank: str | None, whole: bool, with_kind: str | None,
             companion_key: str | None, experts: str | None = None) -> None:
    """Print the local path of the best complete copy (hot before warm); exit 3 if none.

    With the flags a preload was given (--include, --layers, --with ...), the path of that partial copy
    or companion; a partial copy is never printed for the whole version. NAME@V~p<hex> (from status)
    names one directly."""
    from tiering import parse_ref
    parse_ref(ref, local=True)
    kw = {**selection_body(include, exclude, layers, tp_rank, whole, experts), "companion": companion_of(with_kind, companion_key)}
    with Backend(app, query=True) as b:
        r = b.path(ref, **{k: v for k, v in kw.items() if v})
    output.emit_json("path", r) if as_json else output.emit_path(r["path"])


@cli.command()
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "wide", "json"]), default="table",
              show_default=True, help="wide: also watermarks, digests, paths; json: the whole document.")
@click.option("--json", "as_json", is_flag=True, help="Same as -o json.")
@click.option("--watch", "watch_s", type=float, default=None, metavar="S", is_flag=False, flag_value=2.0,
              help="Redraw every S seconds (2 if not given) until Ctrl-C.")
@click.pass_obj
def status(app: AppContext, fmt: str, as_json: bool, watch_s: float | None) -> None:
    """Tiers, transfers in flight (phase, %, rate, ETA, waiters), checkpoints with residency, and what
    holds each copy: pins, leases (holder, time left), processes using it.

    Example: weightd status -o wide --watch 1"""
    import time
    if watch_s is not None and not (0.1 <= watch_s <= 3600):
        raise click.BadParameter("from 0.1 to 3600 seconds", param_hint="--watch")
    fmt = "json" if as_json else fmt
    with Backend(app, query=True) as b:
        try:
            while True:
                st = b.ops.status()
                if watch_s is not None and fmt != "json" and sys.stdout.isatty():
                    click.echo("\x1b[H\x1b[2J", nl=False)  # (clear the screen, as watch(1) does)
                if fmt == "json":
                    output.emit_json("status", st, compact=watch_s is not None)  # (--watch: one document per line)
                else:
                    if watch_s is not None:
                        click.echo(f"every {watch_s:g} s, {time.strftime('%H:%M:%S')} (Ctrl-C to stop)")
                    output.show_status(st, wide=fmt == "wide")
                if st.get("answered_by") == "in-process" and not app.no_daemon:
                    output.note(f"(the daemon did not answer on {app.config.settings.api.socket}: this is what "
                                "this process sees in the tiers; transfers the daemon runs are not shown)")
                if watch_s is None:
                    if st.get("problems"):   # (storage not there as configured: exit 2, as every command)
                        raise SystemExit(2)
                    return
                sys.stdout.flush()
                time.sleep(watch_s)
                if fmt != "json":
                    click.echo()
        except KeyboardInterrupt:  # (the way out of --watch)
            if watch_s is None:
                raise


@cli.command("ls")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def ls(app: AppContext, name: str | None, as_json: bool) -> None:
    """Published versions (of NAME, or all) and the local tiers holding each; local versions that are
    not in cold storage are listed too.

    Example: weightd ls acme/llama-8b"""
    if name is not None:
        from tiering import validate_name
        validate_name(name)
    with Backend(app, query=True) as b:
        r = b.ops.versions(name)
    output.emit_json("ls", r) if as_json else output.show_versions(r["versions"])


def _pin(app: AppContext, ref: str, as_json: bool, pin: bool) -> None:
    split_ref(ref, local=True)
    with Backend(app) as b:
        r = b.ops.pin(ref) if pin else b.ops.unpin(ref)
    if as_json:
        return output.emit_json("pin" if pin else "unpin", r)
    done, noop = ("pinned", "already pinned") if pin else ("unpinned", "was not pinned")
    click.echo(f"{r['name']}@{r['version']}: {done if r['changed'] else noop}")


def _pin_command(name: str, pin: bool, help: str) -> click.Command:
    @cli.command(name, help=help)
    @click.argument("ref", metavar="NAME[@VERSION]")
    @click.option("--json", "as_json", is_flag=True)
    @click.pass_obj
    def command(app: AppContext, ref: str, as_json: bool) -> None:
        _pin(app, ref, as_json, pin)
    return command


pin = _pin_command("pin", True, "Never evict NAME@VERSION (latest published if no version) from any tier.")
unpin = _pin_command("unpin", False, "Let NAME@VERSION be evicted again.")


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--tier", type=click.Choice(["hot", "warm"]), help="Only this tier (default: both).")
@click.option("--force", is_flag=True, help="Even if pinned, leased or in use.")
@click.option("--all", "all_versions", is_flag=True, help="Every local version of NAME (a REF without @VERSION).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def evict(app: AppContext, ref: str, tier: str | None, force: bool, all_versions: bool, as_json: bool) -> None:
    """Remove NAME@VERSION from the local tiers (every local version of NAME with --all).

    Example: weightd evict acme/llama-8b@v1 --tier hot"""
    split_ref(ref, local=True)
    with Backend(app) as b:
        r = b.ops.evict(ref, tier, force, all_versions)
    if as_json:
        return output.emit_json("evict", r)
    for line in r["evicted"]:
        click.echo(f"evicted {line}")


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def gc(app: AppContext, as_json: bool) -> None:
    """Remove stale staging, expire leases, bring tiers above their high watermark down to the low one, and
    remove what Hub imports downloaded and left: a repository's download no import holds, idle for a day."""
    with Backend(app) as b:
        r = b.ops.gc()
    output.emit_json("gc", r) if as_json else output.show_gc(r)
