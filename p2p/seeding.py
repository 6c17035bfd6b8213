"""Torrents beside published versions, and what a node seeds.

- ``ensure_torrent``: a version at or above ``P2PConfig.threshold`` gets ``.weightd/checkpoint.torrent``
  in cold storage, made from the published files (only once ``check_seedable`` passed: libtorrent hashes
  by path) and checked against the manifest; with fleet TLS it carries the fleet CA.
- ``read_torrent``: that torrent, read by descriptor and checked.
- ``seed_held``: a worker seeds every complete version it holds; the origin every published one that
  passes ``check_seedable``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from tiering import DIR_MODE, LOCAL_TIERS, Dir, TieringError, VersionDir, check_unchangeable, open_cold_root, scan_dir

from .config import P2PConfig
from .errors import P2PError, TorrentRejected, map_libtorrent_errors
from .torrent import TORRENT_RELPATH, load_torrent, make_torrent

if TYPE_CHECKING:
    import libtorrent as lt

    from tiering import LocalNode

    from .session import P2PSession

log = logging.getLogger(__name__)


def ensure_torrent(config: P2PConfig, version: VersionDir) -> Path | None:
    """Make the torrent of a published version at or above the threshold (idempotent). Written by
    descriptor beneath cold storage (publish is the one writer of cold); the version must be plain
    files (no symlink in it is ever handed to libtorrent, which would follow it)."""
    if version.size < config.threshold:
        return None
    path = version.path / TORRENT_RELPATH
    meta, _, fname = TORRENT_RELPATH.rpartition("/")
    with _open_version(version) as vdir:
        if vdir is None:
            raise P2PError(f"{version.ref}: cold storage is gone")
        if vdir.is_file(TORRENT_RELPATH):
            return path
        check_seedable(version)  # libtorrent hashes by path: nothing in it may be swapped for a link
        # (libtorrent's errors stop here: a file vanished or changed while hashed)
        with map_libtorrent_errors(f"{version.ref}: cannot make its torrent"):
            data = make_torrent(version.path, version.manifest, piece_size=config.piece_size or None,
                                root_cert=config.tls.ca_pem if config.tls is not None else None)
        load_torrent(data, version.manifest, str(path))  # what we publish must pass our own checks
        with vdir.sub(meta, create=True, mode=DIR_MODE) as mdir:
            mdir.write_atomic(fname, data, 0o644)
    return path


def read_torrent(version: VersionDir) -> "lt.torrent_info | None":
    """The torrent beside a version, read by descriptor (a symlink there reads as no torrent)."""
    path = version.path / TORRENT_RELPATH
    with _open_version(version) as d:
        if d is None or d.lstat(TORRENT_RELPATH) is None:
            return None
        try:
            data = d.read_bytes(TORRENT_RELPATH)
        except (OSError, TieringError) as exc:
            raise TorrentRejected(str(path), str(exc)) from None
    return load_torrent(data, version.manifest, str(path))


def _cold_root_of(version: VersionDir) -> Path:
    return version.path.parents[version.name.count("/") + 1]


@contextmanager
def _open_version(version: VersionDir) -> Iterator[Dir | None]:
    """A version's directory by descriptor: its tier root by path (the configured one), then
    NAME/VERSION beneath it without following anything."""
    root = open_cold_root(_cold_root_of(version))
    if root is None:
        yield None
        return
    try:
        d = root.sub_if_exists(version.rel)
    except TieringError:
        d = None
    finally:
        root.close()
    try:
        yield d
    finally:
        if d is not None:
            d.close()


def check_seedable(version: VersionDir) -> None:
    """libtorrent reads what it seeds by path and follows links. Hand it a version in cold storage only
    if it is plain files and no one but root or weightd's user can change its directories (so no file
    can be swapped for a link to a host file after this check); else UnsafePath naming the reason."""
    root_path = _cold_root_of(version)
    root = open_cold_root(root_path)
    if root is None:
        raise TieringError(f"{root_path}: cold storage is gone")
    with root:
        check_unchangeable(root, version.rel)
        with root.sub(version.rel) as vdir:
            scan_dir(vdir)  # refuses a symlink or a special file, naming it


def seed_held(node: "LocalNode", session: "P2PSession", role: str, super_seed: bool = False) -> int:
    """Seed every complete version this node holds (workers: from its checked tier roots) or has
    published (origin: only versions that pass check_seedable)."""
    # super-seeding stays off: with v2-only torrents libtorrent 2.1.1 delivered nothing in it (0 bytes in 8 s)
    n = 0
    held = node.published() if role == "origin" else [v for t in LOCAL_TIERS for v in node.versions(t)]
    for v in held:
        cold = v if role == "origin" else node.published_version(v.name, v.version)
        if cold is None:
            continue
        if role == "origin":
            try:
                check_seedable(v)
            except TieringError as exc:
                log.warning("not seeding %s: %s", v.ref, exc)
                continue
        try:
            ti = read_torrent(cold)
        except TorrentRejected as exc:
            log.warning("not seeding %s: %s", v.ref, exc)
            continue
        if ti is not None and cold.manifest.digest == v.manifest.digest:
            # (False: a torrent this node's TLS setting refuses, logged by seed)
            n += session.seed(ti, v.path, super_seed=role == "origin" and super_seed)
    return n
