"""``weightd serve``: the per-node daemon (design §1, §5, §10).

One asyncio loop owns all mutable scheduling state (the single-flight table, the current config and
node); blocking work (copies, hashing, warming, /proc scans) runs in bounded thread pools, one per
kind of work, so a slow NVMe copy never starves a /dev/shm promotion or the API. The admin API is
JSON over HTTP on a unix socket (mode 0660, no TCP); Prometheus scrapes ``[metrics] listen``.

Who may do what (design §13): anyone who can connect (the socket's ``[api] group``) reads; the
mutating routes are for root, the daemon's own user and ``[api] admin_group``, told apart by the
kernel's ``SO_PEERCRED``; ``publish`` reads only what its caller could read. Requests are bounded:
headers and body must arrive within ``[api] request_timeout_s``, JSON nests at most
``MAX_JSON_DEPTH`` deep, and durations are finite and at most ``MAX_SECONDS``.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import math
import os
import signal
import socket
import stat
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from p2p import P2PError
from tiering import parse_ref
from tiering import IntegrityError, NoSpace, TieringError
from tiering import HOT, LOCAL_TIERS, WARM
from tiering import LocalNode

from .client import MAX_SECONDS, peer_credentials, peer_groups
from .config import Config, ConfigError, load_config
from .errors import WeightdError, exit_code_for
from .local import open_node
from .metrics import Metrics
from .sdnotify import Notifier
from .swarm import P2PFetcher, ensure_torrent, p2p_config, read_torrent, seed_held

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 8.0
GC_INTERVAL_S = 30.0
PRESSURE_INTERVAL_S = 5.0
PRESSURE_KEEP = 121            # 10 minutes of counter history for `weightd doctor`
API_VERSION = "v1"
MAX_JSON_DEPTH = 32            # request bodies are small flat objects; deeper nesting is an attack
MUTATING_ROUTES = ("publish", "evict", "pin", "unpin", "gc")


class DaemonAlreadyRunning(WeightdError):
    exit_code = 2


class SocketInUse(WeightdError):
    """``[api] socket`` is answered by another daemon, or is not a socket we may replace."""
    exit_code = 2


class ApiError(Exception):
    def __init__(self, status: int, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.status, self.exit_code = status, exit_code


def _status_for(exc: BaseException) -> int:
    code = exit_code_for(exc)
    return {2: 400, 3: 404, 4: 504, 5: 422, 6: 507}.get(code, 409 if code == 1 and isinstance(exc, TieringError) else 500)


class Daemon:
    def __init__(self, config_path: str | None, *, role: str = "worker") -> None:
        self.config_path = config_path
        self.role = role
        self.config: Config = load_config(config_path)
        self.notifier = Notifier()
        self.registry = CollectorRegistry()
        disable_created_metrics()
        self.metrics = Metrics(self.registry, self._status_cached,
                               lambda: self.session.stats() if self.session is not None else {})
        self.session = None  # the P2P session, started in serve() once we own the state directory
        self.node: LocalNode = self._open_node(self.config)
        self.old_nodes: list[LocalNode] = []
        self.pools = {HOT: ThreadPoolExecutor(2, "weightd-hot"), WARM: ThreadPoolExecutor(2, "weightd-warm"),
                      "misc": ThreadPoolExecutor(4, "weightd-misc")}
        self.inflight: dict[tuple[str, str, str], asyncio.Task[dict[str, Any]]] = {}
        self.pressure: deque[tuple[float, dict[str, str]]] = deque(maxlen=PRESSURE_KEEP)
        self.stopping = asyncio.Event()
        self.status_text = "starting"
        self._status_cache: tuple[float, dict[str, Any]] | None = None
        self._lock_fd: int | None = None
        self._active = 0  # blocking calls running in the pools
        self.runners: list[web.AppRunner] = []

    # -- node and state ---------------------------------------------------------------------------
    def _open_node(self, cfg: Config) -> LocalNode:
        node = open_node(cfg, on_evict=self._evicted, on_placed=self._placed,
                         fetchers=[_DaemonP2P(self, cfg)])
        if node.state.recovered:
            self.metrics.state_recoveries.inc()
        return node

    def _evicted(self, tier: str, ref: str, reason: str, nbytes: int) -> None:
        self.metrics.evictions.labels(tier, reason).inc()
        if self.session is not None:
            name, _, version = ref.partition("@")
            other = [t for t in LOCAL_TIERS if t != tier]
            if self.node.version(other[0], name, version) is None:
                cold = self.node.published_version(name, version)
                ti = read_torrent(cold) if cold is not None else None
                if ti is not None:
                    self.session.stop_seeding(ti)

    def _placed(self, tier: str, version) -> None:
        if self.session is not None:
            cold = self.node.published_version(version.name, version.version)
            ti = read_torrent(cold) if cold is not None else None
            if ti is not None:
                self.session.seed(ti, version.path)

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
        return self._status_cache[1]

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

    # -- operations ---------------------------------------------------------------------------------
    async def preload(self, body: dict[str, Any]) -> dict[str, Any]:
        name, version = parse_ref(_str(body, "ref"))
        tier = body.get("tier", HOT)
        if tier not in LOCAL_TIERS:
            raise ApiError(400, f"tier must be one of {', '.join(LOCAL_TIERS)}")
        strict = bool(body.get("strict", False))
        lease_s = _num(body, "lease_s", 600.0)
        timeout_s = body.get("timeout_s")
        if timeout_s is not None:
            timeout_s = _num(body, "timeout_s", 0.0)
        wait = bool(body.get("wait", False))
        if version is None or wait:  # resolve (and wait for publication) before joining a flight
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            resolved = await self.run_blocking("misc", self.node.wait_published if wait else self.node.resolve,
                                               *((name, version, deadline) if wait else (name, version)))
            version = resolved.version
        key = (name, version, tier)
        task = self.inflight.get(key)
        if task is None:  # single flight: everyone asking for this version in this tier shares one
            task = asyncio.get_running_loop().create_task(self._preload_task(name, version, tier, strict, lease_s,
                                                                             timeout_s))
            self.inflight[key] = task
            task.add_done_callback(lambda _t, k=key: self._flight_done(k))
            shared = False
        else:
            shared = True
        report = dict(await asyncio.shield(task))
        if shared and not report.get("already_present"):
            report["shared_transfer"] = True
        return report

    async def _preload_task(self, name: str, version: str, tier: str, strict: bool, lease_s: float,
                            timeout_s: float | None) -> dict[str, Any]:
        self.metrics.in_flight.labels("local").inc()
        self.set_status(f"preloading {name}@{version} into {tier}")
        t0 = time.monotonic()
        try:
            r = await self.run_blocking(tier, self.node.preload, name, version, tier=tier, strict=strict,
                                        lease_s=lease_s, timeout_s=timeout_s)
        except BaseException as exc:
            reason = ("integrity" if isinstance(exc, IntegrityError) else "no_space" if isinstance(exc, NoSpace)
                      else "timeout" if isinstance(exc, TimeoutError) else "not_found" if isinstance(exc, FileNotFoundError)
                      else "error")
            self.metrics.preload_failures.labels(reason).inc()
            if isinstance(exc, IntegrityError):
                self.metrics.hash_failures.inc()
            raise
        finally:
            self.metrics.in_flight.labels("local").dec()
        d = r.to_dict()
        if r.tier_fallback:
            self.metrics.fallbacks.labels("tier", r.tier_fallback["from"], r.tier_fallback["to"]).inc()
        for f in r.source_fallbacks:
            self.metrics.fallbacks.labels("source", f.source, f.to).inc()
        source = max(d["bytes_by_source"], key=lambda k: d["bytes_by_source"][k]) if r.bytes_moved else "local"
        self.metrics.loading.labels(f"{name}@{version}", r.tier, source).observe(time.monotonic() - t0)
        for src, n in d["bytes_by_source"].items():
            if n:
                self.metrics.bytes.labels(src).inc(n)
        self._status_cache = None
        return d

    def _flight_done(self, key: tuple[str, str, str]) -> None:
        """A transfer ended: forget it, then say what is left (counting it would leave "1 in flight")."""
        self.inflight.pop(key, None)
        self.set_status(self._idle_status())

    def _idle_status(self) -> str:
        n = len(self.inflight)
        return f"serving ({n} transfer{'s' if n != 1 else ''} in flight)" if n else "serving, idle"

    # -- background duties ----
    async def _pressure_loop(self) -> None:
        """A history of the raw node counters (``weightd doctor`` reads it instead of sampling)."""
        from .doctor import read_counter_texts
        while not self.stopping.is_set():
            texts = await self.run_blocking("misc", read_counter_texts, Path("/"))
            self.pressure.append((time.monotonic(), texts))
            try:
                await asyncio.wait_for(self.stopping.wait(), PRESSURE_INTERVAL_S)
                return
            except asyncio.TimeoutError:
                pass

    async def _h_pressure(self, request: web.Request) -> web.Response:
        try:
            window = float(request.query.get("window", "60"))
        except ValueError:
            raise web.HTTPBadRequest(text="window: expected seconds") from None
        if len(self.pressure) < 2:
            return web.json_response({"error": "no history yet"}, status=404)
        t1, texts1 = self.pressure[-1]
        t0, texts0 = next(((t, x) for t, x in self.pressure if t1 - t <= window), self.pressure[-2])
        if t0 == t1:
            t0, texts0 = self.pressure[-2]
        return web.json_response({"window_s": round(t1 - t0, 3), "t0": texts0, "t1": texts1,
                                  "age_s": round(time.monotonic() - t1, 3)})

    async def _gc_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), GC_INTERVAL_S)
                return
            except asyncio.TimeoutError:
                pass
            try:
                if self.session is not None:  # the origin picks up versions others published
                    await self.run_blocking("misc", seed_held, self.node, self.session, self.role)
                report = await self.run_blocking("misc", self.node.gc)
                if report["evicted"]:
                    log.info("gc evicted %s", ", ".join(report["evicted"]))
                self._status_cache = None
            except Exception as exc:  # keep serving; say it once per round
                log.warning("background gc failed: %s", exc)

    async def _watchdog_loop(self) -> None:
        assert self.notifier.watchdog_s is not None
        while not self.stopping.is_set():
            self.notifier.notify(WATCHDOG=1)
            try:
                await asyncio.wait_for(self.stopping.wait(), self.notifier.watchdog_s / 2)
            except asyncio.TimeoutError:
                pass

    def reload(self) -> None:
        """SIGHUP: a good config replaces the running one; a bad one is refused and the old one kept."""
        try:
            cfg = load_config(self.config_path)
            old_state, new_state = self.config.settings.state_dir, cfg.settings.state_dir
            if new_state != old_state:  # the state lock is held for the old one: switching needs a restart
                raise ConfigError(cfg.source, f"changed from {old_state} to {new_state}; a running daemon keeps "
                                  "its state dir (restart it to switch)", "state_dir")
            node = self._open_node(cfg)  # tier roots `serve` would refuse raise TieringError here
        except (WeightdError, TieringError, OSError) as exc:  # ConfigError is a WeightdError
            self.metrics.config_reload_failures.inc()
            log.error("config reload failed, keeping the running config: %s", exc)
            self.set_status(f"config reload failed, running the previous config: {exc}")
            return
        old_api, new_api = self.config.settings.api, cfg.settings.api
        if (new_api.socket, new_api.group, new_api.request_timeout_s) != \
                (old_api.socket, old_api.group, old_api.request_timeout_s) or \
                cfg.settings.metrics.listen != self.config.settings.metrics.listen:
            log.warning("api.socket, api.group, api.request_timeout_s and metrics.listen changes take effect at "
                        "the next restart")
        self.old_nodes.append(self.node)
        self.node, self.config = node, cfg
        self._status_cache = None
        log.info("config reloaded from %s", cfg.source)
        self.set_status(f"config reloaded; {self._idle_status()}")

    # -- HTTP -----------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=1 << 20)
        r = app.router
        r.add_get(f"/{API_VERSION}/health", self._h_health)
        r.add_get(f"/{API_VERSION}/pressure", self._h_pressure)
        r.add_get(f"/{API_VERSION}/status", self._h(lambda b: self.run_blocking("misc", self.node.status)))
        r.add_post(f"/{API_VERSION}/preload", self._h(self.preload))
        r.add_post(f"/{API_VERSION}/publish", self._h(self._publish, admin="publish"))
        r.add_post(f"/{API_VERSION}/path", self._h(self._path))
        r.add_post(f"/{API_VERSION}/pin", self._h(lambda b, c: self._pin(b, True), admin="pin"))
        r.add_post(f"/{API_VERSION}/unpin", self._h(lambda b, c: self._pin(b, False), admin="unpin"))
        r.add_post(f"/{API_VERSION}/evict", self._h(lambda b, c: self._evict(b), admin="evict"))
        r.add_post(f"/{API_VERSION}/gc", self._h(lambda b, c: self.run_blocking("misc", self.node.gc), admin="gc"))
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unknown"
        try:
            resp = await handler(request)
        except web.HTTPException as exc:  # unknown route or method: a 4xx with a message
            resp = web.json_response({"error": f"{request.method} {request.path}: {exc.reason}", "exit_code": 2},
                                     status=exc.status)
        except ApiError as exc:
            resp = web.json_response({"error": str(exc), "exit_code": exc.exit_code}, status=exc.status)
        except (TieringError, WeightdError, OSError, ValueError) as exc:
            resp = web.json_response({"error": str(exc), "exit_code": exit_code_for(exc)}, status=_status_for(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the daemon keeps serving
            log.exception("internal error on %s", request.path)
            resp = web.json_response({"error": f"internal error: {type(exc).__name__}: {exc}", "exit_code": 1},
                                     status=500)
        self.metrics.requests.labels(route, str(resp.status)).inc()
        return resp

    def _h(self, fn: Callable[..., Awaitable[Any]], admin: str | None = None
           ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A JSON route; ``admin`` names a mutating route: the caller is checked first and ``fn`` gets
        ``(body, caller)``."""
        async def handler(request: web.Request) -> web.Response:
            caller = self._authorize(request, admin) if admin else None
            body: dict[str, Any] = {}
            if request.method == "POST" and request.can_read_body:
                body = await self._read_body(request)
            return web.json_response(await (fn(body, caller) if admin else fn(body)))
        return handler

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(request.read(), self.config.settings.api.request_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(408, f"request body not received within {self.config.settings.api.request_timeout_s:g} s "
                           "([api] request_timeout_s)") from None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, a 5000-digit int, [[[[...
            raise ApiError(400, "request body is not valid JSON (or nests too deep)") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        if _depth(body) > MAX_JSON_DEPTH:
            raise ApiError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
        return body

    def _authorize(self, request: web.Request, route: str) -> "Caller":
        """Mutating routes: root, the daemon's own user, or a member of ``[api] admin_group``."""
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if sock is None or sock.family != socket.AF_UNIX:
            raise ApiError(403, f"{route}: cannot tell who is calling (no peer credentials)")
        pid, uid, gid = peer_credentials(sock)
        caller = Caller(pid, uid, peer_groups(sock, pid, uid, gid))
        admin_group = self.config.settings.api.admin_group
        if uid in (0, os.geteuid()) or (admin_group is not None and admin_group in caller.gids):
            return caller
        group = f"[api] admin_group (gid {admin_group})" if admin_group is not None else "[api] admin_group (not set)"
        raise ApiError(403, f"uid {uid} may not {route}: it needs root, the daemon's user (uid {os.geteuid()}) "
                       f"or membership of {group}")

    async def _h_health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "pid": os.getpid(), "role": self.role, "status": self.status_text})

    async def _publish(self, b: dict[str, Any], caller: "Caller") -> dict[str, Any]:
        name, version, src = _str(b, "name"), _str(b, "version"), _str(b, "dir")
        if not os.path.isabs(src):
            raise ApiError(400, f"'dir' must be an absolute path, got {src!r}")
        await self.run_blocking("misc", check_caller_can_read, src, caller)  # before anything is written
        r = await self.run_blocking("misc", self.node.publish, Path(src), name, version)
        torrent = await self.run_blocking("misc", lambda: ensure_torrent(self.config, self.node.resolve(name, version)))
        if torrent is not None and self.session is not None and self.role == "origin":
            await self.run_blocking("misc", seed_held, self.node, self.session, self.role)
        return {**r.to_dict(), "torrent": str(torrent) if torrent else None}

    async def _path(self, b: dict[str, Any]) -> dict[str, Any]:
        name, version = parse_ref(_str(b, "ref"))
        tier, p = await self.run_blocking("misc", self.node.path, name, version)
        return {"tier": tier, "path": str(p)}

    async def _pin(self, b: dict[str, Any], pin: bool) -> dict[str, Any]:
        name, version = parse_ref(_str(b, "ref"))
        version, changed = await self.run_blocking("misc", self.node.pin if pin else self.node.unpin, name, version)
        return {"name": name, "version": version, "changed": changed}

    async def _evict(self, b: dict[str, Any]) -> dict[str, Any]:
        name, version = parse_ref(_str(b, "ref"))
        tier = b.get("tier")
        if tier is not None and tier not in LOCAL_TIERS:
            raise ApiError(400, f"tier must be one of {', '.join(LOCAL_TIERS)}")
        out = await self.run_blocking("misc", self.node.evict, name, version, tier, force=bool(b.get("force")))
        self._status_cache = None
        return {"evicted": out}

    async def _metrics(self, request: web.Request) -> web.Response:
        body = await self.run_blocking("misc", generate_latest, self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- lifecycle ------------------------------------------------------------------------------------
    async def serve(self) -> None:
        self._take_state_lock()
        sock_path = self.config.settings.api.socket
        sock_path.parent.mkdir(parents=True, exist_ok=True)
        claim_socket(sock_path)  # before anything starts: another daemon's live socket is never ours
        from p2p import P2PSession
        try:
            self.session = P2PSession(p2p_config(self.config))
        except P2PError as exc:
            raise WeightdError(f"p2p.listen: {exc}") from None
        n = await self.run_blocking("misc", seed_held, self.node, self.session, self.role)
        log.info("p2p listening on %s, seeding %d version(s)", self.config.settings.p2p.listen, n)
        loop = asyncio.get_running_loop()
        api = self.config.settings.api
        # an idle connection, or one whose headers do not arrive, is closed after request_timeout_s
        # (aiohttp's keep-alive timer starts at connect and fires while it waits for a whole request)
        runner = web.AppRunner(self.app(), handle_signals=False, access_log=None,
                               keepalive_timeout=api.request_timeout_s, lingering_time=min(api.request_timeout_s, 5.0))
        await runner.setup()
        old_umask = os.umask(0o117)
        try:
            site = web.UnixSite(runner, str(sock_path))
            await site.start()
        finally:
            os.umask(old_umask)
        if api.group is not None:
            os.chown(sock_path, -1, api.group, follow_symlinks=False)
        # (the umask above made it 0660 at bind: no chmod by path, which would follow a link swapped in)
        self.runners.append(runner)
        host, _, port = self.config.settings.metrics.listen.rpartition(":")
        mapp = web.Application()
        mapp.router.add_get("/metrics", self._metrics)
        mrunner = web.AppRunner(mapp, handle_signals=False, access_log=None)
        await mrunner.setup()
        try:
            await web.TCPSite(mrunner, host.strip("[]"), int(port), reuse_address=True).start()
        except OSError as exc:
            raise WeightdError(f"metrics.listen {self.config.settings.metrics.listen}: {exc.strerror}") from None
        self.runners.append(mrunner)
        tl = self.config.settings.p2p.tracker_listen
        if tl and self.role == "origin":
            from p2p import Tracker
            tracker = Tracker(self.config.settings.p2p.allow)

            async def announce(request: web.Request) -> web.Response:
                body = tracker.announce(request.remote or "", request.rel_url.raw_query_string)
                return web.Response(body=body, content_type="text/plain")
            tapp = web.Application()
            tapp.router.add_get("/announce", announce)
            trunner = web.AppRunner(tapp, handle_signals=False, access_log=None)
            await trunner.setup()
            thost, _, tport = tl.rpartition(":")
            try:
                await web.TCPSite(trunner, thost.strip("[]"), int(tport), reuse_address=True).start()
            except OSError as exc:
                raise WeightdError(f"p2p.tracker_listen {tl}: {exc.strerror}") from None
            self.runners.append(trunner)
            log.info("tracker announce endpoint on http://%s/announce", tl)

        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        loop.add_signal_handler(signal.SIGINT, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        tasks = [loop.create_task(self._gc_loop()), loop.create_task(self._pressure_loop())]
        if self.notifier.watchdog_s:
            tasks.append(loop.create_task(self._watchdog_loop()))
        log.info("serving role=%s api=%s metrics=%s", self.role, sock_path, self.config.settings.metrics.listen)
        self.status_text = "serving, idle"
        self.notifier.notify(READY=1, STATUS=self.status_text, MAINPID=os.getpid())

        await self.stopping.wait()
        self.notifier.notify(STOPPING=1, STATUS="stopping")
        log.info("stopping: %d transfer(s) in flight", len(self.inflight))
        for t in tasks:
            t.cancel()
        if self.inflight:  # let transfers finish briefly; what is left resumes from staging next start
            await asyncio.wait(list(self.inflight.values()), timeout=SHUTDOWN_GRACE_S)
        for r in self.runners:
            await r.cleanup()
        try:
            sock_path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> bool:
        """Release everything; True if worker threads were still busy (the caller exits hard)."""
        busy = self._active > 0
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for n in [self.node, *self.old_nodes]:
            try:
                n.close()
            except Exception:
                pass
        if self.session is not None:
            self.session.close()
        self.notifier.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        return busy


class _DaemonP2P:
    """The swarm as a source, through the daemon's one P2P session (none until serve() starts it)."""

    def __init__(self, daemon: "Daemon", cfg: Config) -> None:
        self.daemon, self.cfg = daemon, cfg

    def fetch(self, request):
        from tiering import FetchResult
        session = self.daemon.session
        return P2PFetcher(self.cfg, session).fetch(request) if session is not None else FetchResult(False)


def _str(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str):
        raise ApiError(400, f"'{key}' must be a string")
    return v


def _num(body: dict[str, Any], key: str, default: float) -> float:
    """Seconds: finite, from 0 to MAX_SECONDS (Infinity would lease forever, NaN would mean no lease)."""
    v = body.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 <= v <= MAX_SECONDS:
        shown = repr(v) if not isinstance(v, int) or abs(v) < 10 ** 30 else "a huge number"
        raise ApiError(400, f"'{key}' must be a number of seconds from 0 to {MAX_SECONDS} (7 days), got {shown[:40]}")
    return float(v)


def _depth(v: Any) -> int:
    """How deep containers nest in a parsed JSON value (iterative: a hostile body cannot recurse us)."""
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, d)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return deepest


@dataclass(frozen=True)
class Caller:
    """The other end of an admin connection, as the kernel saw it at connect time."""
    pid: int
    uid: int
    gids: frozenset[int]   # primary and supplementary


def _mode_allows(st: os.stat_result, caller: Caller, want: int) -> bool:
    """POSIX owner/group/other permission bits (``want``: 4 read, 1 search); root may do anything."""
    if caller.uid == 0:
        return True
    if st.st_uid == caller.uid:
        bits = st.st_mode >> 6
    elif st.st_gid in caller.gids:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def check_caller_can_read(top: str, caller: Caller) -> None:
    """Refuse (403) unless ``caller`` could read the whole tree at ``top`` itself: search (x) on every
    directory on the way, read and search on every directory in the tree, read on every file, with
    symlinks (an HF cache snapshot is made of them) checked where they lead."""
    if caller.uid == 0:
        return

    def refuse(path: str, what: str) -> ApiError:
        return ApiError(403, f"uid {caller.uid} may not read {path} (needs {what} permission): publish reads only "
                        "what its caller could read")

    searchable: set[str] = set()

    def traverse(path: str) -> None:  # x on every directory from / down to path
        cur = "/"
        for part in Path(path).parts[1:] if path != "/" else ():
            cur = os.path.join(cur, part)
            if cur in searchable:
                continue
            if not _mode_allows(os.stat(cur), caller, 1):
                raise refuse(cur, "search (x)")
            searchable.add(cur)
        if not _mode_allows(os.stat("/"), caller, 1):
            raise refuse("/", "search (x)")

    traverse(os.path.dirname(os.path.abspath(top)))   # the path as the caller wrote it
    seen: set[str] = set()
    stack = [top]
    while stack:
        real = os.path.realpath(stack.pop())
        if real in seen:
            continue
        seen.add(real)
        traverse(os.path.dirname(real))                  # ... and where it really leads
        st = os.stat(real)
        if not stat.S_ISDIR(st.st_mode):
            if not _mode_allows(st, caller, 4):
                raise refuse(real, "read (r)")
            continue
        if not _mode_allows(st, caller, 5):
            raise refuse(real, "read and search (r-x)")
        searchable.add(real)
        with os.scandir(real) as it:
            for entry in it:
                if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif not _mode_allows(entry.stat(follow_symlinks=False), caller, 4):
                    raise refuse(entry.path, "read (r)")


def claim_socket(path: Path) -> None:
    """Make way for our socket: a stale one is removed; a live one (another daemon, even with another
    state dir), a symlink or anything that is not a socket is refused, never unlinked."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SocketInUse(f"api.socket {path} is a symlink; refusing to use or remove it")
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"api.socket {path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        try:
            path.unlink()  # nobody listens: a stale socket from a daemon that died
        except FileNotFoundError:
            pass
        return
    except OSError as exc:  # a full backlog or a timeout: someone is there
        raise SocketInUse(f"api.socket {path}: something listens on it ({exc.strerror or exc}); refusing to take "
                          "it over") from None
    else:
        pid, uid, _ = peer_credentials(probe)
        raise SocketInUse(f"api.socket {path}: another weightd daemon (pid {pid}, uid {uid}) answers on it; "
                          "refusing to take it over")
    finally:
        probe.close()


def run(config_path: str | None, role: str) -> int:
    daemon = Daemon(config_path, role=role)
    busy = False
    try:
        asyncio.run(daemon.serve())
    finally:
        busy = daemon.close()
    if busy:  # a copy still running in a worker thread: leave it to reconciliation, exit now
        logging.shutdown()
        os._exit(0)
    return 0
