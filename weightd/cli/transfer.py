"""Commands that move a checkpoint: ``publish`` (a directory into cold storage, or a companion
artefact of a published version) and ``preload`` (a version into a local tier: whole, a partial copy,
with a companion, or a set of models). Each runs through a :class:`~weightd.cli.tiers.Backend`, as the
other tier commands do.
"""

from __future__ import annotations

import os
from typing import Any

import click

from . import output
from .app import AppContext, LeaseOption, Seconds, cli, split_ref
from .tiers import Backend, companion_of, selection_body, selection_options


@cli.command()
@click.argument("directory", metavar="DIRECTORY|hf://ORG/REPO[@REVISION]|oci://REGISTRY/REPO:TAG")
@click.option("--name", help="Checkpoint NAME ([A-Za-z0-9._-]+, at most one '/'; from hf://: ORG/REPO).")
@click.option("--version", "version_label", metavar="VERSION", help="Immutable VERSION label (from hf://: the "
              "commit SHA the revision names).")
@click.option("--include", "include", multiple=True, metavar="GLOB", help="From hf://: only files matching GLOB "
              "(repeatable).")
@click.option("--exclude", "exclude", multiple=True, metavar="GLOB", help="From hf://: not files matching GLOB "
              "(repeatable).")
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False, exists=True), default=None, metavar="KEY",
              help="Sign it with this PEM elliptic-curve private key (model-signing format; default: "
                   "[publish] signing_key).")
@click.option("--signature", type=click.Path(dir_okay=False, exists=True), default=None, metavar="FILE",
              help="Attach a signature made elsewhere (e.g. 'model_signing sign key DIR'); it must cover exactly "
                   "these files.")
@click.option("--companion-of", "companion_of_ref", metavar="NAME@VERSION",
              help="Publish DIR as a companion artefact of this published version (a compile cache...), with "
                   "--kind and --key instead of --name and --version.")
@click.option("--kind", "kind", metavar="KIND", help="The companion's kind, e.g. compile-cache ([a-z0-9-]).")
@click.option("--key", "key", metavar="KEY", help="What makes the companion valid: engine version, GPU type, TP "
              "size... ([A-Za-z0-9._-]+, e.g. vllm-0.8.4-h100-tp8).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def publish(app: AppContext, directory: str, name: str | None, version_label: str | None, include: tuple[str, ...],
            exclude: tuple[str, ...], sign_key: str | None, signature: str | None, companion_of_ref: str | None,
            kind: str | None, key: str | None, as_json: bool) -> None:
    """Copy a checkpoint (a directory, an HF cache snapshot, or a Hugging Face Hub repository) into cold storage.

    Example: weightd publish ./llama-8b --name acme/llama-8b --version v1 --sign /etc/weightd/signing-key.pem

    From a Hugging Face Hub (HF_ENDPOINT, HF_TOKEN): weightd publish hf://meta-llama/Llama-3.1-8B@main
    --exclude 'original/*' (every file checked against the Hub's sha256/sha1 before it is published).

    From an OCI registry (a ModelPack artifact another tool pushed; every blob checked by its sha256):
    weightd publish oci://registry.internal/models/llama:v1 --name acme/llama --version v1

    A companion artefact (a vLLM / torch.compile / Triton cache) is tied to a version and a key:
    weightd publish ~/.cache/vllm/torch_compile_cache --companion-of acme/llama-8b@v1 --kind compile-cache
    --key vllm-0.8.4-h100-tp1
    """
    from tiering import validate_name, validate_version
    if sign_key and signature:
        raise click.UsageError("give --sign or --signature, not both")
    if directory.startswith("hf://"):
        if companion_of_ref is not None or kind or key:
            raise click.UsageError("--companion-of, --kind and --key publish a directory, not hf://")
        from .hf_import import publish_from_hub
        r, name, version = publish_from_hub(app, directory, name, version_label, include, exclude,
                                            os.path.abspath(sign_key) if sign_key else None,
                                            os.path.abspath(signature) if signature else None)
        output.emit_json("publish", r) if as_json else output.show_published(r, name, version)
        return
    if directory.startswith("oci://"):
        if companion_of_ref is not None or kind or key or include or exclude:
            raise click.UsageError("--companion-of, --kind, --key, --include and --exclude do not apply to oci://")
        r, name, version_label = _publish_artifact(app, directory, name, version_label, sign_key, signature)
        output.emit_json("publish", r) if as_json else output.show_published(r, name, version_label)
        return
    if include or exclude:
        raise click.UsageError("--include and --exclude select files of an hf:// repository")
    click.Path(file_okay=False).convert(directory, None, click.get_current_context())  # (as the argument's type did)
    companion = None
    if companion_of_ref is not None:
        if name is not None or version_label is not None or signature:
            raise click.UsageError("--companion-of takes --kind and --key (and --sign), not --name, --version or "
                                   "--signature")
        if not kind or not key:
            raise click.UsageError("--companion-of needs --kind KIND and --key KEY")
        name, version_label = split_ref(companion_of_ref)
        if version_label is None:
            raise click.UsageError(f"--companion-of {companion_of_ref}: name the version (NAME@VERSION)")
        companion = companion_of(kind, key)
    elif kind or key:
        raise click.UsageError("--kind and --key go with --companion-of NAME@VERSION")
    if name is None or version_label is None:
        raise click.UsageError("give --name and --version (or --companion-of NAME@VERSION --kind K --key KEY)")
    validate_name(name)
    validate_version(version_label)
    with Backend(app) as b:
        r = b.publish(directory, name, version_label, sign_key=os.path.abspath(sign_key) if sign_key else None,
                      signature=os.path.abspath(signature) if signature else None, companion=companion)
    output.emit_json("publish", r) if as_json else output.show_published(r, name, r.get("version", version_label))


