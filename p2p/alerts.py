"""The one consumer of a session's alert queue.

libtorrent's ``pop_alerts`` hands each alert to one caller, so exactly one thread calls it: the pump
blocks in ``wait_for_alert`` (a short timeout, so ``stop()`` is prompt), pops, and dispatches. Nothing
else in weightd ever calls ``pop_alerts``: a metrics scrape reads counters, a download waits on its own
queue.

An alert object is only valid until the next ``pop_alerts`` (the bindings hand out pointers into the
session's alert buffer), so the pump copies what anyone needs into an immutable :class:`AlertEvent`
before the next pop, and only events leave its thread:

- counters (hash failures, bans, blocked peers, and the byte totals the session adds) live under one
  lock and are read as a snapshot;
- each transfer registers a queue under its v2 info-hash (``transfer(key)``) before it adds its
  torrent, and gets the events of that torrent, in order, plus a ``TICK`` after every batch the
  session posts (so a download's loop wakes whenever libtorrent has news, as when it waited on the
  session's queue itself: the piece plan keeps its cadence);
- ``subscribe(callback)`` calls ``callback(event)`` on the pump thread for every event. It must not
  block: the daemon hands each event to its asyncio loop, the one owner of its scheduling state::

      unsubscribe = session.subscribe(lambda ev: loop.call_soon_threadsafe(on_alert, ev))

  A callback that raises is logged and stays subscribed; the pump goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import libtorrent as lt

from .errors import P2PError

log = logging.getLogger(__name__)

#: alert type -> counter it adds one to
COUNTED = {lt.hash_failed_alert: "hash_failures", lt.peer_ban_alert: "peer_bans", lt.peer_blocked_alert: "blocked"}
COUNTERS = ("hash_failures", "peer_bans", "blocked", "downloaded", "uploaded_gone")


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """What weightd keeps of one libtorrent alert (plain values: safe on any thread, at any time)."""
    kind: str                    # the alert's type name: "cache_flushed_alert", "torrent_error_alert", ...
    info_hash: str | None        # v2 info-hash of its torrent (None: a session alert, or a torrent gone)
    message: str
    endpoint: str | None = None  # the peer, for peer alerts ("IP:PORT")
    error: bool = False          # the transfer failed (torrent_error_alert, file_error_alert)
    operation: str | None = None  # what failed, for peer errors ("ssl_handshake", "sock_read", ...)
    piece: int | None = None     # piece and block, for block_finished_alert (only with [p2p] trace)
    block: int | None = None


#: put in every transfer's queue after each batch of alerts (carries nothing; wakes the loop)
TICK = AlertEvent("tick", None, "")


def _info_hash(a: lt.alert) -> str | None:
    if not isinstance(a, lt.torrent_alert):
        return None
    try:
        return str(a.handle.info_hashes().v2)
    except RuntimeError:  # the torrent was removed meanwhile (invalid handle)
        return None


def _endpoint(ep: object) -> str:
    # the bindings hand out (ip, port) tuples
    if isinstance(ep, tuple) and len(ep) == 2:
        host, port = ep
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(ep)


def event_of(a: lt.alert) -> AlertEvent:
    endpoint = getattr(a, "endpoint", None) if isinstance(a, lt.peer_alert) else None
    op = getattr(a, "op", None) if isinstance(a, (lt.peer_error_alert, lt.peer_disconnected_alert)) else None
    return AlertEvent(type(a).__name__, _info_hash(a), a.message(),
                      None if endpoint is None else _endpoint(endpoint),
                      isinstance(a, (lt.torrent_error_alert, lt.file_error_alert)),
                      None if op is None else lt.operation_name(op),
                      *((a.piece_index, a.block_index) if isinstance(a, lt.block_finished_alert) else ()))


class AlertPump:
    def __init__(self, ses: lt.session, *, wait_ms: int = 50) -> None:
        self._ses, self._wait_ms = ses, wait_ms
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._transfers: dict[str, queue.SimpleQueue[AlertEvent]] = {}
        self._subscribers: dict[int, Callable[[AlertEvent], None]] = {}
        self._next_id = 0
        self._delivering = threading.RLock()  # held while callbacks run: unsubscribe waits for them
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2p-alerts", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop pumping (returns once the thread is gone; alerts after it stay in libtorrent's queue)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    # -- the pump thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._ses.wait_for_alert(self._wait_ms)
                alerts = self._ses.pop_alerts()
            except Exception:  # noqa: BLE001 (never expected: keep trying, without spinning)
                log.exception("p2p alert pump: cannot read the alert queue")
                self._stop.wait(1.0)
                continue
            for a in alerts:  # (each alert is valid only until the next pop: all of them now)
                try:
                    self._dispatch(a)
                except Exception:  # noqa: BLE001 (the pump must outlive one bad alert)
                    log.exception("p2p alert pump: dispatch failed")
            if alerts:
                self._tick()

    def _tick(self) -> None:
        with self._lock:
            queues = list(self._transfers.values())
        for q in queues:
            q.put(TICK)

    def _dispatch(self, a: lt.alert) -> None:
        ev = event_of(a)
        with self._lock:
            counter = COUNTED.get(type(a))
            if counter is not None:
                self._counters[counter] += 1
            q = self._transfers.get(ev.info_hash) if ev.info_hash is not None else None
        if q is not None:
            q.put(ev)
        with self._delivering:
            with self._lock:
                subscribers = list(self._subscribers.values())
            for callback in subscribers:
                try:
                    callback(ev)
                except Exception:  # noqa: BLE001
                    log.exception("p2p alert subscriber %r failed", callback)

    # -- for everyone else ----------------------------------------------------------------------------
    @contextmanager
    def transfer(self, info_hash: str) -> Iterator[queue.SimpleQueue[AlertEvent]]:
        """The events of the torrent ``info_hash`` while the ``with`` block runs (register before
        adding the torrent, so none is missed)."""
        q: queue.SimpleQueue[AlertEvent] = queue.SimpleQueue()
        with self._lock:
            if info_hash in self._transfers:
                raise P2PError(f"a transfer of {info_hash} is already running in this session")
            self._transfers[info_hash] = q
        try:
            yield q
        finally:
            with self._lock:
                del self._transfers[info_hash]

    def subscribe(self, callback: Callable[[AlertEvent], None]) -> Callable[[], None]:
        """Call ``callback(event)`` on the pump thread for every event; returns the unsubscribe function
        (once it returns, ``callback`` is not called again)."""
        with self._lock:
            token, self._next_id = self._next_id, self._next_id + 1
            self._subscribers[token] = callback

        def unsubscribe() -> None:
            with self._delivering, self._lock:
                self._subscribers.pop(token, None)
        return unsubscribe

    def add(self, counter: str, n: int) -> None:
        with self._lock:
            self._counters[counter] += n

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)
