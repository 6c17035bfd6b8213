"""The ``weightd`` command line (design §5). Every error ends as one line and a documented exit code."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tiering import (MANIFEST_RELPATH, CheckpointNotFound, Manifest, build_manifest, diff_manifests,
                     format_bytes, load_manifest, scan_checkpoint, validate_name, validate_version,
                     verify_checkpoint, write_manifest)
from tiering import plan_size

from . import __version__
from .errors import EXIT_ERROR, UsageError, WeightdError, exit_code_for
from .progress import progress_bar

log = logging.getLogger("weightd")


@dataclass
class AppContext:
    config_path: str | None
    debug: bool
    no_daemon: bool = False
    daemon_only: bool = False
    _config: Any = None

    @property
    def config(self):  # -> weightd.config.Config; imported when first needed (pydantic costs ~70 ms)
        if self._config is None:
            from .config import load_config
            self._config = load_config(self.config_path)
        return self._config


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds > 0 else "-"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_path", metavar="FILE", help="TOML config (else $WEIGHTD_CONFIG, "
              "/etc/weightd/weightd.toml, or the embedded default).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option("--no-daemon", is_flag=True, help="Work in-process even when the node daemon's socket answers.")
@click.option("--daemon-only", is_flag=True, help="Fail (exit 1) instead of working in-process when the node "
              "daemon does not answer (an init-container must not copy into its own filesystem).")
@click.version_option(__version__, prog_name="weightd")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, debug: bool, verbose: int, no_daemon: bool,
        daemon_only: bool) -> None:
    """weightd keeps model weights local, verified and warm on every inference node."""
    level = logging.DEBUG if debug or verbose > 1 else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr, format="weightd: %(levelname)s %(name)s: %(message)s")
    if no_daemon and daemon_only:
        raise UsageError("--no-daemon and --daemon-only contradict each other")
    ctx.obj = AppContext(config_path, debug, no_daemon, daemon_only)


# -- manifest -------------------------------------------------------------------------------------

@cli.group()
def manifest() -> None:
    """Build and compare checkpoint manifests."""


def _build(directory: str, threads: int | None, label: str = "hashing") -> tuple[Manifest, float]:
    files = scan_checkpoint(directory)
    t0 = time.perf_counter()
    with progress_bar(f"{label} {Path(directory).name}", plan_size(files)) as advance:
        m = build_manifest(directory, threads=threads, progress=advance, files=files)
    return m, time.perf_counter() - t0


@manifest.command("build")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("-o", "--output", metavar="FILE", help=f"Where to write (default DIR/{MANIFEST_RELPATH}; '-' = stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report instead of text.")
@click.option("--threads", type=click.IntRange(1, 64), help="Hashing threads (default: cores, at most 8).")
@click.option("--name", help="Label the manifest with a checkpoint NAME (org/model).")
@click.option("--version", "version_label", metavar="VERSION", help="Label the manifest with a VERSION.")
def manifest_build(directory: str, output: str | None, as_json: bool, threads: int | None,
                   name: str | None, version_label: str | None) -> None:
    """Hash every file of DIRECTORY (per tensor for safetensors) and write its manifest."""
    if name is not None:
        validate_name(name)
    if version_label is not None:
        validate_version(version_label)
    m, seconds = _build(directory, threads)
    if name or version_label:
        m = m.with_labels(name=name, version=version_label)
    target = output or os.path.join(directory, MANIFEST_RELPATH)
    if target == "-":
        sys.stdout.write(m.to_json())
        return
    write_manifest(m, target)
    tensors = sum(1 for _ in m.tensors())
    if as_json:
        emit_json({"path": target, "digest": m.digest, "files": len(m.files), "tensors": tensors,
                   "bytes": m.total_bytes, "seconds": round(seconds, 4),
                   "bytes_per_s": round(m.total_bytes / seconds) if seconds > 0 else None})
        return
    click.echo(f"{len(m.files)} files, {tensors} tensors, {format_bytes(m.total_bytes)} hashed in "
               f"{seconds:.2f} s ({rate(m.total_bytes, seconds)})")
    click.echo(f"digest {m.digest}")
    click.echo(target)


def _manifest_of(arg: str, threads: int | None) -> tuple[Manifest, str]:
    """A manifest from a manifest file, or a directory's own manifest, or one built now."""
    p = Path(arg)
    if p.is_dir():
        own = p / MANIFEST_RELPATH
        if own.is_file():
            return load_manifest(own), str(own)
        m, _ = _build(arg, threads)
        return m, f"{arg} (hashed now)"
    if p.exists() or arg.endswith(".json"):
        return load_manifest(p), arg
    raise CheckpointNotFound(arg, "no such manifest file or checkpoint directory")


