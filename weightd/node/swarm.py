"""The control plane's adapter to ``p2p``: builds ``P2PConfig`` from weightd's ``Config`` and re-exports.

Everything P2P (torrents at publish, the swarm as a preload source, moving files out of staging, byte
attribution, seeding what is held) lives in ``p2p`` (``fetch.py``, ``seeding.py``, ``alerts.py``); this
module only translates ``[p2p]`` settings, so the CLI and the daemon keep calling the names below with
a ``Config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from p2p import P2PConfig
from p2p import P2PFetcher as _P2PFetcher
from p2p import check_seedable, mirror_published, read_torrent, reseed, seed_copy, seed_held
from p2p import ensure_torrent as _ensure_torrent
from tiering import VersionDir

from ..config import Config

if TYPE_CHECKING:
    from p2p import P2PSession   # (a session, the piece plan and numpy load when a swarm is joined)

__all__ = ["P2PFetcher", "check_seedable", "ensure_torrent", "mirror_published", "p2p_config", "read_torrent",
           "reseed", "seed_copy",
           "seed_held"]


def p2p_config(cfg: Config, role: str = "worker") -> P2PConfig:
    """The data plane's view of ``[p2p]`` for a node of ``role`` (an origin's session also bounds what
    a peer may ask of it: ``origin_request_queue``)."""
    p = cfg.settings.p2p
    return P2PConfig(listen=p.listen, upload_limit=p.upload_limit, download_limit=p.download_limit, allow=p.allow,
                     max_connections=p.max_connections, peers=p.peers, trackers=p.trackers, threshold=p.threshold,
                     fallback_after_s=p.fallback_after_s, piece_size=p.piece_size,
                     tls=p.tls.fleet if p.tls is not None else None, plan=p.plan, trace=p.trace, rack=p.rack,
                     choke_other_racks=p.choke_other_racks, gateways=p.gateways,
                     crossing=p.crossing, crossing_port=p.crossing_port,
                     request_queue=p.origin_request_queue if role == "origin" else 0)


def ensure_torrent(cfg: Config, version: VersionDir) -> Path | None:
    return _ensure_torrent(p2p_config(cfg), version)


class P2PFetcher(_P2PFetcher):
    """``p2p.P2PFetcher`` configured from weightd's ``Config`` (``session``: the daemon's, or None for
    a session of the fetcher's own, made on first use and closed by ``close()``)."""

    def __init__(self, cfg: Config, session: P2PSession | None = None) -> None:
        super().__init__(p2p_config(cfg), session)
