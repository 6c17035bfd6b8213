"""The node service as the daemon opens it (at start and on each reload), kept in step with the P2P
session: a copy placed starts seeding, an eviction moves a seed to a copy still here (or stops it),
what the origin publishes is seeded (or, with an object-store cold tier, mirrored first), refusals and
evictions are counted; and the swarm is a source of the node's preloads through the daemon's one
session.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..node.local import open_service
from ..node.swarm import P2PFetcher, reseed, seed_copy, seed_held

if TYPE_CHECKING:
    from ..config import Config
    from ..node.service import NodeService
    from .context import DaemonContext

log = logging.getLogger(__name__)


def open_node_service(d: "DaemonContext", cfg: "Config") -> "NodeService":
    """The node service for ``cfg``, its callbacks wired to the daemon (tier roots ``serve`` would
    refuse raise TieringError here)."""
    hooks = NodeHooks(d)
    service = open_service(cfg, d.metrics, on_evict=hooks.evicted, on_placed=hooks.placed, on_refuse=hooks.refused,
                           fetchers=[SwarmSource(d, cfg)], on_published=hooks.published)
    if service.node.state.recovered:
        d.metrics.state_recoveries.inc()
    return service


class NodeHooks:
    """What the daemon does when the node evicts, refuses, places or publishes (on pool threads)."""

    def __init__(self, d: "DaemonContext") -> None:
        self.d = d

    def evicted(self, tier: str, ref: str, reason: str, nbytes: int) -> None:
        d = self.d
        d.metrics.evictions.labels(tier, reason).inc()
        if d.session is not None:
            # (a whole version or a partial copy: a seed reading from the removed directory moves to a
            # copy still here, or stops)
            name, _, version = ref.partition("@")
            try:
                reseed(d.node, d.session, name, version.split(" ")[0])
            except Exception as exc:  # noqa: BLE001 (the eviction happened; seeding catches up at gc)
                log.warning("seeding after evicting %s not updated: %s", ref, exc)

    def refused(self, tier: str, ref: str, reason: str) -> None:
        self.d.metrics.evictions_refused.labels(tier, reason).inc()

    def placed(self, tier: str, version: Any) -> None:
        d = self.d
        if d.session is not None:
            try:
                seed_copy(d.node, d.session, version)   # (whole, partial for its files; a companion never)
            except Exception as exc:  # noqa: BLE001 (the copy is placed; seeding catches up at gc)
                log.warning("seeding of %s not started: %s", version.ref, exc)

    def published(self, name: str, version: str, torrent: Any) -> None:
        """The origin seeds what it publishes (from a pool thread, inside the service's publish); with
        an object-store cold tier it first needs a local copy: its mirror loop is woken for that."""
        d = self.d
        if d.session is None or d.role != "origin":
            return
        if d.node.roots.object is not None:
            if d.loop is not None:
                d.loop.call_soon_threadsafe(d.mirror_wanted.set)
        elif torrent is not None:
            seed_held(d.node, d.session, d.role)


class SwarmSource:
    """The swarm as a source, through the daemon's one P2P session (none until serve() starts it)."""

    def __init__(self, d: "DaemonContext", cfg: "Config") -> None:
        self.d, self.cfg = d, cfg

    def fetch(self, request: Any) -> Any:
        from tiering import FetchResult
        session = self.d.session
        return P2PFetcher(self.cfg, session).fetch(request) if session is not None else FetchResult(False)
