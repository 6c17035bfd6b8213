"""Where things live in a tier (design §3, contract).

``<root>/<NAME>/<VERSION>/`` holds a complete, verified checkpoint and its ``.weightd/manifest.json``;
``<root>/.staging/`` holds work in progress, ``<root>/.trash/`` what is being deleted, and
``<root>/.locks/`` the lock files. A version directory only ever appears by ``rename`` from staging.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointNotFound, ManifestError
from .manifest import MANIFEST_RELPATH, Manifest, load_manifest
from .names import validate_name, validate_version

STAGING = ".staging"
TRASH = ".trash"
LOCKS = ".locks"
HOT, WARM, COLD = "hot", "warm", "cold"
LOCAL_TIERS = (HOT, WARM)


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier's place and budget (resolved from the config by the control plane)."""
    name: str
    path: Path
    capacity_bytes: int | None = None        # absolute budget, or ...
    capacity_fraction: float | None = None   # ... a share of the tier's file system
    high_watermark: float = 0.95
    low_watermark: float = 0.85

    def capacity(self) -> int:
        if self.capacity_bytes is not None:
            return self.capacity_bytes
        st = os.statvfs(existing_ancestor(self.path))
        return int(st.f_blocks * st.f_frsize * (self.capacity_fraction if self.capacity_fraction is not None else 1.0))


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest existing parent (for statvfs of a tier not created yet)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


@dataclass(frozen=True, slots=True)
class VersionDir:
    name: str
    version: str
    path: Path
    manifest: Manifest

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def size(self) -> int:
        return self.manifest.total_bytes


def version_path(root: Path, name: str, version: str) -> Path:
    validate_name(name)
    validate_version(version)
    return root / name / version


def lock_name(name: str, version: str | None = None) -> str:
    base = name.replace("/", "--")
    return f"{base}@{version}.lock" if version else f"{base}.lock"


def read_version(root: Path, name: str, version: str) -> VersionDir | None:
    """The complete version at ``root/NAME/VERSION``, or None. A broken manifest reads as absent."""
    path = version_path(root, name, version)
    mpath = path / MANIFEST_RELPATH
    try:
        m = load_manifest(mpath)
    except CheckpointNotFound:
        return None
    except ManifestError:
        return None
    if m.name != name or m.version != version:
        return None
    return VersionDir(name, version, path, m)


def list_versions(root: Path) -> list[VersionDir]:
    """Every complete version under a tier root (``NAME`` may be ``org/model``)."""
    out: list[VersionDir] = []
    if not root.is_dir():
        return out

    def consider(parts: list[str], path: Path) -> bool:
        if not (path / MANIFEST_RELPATH).is_file():
            return False
        name, version = "/".join(parts[:-1]), parts[-1]
        try:
            v = read_version(root, name, version)
        except Exception:  # names outside the patterns are not ours
            v = None
        if v is not None:
            out.append(v)
        return True

    for a in sorted(root.iterdir()):
        if a.name.startswith(".") or not a.is_dir() or a.is_symlink():
            continue
        for b in sorted(a.iterdir()):
            if not b.is_dir() or b.is_symlink():
                continue
            if consider([a.name, b.name], b):
                continue
            for c in sorted(b.iterdir()):
                if c.is_dir() and not c.is_symlink():
                    consider([a.name, b.name, c.name], c)
    return out


RESUMABLE_MAX_AGE_S = 24 * 3600


def new_staging_dir(root: Path, name: str, version: str, expected_bytes: int, *,
                    resumable: bool = False) -> tuple[Path, Path]:
    """A ``.staging/<id>/`` plus its lock file path. ``<id>.json`` beside it records the expected size,
    so concurrent reservations see it; nothing weightd-internal goes inside the directory that will be
    renamed into place.

    ``resumable``: the id is fixed per NAME@VERSION (callers hold the version's lock), so what a crashed
    transfer left behind is found again and a P2P download re-checks it instead of starting over.
    """
    staging = root / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    base = f"{name.replace('/', '--')}@{version}"
    sid = f"{base}.resumable" if resumable else f"{base}.{uuid.uuid4().hex[:12]}"
    d = staging / sid
    info = staging / f"{sid}.json"
    created = time.time()
    if resumable and d.is_dir():
        try:
            created = float(json.loads(info.read_text()).get("created", created))
        except (OSError, ValueError, AttributeError):
            pass
    d.mkdir(exist_ok=resumable)
    info.write_text(json.dumps({"name": name, "version": version, "bytes": expected_bytes, "pid": os.getpid(),
                                "resumable": resumable, "created": created}))
    return d, staging / f"{sid}.lock"


def staging_keep(info: Path, now: float | None = None) -> bool:
    """Should a stale (unlocked) staging area be kept for a later resume?"""
    try:
        meta = json.loads(info.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or not meta.get("resumable"):
        return False
    age = (now or time.time()) - float(meta.get("created", 0))
    return age < RESUMABLE_MAX_AGE_S


def staging_entries(root: Path) -> list[tuple[Path, Path, Path]]:
    """(dir, info json, lock file) of every staging area under ``root``."""
    staging = root / STAGING
    if not staging.is_dir():
        return []
    ids = {p.name.rsplit(".", 1)[0] if p.suffix in (".json", ".lock") else p.name for p in staging.iterdir()}
    return [(staging / i, staging / f"{i}.json", staging / f"{i}.lock") for i in sorted(ids)]


def staging_expected_bytes(info: Path) -> int:
    try:
        return int(json.loads(info.read_text())["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def remove_tree(root: Path, path: Path) -> None:
    """Make ``path`` disappear at once (rename into ``.trash``), then delete it."""
    trash = root / TRASH
    trash.mkdir(parents=True, exist_ok=True)
    target = trash / f"{path.name}.{uuid.uuid4().hex[:12]}"
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
    shutil.rmtree(target, ignore_errors=True)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune_empty_parents(root: Path, path: Path) -> None:
    """Remove empty NAME directories left after a version is gone (never ``root`` itself)."""
    p = path.parent
    while p != root and root in p.parents:
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent
