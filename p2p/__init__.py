"""weightd's network data plane: BitTorrent distribution of large checkpoints (libtorrent).

Depends on ``tiering`` (manifests, staging, the ``Fetcher`` seam), never on ``weightd``: the control
plane builds a ``P2PConfig`` and passes it in. This module is the package's public surface; names
resolve on first use (PEP 562), so importing ``p2p`` for an error class does not load libtorrent.

By concern::

    config.py    P2PConfig: everything p2p needs to know (frozen, validated when built)
    errors.py    P2PError and its hierarchy; map_libtorrent_errors, the one translation boundary
    session.py   P2PSession: one libtorrent session per node (seeding, downloads, stats, the plan's filters)
    settings.py  libtorrent's settings pack and the IP / peer-class filters, from a P2PConfig
    racks.py     the peer classes of racks: other racks' workers paced, and all but their gateways choked
    alerts.py    AlertPump: the only reader of the session's alert queue; counters, a queue per
                 transfer, subscribe(callback) for the daemon's loop
    transfer.py  one download: its events, the piece plan applied, byte attribution (DownloadResult)
    plan.py      PiecePlan: each worker's slice of the origin's pieces
    gateways.py  a rack's gateways in the plan: their shares, and which are skipped (stalled, absent, told)
    rendezvous.py  the hashing the plan assigns by: each piece's owner (bounded loads), a rack's gateway
    swarm_view.py  what a download's connected peers are to its plan (workers, racks, seeds, held pieces)
    fetch.py     P2PFetcher: the swarm as tiering's Fetcher (staging in, FetchResult out)
    seeding.py   torrents beside published versions (ensure_torrent, read_torrent, check_seedable)
                 and what a node seeds (seed_held; seed_copy: one copy, whole or partial)
    torrent.py   v2 torrents made from and checked against manifests (with fleet TLS: carrying the CA);
                 the files and pieces of a partial copy (subset_of, placement)
    certs.py     fleet TLS: FleetTLS checked from the CA/cert/key files; a throwaway fleet for tests and demos
    tracker.py   the origin's minimal announce endpoint
"""

from __future__ import annotations

import importlib
from typing import Any

_SURFACE: dict[str, str] = {
    # errors, and the one boundary where libtorrent's become ours
    "P2PError": "errors", "PeerRejected": "errors", "TorrentRejected": "errors", "TransferStalled": "errors",
    "TransferFailed": "errors", "LibtorrentError": "errors", "CrossingPortError": "errors", "BadCertificate": "errors",
    "map_libtorrent_errors": "errors",
    # configuration, and fleet TLS credentials (cryptography, loaded only when used)
    "P2PConfig": "config", "RACK": "config", "address_allowed": "config", "peer_address": "config",
    "FleetTLS": "certs", "load_fleet_tls": "certs", "make_ca": "certs", "issue_cert": "certs", "write_fleet": "certs",
    # the session, its alert pump and its downloads
    "P2PSession": "session", "AlertEvent": "alerts", "AlertPump": "alerts", "DownloadResult": "transfer",
    # torrents
    "TORRENT_RELPATH": "torrent", "load_torrent": "torrent", "make_torrent": "torrent",
    "fleet_mismatch": "torrent",
    # the swarm as a preload source, and seeding
    "P2PFetcher": "fetch",
    "check_seedable": "seeding", "ensure_torrent": "seeding", "read_torrent": "seeding", "seed_held": "seeding",
    "ensure_object_torrent": "seeding", "mirror_published": "seeding", "seed_copy": "seeding", "reseed": "seeding",
    "Tracker": "tracker",
}

__all__ = sorted(_SURFACE)


def __getattr__(name: str) -> Any:
    module = _SURFACE.get(name)
    if module is None:
        raise AttributeError(f"module 'p2p' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
