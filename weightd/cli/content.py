"""Content commands: ``manifest build``, ``manifest diff`` (and its delta ``--plan``), ``verify``, and how
their results read as text."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from tiering import MANIFEST_RELPATH, format_bytes

from ..errors import UsageError
from . import output
from .app import cli
from .output import echo, emit_path, rate


@cli.group()
def manifest() -> None:
    """Build and compare checkpoint manifests."""


def _build(directory: str, threads: int | None, label: str = "hashing"):
    from tiering import build_manifest, plan_size, scan_checkpoint
    files = scan_checkpoint(directory)
    t0 = time.perf_counter()
    with output.progress_bar(f"{label} {Path(directory).name}", plan_size(files)) as advance:
        m = build_manifest(directory, threads=threads, progress=advance, files=files)
    return m, time.perf_counter() - t0


@manifest.command("build")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("-o", "--output", "output_path", metavar="FILE",
              help=f"Where to write (default DIR/{MANIFEST_RELPATH}; '-' = stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report instead of text.")
@click.option("--threads", type=click.IntRange(1, 64), help="Hashing threads (default: cores, at most 8).")
@click.option("--name", help="Label the manifest with a checkpoint NAME (org/model).")
@click.option("--version", "version_label", metavar="VERSION", help="Label the manifest with a VERSION.")
def manifest_build(directory: str, output_path: str | None, as_json: bool, threads: int | None,
                   name: str | None, version_label: str | None) -> None:
    """Hash every file of DIRECTORY (per tensor for safetensors) and write its manifest."""
    from tiering import validate_name, validate_version, write_manifest
    if name is not None:
        validate_name(name)
    if version_label is not None:
        validate_version(version_label)
    m, seconds = _build(directory, threads)
    if not m.files:  # (a manifest of nothing verifies anything: almost surely the wrong directory)
        raise UsageError(f"{directory}: no files to hash (an empty directory, or only .weightd/?); nothing written")
    if name or version_label:
        m = m.with_labels(name=name, version=version_label)
    target = output_path or os.path.join(directory, MANIFEST_RELPATH)
    if target == "-":
        sys.stdout.write(m.to_json())
        return
    write_manifest(m, target)
    if not as_json:
        return _show_built(m, target, seconds)
    output.emit_json("manifest.build", {"path": target, "digest": m.digest, "files": len(m.files),
                                        "tensors": m.tensor_count, "bytes": m.total_bytes,
                                        "seconds": round(seconds, 4),
                                        "bytes_per_s": round(m.total_bytes / seconds) if seconds > 0 else None})


def _manifest_of(arg: str, threads: int | None):
    """A manifest from a manifest file, or a directory's own manifest, or one built now."""
    from tiering import CheckpointNotFound, load_manifest
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
    from tiering import diff_manifests
    ma, la = _manifest_of(a, threads)
    mb, lb = _manifest_of(b, threads)
    if show_plan:
        return _plan(ma, la, mb, lb, piece_size, as_json)
    d = diff_manifests(ma, mb)
    if as_json:
        return output.emit_json("manifest.diff", {"a": la, "b": lb, **d.to_dict()})
    _show_diff(ma, la, mb, lb, d)


def _plan(ma, la: str, mb, lb: str, piece_size: str, as_json: bool) -> None:
    from tiering import piece_size_for
    from tiering import Donor, parse_size, plan_delta
    try:
        piece = (mb.piece_size or piece_size_for(mb.total_bytes)) if piece_size == "auto" else parse_size(piece_size)
    except ValueError as exc:
        raise UsageError(f"--piece-size: {exc}") from None
    if piece <= 0:
        raise UsageError("--piece-size: must be positive")
    plan = plan_delta(mb, [Donor(la, Path(la), ma)])  # (the donor's path is only shown, never read)
    regions = sum(len(f.regions(False)) for f in plan.files)
    p2p_bytes = plan.piece_bytes(piece)
    if as_json:
        return output.emit_json("manifest.diff-plan", {"a": la, "b": lb, **plan.to_dict(), "fetch_regions": regions,
                                                       "p2p": {"piece_size": piece, "bytes": p2p_bytes}})
    _show_plan(ma, la, mb, lb, plan, piece, p2p_bytes, regions)


@cli.command()
@click.argument("target", metavar="NAME[@VERSION]|DIR")
@click.option("--manifest", "manifest_path", metavar="FILE",
              help=f"Manifest to check against (default DIR/{MANIFEST_RELPATH}).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--threads", type=click.IntRange(1, 64))
@click.option("--key", "keys", multiple=True, type=click.Path(dir_okay=False, exists=True), metavar="PUB",
              help="A trusted public key (PEM) to check the signature with (default: [trust] public_keys).")
