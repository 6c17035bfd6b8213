"""weightd's network data plane: BitTorrent distribution of large checkpoints (libtorrent).

Depends on ``tiering`` (manifests), never on ``weightd``. This module is the package's public
surface; names resolve on first use (PEP 562), so importing ``p2p`` for an error class does not load
libtorrent.
"""

from __future__ import annotations

import importlib
from typing import Any

_SURFACE: dict[str, str] = {
    # errors, and the one boundary where libtorrent's become ours
    "P2PError": "errors", "PeerRejected": "errors", "TorrentRejected": "errors", "TransferStalled": "errors",
    "TransferFailed": "errors", "LibtorrentError": "errors", "map_libtorrent_errors": "errors",
    # configuration
    "P2PConfig": "config",
    # the session, its alert pump and its downloads
    "P2PSession": "session", "AlertEvent": "alerts", "AlertPump": "alerts", "DownloadResult": "transfer",
    # torrents
    "TORRENT_RELPATH": "torrent", "load_torrent": "torrent", "make_torrent": "torrent",
    "piece_size_for": "torrent",
    # the swarm as a preload source, and seeding
    "P2PFetcher": "fetch",
    "check_seedable": "seeding", "ensure_torrent": "seeding", "read_torrent": "seeding", "seed_held": "seeding",
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