@manifest.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON.")
@click.option("--plan", "show_plan", is_flag=True,
              help="Show the delta plan: which byte ranges of B are taken from A, which are fetched.")
@click.option("--piece-size", default="auto", metavar="SIZE",
              help="P2P piece size for the --plan estimate (default: B's, else chosen from its size).")
@click.option("--threads", type=click.IntRange(1, 64))
def manifest_diff(a: str, b: str, as_json: bool, show_plan: bool, piece_size: str, threads: int | None) -> None:
    """What changed from A to B (manifest files or checkpoint directories)."""
    ma, la = _manifest_of(a, threads)
    mb, lb = _manifest_of(b, threads)
    if show_plan:
        _print_plan(ma, la, mb, lb, piece_size, as_json)
        return
    d = diff_manifests(ma, mb)
    if as_json:
        emit_json({"a": la, "b": lb, **d.to_dict()})
        return
    click.echo(f"A {la}: {ma.digest}, {len(ma.files)} files, {format_bytes(ma.total_bytes)}")
    click.echo(f"B {lb}: {mb.digest}, {len(mb.files)} files, {format_bytes(mb.total_bytes)}")
    if d.identical:
        click.echo("identical content")
        return
    click.echo(f"files: {len(d.files_changed)} changed, {len(d.files_added)} added, {len(d.files_removed)} removed")
    for sign, paths in (("~", d.files_changed), ("+", d.files_added), ("-", d.files_removed)):
        for path in paths:
            click.echo(f"  {sign} {path}")
    click.echo(f"tensors: {d.count('changed')} changed, {d.count('added')} added, {d.count('removed')} removed, "
               f"{d.count('moved')} moved")
    signs = {"changed": "~", "added": "+", "removed": "-", "moved": ">"}
    for t in d.tensors:
        click.echo(f"  {signs[t.kind]} {t.name}  {format_bytes(t.nbytes)}  {t.path}  {t.detail}")
    pct = 100 * d.changed_bytes / d.total_bytes if d.total_bytes else 0.0
    click.echo(f"changed bytes: {d.changed_bytes} ({format_bytes(d.changed_bytes)}, {pct:.2f}% of "
               f"{format_bytes(d.total_bytes)})")


def _print_plan(ma: Manifest, la: str, mb: Manifest, lb: str, piece_size: str, as_json: bool) -> None:
    from p2p import piece_size_for
    from tiering import parse_size
    from tiering import Donor, plan_delta
    try:
        piece = (mb.piece_size or piece_size_for(mb.total_bytes)) if piece_size == "auto" else parse_size(piece_size)
    except ValueError as exc:
        raise UsageError(f"--piece-size: {exc}") from None
    if piece <= 0:
        raise UsageError("--piece-size: must be positive")
    plan = plan_delta(mb, [Donor(la, Path(la), ma)])  # (the donor's path is only shown, never read)
    regions = sum(len(f.regions(False)) for f in plan.files)
    p2p = plan.piece_bytes(piece)
    if as_json:
        emit_json({"a": la, "b": lb, **plan.to_dict(), "fetch_regions": regions,
                   "p2p": {"piece_size": piece, "bytes": p2p}})
        return
    total = plan.total_bytes or 1
    click.echo(f"B {lb}: {mb.digest}, {len(mb.files)} files, {format_bytes(mb.total_bytes)}")
    click.echo(f"donor A {la}: {ma.digest}")
    for f in plan.files:
        if f.fetch_bytes == 0:
            how = "reuse all" if f.reuse_bytes or not f.entry.size else "empty"
        elif f.reuse_bytes == 0:
            how = "fetch all"
        else:
            how = (f"reuse {format_bytes(f.reuse_bytes)}, fetch {format_bytes(f.fetch_bytes)} in "
                   f"{len(f.regions(False))} range(s)")
        click.echo(f"  {f.entry.path}  {format_bytes(f.entry.size)}  {how}")
    click.echo(f"reuse {plan.reuse_bytes} ({format_bytes(plan.reuse_bytes)}, {100 * plan.reuse_bytes / total:.2f}%)")
    click.echo(f"fetch from cold {plan.fetch_bytes} ({format_bytes(plan.fetch_bytes)}, "
               f"{100 * plan.fetch_bytes / total:.2f}%) in {regions} range(s)")
    click.echo(f"fetch over P2P {p2p} ({format_bytes(p2p)}, {100 * p2p / total:.2f}%) with "
               f"{format_bytes(piece)} pieces")


# -- verify ---------------------------------------------------------------------------------------

