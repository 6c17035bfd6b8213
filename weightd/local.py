"""Build the local data plane (``tiering.LocalNode``) from the configuration."""

from __future__ import annotations

from tiering import HOT, WARM, TierSpec
from tiering import LocalNode
from tiering import WarmOptions

from .config import Config, TierSettings


def tier_spec(name: str, t: TierSettings) -> TierSpec:
    return TierSpec(name, t.path, t.capacity.bytes, t.capacity.fraction, t.high_watermark, t.low_watermark, t.group)


def open_node(cfg: Config, *, reconcile: bool = True, **hooks) -> LocalNode:
    """``hooks``: ``fetchers``, ``on_placed``, ``on_evict`` (see LocalNode)."""
    tiers = cfg.settings.tiers
    return LocalNode(hot=tier_spec(HOT, tiers.hot), warm=tier_spec(WARM, tiers.warm), cold=tiers.cold.path,
                     state_dir=cfg.settings.state_dir, reconcile=reconcile, warm_options=warm_options(cfg), **hooks)


def warm_options(cfg: Config) -> WarmOptions:
    w = cfg.settings.warm
    return WarmOptions(w.concurrency, w.bandwidth, w.await_threshold_ms)
