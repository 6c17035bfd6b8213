"""Every TCP listener of the daemon (metrics and probes; the origin's tracker and fleet endpoints)
accepts through one guard, :class:`GuardedListener`, in front of aiohttp's protocol factory:

- at accept, before a byte is read (and before a TLS handshake): an address outside the listener's
  ``allow`` list, or over the cap of open connections per listener or per address, is closed at once
  (with a reset: no ``TIME_WAIT`` is kept for it) and counted;
- a TLS handshake must finish within ``tls_handshake_timeout_s``;
- aiohttp's keep-alive timer starts at connect and is not moved by partial data, so a connection
  that has not sent a whole request's headers within ``idle_timeout_s`` of connecting (or of its
  last answer) is closed: an idle connection and a slowloris trickling headers alike (measured with
  aiohttp 3.14); a request whose body or handler takes longer than ``request_timeout_s`` gets 408,
  and a connection whose peer stops reading its answer (the send buffer full, not draining) for
  ``request_timeout_s`` is cut;
- accept errors (``EMFILE`` and other resource shortages) pause accepting for a moment and are
  logged at most once per ``ACCEPT_LOG_EVERY_S`` with a count, never a traceback per accept.

The admin unix socket is not a TCP listener: nothing here applies to it, and with these caps what
happens on TCP cannot take the descriptors it needs.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from p2p import address_allowed, peer_address

log = logging.getLogger(__name__)

ACCEPT_BATCH = 64         # connections taken per wake-up of the listening socket
ACCEPT_RETRY_S = 0.5      # after a resource shortage (EMFILE, ENFILE, ENOBUFS, ENOMEM): accept again after this
ACCEPT_LOG_EVERY_S = 10.0
_SHORTAGE = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_LINGER_RESET = struct.pack("ii", 1, 0)   # SO_LINGER on, 0 s: close() sends a reset, keeps no TIME_WAIT


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    allow: tuple[str, ...]            # CIDRs that may connect (anything else is closed at accept)
    max_connections: int              # open connections on this listener
    max_connections_per_address: int
    idle_timeout_s: float             # a whole request's headers within this of connecting or of the last answer
    request_timeout_s: float          # a request's body and answer
    tls_handshake_timeout_s: float


def _networks(allow: tuple[str, ...]) -> list[Any]:
    return [ipaddress.ip_network(c, strict=False) for c in allow]


def request_deadline(timeout_s: float) -> Any:
    """aiohttp middleware: a request's handler (reading its body included) ends within ``timeout_s``."""
    @web.middleware
    async def bounded(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        try:
            async with asyncio.timeout(timeout_s):
                return await handler(request)
        except TimeoutError:
            raise web.HTTPRequestTimeout(text=f"request not complete within {timeout_s:g} s\n") from None
    return bounded


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, with its slot given back when the connection ends, and
    cut (aborted) when its peer stops reading: the transport's buffer full (``pause_writing``) for
    ``stalled_s`` without draining. (aiohttp writes an answer after its handler returned, with no
    timeout: a client that never reads would hold its slot for ever.)"""

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None], stalled_s: float) -> None:
        self.inner, self.release, self.stalled_s = inner, release, stalled_s
        self.transport: asyncio.BaseTransport | None = None
        self._stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        if self._stall is None and self.transport is not None:
            self._stall = asyncio.get_running_loop().call_later(self.stalled_s, self._cut)
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self._disarm()
        self.inner.resume_writing()

    def _cut(self) -> None:
        self._stall = None
        if self.transport is not None:
            log.debug("closing a connection whose peer has read nothing for %.1f s", self.stalled_s)
            sock = self.transport.get_extra_info("socket")
            try:   # (a reset: the kernel drops the unread answer now, no orphan keeps it)
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            except OSError:
                pass
            self.transport.abort()   # (connection_lost follows: the slot is given back)

    def _disarm(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        try:
            self.inner.connection_lost(exc)
        finally:
            self.release()


class GuardedListener:
    """A listening TCP socket whose accepts are checked before aiohttp (``server``: the runner's
    protocol factory) sees a connection. ``on_refused(reason)``: "not_allowed", "listener_full" or
    "address_full", for each connection closed at accept."""

    def __init__(self, what: str, listen: str, server: Callable[[], asyncio.Protocol], limits: ListenerLimits, *,
                 ssl_context: Any = None, on_refused: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.listen, self.server, self.ssl_context = what, listen, server, ssl_context
        self.on_refused, self.clock = on_refused, clock
        self.configure(limits)
        self.sock: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.open = 0                          # connections holding a slot
        self.by_address: dict[str, int] = {}
        self.handshakes: set[asyncio.Task[None]] = set()
        self._failures = 0                      # accept errors since the last log line
        self._logged_at: float | None = None
        self._retry: asyncio.TimerHandle | None = None

    def configure(self, limits: ListenerLimits) -> None:
        """New limits (a reload): they apply to the next accepts."""
        self.limits, self._nets = limits, _networks(limits.allow)

    def allowed(self, ip: str) -> bool:
        return address_allowed(ip, self._nets)   # (the tracker reads an address the same way)

    def bind(self) -> None:
        """Bind and listen (an OSError, e.g. the port is taken, is the caller's to report)."""
        host, _, port = self.listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
            sock.listen(min(socket.SOMAXCONN, 1024))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    @property
    def port(self) -> int:
        assert self.sock is not None
        return self.sock.getsockname()[1]

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        assert self.sock is not None
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting (the connections already open are the aiohttp runner's to close)."""
        if self._retry is not None:
            self._retry.cancel()
        if self.sock is not None:
            if self.loop is not None:
                self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for t in list(self.handshakes):
            t.cancel()

    # -- accepting ------------------------------------------------------------------------------------
    def _accept(self) -> None:
        sock = self.sock
        if sock is None:
            return
        for _ in range(ACCEPT_BATCH):
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _SHORTAGE:
                    self._shortage(exc)
                    return
                continue   # (ECONNABORTED and friends: that connection is gone, the next may not be)
            self._admit(conn, str(addr[0]))

    def _shortage(self, exc: OSError) -> None:
        """Out of descriptors or buffers: stop accepting for ACCEPT_RETRY_S (the backlog waits in the
        kernel), and say so once per ACCEPT_LOG_EVERY_S with how often it happened."""
        self._failures += 1
        now = self.clock()
        if self._logged_at is None or now - self._logged_at >= ACCEPT_LOG_EVERY_S:
            log.error("%s %s: cannot accept connections: %s (%d time(s) since the last report); accepting again "
                      "in %.1f s", self.what, self.listen, exc.strerror or exc, self._failures, ACCEPT_RETRY_S)
            self._logged_at, self._failures = now, 0
        if self.loop is not None and self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self._retry = self.loop.call_later(ACCEPT_RETRY_S, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if self.loop is not None and self.sock is not None:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def _admit(self, conn: socket.socket, ip: str) -> None:
        lim = self.limits
        ip = str(peer_address(ip) or ip)   # (::ffff:10.0.0.5 and 10.0.0.5 are one address, for the caps too)
        reason = "not_allowed" if not self.allowed(ip) else \
            "listener_full" if self.open >= lim.max_connections else \
            "address_full" if self.by_address.get(ip, 0) >= lim.max_connections_per_address else None
        if reason is not None:
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            except OSError:
                pass
            conn.close()
            if self.on_refused is not None:
                self.on_refused(reason)
            return
        self.open += 1
        self.by_address[ip] = self.by_address.get(ip, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.open -= 1
            n = self.by_address.get(ip, 1) - 1
            if n > 0:
                self.by_address[ip] = n
            else:
                self.by_address.pop(ip, None)

        conn.setblocking(False)
        assert self.loop is not None
        task = self.loop.create_task(self._connect(conn, release))
        self.handshakes.add(task)
        task.add_done_callback(self.handshakes.discard)

    async def _connect(self, conn: socket.socket, release: Callable[[], None]) -> None:
        """Hand the connection to aiohttp (after the TLS handshake, bounded, with TLS)."""
        assert self.loop is not None
        proto = _Counted(self.server(), release, self.limits.request_timeout_s)
        kw: dict[str, Any] = {}
        if self.ssl_context is not None:
            kw = {"ssl": self.ssl_context, "ssl_handshake_timeout": self.limits.tls_handshake_timeout_s}
        try:
            await self.loop.connect_accepted_socket(lambda: proto, conn, **kw)
        except BaseException as exc:   # (a failed or timed-out handshake, cancelled at stop: the slot is free)
            conn.close()
            release()
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
            if isinstance(exc, Exception):
                log.debug("%s %s: connection dropped before its first request: %s", self.what, self.listen, exc)
