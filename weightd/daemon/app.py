"""The daemon's state and lifecycle: its config, node service, P2P session, pools and listeners.

One asyncio loop owns all mutable scheduling state (the single-flight table, the current config and
service); blocking work (copies, hashing, warming, /proc scans) runs in bounded thread pools, one per
kind of work, so a slow NVMe copy never starves a /dev/shm promotion or the API.
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics

from p2p import P2PError
from tiering import HOT, LOCAL_TIERS, WARM, TieringError, bounded_running, stuck_reads

from .. import __version__
from ..config import Config, ConfigError, describe_source, load_config
from ..errors import DaemonAlreadyRunning, WeightdError
from ..exiting import finish, leave
from ..node.local import open_service
from ..metrics import Metrics
from .sdnotify import Notifier
from ..node.service import NodeService
from ..node.swarm import P2PFetcher, p2p_config, read_torrent, reseed, seed_copy, seed_held
from .loops import check_storage, gc_loop, origin_mirror_loop, pressure_loop, storage_loop, watchdog_loop
from .authz import claim_socket
from .context import DaemonContext
from .intent import IntentRunner
from .listeners import GuardedListener, ListenerLimits, request_deadline
from .origin import fleet_routes
from .routes import Api

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 8.0
RESEED_S = 10.0  # the tracker looks for newly published versions at most this often
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
        self.service: NodeService = self._open_service(self.config)
        self.old_services: list[NodeService] = []
        self.pools = {HOT: ThreadPoolExecutor(2, "weightd-hot"), WARM: ThreadPoolExecutor(2, "weightd-warm"),
                      "misc": ThreadPoolExecutor(4, "weightd-misc"),
                      "storage": ThreadPoolExecutor(1, "weightd-storage")}   # (loops.check_storage only)
        self.storage_problems: list[dict[str, str]] = []   # the last storage check's findings (readyz, status)
        self.storage_check: asyncio.Future[Any] | None = None
        self.api = Api(self)
        self.intent = IntentRunner(self)
        self.service.on_loaded = self.intent.loaded
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
        self.runners: list[web.AppRunner] = []
        self.listeners: list[GuardedListener] = []   # every TCP listener (metrics, tracker), in start order
        self._socket_id: tuple[int, int] | None = None   # (st_dev, st_ino) of the admin socket this daemon bound
        self._tracker_ssl = None  # ssl.SSLContext of the tracker's HTTPS endpoint (with p2p.tls)
        self.tracker = None  # p2p.Tracker (origin with tracker_listen)
        self.ready = False   # READY=1 sent: /readyz answers 200

    # -- node and state ---------------------------------------------------------------------------
    def _open_service(self, cfg: Config) -> NodeService:
        service = open_service(cfg, self.metrics, on_evict=self._evicted, on_placed=self._placed,
                               on_refuse=self._refused, fetchers=[_DaemonP2P(self, cfg)], on_published=self._published)
        if service.node.state.recovered:
            self.metrics.state_recoveries.inc()
        return service

    def _evicted(self, tier: str, ref: str, reason: str, nbytes: int) -> None:
        self.metrics.evictions.labels(tier, reason).inc()
        if self.session is not None:
            # (a whole version or a partial copy: a seed reading from the removed directory moves to a
            # copy still here, or stops)
            name, _, version = ref.partition("@")
            try:
                reseed(self.node, self.session, name, version.split(" ")[0])
            except Exception as exc:  # noqa: BLE001 (the eviction happened; seeding catches up at gc)
                log.warning("seeding after evicting %s not updated: %s", ref, exc)

    def _refused(self, tier: str, ref: str, reason: str) -> None:
        self.metrics.evictions_refused.labels(tier, reason).inc()

    def _placed(self, tier: str, version) -> None:
        if self.session is not None:
            try:
                seed_copy(self.node, self.session, version)   # (whole, partial for its files; a companion never)
            except Exception as exc:  # noqa: BLE001 (the copy is placed; seeding catches up at gc)
                log.warning("seeding of %s not started: %s", version.ref, exc)

    def _published(self, name: str, version: str, torrent: Any) -> None:
        """The origin seeds what it publishes (from a pool thread, inside the service's publish); with
        an object-store cold tier it first needs a local copy: its mirror loop is woken for that."""
        if self.session is None or self.role != "origin":
            return
        if self.node.roots.object is not None:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.mirror_wanted.set)
        elif torrent is not None:
            seed_held(self.node, self.session, self.role)

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
            old_state, new_state = self.config.settings.state_dir, cfg.settings.state_dir
            if new_state != old_state:  # the state lock is held for the old one: switching needs a restart
                raise ConfigError(cfg.source, f"changed from {old_state} to {new_state}; a running daemon keeps "
                                  "its state dir (restart it to switch)", "state_dir")
            _check_tls_change(self.config, cfg)
            service = self._open_service(cfg)  # tier roots `serve` would refuse raise TieringError here
        except (WeightdError, TieringError, OSError) as exc:  # ConfigError is a WeightdError
            self.metrics.config_reload_failures.inc()
            log.error("config reload failed, keeping the running config: %s", exc)
            self.set_status(f"config reload failed, running the previous config: {exc}")
            return
        old_api, new_api = self.config.settings.api, cfg.settings.api
        if (new_api.socket, new_api.group, new_api.request_timeout_s) != \
                (old_api.socket, old_api.group, old_api.request_timeout_s) or \
                cfg.settings.metrics.listen != self.config.settings.metrics.listen or \
                cfg.settings.listeners.model_dump() != self.config.settings.listeners.model_dump():
            log.warning("api.socket, api.group, api.request_timeout_s, metrics.listen and the [listeners] timeouts "
                        "take effect at the next restart ([listeners] caps and allow lists at once)")
        self.old_services.append(self.service)
        self.service, self.config = service, cfg
        for g, listener in zip(self.listeners, ("metrics", "tracker")):   # (allow lists and caps: at once)
            g.configure(self._limits(listener))
        if self.movers is not None:
            self.movers.cap = cfg.settings.intent.max_movers
        service.on_loaded = self.intent.loaded
        self.intent.wake.set()
        self._start_intent()
        self._rotate_tls()
        self.status_changed()
        log.info("config reloaded from %s", cfg.source)
        self.set_status(f"config reloaded; {self.api.idle_status()}")

    def _rotate_tls(self) -> None:
        """After a reload: every torrent of the session (and the tracker's HTTPS endpoint) presents the
        certificate the new config names (load_config checked it; same fleet CA, _check_tls_change)."""
        tls = self.config.settings.p2p.tls
        if tls is None or self.session is None:
            return
        n = self.session.set_tls(tls.fleet)
        if self._tracker_ssl is not None:
            try:  # (new handshakes use it; load_config checked these files a moment ago)
                self._tracker_ssl.load_cert_chain(tls.cert, tls.key)
            except (OSError, ValueError) as exc:  # (ssl.SSLError is an OSError)
                log.error("tracker: keeping the previous certificate: %s: %s", tls.cert, exc)
        log.info("p2p: presenting %s (valid until %s) on %d torrent(s)", tls.cert, f"{tls.fleet.not_after:%Y-%m-%d}", n)

    def _tracker_tls(self) -> Any:
        """With fleet TLS the tracker speaks HTTPS with this node's certificate and requires a client
        certificate from the fleet CA: libtorrent checks the server's against the torrent's CA and the
        URL's host (IP or DNS subjectAltName), and presents the torrent's certificate (the node's) as
        its client certificate to the https tracker of an SSL torrent (measured with 2.1.1)."""
        tls = self.config.settings.p2p.tls
        if tls is None:
            return None
        import ssl
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=tls.fleet.ca_pem.decode())
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(tls.cert, tls.key)
        except (OSError, ValueError) as exc:
            raise WeightdError(f"p2p.tls: {tls.cert}: {exc}") from None
        self._tracker_ssl = ctx
        return ctx

    # -- lifecycle ------------------------------------------------------------------------------------
    async def serve(self) -> None:
        self._take_state_lock()
        sock_path = self.config.settings.api.socket
        sock_path.parent.mkdir(parents=True, exist_ok=True)
        claim_socket(sock_path)  # before anything starts: another daemon's live socket is never ours
        try:
            await self._serve(sock_path)
        finally:  # (stopped, or failed to start: a port taken, a bad file; never leave our socket behind)
            for g in self.listeners:
                g.close()
            for r in self.runners:
                try:
                    await r.cleanup()
                except Exception as exc:  # noqa: BLE001 (the rest is still released)
                    log.warning("listener cleanup: %s", exc)
            self._remove_socket(sock_path)

    def _remove_socket(self, sock_path) -> None:
        """Unlink the socket this daemon bound, and only that one (the same inode: a path another
        process has since bound, or swapped for something else, is not ours to remove)."""
        if self._socket_id is None:
            return
        try:
            st = os.lstat(sock_path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == self._socket_id:
            try:
                sock_path.unlink()
            except FileNotFoundError:
                pass

    async def _serve(self, sock_path) -> None:
        await self._start_p2p()
        await self._start_api()
        await self._start_metrics()
        await self._start_tracker()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(signal.SIGINT, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        self.loop = loop
        await check_storage(self)   # (before READY: a missing cold store is not "ready")
        tasks = [loop.create_task(gc_loop(self)), loop.create_task(pressure_loop(self)),
                 loop.create_task(storage_loop(self))]
        if self.role == "origin" and self.session is not None and self.node.roots.object is not None:
            tasks.append(loop.create_task(origin_mirror_loop(self)))
        self.tasks = tasks
        self._start_intent()
        if self.notifier.watchdog_s:
            tasks.append(loop.create_task(watchdog_loop(self)))
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
        p = self.config.settings.p2p
        if self.role != "origin" and not (p.peers or p.trackers or p.tracker_listen):
            # nobody could find this node, and it could find nobody: no listening port at all (a default
            # config must not open 0.0.0.0:6881 on a machine that never joins a swarm)
            log.info("p2p off: no [p2p] peers or trackers configured (versions come from cold storage)")
            return
        from p2p import P2PSession
        try:
            self.session = P2PSession(p2p_config(self.config))
        except P2PError as exc:
            raise WeightdError(f"p2p.listen: {exc}") from None
        self.session.subscribe(self._on_alert)
        n = await self.run_blocking("misc", seed_held, self.node, self.session, self.role)
        log.info("p2p listening on %s, seeding %d version(s)", self.config.settings.p2p.listen, n)

    def _on_alert(self, ev: Any) -> None:
        """On the alert pump's thread (prometheus counters are thread-safe): a peer whose TLS handshake
        failed (no certificate, or one the fleet CA did not sign) is a refused peer."""
        if ev.kind == "peer_error_alert" and ev.operation == "ssl_handshake":
            self.metrics.trust_refusals.labels("peer_certificate").inc()

    async def _start_api(self) -> None:
        api, sock_path = self.config.settings.api, self.config.settings.api.socket
        # an idle connection, or one whose headers do not arrive, is closed after request_timeout_s
        # (aiohttp's keep-alive timer starts at connect and fires while it waits for a whole request)
        runner = web.AppRunner(self.api.app(), handle_signals=False, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=api.request_timeout_s, lingering_time=min(api.request_timeout_s, 5.0))
        await runner.setup()
        old_umask = os.umask(0o117)
        try:
            await web.UnixSite(runner, str(sock_path)).start()
        finally:
            os.umask(old_umask)
        st = os.lstat(sock_path)
        self._socket_id = (st.st_dev, st.st_ino)   # (what serve() removes on the way out: this inode only)
        if api.group is not None:
            os.chown(sock_path, -1, api.group, follow_symlinks=False)
        # (the umask above made it 0660 at bind: no chmod by path, which would follow a link swapped in)
        self.runners.append(runner)

    def _limits(self, listener: str) -> ListenerLimits:
        """The caps and timeouts of ``[listeners]``, with the listener's allow list: ``[metrics] allow``
        for metrics and probes, ``[p2p] allow`` for the tracker and fleet endpoints."""
        s = self.config.settings
        lim = s.listeners
        allow = s.metrics.allow if listener == "metrics" else s.p2p.allow
        return ListenerLimits(allow, lim.max_connections, lim.max_connections_per_address, lim.idle_timeout_s,
                              lim.request_timeout_s, lim.tls_handshake_timeout_s)

    async def _start_tcp(self, app: web.Application, listen: str, what: str, listener: str,
                         ssl_context: Any = None) -> None:
        """A TCP listener behind the accept guard (listeners.py): allow list, connection caps, header,
        idle, request and TLS handshake timeouts, accept errors logged at a bounded rate."""
        limits = self._limits(listener)
        app.middlewares.append(request_deadline(limits.request_timeout_s))
        # (keep-alive timer: from connect, and from each answer, to the next whole request's headers)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=limits.idle_timeout_s, lingering_time=1.0)
        await runner.setup()
        self.runners.append(runner)
        refused = self.metrics.tcp_refused
        guard = GuardedListener(what, listen, runner.server, limits, ssl_context=ssl_context,
                                on_refused=lambda reason: refused.labels(listener, reason).inc())
        try:
            guard.bind()
        except OSError as exc:
            raise WeightdError(f"{what} {listen}: {exc.strerror}") from None
        guard.start()
        self.listeners.append(guard)
        self.metrics.tcp_open.labels(listener).set_function(lambda: guard.open)

    async def _start_metrics(self) -> None:
        mapp = web.Application()
        mapp.router.add_get("/metrics", self.api.metrics)
        mapp.router.add_get("/healthz", self.api.healthz)
        mapp.router.add_get("/readyz", self.api.readyz)
        await self._start_tcp(mapp, self.config.settings.metrics.listen, "metrics.listen", "metrics")

    async def _start_tracker(self) -> None:
        """The origin's announce endpoint (``p2p/tracker.py``): it tracks only the versions this origin
        seeds (every published one it can), so a version published by another node is refused until the
        origin picks it up: a refusal triggers that pick-up at once (at most every RESEED_S)."""
        tl = self.config.settings.p2p.tracker_listen
        if not tl or self.role != "origin":
            return
        from p2p import Tracker
        session = self.session
        tracker = Tracker(self.config.settings.p2p.allow, known=session.seeds_announced)
        reseed: dict[str, Any] = {"at": -RESEED_S, "task": None}

        async def pick_up() -> None:
            try:
                await self.run_blocking("misc", seed_held, self.node, session, self.role)
            except Exception as exc:  # noqa: BLE001 (the next announce or gc round tries again)
                log.warning("tracker: cannot pick up newly published versions: %s", exc)

        async def announce(request: web.Request) -> web.Response:
            body, refused = tracker.announce(request.remote or "", request.rel_url.raw_query_string)
            if refused is not None:
                self.metrics.trust_refusals.labels(refused).inc()
                now = time.monotonic()
                if refused == "tracker_unknown_torrent" and now - reseed["at"] > RESEED_S:
                    reseed["at"] = now
                    reseed["task"] = asyncio.get_running_loop().create_task(pick_up())
            return web.Response(body=body, content_type="text/plain")
        async def members(request: web.Request) -> web.Response:
            body, refused = tracker.members(request.remote or "", request.rel_url.raw_query_string)
            if refused is not None:
                self.metrics.trust_refusals.labels(refused).inc()
            return web.Response(body=body, status=200 if refused is None else 404 if
                                refused == "tracker_unknown_torrent" else 403 if refused == "tracker_not_allowed"
                                else 400, content_type="application/json")
        tapp = web.Application(client_max_size=1 << 20)
        tapp.router.add_get("/announce", announce)
        tapp.router.add_get("/swarm", members)
        fleet_routes(self, tapp, tracker)
        await self._start_tcp(tapp, tl, "p2p.tracker_listen", "tracker", ssl_context=self._tracker_tls())
        self.tracker = tracker
        self.metrics.tracker_peers.set_function(tracker.peers)
        log.info("tracker announce endpoint on %s://%s/announce", "https" if self._tracker_ssl else "http", tl)

    def close(self) -> bool:
        """Release everything; True if worker threads were still busy (the caller exits hard)."""
        # (a thread stuck in a read of hung storage is busy too: the interpreter's orderly exit must not wait
        # on it; os._exit ends the process, but for threads the kernel holds until the storage answers)
        busy = self._active > 0 or stuck_reads()[0] > 0 or bounded_running() > 0
        busy = self.intent.close() or busy
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
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


def _check_tls_change(old: Config, new: Config) -> None:
    """Certificates rotate on SIGHUP; turning fleet TLS on or off, or another fleet CA, needs a restart
    (the listen port changes kind, and torrents carry their CA)."""
    a, b = old.settings.p2p.tls, new.settings.p2p.tls
    if (a is None) != (b is None):
        raise ConfigError(new.source, f"turning fleet TLS {'on' if b else 'off'} needs a restart", "p2p.tls")
    if a is not None and b is not None and a.fleet.ca_pem != b.fleet.ca_pem:
        raise ConfigError(new.source, f"{b.ca} is another fleet CA than the running one; restart to switch "
                          "(and publish again: torrents carry their CA)", "p2p.tls.ca")


class _DaemonP2P:
    """The swarm as a source, through the daemon's one P2P session (none until serve() starts it)."""

    def __init__(self, daemon: Daemon, cfg: Config) -> None:
        self.daemon, self.cfg = daemon, cfg

    def fetch(self, request):
        from tiering import FetchResult
        session = self.daemon.session
        return P2PFetcher(self.cfg, session).fetch(request) if session is not None else FetchResult(False)


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
