"""``weightd publish hf://ORG/REPO[@REVISION]``: a Hugging Face Hub repository into cold storage.

This process downloads (``tiering.sources.hf``, through ``tiering``'s surface: resolve the revision to
its commit SHA once, list the Hub's hashes, download in parallel and resumably, check every file),
then publishes the verified snapshot exactly as ``weightd publish DIR`` does, through
:class:`~weightd.cli.tiers.Backend` (the daemon when one answers, else in-process), by the steps of
:func:`weightd.node.hub_import.import_from_hub`. The CLI downloads, not the daemon: the caller's token
stays in the caller's environment (never sent to the daemon), the caller's network and ``HF_ENDPOINT``
apply, and the daemon's part is the publish it already does (atomic, checked, its read-permission check
on the caller's files). (Intent's ``[[import]]`` entries are the daemon's own imports, with its own
environment: :mod:`weightd.daemon.intent_import`.)

The download cache is ``STATE_DIR/imports/hf`` (an HF cache per endpoint:
``endpoint-<hash>/models--ORG--REPO/blobs``), or ``~/.cache/weightd/hf`` for a user who may not write
the state directory (or a read-only one); either must be a real 0700 directory of this user's. An
interrupted import leaves it there, and the next one resumes (gc removes one under ``STATE_DIR/imports/hf``
once idle for a day: :mod:`weightd.node.import_gc`; the home cache is the user's); a published import is
removed from it,
and so are bytes that fail their hash (that file's only). Only the files this import checked are published
(``_publish_checked``). Imports of one repository take turns (:func:`weightd.node.hub_import.repo_lock`),
as that removal would pull the files from under another one.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from ..errors import EXIT_NOT_FOUND
from . import output
from .app import AppContext
from .tiers import Backend


def cache_dir(app: AppContext) -> Path:
    """Where the download goes: ``STATE_DIR/imports/hf`` when this user owns the state directory (the
    daemon's user, whose intent imports share it; or it is not there yet), else ``~/.cache/weightd/hf`` (root running the CLI
    on a node must not leave a root-owned cache in the daemon's way); a real 0700 directory of this
    user's either way (:func:`tiering.private_dir`: a symlink, another user's or one open to others is
    exit 2)."""
    from tiering import private_dir
    state = Path(app.config.settings.state_dir)
    places = [Path.home() / ".cache" / "weightd" / "hf"]
    try:
        owner = os.stat(state).st_uid
    except OSError:
        owner = os.geteuid()   # (not there yet: this command makes it, as any in-process command does)
    if owner == os.geteuid():
        places.insert(0, state / "imports" / "hf")
    for d in places:
        try:
            d = private_dir(d)
        except PermissionError:   # (EACCES, EROFS, ...: the next place)
            continue
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                continue
            raise
        if os.access(d, os.W_OK | os.X_OK):
            return d
    raise PermissionError(f"cannot write {' nor '.join(map(str, places))} for the download")


def _publish_checked(b: Backend, snap: Any, name: str, version: str, sign_key: str | None,
                     signature: str | None) -> dict[str, Any]:
    """Publish exactly the checked files: the snapshot pruned to them and scanned first; in this process
    the publish's scan admits only the inodes hashed (``snap.check``), and after it every file is
    compared again (a daemon's publish gets the checks before and after)."""
    gone = snap.publishable()
    if gone:
        output.note(f"{snap.ref}: {len(gone)} file(s) left in the snapshot by an earlier import removed from it "
                    f"(not selected or not checked now)")
    if b.client is not None:
        r = b.publish(str(snap.path), name, version, sign_key=sign_key, signature=signature)
    else:
        from tiering import plan_size, scan_checkpoint
        with output.progress_bar(f"publishing {name}@{version}", plan_size(scan_checkpoint(snap.path))) as advance:
            r = b.service.publish(snap.path, name, version, progress=advance, check=snap.check,
                                  sign_key=Path(sign_key) if sign_key else None,
                                  signature=Path(signature) if signature else None)
    snap.unchanged()
    return r


def publish_from_hub(app: AppContext, source: str, name: str | None, version_label: str | None,
                     include: Sequence[str], exclude: Sequence[str], sign_key: str | None,
                     signature: str | None) -> tuple[dict[str, Any], str, str]:
    """Import ``source`` (hf://ORG/REPO[@REVISION]); returns (publish report, name, version)."""
    from ..node.hub_import import cold_location, import_from_hub, published_report
    from .progress import quiet

    def published(name: str, version: str) -> dict[str, Any] | None:
        cold = app.config.settings.tiers.cold
        if not cold.url and not os.path.lexists(cold.path):
            return None   # (no store yet: the publish makes it, as a publish of a directory does)
        with Backend(app, query=True) as b:
            try:
                rows = b.ops.versions(name)["versions"]
            except Exception as exc:   # (in-process CheckpointNotFound, or the daemon's answer with its code)
                if getattr(exc, "exit_code", None) == EXIT_NOT_FOUND:
                    return None
                raise
        return published_report(rows, name, version, cold_location(app.config.settings))

    def publish(snap: Any, name: str, version: str) -> dict[str, Any]:
        with Backend(app) as b:
            return _publish_checked(b, snap, name, version, sign_key, signature)

    return import_from_hub(source, lambda: cache_dir(app), name=name, version_label=version_label, include=include,
                           exclude=exclude, published=published, publish=publish, note=output.note,
                           progress_bars=sys.stderr.isatty() and not quiet())


__all__ = ["cache_dir", "publish_from_hub"]
