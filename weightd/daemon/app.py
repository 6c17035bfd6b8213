"""The daemon's lifecycle: it opens the config, the node service and the pools, composes the parts
(each takes the :class:`.context.DaemonContext` it extends), owns the state directory, starts the
P2P session, the listeners and the background duties, reloads on SIGHUP, and stops.

One asyncio loop owns all mutable scheduling state (the single-flight table, the current config and
service); blocking work (copies, hashing, warming, /proc scans) runs in bounded thread pools
(:mod:`.pools`), so a slow NVMe copy never starves a /dev/shm promotion or the API.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import signal
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, disable_created_metrics

from p2p import CrossingPortError, P2PError
from tiering import TieringError, bounded_running, stuck_reads

from .. import __version__
from ..config import Config, describe_source, load_config
from ..errors import DaemonAlreadyRunning, WeightdError
from ..exiting import finish, leave
from ..metrics import Metrics, NetworkGauges
from ..node.network import NetworkYield, network_loop
from ..node.service import NodeService
from ..node.swarm import p2p_config, seed_held
from .authz import claim_socket
from .cold import ColdReads
from .context import DaemonContext
from .flights import Flights
from .health import Health
from .intent import IntentRunner
from .leases import LeaseGuard
from .loops import check_storage, gc_loop, origin_mirror_loop, pressure_loop, storage_loop, watchdog_loop
from .node_hooks import open_node_service
from .pools import close_pools, open_pools
from .reload import check_reload, rotate_tls, warn_p2p_restart, warn_restart_only
from .routes import Api
from .sdnotify import Notifier
from .servers import Servers
from .tracker import TrackerEndpoint

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 8.0
PRESSURE_KEEP = 121            # 10 minutes of counter history for `weightd doctor`


class Daemon(DaemonContext):
    """The daemon: the shared state (:class:`.context.DaemonContext`) and its lifecycle."""

    def __init__(self, config_path: str | None, *, role: str = "worker") -> None:
        self.config_path = config_path
        self.role = role
        self.config: Config = load_config(config_path)
        self.notifier = Notifier()
        self.registry = CollectorRegistry()
        disable_created_metrics()
        self.metrics = Metrics(self.registry, self._status_cached,
                               lambda: self.session.stats() if self.session is not None else {},
                               lambda: self.node.roots.object.stats if self.node.roots.object is not None else None)
        self.session = None  # the P2P session, started in serve() once we own the state directory
        self.p2p_started = self.config.settings.p2p   # ([p2p] as the P2P part started: reload compares)
        self.network = NetworkYield(NetworkGauges(self.registry))   # [network]: weight traffic yields the link
        self.service: NodeService = open_node_service(self, self.config)
        self.old_services: list[NodeService] = []
        self.pools = open_pools()
        self.storage_problems: list[dict[str, str]] = []   # the last storage check's findings (readyz, status)
        self.storage_check: asyncio.Future[Any] | None = None
        self._compose()
        self.tasks: list[asyncio.Task[None]] = []   # the background duties (loops.py, intent), cancelled at stop
        self._intent_task: asyncio.Task[None] | None = None
        self.fleet = None    # the origin's FleetView and MoverSlots (with tracker_listen)
        self.movers = None
        self.pressure: deque[tuple[float, dict[str, str]]] = deque(maxlen=PRESSURE_KEEP)
        self.stopping = asyncio.Event()
        self.mirror_wanted = asyncio.Event()  # the origin of an object-store cold tier: copy what was published
        self.loop: asyncio.AbstractEventLoop | None = None
        self.status_text = "starting"
        self._status_cache: tuple[float, dict[str, Any]] | None = None
        self._lock_fd: int | None = None
        self._active = 0  # blocking calls running in the pools
        self.ready = False   # READY=1 sent: /readyz answers 200

    def _compose(self) -> None:
        """The parts, each given what it uses of the daemon."""
        cold, leases = ColdReads(), LeaseGuard(self)   # (leases: read-only callers' leases, their length and share)
        self.api = Flights(self, cold, leases)
        self.health = Health(self)
        self.routes = Api(self, self.api, cold, leases, self.health)
        self.intent = IntentRunner(self)
        self.service.on_loaded = self.intent.loaded
        self.servers = Servers(self)
        self.tracker = TrackerEndpoint(self)   # (listening on an origin with tracker_listen)

    # -- state ----------------------------------------------------------------------------------------
    def _take_state_lock(self) -> None:
        """One daemon per state directory: a second one refuses to start."""
        state_dir = self.config.settings.state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        path = state_dir / "daemon.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise DaemonAlreadyRunning(f"another weightd daemon (pid {holder}) is running on state dir {state_dir}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _status_cached(self) -> dict[str, Any]:
        """Status for scrapes; residency checks are cheap, but a scrape storm should not repeat them."""
        now = time.monotonic()
        if self._status_cache is None or now - self._status_cache[0] > 2.0:
            self._status_cache = (now, self.node.status())
        return {**self._status_cache[1], "transfers": self.api.transfer_rows()}  # (transfers: live)

    def reload(self) -> None:
        """SIGHUP: a good config replaces the running one; a bad one is refused and the old one kept."""
        try:
            cfg = load_config(self.config_path)
            check_reload(self.config, cfg)
            service = open_node_service(self, cfg)  # tier roots `serve` would refuse raise TieringError here
        except (WeightdError, TieringError, OSError) as exc:  # ConfigError is a WeightdError
            self.metrics.config_reload_failures.inc()
            log.error("config reload failed, keeping the running config: %s", exc)
            self.set_status(f"config reload failed, running the previous config: {exc}")
            return
        warn_restart_only(self.config, cfg)
        warn_p2p_restart(self.p2p_started, cfg, self.session is not None, self.role)
        self.old_services.append(self.service)
        self.service, self.config = service, cfg
        self.servers.reconfigure()   # (allow lists and caps: at once)
        if self.movers is not None:
            self.movers.cap = cfg.settings.intent.max_movers
        service.on_loaded = self.intent.loaded
        self.intent.wake.set()
        self._start_intent()
        rotate_tls(cfg, self.session, self.tracker)
        self.status_changed()
        log.info("config reloaded from %s", cfg.source)
        self.set_status(f"config reloaded; {self.api.idle_status()}")

    # -- lifecycle ------------------------------------------------------------------------------------
    async def serve(self) -> None:
        self._take_state_lock()
        sock_path = self.config.settings.api.socket
        sock_path.parent.mkdir(parents=True, exist_ok=True)
        claim_socket(sock_path)  # before anything starts: another daemon's live socket is never ours
        try:
            await self._serve(sock_path)
        finally:  # (stopped, or failed to start: a port taken, a bad file; never leave our socket behind)
            await self.servers.close(sock_path)

    async def _serve(self, sock_path: Any) -> None:
        await self._start_p2p()
        await self.servers.start_tcp(self.health.app(), self.config.settings.metrics.listen, "metrics.listen",
                                     "metrics")
        await self.tracker.start(self.servers)
        # the admin socket last: once it exists, every listener (P2P, metrics, tracker) is up
        await self.servers.start_api(self.routes.app())
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(signal.SIGINT, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        self.loop = loop
        await check_storage(self)   # (before READY: a missing cold store is not "ready")
        self._start_duties(loop)
        log.info("serving role=%s version=%s config=%s api=%s metrics=%s", self.role, __version__,
                 describe_source(self.config), sock_path, self.config.settings.metrics.listen)
        self.status_text = "serving, idle"
        self.ready = True
        self.notifier.notify(READY=1, STATUS=self.status_text, MAINPID=os.getpid())

        await self.stopping.wait()
        self.notifier.notify(STOPPING=1, STATUS="stopping")
        log.info("stopping: %d transfer(s) in flight", len(self.api.inflight))
        for t in self.tasks:
            t.cancel()
        if self.api.inflight:  # let transfers finish briefly; what is left resumes from staging next start
            await asyncio.wait(list(self.api.inflight.values()), timeout=SHUTDOWN_GRACE_S)

    def _start_duties(self, loop: asyncio.AbstractEventLoop) -> None:
        """The background duties (:mod:`.loops`, the intent runner), cancelled when the daemon stops."""
        tasks = [loop.create_task(gc_loop(self)), loop.create_task(pressure_loop(self)),
                 loop.create_task(storage_loop(self)), loop.create_task(network_loop(self))]
        if self.role == "origin" and self.session is not None and self.node.roots.object is not None:
            tasks.append(loop.create_task(origin_mirror_loop(self)))
        self.tasks = tasks
        self._start_intent()
        if self.notifier.watchdog_s:
            tasks.append(loop.create_task(watchdog_loop(self)))

    def _start_intent(self) -> None:
        """The intent loop, once it is wanted (at start, or after a reload that configures it)."""
        if self.loop is None or not self._intent_wanted():
            return
        if self._intent_task is None or self._intent_task.done():
            self._intent_task = self.loop.create_task(self.intent.run())
            self.tasks.append(self._intent_task)

    def _intent_wanted(self) -> bool:
        """The intent loop runs for intent files, prewarming, the NFD file, or reports to an origin."""
        i = self.config.settings.intent
        return i.dir is not None or i.prewarm is not None or i.nfd_dir is not None or \
            (i.origin is not None and self.role != "origin")

    async def _start_p2p(self) -> None:
        p = self.p2p_started = self.config.settings.p2p
        if self.role != "origin" and not (p.peers or p.trackers or p.tracker_listen):
            # nobody could find this node, and it could find nobody: no listening port at all (a default
            # config must not open 0.0.0.0:6881 on a machine that never joins a swarm)
            log.info("p2p off: no [p2p] peers or trackers configured (versions come from cold storage)")
            return
        from p2p import P2PSession
        try:
            self.session = P2PSession(p2p_config(self.config, self.role))
        except P2PError as exc:   # (the crossing session's port is its own key)
            key = "p2p.crossing_port" if isinstance(exc, CrossingPortError) else "p2p.listen"
            raise WeightdError(f"{key}: {exc}") from None
        self.session.subscribe(self._on_alert)
        n = await self.run_blocking("misc", seed_held, self.node, self.session, self.role)
        log.info("p2p listening on %s, seeding %d version(s)", self.config.settings.p2p.listen, n)

    def _on_alert(self, ev: Any) -> None:
        """On the alert pump's thread (prometheus counters are thread-safe): a peer whose TLS handshake
        failed (no certificate, or one the fleet CA did not sign) is a refused peer."""
        if ev.kind == "peer_error_alert" and ev.operation == "ssl_handshake":
            self.metrics.trust_refusals.labels("peer_certificate").inc()

    def close(self) -> bool:
        """Release everything; True if worker threads were still busy (the caller exits hard)."""
        # (a thread stuck in a read of hung storage is busy too: the interpreter's orderly exit must not wait
        # on it; os._exit ends the process, but for threads the kernel holds until the storage answers)
        busy = self._active > 0 or stuck_reads()[0] > 0 or bounded_running() > 0
        busy = self.intent.close() or busy
        close_pools(self.pools)
        for s in [self.service, *self.old_services]:
            try:
                s.node.close()
            except Exception:
                pass
        if self.session is not None:
            self.session.close()
        self.notifier.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        return busy


def run(config_path: str | None, role: str) -> int:
    daemon = Daemon(config_path, role=role)
    busy = False
    try:
        asyncio.run(daemon.serve())
    finally:
        busy = daemon.close()
    if busy:  # a copy still running in a worker thread: leave it to reconciliation, exit now
        leave(0)
    return finish(0)   # (no teardown after object storage was used: see weightd.exiting)
