"""Errors of the network data plane.

Hierarchy::

    P2PError                     exit 1
    └── PeerRejected             a peer outside the allowlist or one that sent corrupt data

libtorrent's own errors are translated into these at one boundary (the session wrapper).
"""

from __future__ import annotations


class P2PError(Exception):
    exit_code = 1


class PeerRejected(P2PError):
    def __init__(self, peer: str, reason: str) -> None:
        self.peer, self.reason = peer, reason
        super().__init__(f"peer {peer}: {reason}")
