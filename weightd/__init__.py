"""weightd: distributes, tiers and preloads large-model weights on every inference node.

The control plane (CLI, daemon, config, metrics) lives here; it wires ``tiering`` and ``p2p``.
"""

__version__ = "0.1.0"