@cli.command()
@click.argument("target")
@click.option("--manifest", "manifest_path", metavar="FILE", help=f"Manifest to check against (default DIR/{MANIFEST_RELPATH}).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--threads", type=click.IntRange(1, 64))
def verify(target: str, manifest_path: str | None, as_json: bool, threads: int | None) -> None:
    """Re-hash a checkpoint directory against its manifest; exit 5 naming the first bad file/tensor."""
    root = Path(target)
    if not root.exists():
        raise CheckpointNotFound(target, "no such checkpoint directory")
    mpath = Path(manifest_path) if manifest_path else root / MANIFEST_RELPATH
    if not manifest_path and not mpath.is_file():
        raise CheckpointNotFound(str(mpath), f"no manifest (build one with: weightd manifest build {target})")
    m = load_manifest(mpath)
    t0 = time.perf_counter()
    with progress_bar(f"verifying {root.name}", m.total_bytes) as advance:
        report = verify_checkpoint(root, m, threads=threads, progress=advance)
    seconds = time.perf_counter() - t0
    if as_json:
        emit_json({"path": str(root), "digest": m.digest, "ok": report.ok, "files": report.files,
                   "bytes_checked": report.bytes_checked, "seconds": round(seconds, 4),
                   "problems": [{"path": p.path, "what": p.what, "expected": p.expected, "actual": p.actual}
                                for p in report.problems]})
    elif report.ok:
        click.echo(f"ok: {root} matches {m.digest} ({report.files} files, {format_bytes(report.bytes_checked)}, "
                   f"{seconds:.2f} s)")
    else:
        for p in report.problems[:20]:
            click.echo(f"  {p}", err=True)
        if len(report.problems) > 20:
            click.echo(f"  ... {len(report.problems) - 20} more", err=True)
    report.raise_for_problems()


# -- tiers: publish, preload, path, status, pin, unpin, evict, gc -----------------------------------

