"""Where things live in a tier (design §3, contract), reached only through :mod:`tiering.safefs`.

``<root>/<NAME>/<VERSION>/`` holds a complete, verified checkpoint and its ``.weightd/manifest.json``;
``<root>/.staging/`` holds work in progress, ``<root>/.trash/`` what is being deleted, and
``<root>/.locks/`` the lock files. A version directory only ever appears by ``rename`` from staging.
This module names those places (the tiers, a version's path and label, its lock file); reading the
versions there is :mod:`tiering.versions`, and telling weightd's entries from anyone else's is
:mod:`tiering.ownership`. Every function taking a root takes an open :class:`~tiering.safefs.Dir` of it
(a ``Path`` is opened for the call, as cold storage is: the configured path itself, nothing beneath
it followed).
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .content.manifest import Manifest
from .content.names import LABEL_SEP, split_label, validate_label, validate_name
from .safefs import Dir, open_cold_root

STAGING = ".staging"
TRASH = ".trash"
LOCKS = ".locks"
TIER_MARKER = ".weightd-tier"   # in a hot or warm root: "weightd made (or adopted) this tier"
HOT, WARM, COLD = "hot", "warm", "cold"
LOCAL_TIERS = (HOT, WARM)
DIR_MODE = 0o755          # NAME/ and version directories: the root's own mode is the gate


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier's place and budget (resolved from the config by the control plane)."""
    name: str
    path: Path
    capacity_bytes: int | None = None        # absolute budget, or ...
    capacity_fraction: float | None = None   # ... a share of the tier's file system
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    group: int | None = None                 # the root's group (readers such as the serving engine)

    def capacity(self) -> int:
        if self.capacity_bytes is not None:
            return self.capacity_bytes
        st = os.statvfs(existing_ancestor(self.path))
        return int(st.f_blocks * st.f_frsize * (self.capacity_fraction if self.capacity_fraction is not None else 1.0))

    @property
    def root_mode(self) -> int:
        return 0o750 if self.group is not None else 0o700


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
    path: Path          # for people and engines; never opened by weightd through this string
    manifest: Manifest
    store: Any = field(default=None, compare=False)  # the ObjectCold holding it (object storage), else None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def rel(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def size(self) -> int:
        return self.manifest.total_bytes


@contextmanager
def as_dir(root: "Dir | Path | None") -> Iterator[Dir | None]:
    """An open Dir for ``root`` for the duration of a call (the caller's own, or opened here)."""
    if root is None or isinstance(root, Dir):
        yield root
        return
    d = open_cold_root(Path(root))
    try:
        yield d
    finally:
        if d is not None:
            d.close()


def version_rel(name: str, version: str) -> str:
    """``NAME/VERSION``; VERSION may be a local object's label (``V~p<hex>``, ``V~<kind>~<key>``)."""
    validate_name(name)
    validate_label(version)
    return f"{name}/{version}"


def is_whole(v: "VersionDir") -> bool:
    """A whole published version (not a partial copy or a companion artefact)."""
    return LABEL_SEP not in v.version


def part_of(v: "VersionDir") -> str | None:
    """The version a partial copy or companion belongs to (None for a whole version)."""
    return split_label(v.version)[0] if LABEL_SEP in v.version else None


SHORT_STEM = 180   # bytes: the longest NAME@VERSION kept whole in a file name weightd derives from it (see fitted)


def fitted(stem: str, suffix: str = "", prefix: str = "") -> str:
    """``prefix + stem + suffix`` as one file name. A name part or version may take 255 bytes, and a
    file name no more (ENAMETOOLONG), so a lock, a staging area or a trash entry named after a long
    version could not be made: a stem over SHORT_STEM bytes keeps its first bytes and a hash of the
    whole, after a ``#``, which no name, version or label holds (a shortened name never equals
    another's plain one; the same stem always gives the same name). The stem is shortened alone, so
    names with different suffixes still share it (a staging area's lock is found from its name)."""
    raw = stem.encode()
    if len(raw) > SHORT_STEM:
        digest = hashlib.sha256(raw).hexdigest()[:32]
        stem = f"{raw[:SHORT_STEM - len(digest) - 1].decode(errors='ignore')}#{digest}"
    return f"{prefix}{stem}{suffix}"


def lock_name(name: str, version: str | None = None) -> str:
    base = name.replace("/", "--")
    return fitted(f"{base}@{version}" if version else base, ".lock")


def prune_empty_parents(root: Dir, rel: str) -> None:
    """Remove an empty ``org/`` left after a version is gone (never ``root`` itself)."""
    parts = rel.split("/")[:-1]
    while parts:
        parent_rel, last = "/".join(parts[:-1]), parts[-1]
        parent = root.sub_if_exists(parent_rel) if parent_rel else root
        if parent is None:
            return
        try:
            os.rmdir(last, dir_fd=parent.fd)
        except OSError:
            return
        finally:
            if parent is not root:
                parent.close()
        parts = parts[:-1]
