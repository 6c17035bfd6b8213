"""What the daemon's parts share: the admin routes (:mod:`.routes`), the preload flights
(:mod:`.flights`), health and metrics (:mod:`.health`), the intent runner (:mod:`.intent`), the
background loops (:mod:`.loops`), the origin's endpoints (:mod:`.origin`) and the lease guard
(:mod:`.leases`) each take a :class:`DaemonContext` and use only what it declares.
:class:`~weightd.daemon.app.Daemon` is one (it adds the lifecycle: listeners, reload, shutdown) and
composes the parts; none of them imports it.

The service, config and session change on a reload, so the parts read them from the context when
they need them, never keep their own copy.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from p2p import P2PSession

    from ..config import Config
    from ..metrics import Metrics
    from .sdnotify import Notifier
    from ..node.service import NodeService


class Preloads(Protocol):
    """The admin API's preload flights, as the intent runner uses them (:class:`.flights.Flights`)."""
    inflight: dict[tuple[str, ...], "asyncio.Task[dict[str, Any]]"]

    async def preload(self, body: dict[str, Any], *, holder: str | None = None, joined: Any = None,
                      rate_bytes_per_s: int = 0, waited_on: bool = True, caller: Any = ...) -> dict[str, Any]: ...

    def transfer_rows(self) -> list[dict[str, Any]]: ...


class IntentView(Protocol):
    """The intent runner, as the admin routes use it (:class:`.intent.IntentRunner`)."""
    def loaded(self, name: str, version: str, tier: str) -> None: ...

    def admin_pinned(self, name: str, version: str) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def explain(self) -> dict[str, Any]: ...


class DaemonContext:
    """The daemon's shared state and the calls its parts make on it."""
    config_path: str | None
    role: str                              # "worker" or "origin"
    config: "Config"
    service: "NodeService"
    session: "P2PSession | None"           # started once the daemon owns the state directory
    p2p_started: Any                       # [p2p] as the P2P part started (a reload names what waits for a restart)
    registry: "CollectorRegistry"
    metrics: "Metrics"
    notifier: "Notifier"
    pools: dict[str, ThreadPoolExecutor]   # by tier, and "misc", "storage", "query"
    api: Preloads                          # the admin API's preloads: the single flight
    intent: IntentView
    fleet: Any                             # the origin's FleetView and MoverSlots (with tracker_listen)
    movers: Any
    network: Any                           # node.network.NetworkYield: the link's share and weightd's limits
    storage_problems: list[dict[str, str]]
    storage_check: "asyncio.Future[Any] | None"
    pressure: deque[tuple[float, dict[str, str]]]
    stopping: asyncio.Event
    mirror_wanted: asyncio.Event
    loop: asyncio.AbstractEventLoop | None
    status_text: str
    ready: bool
    _status_cache: tuple[float, dict[str, Any]] | None
    _active: int                           # blocking calls running in the pools

    @property
    def node(self) -> Any:
        return self.service.node

    def status_changed(self) -> None:
        self._status_cache = None

    def set_status(self, text: str) -> None:
        self.status_text = text
        self.notifier.notify(STATUS=text)

    async def run_blocking(self, pool: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()

        def call() -> Any:
            self._active += 1  # (+= on an int under the GIL from pool threads: a counter, not a lock)
            try:
                return fn(*args, **kwargs)
            finally:
                self._active -= 1
        return await loop.run_in_executor(self.pools[pool], call)
