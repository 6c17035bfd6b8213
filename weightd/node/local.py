"""The one place the configuration becomes tiering's runtime objects (``TierSpec``, ``WarmOptions``,
``LocalNode``) and the :class:`~weightd.node.service.NodeService` over them. (P2P's ``P2PConfig`` is built
in :mod:`weightd.node.swarm`.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tiering import HOT, WARM, LocalNode, TierSpec, WarmOptions

from ..config import Config, TierSettings

if TYPE_CHECKING:
    from pathlib import Path

    from tiering import ObjectCold, OciCold, TrustPolicy

    from ..metrics import Metrics
    from .service import NodeService


def tier_spec(name: str, t: TierSettings) -> TierSpec:
    return TierSpec(name, t.path, t.capacity.bytes, t.capacity.fraction, t.high_watermark, t.low_watermark, t.group)


def tier_specs(cfg: Config) -> dict[str, TierSpec]:
    """The local tiers, hot then warm."""
    tiers = cfg.settings.tiers
    return {HOT: tier_spec(HOT, tiers.hot), WARM: tier_spec(WARM, tiers.warm)}


def open_node(cfg: Config, *, reconcile: bool = True, **hooks: Any) -> LocalNode:
    """``hooks``: ``fetchers``, ``on_placed``, ``on_evict`` (see LocalNode)."""
    specs = tier_specs(cfg)
    return LocalNode(hot=specs[HOT], warm=specs[WARM], cold=cold_tier(cfg),
                     state_dir=cfg.settings.state_dir, reconcile=reconcile, warm_options=warm_options(cfg),
                     trust=trust_policy(cfg), **hooks)


def cold_tier(cfg: Config) -> "Path | ObjectCold | OciCold":
    """The cold tier: a path, or an object store or registry (``url``) built from the [tiers.cold] settings."""
    c = cfg.settings.tiers.cold
    if c.url is None:
        assert c.path is not None
        return c.path
    if c.url.startswith("oci://"):
        from tiering import OciCold
        return OciCold(c.url, range_bytes=c.range_size, concurrency=c.concurrency, chunk_bytes=c.part_size,
                       bandwidth=c.bandwidth, insecure=c.insecure, ca_file=c.ca_file)
    from tiering import ObjectCold
    return ObjectCold(c.url, endpoint=c.endpoint, region=c.region, range_bytes=c.range_size,
                      concurrency=c.concurrency, part_bytes=c.part_size, bandwidth=c.bandwidth)


def trust_policy(cfg: Config) -> "TrustPolicy | None":
    """The keys this node trusts (None when none are configured: signatures are then not checked)."""
    t = cfg.settings.trust
    if not t.public_keys:
        return None
    from tiering import TrustPolicy
    return TrustPolicy.load(list(t.public_keys), required=t.require_signature)


def warm_options(cfg: Config) -> WarmOptions:
    w = cfg.settings.warm
    return WarmOptions(w.concurrency, w.bandwidth, w.await_threshold_ms)


def open_service(cfg: Config, metrics: "Metrics | None" = None, *, reconcile: bool = True,
                 on_published: Any = None, **hooks: Any) -> "NodeService":
    """A node and the service over it. Without ``metrics`` (the in-process CLI) the service counts
    into a private registry: the same counting code as the daemon's, seen by no one."""
    from .service import NodeService
    node = open_node(cfg, reconcile=reconcile, **hooks)
    if metrics is None:
        from prometheus_client import CollectorRegistry

        from ..metrics import Metrics
        metrics = Metrics(CollectorRegistry(), node.status)
    return NodeService(cfg, node, metrics, on_published=on_published)