@click.pass_obj
def verify(app: Any, target: str, manifest_path: str | None, as_json: bool, threads: int | None,
           keys: tuple[str, ...]) -> None:
    """Re-hash a checkpoint (its local copy, as ``weightd path`` names it, or a directory) against its
    manifest; exit 5 naming the first bad file/tensor.

    A signed version (.weightd/model.sig) is checked too, in the same read: who signed it, and that
    every file's SHA-256 is what was signed.

    Example: weightd verify /var/cache/weightd/acme/llama-8b/v1 --key /etc/weightd/fleet-signing.pub
    """
    from tiering import CheckpointNotFound, load_manifest, verify_checkpoint
    root = Path(target)
    if not root.exists():
        root = _local_copy(app, target)
    mpath = Path(manifest_path) if manifest_path else root / MANIFEST_RELPATH
    if not manifest_path and not mpath.is_file():
        raise CheckpointNotFound(str(mpath), f"no manifest (build one with: weightd manifest build {target})")
    m = load_manifest(mpath)
    statement, sig_note = _signature_of(app, root, m, keys)
    t0 = time.perf_counter()
    crypto = None
    if statement is not None:
        from tiering import HASHERS
        crypto = HASHERS[statement.algorithm]
    with output.progress_bar(f"verifying {root.name}", m.total_bytes) as advance:
        report = verify_checkpoint(root, m, threads=threads, progress=advance, crypto=crypto)
    seconds = time.perf_counter() - t0
    sig_error = None
    if statement is not None and report.ok:
        try:
            statement.check_digests(f"{root}", report.crypto_digests,   # (a partial copy: its own files)
                                    only={f.path for f in m.files} if m.of is not None else None)
            sig_note = {"signed_by": statement.key_name, "key_id": statement.key_id, "algorithm": statement.algorithm,
                        "checked": True}
        except Exception as exc:  # SignatureRefused: reported below, after the report is shown
            sig_error = exc
            sig_note = {"signed_by": statement.key_name, "key_id": statement.key_id, "checked": False,
                        "problem": str(exc)}
    if as_json:
        output.emit_json("verify", {"path": str(root), "digest": m.digest, "ok": report.ok and sig_error is None,
                                    "files": report.files, "bytes_checked": report.bytes_checked,
                                    "seconds": round(seconds, 4), "signature": sig_note,
                                    "problems": [{"path": p.path, "what": p.what, "expected": p.expected,
                                                  "actual": p.actual} for p in report.problems]})
    else:
        _show_verified(root, m, report, seconds)
        _show_signature(sig_note)
    report.raise_for_problems()
    if sig_error is not None:
        raise sig_error


def _signature_of(app: Any, root: Path, m: Any, keys: tuple[str, ...]) -> tuple[Any, dict[str, Any] | None]:
    """(the checked statement or None, what to say about the signature). Unsigned where signatures are
    required, or a signature that does not verify, is SignatureRefused (exit 5) before any byte is read."""
    from tiering import SIGNATURE_RELPATH, SignatureRefused, TrustPolicy
    from tiering import read_unverified_signature as read_unverified
    trust = app.config.settings.trust if app is not None else None
    key_paths = [Path(k) for k in keys] or list(trust.public_keys if trust else ())
    required = bool(trust and trust.require_signature)
    sig = root / SIGNATURE_RELPATH
    ref = str(root)
    if not sig.is_file() or sig.is_symlink():
        if required:
            raise SignatureRefused(ref, "unsigned", "it is not signed (no .weightd/model.sig) and "
                                   "trust.require_signature is set")
        return None, None
    data = sig.read_bytes()
    if not key_paths:
        st = read_unverified(ref, data)
        return None, {"signed_by": None, "key_id": st.key_id, "checked": False,
                      "problem": "no trusted key to check it with (--key, or [trust] public_keys)"}
    st = TrustPolicy.load(key_paths, required=True).verify(ref, data)
    st.check_files(ref, m)
    return st, None


@cli.command()
@click.argument("prefix", type=click.Path(dir_okay=False))
def keygen(prefix: str) -> None:
    """Make a signing key pair: PREFIX.pem (private, mode 0600) and PREFIX.pub.pem (to trust).

    Publish with 'weightd publish ... --sign PREFIX.pem' (or [publish] signing_key); on every node, list
    PREFIX.pub.pem in [trust] public_keys and set require_signature = true.

    Example: weightd keygen /etc/weightd/signing-key
    """
    from tiering import generate_keypair
    priv, pub = Path(prefix + ".pem"), Path(prefix + ".pub.pem")
    for p in (priv, pub):
        if os.path.lexists(p):
            raise UsageError(f"{p} exists; refusing to overwrite a key")
    key_id = generate_keypair(priv, pub)
    click.echo(f"wrote {priv} (private: keep it on the publisher) and {pub} (key {key_id[:16]})")


