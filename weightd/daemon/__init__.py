"""``weightd serve``: the per-node daemon (design §1, §5, §10).

- :mod:`.app`: the daemon's lifecycle (config, node service, P2P session, start, SIGHUP reload,
  shutdown); it composes the parts below, which take a :class:`.context.DaemonContext`
  (:mod:`.context`: what they share) and never import it back;
- :mod:`.pools`: the thread pools, one per kind of blocking work;
- :mod:`.node_hooks`: the node service as the daemon opens it, kept in step with the P2P session;
- :mod:`.reload`: what a SIGHUP may change at once, and what needs a restart;
- :mod:`.servers`: the admin socket and the TCP listeners; :mod:`.listeners`: the TCP listeners'
  accept guard (allow lists, caps, timeouts);
- :mod:`.routes`: the admin API, JSON over HTTP on a unix socket (mode 0660, no TCP), one route per
  operation of :class:`weightd.node.service.NodeService`; :mod:`.jsonapi`: request bodies read
  within bounds, errors answered as JSON;
- :mod:`.flights`: single flight around ``preload`` (one transfer per version and tier);
  :mod:`.stream`: a preload's progress streamed as NDJSON; :mod:`.cold`: the API's reads of cold
  storage, bounded;
- :mod:`.health`: ``/v1/health`` and the pressure history on the socket; ``/healthz``, ``/readyz``
  and ``/metrics`` on the metrics port;
- :mod:`.authz`: who may call the mutating routes (``SO_PEERCRED``), what ``publish`` may read,
  and whose socket ``[api] socket`` is; :mod:`.leases`: the leases read-only callers may take;
- :mod:`.intent`: the fleet intent runner, one task on the daemon's loop, with its parts
  :mod:`.intent_catalog` (published versions, what is held, partial copies' labels),
  :mod:`.intent_fleet` (rollout slots, the holdings report), :mod:`.intent_prewarm` (the load
  history, prewarming) and :mod:`.intent_state` (what it keeps across restarts);
- :mod:`.tracker`: the origin's tracker listener; :mod:`.origin`: the fleet endpoints beside it
  (reports, the fleet view, rollout slots);
- :mod:`.loops`: background gc, the counter history ``weightd doctor`` reads, storage checks, the
  systemd watchdog;
- :mod:`.selfcheck`: ``serve --check``; :mod:`.sdnotify`: the systemd notify socket.

Prometheus scrapes ``[metrics] listen``.
"""

from __future__ import annotations

from ..errors import ApiError, DaemonAlreadyRunning, SocketInUse
from .app import Daemon, run
from .authz import MUTATING_ROUTES, Caller, check_caller_can_read, claim_socket

__all__ = ["ApiError", "Caller", "Daemon", "DaemonAlreadyRunning", "MUTATING_ROUTES", "SocketInUse",
           "check_caller_can_read", "claim_socket", "run"]
