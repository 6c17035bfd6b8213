"""Errors of the network data plane.

Hierarchy::

    P2PError                     exit 1
    ├── PeerRejected             a peer outside the allowlist or one that sent corrupt data
    ├── TorrentRejected          a torrent that is malformed, not v2, or disagrees with its manifest (exit 2)
    └── TransferStalled          no peer delivered for too long (the caller falls back to cold)

libtorrent's own errors are translated into these at one boundary (the session wrapper).
"""

from __future__ import annotations


class P2PError(Exception):
    exit_code = 1


class PeerRejected(P2PError):
    def __init__(self, peer: str, reason: str) -> None:
        self.peer, self.reason = peer, reason
        super().__init__(f"peer {peer}: {reason}")


class TorrentRejected(P2PError, ValueError):
    exit_code = 2

    def __init__(self, source: str, reason: str) -> None:
        self.source, self.reason = source, reason
        super().__init__(f"{source}: bad torrent: {reason}")


class TransferStalled(P2PError, TimeoutError):
    exit_code = 4
