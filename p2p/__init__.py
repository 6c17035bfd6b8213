"""weightd's network data plane: BitTorrent distribution of large checkpoints (libtorrent).

Depends on ``tiering`` (manifests), never on ``weightd``.
"""

from .errors import P2PError, PeerRejected

__all__ = ["P2PError", "PeerRejected"]
