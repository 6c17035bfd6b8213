""":class:`OciCold`: a registry (and repository prefix) as the cold tier, the one object the tier code
holds (``TierRoots.cold_store``'s object, ``VersionDir.store``), with the same calls as the object
store's :class:`~tiering.sources.s3.cold.ObjectCold`: the catalog's, the ranged reads' and
publishing's, on its own client."""

from __future__ import annotations

from typing import Any

from ...content.manifest import Manifest
from ...errors import BadInput, CheckpointNotFound, IntegrityError
from ...layout import VersionDir
from ...progress import ProgressFn
from ...safefs import Dir
from . import catalog, layout, ranged
from . import publish as publishing
from .client import RegistryClient
from .layout import Artifact


class OciCold(RegistryClient):
    """A cold tier in an OCI registry. Thread-safe; one per node."""

    def __init__(self, url: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.pins = catalog.Pins()
        # NAME@VERSION -> (its artifact, its weightd manifest) as last read: what a fetch reads, by digest
        self._read: dict[tuple[str, str], tuple[Artifact, Manifest]] = {}

    def read_manifest(self, name: str, version: str, *, deadline: float | None = None) -> Manifest | None:
        got = catalog.read_manifest(self, name, version, deadline=deadline, pins=self.pins)
        if got is None:
            return None
        m, art = got
        self._read[(name, version)] = (art, m)
        return m

    def version_dir(self, name: str, version: str) -> VersionDir | None:
        m = self.read_manifest(name, version)
        return None if m is None else catalog.as_version_dir(self, m)

    def where(self, name: str, version: str) -> str:
        """NAME@VERSION's artifact, as a reference (``oci://REGISTRY/PREFIX/NAME:VERSION``)."""
        return f"oci://{self.location.host}/{self.location.repo(name)}:{version}"

    def as_version_dir(self, m: Manifest) -> VersionDir:
        return catalog.as_version_dir(self, m)

    def artifact(self, name: str, version: str) -> Artifact:
        """The artifact NAME@VERSION was read as (read now if it was not yet)."""
        if (name, version) not in self._read and self.read_manifest(name, version) is None:
            raise CheckpointNotFound(f"{self.url}/{self.location.repo(name)}:{version}", "the tag does not exist")
        return self._read[(name, version)][0]

    def read_meta(self, name: str, version: str, rel: str, limit: int = 64 << 20) -> bytes | None:
        return catalog.read_meta(self, name, version, rel, limit, self.artifact(name, version))

    def put_meta_if_absent(self, name: str, version: str, rel: str, data: bytes) -> bool:
        if rel != layout.TORRENT_RELPATH:
            raise BadInput(f"{self.url}: only a torrent is added beside a published version, not {rel}")
        return publishing.put_torrent_if_absent(self, name, version, data, self.artifact(name, version))

    def names(self) -> list[str]:
        return catalog.names(self)

    def versions(self, name: str) -> list[str]:
        return catalog.versions(self, name)

    def head(self, key: str) -> dict[str, Any]:
        """``NAME/VERSION/PATH``'s blob exists (``weightd doctor``'s check of a version read just before)."""
        parts = key.split("/")
        for i in (1, 2):
            got = self._read.get(("/".join(parts[:i]), parts[i] if len(parts) > i else ""))
            if got is not None:
                layer = got[0].by_path.get("/".join(parts[i + 1:]))
                if layer is None:
                    break
                repo = self.location.repo(got[1].name)
                if not publishing.has_blob(self, repo, layer.digest):
                    raise CheckpointNotFound(f"{self.url}/{repo}@{layer.digest}", "the blob is missing")
                return {"size": layer.size, "digest": layer.digest}
        raise CheckpointNotFound(f"{self.url}/{key}")

    def fetch(self, m: Manifest, dest: Dir, *, deadline: float | None = None, progress: ProgressFn | None = None,
              skip: set[str] | None = None, have: dict[str, set[str]] | None = None,
              only_wanted: bool = False) -> int:
        """``m``'s files (all of NAME@VERSION, or a partial copy's) from the blobs of the artifact its
        version was read as: every file must be that artifact's manifest's own entry (a tag moved to
        other content in between is refused). ``only_wanted``: ``have`` names the parts not wanted
        (an expert-parallel copy's ranges: no blob's sha256 is taken, each part is still checked)."""
        art = self.artifact(m.name, m.version)
        _, published = self._read[(m.name, m.version)]
        entries = {f.path: f for f in published.files}
        for f in m.files:
            if entries.get(f.path) != f:
                raise IntegrityError(f"{self.url}/{self.location.repo(m.name)}:{m.version}: {f.path} is not the file "
                                     f"the published version has (the tag was moved to other content?)")
        return ranged.fetch(self, self.location.repo(m.name), art, m, dest, deadline=deadline, progress=progress,
                            skip=skip, have=have, only_wanted=only_wanted)

    # publish(src, m, files, *, progress, extra, before_manifest, crypto, signed) -> bool (see .publish)
    publish = publishing.publish
