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
import os
import shutil
import tempfile
import time
from pathlib import Path

from p2p.errors import P2PError, TorrentRejected, TransferStalled
from p2p.session import P2PConfig, P2PSession
from p2p.torrent import TORRENT_RELPATH, load_torrent, make_torrent
from tiering.delta import DeltaPlan
from tiering.delta import prefill as prefill_delta
from tiering.layout import COLD, LOCAL_TIERS, VersionDir, list_versions
from tiering.node import LocalNode, PreloadReport

from .config import Config

log = logging.getLogger(__name__)


def p2p_config(cfg: Config) -> P2PConfig:
    p = cfg.settings.p2p
    return P2PConfig(p.listen, p.upload_limit, p.download_limit, p.allow, p.max_connections, p.peers, p.trackers)


def ensure_torrent(cfg: Config, version: VersionDir) -> Path | None:
    """Make the torrent of a published version at or above the threshold (idempotent)."""
    if version.size < cfg.settings.p2p.threshold:
        return None
    path = version.path / TORRENT_RELPATH
    if path.is_file():
        return path
    try:
        data = make_torrent(version.path, version.manifest, piece_size=cfg.settings.p2p.piece_size or None)
    except RuntimeError as exc:  # libtorrent's errors stop here (a file vanished or changed while hashed)
        raise P2PError(f"{version.ref}: cannot make its torrent: {exc}") from None
    load_torrent(data, version.manifest, str(path))  # what we publish must pass our own checks
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".torrent.", suffix=".incomplete")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def read_torrent(version: VersionDir):
    path = version.path / TORRENT_RELPATH
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return load_torrent(data, version.manifest, str(path))


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

    def __call__(self, src: VersionDir, staging: Path, report: PreloadReport, deadline: float | None,
                 progress, delta: DeltaPlan | None = None) -> bool:
        p = self.cfg.settings.p2p
        if src.size < p.threshold or not p.peers:
            return False
        try:
            ti = read_torrent(src)
        except TorrentRejected as exc:
            log.warning("not using P2P for %s: %s", src.ref, exc)
            return False
        if ti is None:
            return False
        target = staging / src.version  # the torrent's root is the version label
        if delta is not None:
            # donor bytes at their new offsets: libtorrent's check passes their pieces, only the rest moves
            # (a donor that rotted just fails its pieces, which are then downloaded)
            prefill_delta(delta, target, deadline=deadline)
        try:
            result = self.session.download(ti, target, peers=p.peers, stall_s=p.fallback_after_s,
                                           timeout_s=None if deadline is None else max(1.0, deadline - time.monotonic()),
                                           progress=progress)
        except (TransferStalled, P2PError) as exc:
            log.warning("P2P download of %s failed, copying from cold instead: %s", src.ref, exc)
            report.fallback = f"p2p: {exc}; copied from cold instead"
            shutil.rmtree(target, ignore_errors=True)
            return False
        for child in target.iterdir():  # move the files up into the staging directory itself
            os.rename(child, staging / child.name)
        target.rmdir()
        shutil.rmtree(staging / ".pad", ignore_errors=True)
        origin, peers = result.split({e.rpartition(":")[0] for e in p.peers})
        report.bytes_by_source["origin"] += origin
        report.bytes_by_source["peer"] += peers
        report.bytes_by_source["local_reuse"] += result.local_bytes
        return True


def seed_held(node: LocalNode, session: P2PSession, role: str, super_seed: bool = False) -> int:
    # super-seeding stays off: with v2-only torrents libtorrent 2.1.1 delivered nothing in it (0 bytes in 8 s)
    """Seed every complete version this node holds (workers) or has published (origin)."""
    n = 0
    roots = [node.cold] if role == "origin" else [node.tiers[t].path for t in LOCAL_TIERS]
    for root in roots:
        for v in list_versions(root):
            cold = v if role == "origin" else _cold_twin(node, v)
            if cold is None:
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


def _cold_twin(node: LocalNode, v: VersionDir) -> VersionDir | None:
    from tiering.layout import read_version
    return read_version(node.cold, v.name, v.version)


__all__ = ["P2PFetcher", "ensure_torrent", "p2p_config", "seed_held", "COLD"]
