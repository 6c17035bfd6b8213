"""``weightd serve``: the per-node daemon (design §1, §5, §10).

- :mod:`.app`: the daemon's state and lifecycle (config, node service, P2P session, pools,
  listeners, SIGHUP reload, shutdown);
- :mod:`.routes`: the admin API, JSON over HTTP on a unix socket (mode 0660, no TCP), one route per
  operation of :class:`weightd.node.service.NodeService`, with single flight around ``preload``;
- :mod:`.authz`: who may call the mutating routes (``SO_PEERCRED``), what ``publish`` may read,
  and whose socket ``[api] socket`` is;
- :mod:`.loops`: background gc, the counter history ``weightd doctor`` reads, the systemd watchdog.

Prometheus scrapes ``[metrics] listen``.
"""

from __future__ import annotations

from ..errors import ApiError, DaemonAlreadyRunning, SocketInUse
from .app import Daemon, run
from .authz import MUTATING_ROUTES, Caller, check_caller_can_read, claim_socket

__all__ = ["ApiError", "Caller", "Daemon", "DaemonAlreadyRunning", "MUTATING_ROUTES", "SocketInUse",
           "check_caller_can_read", "claim_socket", "run"]
