"""An import from the Hugging Face Hub into cold storage, as ``weightd publish hf://`` (the CLI's process
downloads, :mod:`weightd.cli.hf_import`) and intent's ``[[import]]`` entries (the origin's daemon downloads,
:mod:`weightd.daemon.intent_import`) both run it: resolve the revision to its commit SHA (one request),
stop there when ``NAME@<that SHA>`` is published already, else download and check every file
(``tiering.sources.hf``), publish exactly the checked files, and empty the download cache.

The caller says how to ask cold storage (``published``) and how to publish (``publish``): through the
daemon or in its own process, with the checks that caller owes (the daemon's read-permission check of
a caller's files, the inode checks of :class:`tiering.sources.hf.HubSnapshot`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

Note = Callable[[str], None]


def open_lock(cache: Path | None, repo_dir: str, *, dir_fd: int | None = None) -> int:
    """The open lock file of the repository whose downloads are ``cache/endpoint-*/REPO_DIR``
    (``models--ORG--REPO``): ``cache/REPO_DIR.lock`` (or in the directory ``dir_fd``), 0600, never
    through a symlink. It is never removed (an import blocked on the removed file's lock and one on a
    new file would both run)."""
    where = f"{repo_dir}.lock" if dir_fd is not None else Path(cache or ".") / f"{repo_dir}.lock"
    return os.open(where, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)


@contextmanager
def repo_lock(cache: Path, repo_id: str, note: Note) -> Iterator[None]:
    """One import of a repository at a time per cache: the next waits (and says so), because an import
    that ends removes the repository's downloads, which another one may be using."""
    fd = open_lock(cache, "models--" + repo_id.replace("/", "--"))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            note(f"hf://{repo_id}: another import of it is running here (or gc is removing an old download of it); "
                 f"waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def default_label(commit: str, include: Sequence[str], exclude: Sequence[str]) -> str:
    """The version label of an import: the commit SHA, or with --include/--exclude the SHA and 8 hex of
    the selection (``<sha>-1a2b3c4d``), so one label is one commit and one selection of its files."""
    if not include and not exclude:
        return commit
    sel = json.dumps([list(include), list(exclude)], separators=(",", ":")).encode()
    return f"{commit}-{hashlib.sha256(sel).hexdigest()[:8]}"


def published_report(rows: Sequence[Mapping[str, Any]], name: str, version: str,
                     cold_path: str) -> dict[str, Any] | None:
    """NAME@VERSION's publish report from a listing's rows (``weightd ls``) if it is published, as
    publishing the same content again reports it (``unchanged``); else None."""
    row = next((r for r in rows if r["version"] == version and r.get("published")), None)
    if row is None:
        return None
    return {"name": name, "version": version, "path": f"{cold_path.rstrip('/')}/{name}/{version}",
            "digest": row["digest"], "bytes": row["bytes"], "unchanged": True, "seconds": 0.0, "signed_by": None,
            "signed": bool(row.get("signed"))}


def cold_location(settings: Any) -> str:
    """Where cold storage is, as a publish report names it (a path, or the object store's URL)."""
    cold = settings.tiers.cold
    return cold.url if cold.url else str(cold.path)


def import_from_hub(source: str, cache: Callable[[], Path], *, name: str | None, version_label: str | None,
                    include: Sequence[str], exclude: Sequence[str],
                    published: Callable[[str, str], dict[str, Any] | None],
                    publish: Callable[[Any, str, str], dict[str, Any]], note: Note,
                    progress_bars: bool = False,
                    cancelled: Callable[[], bool] = lambda: False) -> tuple[dict[str, Any], str, str]:
    """Import ``source`` (hf://ORG/REPO[@REVISION]) into cold storage through ``publish(snapshot, name,
    version)``; returns (publish report with a ``source`` section, name, version). Under the default
    label (:func:`default_label`: the commit and the selection) a version ``published(name, version)``
    finds is not downloaded again; a label given by the caller may name other content, which the publish
    then refuses (VersionConflict). ``cache()`` is asked for the download directory once the reference
    and names are checked; ``cancelled()`` between the steps (resolve, download, publish)."""
    from tiering import (discard_snapshot, fetch_snapshot, format_bytes, parse_hub_ref, resolve_commit,
                         validate_name, validate_version)
    ref = parse_hub_ref(source)
    name = name or ref.repo_id
    validate_name(name)
    if version_label is not None:
        validate_version(version_label)
    where = cache()
    with repo_lock(where, ref.repo_id, note):
        _check(cancelled, ref)
        commit = resolve_commit(ref, note=note)
        version = version_label or default_label(commit, include, exclude)
        done = published(name, version) if version_label is None else None
        if done is not None:
            note(f"{ref}: commit {commit} is published as {name}@{version} already: nothing to download")
            done["source"] = {"url": str(ref), "repo": ref.repo_id, "revision": ref.revision, "commit": commit,
                              "downloaded": 0}
            return done, name, version
        _check(cancelled, ref)
        snap = fetch_snapshot(ref, where, include=include, exclude=exclude, note=note,
                              progress_bars=progress_bars, commit=commit)
        _check(cancelled, ref)
        note(f"{ref}: commit {snap.commit}, {len(snap.files)} file(s) ({format_bytes(snap.size)}) match the "
             f"Hub's hashes; publishing {name}@{version}")
        r = publish(snap, name, version)
        discard_snapshot(snap)
    r["source"] = {"url": str(ref), "repo": ref.repo_id, "revision": ref.revision, "commit": snap.commit,
                   "files": len(snap.files), "bytes": snap.size,
                   "lfs_files": sum(1 for f in snap.files if f.sha256 is not None)}
    return r, name, r.get("version", version)


def _check(cancelled: Callable[[], bool], ref: Any) -> None:
    if cancelled():
        from tiering import TieringError
        raise TieringError(f"{ref}: the import was called off (its entry removed, or the daemon stopping)")


__all__ = ["cold_location", "default_label", "import_from_hub", "open_lock", "published_report", "repo_lock"]
