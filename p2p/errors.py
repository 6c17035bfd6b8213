"""Errors of the network data plane.

Hierarchy::

    P2PError                     exit 1
    ├── PeerRejected             a peer outside the allowlist or one that sent corrupt data
    ├── TorrentRejected          a torrent that is malformed, not v2, or disagrees with its manifest (exit 2)
    ├── TransferStalled          no peer delivered for too long (the caller falls back to cold)
    ├── TransferFailed           libtorrent failed a transfer (torrent_error_alert, file_error_alert)
    ├── BadCertificate           a fleet TLS file that cannot be used (missing, expired, not the CA's, ...) (exit 2)
    └── LibtorrentError          a libtorrent call raised (translated by ``map_libtorrent_errors``)

libtorrent's own errors are translated into these at one boundary: ``with map_libtorrent_errors(what):``
around every call into libtorrent that can raise (as httpx's ``map_httpcore_exceptions``), and the
alert pump's events for a transfer's failures.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


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


class TransferFailed(P2PError):
    """libtorrent reported an error for the transfer of ``info_hash`` (a file it cannot write, ...)."""

    def __init__(self, info_hash: str, reason: str) -> None:
        self.info_hash, self.reason = info_hash, reason
        super().__init__(f"P2P download failed: {reason}")


class BadCertificate(P2PError, ValueError):
    """A fleet TLS file that cannot be used: ``path`` names it, ``reason`` says why."""
    exit_code = 2

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


class LibtorrentError(P2PError):
    """A call into libtorrent raised: ``what`` we were doing, ``reason`` libtorrent's message."""

    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        super().__init__(f"{what}: {reason}")


class CrossingPortError(LibtorrentError):
    """The crossing session (``[p2p] crossing``) could not start on its port: ``p2p.crossing_port``'s
    error, not ``p2p.listen``'s."""


@contextmanager
def map_libtorrent_errors(what: str) -> Iterator[None]:
    """Turn the errors libtorrent's bindings raise (``RuntimeError`` for an ``error_code`` or a
    ``system_error``, e.g. a file that vanished while hashed or an invalid handle) into
    ``LibtorrentError(what, reason)``; ``P2PError`` and everything else pass unchanged."""
    try:
        yield
    except P2PError:
        raise
    except RuntimeError as exc:
        raise LibtorrentError(what, str(exc)) from None
