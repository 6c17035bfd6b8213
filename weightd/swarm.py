"""Wires P2P into the node: torrents at publish, the swarm as a preload source, seeding what is held.

- ``publish``: a checkpoint at or above ``[p2p] threshold`` gets ``.weightd/checkpoint.torrent`` in
  cold storage, made from the published files and checked against the manifest.
- ``P2PFetcher`` is a ``LocalNode`` fetcher: for a P2P-sized version it downloads from the swarm
  (starting at ``[p2p] peers``, the origin; workers find each other by peer exchange) into staging, and
  the node then verifies every file against the manifest and publishes atomically as for any source.
  If no peer delivers for ``fallback_after_s`` it gives up and the node copies from cold instead.
- Seeding: a worker seeds every complete version it holds; the origin every published one.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from p2p import P2PError, TorrentRejected, TransferStalled
from p2p import P2PConfig, P2PSession
from p2p import TORRENT_RELPATH, load_torrent, make_torrent
from tiering import DeltaPlan
from tiering import prefill_delta
from tiering import TieringError
from tiering import COLD, DIR_MODE, LOCAL_TIERS, StagingArea, VersionDir
from tiering import Dir, check_unchangeable, open_cold_root
from tiering import scan_dir
from tiering import LocalNode
from tiering import FetchRequest, FetchResult, SourceFallback

from .config import Config

log = logging.getLogger(__name__)


def p2p_config(cfg: Config) -> P2PConfig:
    p = cfg.settings.p2p
    return P2PConfig(p.listen, p.upload_limit, p.download_limit, p.allow, p.max_connections, p.peers, p.trackers)


def ensure_torrent(cfg: Config, version: VersionDir) -> Path | None:
    """Make the torrent of a published version at or above the threshold (idempotent). Written by
    descriptor beneath cold storage (publish is the one writer of cold); the version must be plain
    files (no symlink in it is ever handed to libtorrent, which would follow it)."""
    if version.size < cfg.settings.p2p.threshold:
        return None
    path = version.path / TORRENT_RELPATH
    meta, _, fname = TORRENT_RELPATH.rpartition("/")
    with _open_version(version) as vdir:
        if vdir is None:
            raise P2PError(f"{version.ref}: cold storage is gone")
        if vdir.is_file(TORRENT_RELPATH):
            return path
        check_seedable(version)  # libtorrent hashes by path: nothing in it may be swapped for a link
        try:
            data = make_torrent(version.path, version.manifest, piece_size=cfg.settings.p2p.piece_size or None)
        except RuntimeError as exc:  # libtorrent's errors stop here (a file vanished or changed while hashed)
            raise P2PError(f"{version.ref}: cannot make its torrent: {exc}") from None
        load_torrent(data, version.manifest, str(path))  # what we publish must pass our own checks
        with vdir.sub(meta, create=True, mode=DIR_MODE) as mdir:
            mdir.write_atomic(fname, data, 0o644)
    return path


def read_torrent(version: VersionDir):
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


@contextmanager
def _open_version(version: VersionDir) -> Iterator[Dir | None]:
    """A version's directory by descriptor: its tier root by path (the configured one), then
    NAME/VERSION beneath it without following anything."""
    root_path = version.path.parents[version.name.count("/") + 1]
    root = open_cold_root(root_path)
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


class P2PFetcher:
    def __init__(self, cfg: Config, session: P2PSession | None = None) -> None:
        self.cfg = cfg
        self._session = session
        self.own_session = session is None

    @property
    def session(self) -> P2PSession:
        if self._session is None:  # in-process CLI use: a session for this download only
            self._session = P2PSession(p2p_config(self.cfg))
        return self._session

    def close(self) -> None:
        if self.own_session and self._session is not None:
            self._session.close()
            self._session = None

    def fetch(self, request: FetchRequest) -> FetchResult:
        src, staging, deadline, delta = request.source, request.staging, request.deadline, request.delta
        p = self.cfg.settings.p2p
        if src.size < p.threshold or not p.peers:
            return FetchResult(False)
        try:
            ti = read_torrent(src)
        except TorrentRejected as exc:
            log.warning("not using P2P for %s: %s", src.ref, exc)
            return FetchResult(False, fallback=SourceFallback("p2p", "cold", str(exc)))
        if ti is None:
            return FetchResult(False)
        # the torrent's root is the version label: libtorrent writes under staging/<version>/ (a
        # directory weightd made inside its own staging area, which no one else can write)
        staging.mark_resumable()
        inner = staging.dir.sub(src.version, create=True, mode=DIR_MODE)
        try:
            if delta is not None:
                # donor bytes at their new offsets: libtorrent's check passes their pieces, only the rest moves
                # (a donor that rotted just fails its pieces, which are then downloaded)
                prefill_delta(delta, inner, deadline=deadline)
            try:
                result = self.session.download(ti, staging.path / src.version, peers=p.peers,
                                               stall_s=p.fallback_after_s,
                                               timeout_s=None if deadline is None else max(1.0, deadline - time.monotonic()),
                                               progress=request.progress)
            except (TransferStalled, P2PError) as exc:
                log.warning("P2P download of %s failed, copying from cold instead: %s", src.ref, exc)
                inner.close()
                inner = None
                staging.dir.remove(src.version)
                return FetchResult(False, fallback=SourceFallback("p2p", "cold", str(exc)))
            # durable before it is renamed into place, as copies are: libtorrent does not fsync
            inner.fsync_tree(files=True)
            for child, _ in inner.entries():  # move the files up into the staging directory itself
                if child == ".pad":
                    inner.remove(child)
                    continue
                inner.rename(child, staging.dir, child)
        finally:
            if inner is not None:
                inner.close()
        staging.dir.remove(src.version)
        origin, peers = result.split({e.rpartition(":")[0] for e in p.peers})
        return FetchResult(True, {"origin": origin, "peer": peers, "local_reuse": result.local_bytes})


def check_seedable(version: VersionDir) -> None:
    """libtorrent reads what it seeds by path and follows links. Hand it a version in cold storage only
    if it is plain files and no one but root or weightd's user can change its directories (so no file
    can be swapped for a link to a host file after this check); else UnsafePath naming the reason."""
    root_path = version.path.parents[version.name.count("/") + 1]
    root = open_cold_root(root_path)
    if root is None:
        raise TieringError(f"{root_path}: cold storage is gone")
    with root:
        check_unchangeable(root, version.rel)
        with root.sub(version.rel) as vdir:
            scan_dir(vdir)  # refuses a symlink or a special file, naming it


def seed_held(node: LocalNode, session: P2PSession, role: str, super_seed: bool = False) -> int:
    # super-seeding stays off: with v2-only torrents libtorrent 2.1.1 delivered nothing in it (0 bytes in 8 s)
    """Seed every complete version this node holds (workers: from its checked tier roots) or has
    published (origin: only versions that pass check_seedable)."""
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
            session.seed(ti, v.path, super_seed=role == "origin" and super_seed)
            n += 1
    return n


__all__ = ["P2PFetcher", "ensure_torrent", "p2p_config", "seed_held", "COLD"]
