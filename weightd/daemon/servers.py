"""Where the daemon listens: the admin API on its unix socket (mode 0660 from the bind, the ``[api]
group``, an idle connection closed after ``[api] request_timeout_s``, and removed at exit only while
it is still the socket this daemon bound), and the TCP listeners (metrics and probes; the origin's
tracker and fleet endpoints), each behind the accept guard of :mod:`.listeners`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import WeightdError
from .listeners import GuardedListener, ListenerLimits, request_deadline

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)


class Servers:
    def __init__(self, d: "DaemonContext") -> None:
        self.d = d
        self.runners: list[web.AppRunner] = []
        self.listeners: list[GuardedListener] = []   # every TCP listener (metrics, tracker), in start order
        self._socket_id: tuple[int, int] | None = None   # (st_dev, st_ino) of the admin socket this daemon bound

    async def start_api(self, app: web.Application) -> None:
        """The admin API on ``[api] socket``."""
        api, sock_path = self.d.config.settings.api, self.d.config.settings.api.socket
        # an idle connection, or one whose headers do not arrive, is closed after request_timeout_s
        # (aiohttp's keep-alive timer starts at connect and fires while it waits for a whole request)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=api.request_timeout_s, lingering_time=min(api.request_timeout_s, 5.0))
        await runner.setup()
        self.runners.append(runner)   # (cleaned up at close(), whatever fails below)
        old_umask = os.umask(0o117)
        try:
            await web.UnixSite(runner, str(sock_path)).start()
        except OSError as exc:
            raise WeightdError(f"api.socket {sock_path}: cannot listen: {exc.strerror or exc}") from None
        finally:
            os.umask(old_umask)
        st = os.lstat(sock_path)
        self._socket_id = (st.st_dev, st.st_ino)   # (what close() removes on the way out: this inode only)
        if api.group is not None:
            try:
                os.chown(sock_path, -1, api.group, follow_symlinks=False)
            except OSError as exc:   # (the socket is removed on the way out: close())
                raise WeightdError(f"api.group {api.group}: cannot give the admin socket {sock_path} to it: "
                                   f"{exc.strerror or exc} (the daemon's user must be root or in that group)") from None
        # (the umask above made it 0660 at bind: no chmod by path, which would follow a link swapped in)

    def limits(self, listener: str) -> ListenerLimits:
        """The caps and timeouts of ``[listeners]``, with the listener's allow list: ``[metrics] allow``
        for metrics and probes, ``[p2p] allow`` for the tracker and fleet endpoints."""
        s = self.d.config.settings
        lim = s.listeners
        allow = s.metrics.allow if listener == "metrics" else s.p2p.allow
        return ListenerLimits(allow, lim.max_connections, lim.max_connections_per_address, lim.idle_timeout_s,
                              lim.request_timeout_s, lim.tls_handshake_timeout_s)

    async def start_tcp(self, app: web.Application, listen: str, what: str, listener: str,
                        ssl_context: Any = None) -> None:
        """A TCP listener behind the accept guard (listeners.py): allow list, connection caps, header,
        idle, request and TLS handshake timeouts, accept errors logged at a bounded rate."""
        limits = self.limits(listener)
        app.middlewares.append(request_deadline(limits.request_timeout_s))
        # (keep-alive timer: from connect, and from each answer, to the next whole request's headers)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=limits.idle_timeout_s, lingering_time=1.0)
        await runner.setup()
        self.runners.append(runner)
        refused = self.d.metrics.tcp_refused
        guard = GuardedListener(what, listen, runner.server, limits, ssl_context=ssl_context,
                                on_refused=lambda reason: refused.labels(listener, reason).inc())
        try:
            guard.bind()
        except OSError as exc:
            raise WeightdError(f"{what} {listen}: {exc.strerror or exc}") from None
        guard.start()
        self.listeners.append(guard)
        self.d.metrics.tcp_open.labels(listener).set_function(lambda: guard.open)

    def reconfigure(self) -> None:
        """After a reload: the TCP listeners' allow lists and caps take effect at once."""
        for g, listener in zip(self.listeners, ("metrics", "tracker")):
            g.configure(self.limits(listener))

    async def close(self, sock_path: Path) -> None:
        """Stop listening, and remove the admin socket if it is still ours (stopped, or failed to start:
        a port taken, a bad file; never leave our socket behind)."""
        for g in self.listeners:
            g.close()
        for r in self.runners:
            try:
                await r.cleanup()
            except Exception as exc:  # noqa: BLE001 (the rest is still released)
                log.warning("listener cleanup: %s", exc)
        self._remove_socket(sock_path)

    def _remove_socket(self, sock_path: Path) -> None:
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
