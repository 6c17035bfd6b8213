""":class:`ObjectCold`: an S3 bucket (and prefix) as the cold tier, the one object the tier code holds
(``TierRoots.cold_store``, ``VersionDir.store``). Its calls are the catalog's, the ranged reads' and
publishing's, on its own client."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...content.manifest import FileEntry, Manifest
from ...layout import VersionDir
from ...progress import ProgressFn
from ...safefs import Dir
from . import catalog, publish, ranged
from .client import OBJECT_MANIFEST_LIMIT, S3Client


class ObjectCold(S3Client):
    """A cold tier in object storage. Thread-safe; one per node."""
    # fetch() can take every file's whole-file digest (a signature's SHA-256) as the ranges arrive
    takes_digests = True

    def read_manifest(self, name: str, version: str, *, deadline: float | None = None) -> Manifest | None:
        return catalog.read_manifest(self, name, version, deadline=deadline)

    def version_dir(self, name: str, version: str) -> VersionDir | None:
        """NAME@VERSION as the tier code sees a published version (see :func:`catalog.as_version_dir`)."""
        m = catalog.read_manifest(self, name, version)
        return None if m is None else catalog.as_version_dir(self, m)

    def as_version_dir(self, m: Manifest) -> VersionDir:
        return catalog.as_version_dir(self, m)

    def read_meta(self, name: str, version: str, rel: str, limit: int = OBJECT_MANIFEST_LIMIT) -> bytes | None:
        return catalog.read_meta(self, name, version, rel, limit)

    def put_meta_if_absent(self, name: str, version: str, rel: str, data: bytes) -> bool:
        return catalog.put_meta_if_absent(self, name, version, rel, data)

    def names(self) -> list[str]:
        return catalog.names(self)

    def versions(self, name: str) -> list[str]:
        return catalog.versions(self, name)

    def fetch(self, m: Manifest, dest: Dir, *, deadline: float | None = None, progress: ProgressFn | None = None,
              skip: set[str] | None = None, have: dict[str, set[str]] | None = None,
              crypto: Callable[[], Any] | None = None, digests: dict[str, str] | None = None) -> int:
        return ranged.fetch(self, m, dest, deadline=deadline, progress=progress, skip=skip, have=have,
                            crypto=crypto, digests=digests)

    def _fetch_group(self, f: FileEntry, key: str, fd: int, group: ranged.Group, obj: ranged.ObjectVersion,
                     deadline: float | None, progress: ProgressFn | None) -> int:
        return ranged.fetch_group(self, f, key, fd, group, obj, deadline, progress)

    def publish(self, src: Path, m: Manifest, files: list[tuple[str, Any]], *, progress: ProgressFn | None = None,
                extra: dict[str, bytes] | None = None, before_manifest: Callable[[], None] | None = None,
                crypto: Callable[[], Any] | None = None,
                signed: Callable[[dict[str, str]], dict[str, bytes]] | None = None) -> bool:
        return publish.publish(self, src, m, files, progress=progress, extra=extra, before_manifest=before_manifest,
                               crypto=crypto, signed=signed)

    def _claim(self, key: str, name: str, version: str) -> None:
        publish.claim(self, key, name, version)