def _local_copy(app: Any, target: str) -> Path:
    """The local copy of NAME[@VERSION] (found as ``weightd path`` finds it, with its not-found line),
    for a ``verify`` TARGET that is no directory."""
    from tiering import BadInput, CheckpointNotFound, parse_ref
    try:
        parse_ref(target, local=True)
    except BadInput:  # (neither a directory nor a name)
        raise CheckpointNotFound(target, "no such checkpoint directory") from None
    from .tiers import Backend
    with Backend(app, query=True) as b:
        return Path(b.path(target)["path"])


# -- how the results read as text ------------------------------------------------------------------

def _show_built(m: Any, target: str, seconds: float) -> None:
    tensors = m.tensor_count
    echo(f"{len(m.files)} files, {tensors} tensors, {format_bytes(m.total_bytes)} hashed in "
               f"{seconds:.2f} s ({rate(m.total_bytes, seconds)})")
    echo(f"digest {m.digest}")
    emit_path(target)


def _show_diff(ma: Any, la: str, mb: Any, lb: str, d: Any) -> None:
    echo(f"A {la}: {ma.digest}, {len(ma.files)} files, {format_bytes(ma.total_bytes)}")
    echo(f"B {lb}: {mb.digest}, {len(mb.files)} files, {format_bytes(mb.total_bytes)}")
    if d.identical:
        echo("identical content")
        return
    echo(f"files: {len(d.files_changed)} changed, {len(d.files_added)} added, {len(d.files_removed)} removed")
    for sign, paths in (("~", d.files_changed), ("+", d.files_added), ("-", d.files_removed)):
        for path in paths:
            echo(f"  {sign} {path}")
    echo(f"tensors: {d.count('changed')} changed, {d.count('added')} added, {d.count('removed')} removed, "
               f"{d.count('moved')} moved")
    signs = {"changed": "~", "added": "+", "removed": "-", "moved": ">"}
    for t in d.tensors:
        echo(f"  {signs[t.kind]} {t.name}  {format_bytes(t.nbytes)}  {t.path}  {t.detail}")
    pct = 100 * d.changed_bytes / d.total_bytes if d.total_bytes else 0.0
    echo(f"changed bytes: {d.changed_bytes} ({format_bytes(d.changed_bytes)}, {pct:.2f}% of "
               f"{format_bytes(d.total_bytes)})")


def _show_plan(ma: Any, la: str, mb: Any, lb: str, plan: Any, piece: int, p2p_bytes: int, regions: int) -> None:
    total = plan.total_bytes or 1
    echo(f"B {lb}: {mb.digest}, {len(mb.files)} files, {format_bytes(mb.total_bytes)}")
    echo(f"donor A {la}: {ma.digest}")
    for f in plan.files:
        if f.fetch_bytes == 0:
            how = "reuse all" if f.reuse_bytes or not f.entry.size else "empty"
        elif f.reuse_bytes == 0:
            how = "fetch all"
        else:
            how = (f"reuse {format_bytes(f.reuse_bytes)}, fetch {format_bytes(f.fetch_bytes)} in "
                   f"{len(f.regions(False))} range(s)")
        echo(f"  {f.entry.path}  {format_bytes(f.entry.size)}  {how}")
    echo(f"reuse {plan.reuse_bytes} ({format_bytes(plan.reuse_bytes)}, {100 * plan.reuse_bytes / total:.2f}%)")
    echo(f"fetch from cold {plan.fetch_bytes} ({format_bytes(plan.fetch_bytes)}, "
               f"{100 * plan.fetch_bytes / total:.2f}%) in {regions} range(s)")
    echo(f"fetch over P2P {p2p_bytes} ({format_bytes(p2p_bytes)}, {100 * p2p_bytes / total:.2f}%) with "
               f"{format_bytes(piece)} pieces")


def _show_verified(root: Any, m: Any, report: Any, seconds: float) -> None:
    if report.ok:
        echo(f"ok: {root} matches {m.digest} ({report.files} files, {format_bytes(report.bytes_checked)}, "
                   f"{seconds:.2f} s)")
        return
    for p in report.problems[:20]:
        echo(f"  {p}", err=True)
    if len(report.problems) > 20:
        echo(f"  ... {len(report.problems) - 20} more", err=True)


def _show_signature(sig: Any) -> None:
    if sig is None:
        echo("signature: none (unsigned)")
    elif sig.get("checked"):
        echo(f"signature: signed by {sig['signed_by']} (key {sig['key_id'][:16]}), every file's "
                   f"{sig['algorithm']} matches what was signed")
    else:
        echo(f"signature: key {str(sig.get('key_id'))[:16]}, not checked: {sig.get('problem')}")
