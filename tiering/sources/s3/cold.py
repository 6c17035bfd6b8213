""":class:`ObjectCold`: an S3 bucket (and prefix) as the cold tier, the one object the tier code holds
(``TierRoots.cold_store``, ``VersionDir.store``). Its calls are the catalog's, the ranged reads' and
publishing's, on its own client."""

from __future__ import annotations

from typing import Any, Callable

from ...content.manifest import Manifest
from ...layout import VersionDir
from ...progress import ProgressFn
from ...safefs import Dir
from ..ranged.fetch import fetch as ranged_fetch
from . import catalog
from . import publish as publishing
from .client import OBJECT_MANIFEST_LIMIT, S3Client, deadline_of
from .ranged import ObjectRanges


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
        """``m``'s files by ranged GETs (:func:`tiering.sources.ranged.fetch.fetch`), within ``deadline``
        and the deadline this thread works for."""
        return ranged_fetch(ObjectRanges(self), m, dest, deadline=deadline_of(deadline), progress=progress, skip=skip,
                            have=have, crypto=crypto, digests=digests)

    # publish(src, m, files, *, progress, extra, before_manifest, crypto, signed) -> bool (see .publish)
    publish = publishing.publish

    def _claim(self, key: str, name: str, version: str) -> None:
        publishing.claim(self, key, name, version)
