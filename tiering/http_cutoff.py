"""A whole-request deadline for ``http.client`` connections.

A socket timeout bounds each read, not a request: a server that sends its answer a byte every second
never trips it, and holds the caller for as long as it likes. :class:`Cutoff` watches one connection
and shuts its socket down at the deadline, so the read it is blocked in returns at once. Used by every
client that asks a peer over HTTP in a loop: the fleet client (origins) and the member lists (trackers).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time


class Cutoff:
    """Shuts a connection's socket down at ``end`` (time.monotonic()) unless the call ended first: the
    read it is blocked in returns at once. One short-lived thread per call."""

    def __init__(self, conn: http.client.HTTPConnection, end: float) -> None:
        self.conn, self.end, self.fired, self.done = conn, end, False, threading.Event()
        self.thread = threading.Thread(target=self._watch, name="weightd-origin-deadline", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        if self.done.wait(max(0.0, self.end - time.monotonic())):
            return
        self.fired = True
        while True:   # (the socket exists once connect() made it; connect is bounded by its own timeout)
            sock = self.conn.sock
            if sock is not None:
                try:   # (socket.socket's own shutdown: the file descriptor, even under TLS)
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if self.done.wait(0.05):
                return

    def stop(self) -> None:
        self.done.set()