def _publish_artifact(app: AppContext, source: str, name: str | None, version_label: str | None,
                      sign_key: str | None, signature: str | None) -> tuple[dict[str, Any], str, str]:
    """``publish oci://REGISTRY/REPO:TAG|@sha256:...``: the artifact pulled (every blob checked by its
    sha256) into a scratch directory, then published as a directory."""
    from tiering import ArtifactRef, RegistryLocation, pull_artifact, validate_name, validate_version
    ref, cold = ArtifactRef.parse(source), app.config.settings.tiers.cold
    name, version_label = name or ref.default_name(), version_label or ref.default_version()
    validate_name(name)
    validate_version(version_label)
    # (the cold tier's own registry: its insecure setting applies; its ca_file to any registry)
    same = bool(cold.url and cold.url.startswith("oci://")) and RegistryLocation.parse(cold.url).host == ref.host
    with pull_artifact(source, insecure=same and cold.insecure, ca_file=cold.ca_file) as art, Backend(app) as b:
        r = b.publish(str(art.dir), name, version_label, sign_key=os.path.abspath(sign_key) if sign_key else None,
                      signature=os.path.abspath(signature) if signature else None)
    return r, name, version_label


@cli.command()
@click.argument("ref", metavar="NAME[@VERSION]", required=False)
@click.option("--tier", type=click.Choice(["hot", "warm"]), default="hot", show_default=True)
@click.option("--strict", is_flag=True, help="Fail (exit 6) instead of falling back to warm when hot is full.")
@click.option("--lease", "lease_s", cls=LeaseOption, type=Seconds(), metavar="S",
              help="Keep it from eviction for S seconds (0: no lease; at most 7 days).")
@click.option("--timeout", "timeout_s", type=Seconds(), metavar="S",
              help="Give up after S seconds (exit 4; at most 7 days).")
@click.option("--wait", is_flag=True, help="If the version is not published yet, wait for it (until --timeout).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON document (its 'path' is "
              "where the checkpoint is).")
@selection_options
@click.option("--companion-dir", "companion_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="With --with: copy the companion into DIR (the path the engine expects, e.g. "
                   "~/.cache/vllm/torch_compile_cache), as this user.")
@click.option("--set", "set_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Preload every model FILE lists (one NAME[@VERSION] a line, or TOML models = [...]) as one "
                   "operation: fanned out at once, one summary (LoRA adapters; hot by default).")
@click.pass_obj
def preload(app: AppContext, ref: str | None, tier: str, strict: bool, lease_s: float | None, timeout_s: float | None,
            wait: bool, as_json: bool, include: tuple[str, ...], exclude: tuple[str, ...], layers: str | None,
            tp_rank: str | None, whole: bool, with_kind: str | None, companion_key: str | None,
            companion_dir: str | None, set_file: str | None, experts: str | None = None) -> None:
    """Make a checkpoint local, verified and ready; the last stdout line is its path (without --json).

    A partial copy: --include/--exclude GLOB, --layers A-B, --tp-rank R/N (its own object, NAME/V~p<hex>);
    --experts R/N: an expert-parallel rank's repacked copy (NAME/V~e<R>of<N>).
    A companion: --with compile-cache --key K [--companion-dir DIR]. A set: --set FILE.
    """
    kw: dict[str, Any] = {"tier": tier, "strict": strict, "timeout_s": timeout_s, "wait": wait}
    if lease_s is not None:  # else the service's default, tiering.DEFAULT_LEASE_S
        kw["lease_s"] = lease_s
    if set_file is not None:
        if ref is not None or with_kind or companion_dir:
            raise click.UsageError("--set FILE preloads what FILE lists: no NAME, --with or --companion-dir with it")
        from ..node.sets import read_set_file
        refs = read_set_file(set_file)
        kw.update(selection_body(include, exclude, layers, tp_rank, whole, experts))
        kw.pop("wait")
        with Backend(app) as b:
            r = b.preload_set(refs, **kw)
        output.emit_json("preload-set", r) if as_json else output.show_set(r, set_file)
        failed = r.get("failed") or []
        if failed:
            raise SystemExit(failed[0].get("exit_code") or 1)
        return
    if ref is None:
        raise click.UsageError("give NAME[@VERSION] (or --set FILE)")
    split_ref(ref)
    comp = companion_of(with_kind, companion_key)
    if companion_dir is not None and comp is None:
        raise click.UsageError("--companion-dir goes with --with KIND --key KEY")
    kw.update(selection_body(include, exclude, layers, tp_rank, whole, experts))
    dest = None
    if companion_dir is not None:   # refused before anything is fetched (a planted symlink, another uid's)
        from ..node.companion import open_dest
        dest = open_dest(companion_dir)
    with Backend(app) as b:
        r = b.preload(ref, **kw)
        if comp is not None:  # the same version, now resolved: its companion into the same tier
            ckw = {k: v for k, v in kw.items() if k not in ("selection", "whole", "wait")}
            c = b.preload(f"{r['name']}@{r['part_of']['version'] if r.get('part_of') else r['version']}",
                          companion=comp, **ckw)
            if dest is not None:
                from ..node.companion import install
                with dest:
                    c["installed"] = install(c["path"], dest)
            r["companions"] = [c]
    output.warn_fallbacks(r)
    if as_json:
        output.emit_json("preload", r, compact=True)
        return
    for c in r.get("companions", []):
        output.note(output.companion_line(c))
    output.show_preloaded(r)

