"""weightd's network data plane: BitTorrent distribution of large checkpoints (libtorrent).

Depends on ``tiering`` (manifests), never on ``weightd``. This module is the package's public
surface; names resolve on first use (PEP 562), so importing ``p2p`` for an error class does not load
libtorrent.
"""

from __future__ import annotations

import importlib
from typing import Any

_SURFACE: dict[str, str] = {
    "P2PError": "errors", "PeerRejected": "errors", "TorrentRejected": "errors", "TransferStalled": "errors",
    "P2PConfig": "session", "P2PSession": "session",
    "TORRENT_RELPATH": "torrent", "load_torrent": "torrent", "make_torrent": "torrent",
    "piece_size_for": "torrent",
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