class Backend:
    """The daemon when its socket answers, else the same work in-process; both return plain dicts,
    so output and exit codes are the same either way."""

    def __init__(self, app: AppContext) -> None:
        self.app = app
        self.client = None
        self._node = None
        self._fetcher = None
        if not app.no_daemon:
            client = _daemon_client(app)
            if client.available():
                self.client = client
        if self.client is None and app.daemon_only:
            raise WeightdError(f"the node daemon does not answer on {app.config.settings.api.socket} (--daemon-only)")

    def _local(self, r: dict[str, Any]) -> dict[str, Any]:
        """A path the daemon returned must lie inside a configured hot or warm tier (after symlinks)."""
        from .client import UntrustedDaemon
        tiers = self.app.config.settings.tiers
        roots = [os.path.realpath(t.path) for t in (tiers.hot, tiers.warm)]
        p = r.get("path") if isinstance(r, dict) else None
        real = os.path.realpath(p) if isinstance(p, str) and p and "\0" not in p else None
        if real is None or not any(real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
            raise UntrustedDaemon(f"the daemon on {self.app.config.settings.api.socket} answered path {p!r}, "
                                  f"which is not inside the hot or warm tier ({', '.join(roots)}); refusing it")
        return r

    @property
    def node(self):
        """The in-process node for commands that change things (reconciled first)."""
        return self._open(reconcile=True)

    @property
    def query_node(self):
        """The in-process node for ``status`` and ``path``: nothing is reconciled, created, locked or
        removed in any tier by a query."""
        return self._open(reconcile=False)

    def _open(self, *, reconcile: bool):
        if self._node is None:
            from .local import open_node
            from .swarm import P2PFetcher
            self._fetcher = P2PFetcher(self.app.config)  # a P2P session only if a download needs one
            self._node = open_node(self.app.config, fetchers=[self._fetcher], reconcile=reconcile)
        return self._node

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
        if self._node is not None:
            self._node.close()

    def publish(self, directory: str, name: str, version: str) -> dict[str, Any]:
        if self.client:
            return self.client.call("POST", "publish", {"dir": os.path.abspath(directory), "name": name,
                                                        "version": version})
        from .swarm import ensure_torrent
        files = scan_checkpoint(directory)
        with progress_bar(f"publishing {name}@{version}", plan_size(files)) as advance:
            r = self.node.publish(Path(directory), name, version, progress=advance)
        d = r.to_dict()
        torrent = ensure_torrent(self.app.config, self.node.resolve(name, version))
        d["torrent"] = str(torrent) if torrent else None
        return d

    def preload(self, ref: str, **kw: Any) -> dict[str, Any]:
        if self.client:
            t = kw.get("timeout_s")
            return self._local(self.client.call("POST", "preload", {"ref": ref, **kw},
                                                timeout=None if t is None else t + 60))
        name, version = _split_ref(ref)
        total = 0
        try:
            total = self.node.resolve(name, version).size
        except CheckpointNotFound:
            if not kw.get("wait"):
                raise
        with progress_bar(f"preloading {ref} -> {kw.get('tier')}", total) as advance:
            return self.node.preload(name, version, progress=advance, **kw).to_dict()

    def path(self, ref: str) -> dict[str, Any]:
        if self.client:
            return self._local(self.client.call("POST", "path", {"ref": ref}))
        tier, p = self.query_node.path(*_split_ref(ref))
        return {"tier": tier, "path": str(p)}

    def status(self) -> dict[str, Any]:
        return self.client.call("GET", "status") if self.client else self.query_node.status()

    def pin(self, ref: str, pin: bool) -> dict[str, Any]:
        if self.client:
            return self.client.call("POST", "pin" if pin else "unpin", {"ref": ref})
        name, version = _split_ref(ref)
        version, changed = (self.node.pin if pin else self.node.unpin)(name, version)
        return {"name": name, "version": version, "changed": changed}

    def evict(self, ref: str, tier: str | None, force: bool) -> dict[str, Any]:
        if self.client:
            return self.client.call("POST", "evict", {"ref": ref, "tier": tier, "force": force})
        name, version = _split_ref(ref)
        return {"evicted": self.node.evict(name, version, tier, force=force)}

    def gc(self) -> dict[str, Any]:
        return self.client.call("POST", "gc", {}) if self.client else self.node.gc()


def _daemon_client(app: AppContext):
    """The client of this node's daemon, trusting root and ``[api] daemon_user`` (default: our euid)."""
    from .client import DaemonClient
    api = app.config.settings.api
    return DaemonClient(api.socket, None if api.daemon_user is None else [api.daemon_user])


class Seconds(click.ParamType):
    """A finite number of seconds from 0 to 7 days (NaN and Infinity are not durations)."""
    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        import math
        from .client import MAX_SECONDS
        try:
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(v) or not 0 <= v <= MAX_SECONDS:
            self.fail(f"{value!r} is not a number of seconds from 0 to {MAX_SECONDS} (7 days)", param, ctx)
        return v


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    s = max(0, time.time() - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h"


def _split_ref(ref: str) -> tuple[str, str | None]:
    from tiering import parse_ref
    return parse_ref(ref)


@cli.command()
@click.option("--role", type=click.Choice(["worker", "origin"]), default="worker", show_default=True)
@click.pass_obj
def serve(app: AppContext, role: str) -> None:
    """Run the node daemon (systemd: Type=notify): admin API on [api] socket, metrics on [metrics] listen."""
    from .daemon import run
    run(app.config_path, role)


@cli.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", required=True, help="Checkpoint NAME ([A-Za-z0-9._-]+, at most one '/').")
@click.option("--version", "version_label", required=True, metavar="VERSION", help="Immutable VERSION label.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def publish(app: AppContext, directory: str, name: str, version_label: str, as_json: bool) -> None:
    """Copy a checkpoint (or an HF cache snapshot) into cold storage as NAME@VERSION, with its manifest."""
    validate_name(name)
    validate_version(version_label)
    with Backend(app) as b:
        r = b.publish(directory, name, version_label)
    if as_json:
        emit_json(r)
        return
    what = "already published with the same content" if r["unchanged"] else f"published in {r['seconds']:.2f} s"
    click.echo(f"{name}@{version_label}: {what} ({format_bytes(r['bytes'])}, digest {r['digest']})")
    click.echo(r["path"])


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--tier", type=click.Choice(["hot", "warm"]), default="hot", show_default=True)
@click.option("--strict", is_flag=True, help="Fail (exit 6) instead of falling back to warm when hot is full.")
@click.option("--lease", "lease_s", type=Seconds(), default=600, show_default=True,
              metavar="S", help="Keep it from eviction for S seconds (0: no lease; at most 7 days).")
@click.option("--timeout", "timeout_s", type=Seconds(), metavar="S",
              help="Give up after S seconds (exit 4; at most 7 days).")
@click.option("--wait", is_flag=True, help="If the version is not published yet, wait for it (until --timeout).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report (the path is still the last line).")
@click.pass_obj
def preload(app: AppContext, ref: str, tier: str, strict: bool, lease_s: float, timeout_s: float | None,
            wait: bool, as_json: bool) -> None:
    """Make a checkpoint local, verified and ready; the last stdout line is its path."""
    _split_ref(ref)
    with Backend(app) as b:
        r = b.preload(ref, tier=tier, strict=strict, lease_s=lease_s, timeout_s=timeout_s, wait=wait)
    who = f"{r['name']}@{r['version']}"
    tf = r.get("tier_fallback")
    if tf:
        click.echo(f"weightd: warning: {who} went to the {tf['to']} tier: {tf['reason']}", err=True)
    for sf in r.get("source_fallbacks") or []:
        click.echo(f"weightd: warning: {who}: {sf['from']} gave up ({sf['reason']}); copied from {sf['to']} "
                   "instead", err=True)
    if as_json:
        click.echo(json.dumps(r))
    elif r["already_present"]:
        click.echo(f"{who}: already in {r['tier']}, 0 bytes moved", err=True)
    else:
        moved = ", ".join(f"{format_bytes(v)} from {k}" for k, v in r["bytes_by_source"].items() if v)
        delta = r.get("delta")
        net = r["bytes_moved"] - r["bytes_by_source"]["local_reuse"]
        click.echo(f"{who}: {moved} into {r['tier']} in {r['seconds']:.2f} s"
                   + (f"; delta update from {', '.join(delta['donors'])}: {format_bytes(net)} moved of "
                      f"{format_bytes(r['bytes'])} ({100 * net / max(1, r['bytes']):.1f}%)" if delta else "")
                   + (f"; evicted {', '.join(r['evicted'])}" if r["evicted"] else ""), err=True)
        for why in (delta or {}).get("refetched", []):
            click.echo(f"weightd: warning: donor bytes failed their check and were fetched instead: {why}", err=True)
    click.echo(r["path"])


@cli.command("path")
@click.argument("ref", metavar="NAME[@VERSION]")
@click.pass_obj
def path_cmd(app: AppContext, ref: str) -> None:
    """Print the local path of the best complete copy (hot before warm); exit 3 if none."""
    _split_ref(ref)
    with Backend(app) as b:
        click.echo(b.path(ref)["path"])


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(app: AppContext, as_json: bool) -> None:
    """Checkpoints x tiers, sizes, residency, pins, leases, transfers in flight, tier usage vs capacity."""
    with Backend(app) as b:
        st = b.status()
    if as_json:
        emit_json(st)
        return
    click.echo(f"{'TIER':<5} {'USED':>10} {'CAPACITY':>10} {'USE%':>5} {'CKPTS':>5} {'IN FLIGHT':>9}  PATH")
    for t, info in st["tiers"].items():
        cap = info["capacity_bytes"]
        pct = f"{100 * info['used_bytes'] / cap:.0f}%" if cap else "-"
        click.echo(f"{t:<5} {format_bytes(info['used_bytes']):>10} {format_bytes(cap):>10} {pct:>5} "
                   f"{info['checkpoints']:>5} {info['transfers_in_flight']:>9}  {info['path']}")
    if not st["checkpoints"]:
        click.echo("\nno checkpoints on this node")
        return
    click.echo(f"\n{'CHECKPOINT':<40} {'SIZE':>10}  {'HOT':<5} {'WARM':<5} {'PIN':<3}  {'LEASES':<6} LAST USE")
    click.echo("(hot/warm: % resident in the page cache; '-': not in that tier)")
    for c in st["checkpoints"]:
        leases = [le for t in c["tiers"].values() for le in t["leases"]]
        last = max((t["last_access"] or 0) for t in c["tiers"].values())
        cols = [f"{c['tiers'][t]['resident_percent']:.0f}%" if t in c["tiers"] else "-" for t in ("hot", "warm")]
        click.echo(f"{c['name'] + '@' + c['version']:<40} {format_bytes(c['bytes']):>10}  "
                   f"{cols[0]:<5} {cols[1]:<5} {'yes' if c['pinned'] else '-':<3}  {len(leases) or '-':<6} "
                   f"{_ago(last)} ago")


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.pass_obj
def pin(app: AppContext, ref: str) -> None:
    """Never evict NAME@VERSION (latest published if no version) from any tier."""
    _split_ref(ref)
    with Backend(app) as b:
        r = b.pin(ref, True)
    click.echo(f"{r['name']}@{r['version']}: {'pinned' if r['changed'] else 'already pinned'}")


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.pass_obj
def unpin(app: AppContext, ref: str) -> None:
    """Let NAME@VERSION be evicted again."""
    _split_ref(ref)
    with Backend(app) as b:
        r = b.pin(ref, False)
    click.echo(f"{r['name']}@{r['version']}: {'unpinned' if r['changed'] else 'was not pinned'}")


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]")
@click.option("--tier", type=click.Choice(["hot", "warm"]), help="Only this tier (default: both).")
@click.option("--force", is_flag=True, help="Even if pinned, leased or in use.")
@click.pass_obj
def evict(app: AppContext, ref: str, tier: str | None, force: bool) -> None:
    """Remove NAME@VERSION (every local version of NAME without @VERSION) from the local tiers."""
    _split_ref(ref)
    with Backend(app) as b:
        for line in b.evict(ref, tier, force)["evicted"]:
            click.echo(f"evicted {line}")


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def gc(app: AppContext, as_json: bool) -> None:
    """Remove stale staging, expire leases, and bring tiers above their high watermark down to the low one."""
    with Backend(app) as b:
        r = b.gc()
    if as_json:
        emit_json(r)
        return
    for t, info in r["reconcile"].items():
        click.echo(f"{t}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in info.items()))
    for line in r["evicted"]:
        click.echo(f"evicted {line}")


# -- page cache: warm, residency, cool ---------------------------------------------------------------

def _skip_exit(skipped: list) -> None:
    """One warning line per skipped path; the exit code of the worst problem (3 missing, 2 bad input)."""
    from .errors import WeightdError
    for sk in skipped:
        click.echo(f"weightd: warning: {sk.path}: {sk.reason}", err=True)
    if not skipped:
        return
    err = WeightdError(f"{len(skipped)} path(s) skipped")
    if any("no such file" in sk.reason for sk in skipped):
        err.exit_code = 3
    elif any(("regular file" in sk.reason or "permission" in sk.reason) for sk in skipped):
        err.exit_code = 2
    raise err


def _parse_rate(value: str | None) -> int | None:
    if value is None:
        return None
    from tiering import parse_size
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--rate") from None


@cli.command("warm")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--rate", "rate_opt", metavar="BYTES_PER_S", help="Cap bandwidth, e.g. 500MB (default: [warm] bandwidth, 0 = none).")
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
    with progress_bar("warming", sum(f.size for f in files)) as advance:
        r = warm(paths, files=files, concurrency=concurrency or w.concurrency,
                 rate_bytes_per_s=w.bandwidth if rate_bps is None else rate_bps,
                 await_threshold_ms=w.await_threshold_ms, progress=advance)
    r.skipped[:0] = skipped
    locked = None
    if lock_:
        locked = LockedFiles()
        r.skipped += locked.lock(files)
    if as_json:
        d = r.to_dict()
        if locked is not None:
            d["locked_bytes"], d["lock_holder_pid"] = locked.bytes, os.getpid()
        click.echo(json.dumps(d))
    else:
        for note in r.notes:
            click.echo(f"note: {note}", err=True)
        click.echo(f"{r.files} files, {format_bytes(r.bytes)}: {format_bytes(r.warmed_bytes)} read in {r.seconds:.2f} s "
                   f"({rate(r.warmed_bytes, r.seconds)}), {format_bytes(r.already_resident_bytes)} already resident; "
                   f"now {format_bytes(r.resident_bytes)} resident")
    if locked is not None:
        _hold_lock(locked)
    _skip_exit(r.skipped)


def _hold_lock(locked) -> None:
    import signal
    import threading
    click.echo(f"locked {locked.bytes} bytes in pid {os.getpid()}; the lock lasts while this process runs "
               f"(SIGTERM or Ctrl-C releases it)", err=True)
    sys.stdout.flush()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass
    locked.release()


@cli.command("residency")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def residency_cmd(app: AppContext, paths: tuple[str, ...], as_json: bool) -> None:
    """How much of each file is in the page cache (cachestat, else mincore)."""
    from tiering import residency
    r = residency(paths)
    if as_json:
        emit_json(r.to_dict())
    else:
        for f in r.files:
            flag = "" if f.reliable else "  (unreliable: mincore on a file you cannot write)"
            click.echo(f"{format_bytes(f.resident_bytes):>10} / {format_bytes(f.size):>10} {f.percent:6.1f}%  {f.path}{flag}")
        methods = sorted({f.method for f in r.files}) or ["-"]
        click.echo(f"total: {format_bytes(r.resident_bytes)} of {format_bytes(r.size)} resident ({r.percent:.1f}%) "
                   f"in {len(r.files)} files [{', '.join(methods)}]")
    _skip_exit(r.skipped)


# -- doctor and bench ------------------------------------------------------------------------------

def _doctor_tiers(app: AppContext):
    from .doctor import Tier
    from .local import tier_spec
    t = app.config.settings.tiers
    out = []
    for name, ts in (("hot", t.hot), ("warm", t.warm)):
        spec = tier_spec(name, ts)
        try:
            cap = spec.capacity()
        except OSError:
            cap = None
        out.append(Tier(name, str(ts.path), cap))
    out.append(Tier("cold", str(t.cold.path), None))
    return out


@cli.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema in docs/doctor.md).")
@click.option("--sample-s", type=click.FloatRange(0.1, 600), default=3.0, show_default=True,
              help="How long to sample the node's counters (a running daemon's history is used instead).")
@click.option("--symptom", metavar="TEXT", help="What the operator sees (e.g. 'high TTFT'): with neither the disk "
              "nor the NIC saturated, the verdict points at the GPU side.")
@click.option("--lock", "lock", is_flag=True, help="Check RLIMIT_MEMLOCK for `weightd warm --lock` of the largest "
              "local checkpoint.")
@click.option("--log-dir", default="/var/log", show_default=True, help="Where the node's logs are written.")
@click.option("--no-probe", is_flag=True, help="Skip the 4 KiB O_DIRECT random-read probe of the warm tier.")
@click.option("--snapshot", metavar="DIR", type=click.Path(file_okay=False),
              help="Diagnose a recorded snapshot (DIR/t0, DIR/t1, DIR/static, DIR/meta.json) instead of this node.")
@click.pass_obj
def doctor_cmd(app: AppContext, as_json: bool, sample_s: float, symptom: str | None, lock: bool, log_dir: str,
               no_probe: bool, snapshot: str | None) -> None:
    """Why is model loading slow? The seed reports' decision tree, with evidence (exit 7: critical)."""
    from .doctor import diagnose, gather_live, gather_snapshot
    from .errors import EXIT_CRITICAL
    if snapshot is not None:
        if not (Path(snapshot) / "t0").is_dir() or not (Path(snapshot) / "t1").is_dir():
            raise UsageError(f"--snapshot {snapshot}: expected t0/ and t1/ directories of /proc files")
        inputs = gather_snapshot(Path(snapshot), [], log_dir=log_dir, symptom=symptom)
        source = f"snapshot {snapshot}"
    else:
        tiers = _doctor_tiers(app)
        lock_wanted = 0
        if lock:
            from tiering import TieringError
            from tiering import list_versions
            from tiering import open_tier_root
            sizes = []
            for t in tiers[:2]:
                try:
                    root = open_tier_root(Path(t.path), create=False)  # checked, by descriptor
                except TieringError:
                    continue
                if root is not None:
                    with root:
                        sizes += [v.size for v in list_versions(root)]
            lock_wanted = max(sizes, default=0) or (tiers[0].capacity or 0)
        history = None
        if not app.no_daemon:
            from .client import DaemonError
            client = _daemon_client(app)
            if client.available():
                try:
                    history = client.call("GET", f"pressure?window={max(sample_s, 30.0)}", timeout=10)
                except (DaemonError, OSError):
                    history = None
        probe = None
        if not no_probe:
            from .diskbench import probe as disk_probe
            probe = disk_probe(Path(tiers[1].path), app.config.settings.state_dir)
            if probe is not None:
                probe["tier"] = "warm"
        inputs = gather_live(tiers, sample_s, history=history, log_dir=log_dir, lock_wanted=lock_wanted,
                             probe=probe, symptom=symptom)
        source = (f"the daemon's history ({inputs.window_s:.0f} s)" if history else
                  f"{inputs.window_s:.1f} s of sampling")
    report = diagnose(inputs)
    doc = {**report.to_dict(), "source": source, "window_s": round(inputs.window_s, 3)}
    if as_json:
        emit_json(doc)
    else:
        verdicts = {"disk": "the DISK is the bottleneck", "network": "the NETWORK is the bottleneck",
                    "gpu": "neither disk nor network: look at the GPU side", "healthy": "no bottleneck found"}
        click.echo(f"verdict: {verdicts[report.verdict]}  (from {source})")
        for f in doc["findings"]:
            click.echo(f"\n[{f['severity'].upper()}] {f['summary']}")
            ev = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if not isinstance(v, (dict, list)))
            click.echo(f"  evidence: {ev}")
            click.echo(f"  do: {f['recommendation']}")
        disks = report.measurements.get("disks", {})
        if disks:
            click.echo("\ndisks: " + "; ".join(
                f"{n} await {d['read_await_ms']} ms util {d['util']:.0%} {d['read_bytes_per_s'] / 1e6:.0f} MB/s"
                + (f" ({', '.join(d['tiers'])})" if d["tiers"] else "") for n, d in disks.items()))
        nics = report.measurements.get("nics", {})
        if nics:
            click.echo("nics: " + "; ".join(
                f"{n} {d['bytes_per_s'] / 1e6:.1f} MB/s" + (f" = {d['util']:.1%} of link" if d["util"] is not None else "")
                + (f" mtu {d['mtu']}" if d["mtu"] else "") for n, d in nics.items()))
        if "probe" in report.measurements:
            pr = report.measurements["probe"]
            click.echo(f"warm tier 4K random read: p50 {pr['p50_us']} µs, p99 {pr['p99_us']} µs"
                       + (f" (baseline p50 {pr['baseline_p50_us']} µs)" if pr.get("baseline_p50_us") else
                          " (no baseline: run `weightd bench disk`)"))
    if report.critical:
        sys.exit(EXIT_CRITICAL)


@cli.group("bench")
def bench_group() -> None:
    """Measure this node."""


@bench_group.command("disk")
@click.argument("path", required=False, type=click.Path())
@click.option("--size", default="256MiB", show_default=True, help="Size of the test file made in a directory.")
@click.option("--seconds", type=click.FloatRange(0.2, 120), default=3.0, show_default=True,
              help="Duration of each random-read test.")
@click.option("--depths", default="1,4,16", show_default=True, help="Queue depths (concurrent readers).")
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-record", is_flag=True, help="Do not store the result as the device's baseline.")
@click.pass_obj
def bench_disk_cmd(app: AppContext, path: str | None, size: str, seconds: float, depths: str, as_json: bool,
                   no_record: bool) -> None:
    """4 KiB O_DIRECT random-read latency and 16 MiB sequential throughput of PATH's device (default:
    the warm tier); recorded as the baseline `weightd doctor` compares against."""
    from tiering import parse_size
    from .diskbench import BenchError, bench_disk, save_baseline
    try:
        nbytes = parse_size(size)
        qd = tuple(int(x) for x in depths.split(","))
    except ValueError as exc:
        raise UsageError(f"--size/--depths: {exc}") from None
    if not qd or any(d < 1 or d > 256 for d in qd) or nbytes < (1 << 20):
        raise UsageError("--depths: 1 to 256 each; --size: at least 1MiB")
    target = Path(path) if path else app.config.settings.tiers.warm.path
    if not path:
        target.mkdir(parents=True, exist_ok=True)
    try:
        r = bench_disk(target, size=nbytes, seconds=seconds, depths=qd)
    except BenchError as exc:
        raise UsageError(str(exc)) from None
    if not no_record:
        r["baseline_file"] = str(save_baseline(app.config.settings.state_dir, r))
    if as_json:
        emit_json(r)
        return
    click.echo(f"{target} (device {r['device']}, {format_bytes(r['file_bytes'])} test file)")
    for d, x in r["randread_4k"].items():
        click.echo(f"  4K random read QD{d:<3} p50 {x['p50_us']:>8} µs  p99 {x['p99_us']:>8} µs  {x['iops']:>7} IOPS")
    click.echo(f"  16M sequential read  {r['seqread_16m']['bytes_per_s'] / 1e9:.2f} GB/s")
    if not no_record:
        click.echo(f"recorded as the baseline in {r['baseline_file']}")


@cli.command("cool")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
def cool_cmd(paths: tuple[str, ...]) -> None:
    """Drop files from the page cache (POSIX_FADV_DONTNEED; no root needed)."""
    from tiering import cool
    dropped, skipped = cool(paths)
    click.echo(f"dropped {format_bytes(dropped)} from the page cache")
    _skip_exit(skipped)


# -- config ---------------------------------------------------------------------------------------

@cli.group("config")
def config_group() -> None:
    """Inspect the configuration."""


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def config_show(app: AppContext, as_json: bool) -> None:
    """Print the effective configuration (file merged over the embedded default)."""
    from .config import config_to_dict, to_toml
    cfg = app.config
    d = config_to_dict(cfg)
    if as_json:
        emit_json({"source": cfg.source, "config": d})
        return
    click.echo(f"# source: {cfg.source}")
    click.echo(to_toml(d), nl=False)


# -- demo -----------------------------------------------------------------------------------------

@cli.command(hidden=False)
@click.option("--dir", "workdir", metavar="DIR", help="Where to build the sample (default: a new temporary directory).")
@click.option("--size", default="64MiB", show_default=True, help="Size of the sample checkpoint.")
def demo(workdir: str | None, size: str) -> None:
    """Walk through weightd's main job on a generated sample checkpoint."""
    from .demo import run_demo
    run_demo(workdir, size)


# -- entry point ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
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
    except Exception as exc:  # every error ends here: one line, the documented exit code
        if debug:
            import traceback
            traceback.print_exc()
        code = exit_code_for(exc)
        if code == EXIT_ERROR and not isinstance(exc, OSError) and not hasattr(exc, "exit_code"):
            click.echo(f"weightd: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                       err=True)
        elif isinstance(exc, OSError) and not hasattr(exc, "exit_code"):
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"weightd: {where}{exc.strerror or exc}", err=True)
        else:
            click.echo(f"weightd: {exc}", err=True)
        return code
