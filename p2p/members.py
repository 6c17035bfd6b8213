"""The list of workers downloading one torrent, read from the origin's tracker (``GET /swarm``) in the
background while the download runs, so every worker's piece plan starts from the same list.

Connected peers alone are a poor list: at the start of a restart storm a worker knows only the peers
that announced before it, and a connection whose handshake waits behind a capped upload can take
seconds (measured: at N = 16 on 10 MB/s caps, ten of sixteen workers never saw more than ten others
during the whole download). The tracker sees every announce.

One request per ``every_s`` (a small JSON answer), bounded by ``timeout_s``; a tracker that is not
weightd's (404, not JSON) or keeps failing makes ``members`` None again after ``stale_s``, and the
plan falls back to the connected peers. With fleet TLS the request presents this node's certificate
and checks the tracker's against the fleet CA, as libtorrent does.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING

from .config import RACK

if TYPE_CHECKING:
    from .certs import FleetTLS

log = logging.getLogger(__name__)

MAX_ANSWER = 4 << 20   # bytes read of an answer (10,000 workers are ~300 KB)


def swarm_url(tracker: str, info_hash: bytes, rack: str = "", want: str = "") -> str | None:
    """``http(s)://host:port/swarm?info_hash=...[&rack=NAME][&want=TAG]`` beside an ``.../announce``
    URL (None: not one). Each request registers this node as downloading for a few seconds (``want``:
    a partial copy's files, see ``Subset.tag``)."""
    base = tracker.split("?", 1)[0]
    if not base.startswith(("http://", "https://")) or not base.endswith("/announce"):
        return None
    return (base[: -len("announce")] + "swarm?info_hash=" + urllib.parse.quote_from_bytes(info_hash)
            + (f"&rack={rack}" if rack else "") + (f"&want={want}" if want else ""))


class Membership:
    def __init__(self, trackers: tuple[str, ...], info_hash: bytes, tls: "FleetTLS | None" = None, *,
                 rack: str = "", source_ip: str = "", want: str = "", every_s: float = 1.0, timeout_s: float = 2.0,
                 stale_s: float = 10.0) -> None:
        # (the tracker lists the address a request comes from: from the node's own address, the one
        # its peers know it by, as libtorrent's connections do with ``outgoing_interfaces``)
        self.source = (source_ip, 0) if source_ip and source_ip not in ("0.0.0.0", "::") else None
        self.urls = [u for u in (swarm_url(t, info_hash, rack, want) for t in trackers) if u]
        self.every_s, self.timeout_s, self.stale_s = every_s, timeout_s, stale_s
        self._ctx = None
        if tls is not None:
            ctx = ssl.create_default_context(cadata=tls.ca_pem.decode())
            ctx.check_hostname = False   # (fleet certificates name IPs or nodes; the CA is what is checked)
            if tls.cert_path and tls.key_path:
                ctx.load_cert_chain(tls.cert_path, tls.key_path)
            self._ctx = ctx
        self._members: dict[str, str] | None = None
        self._others: dict[str, str] = {}   # workers downloading other files of the torrent: ip -> rack
        self._at = 0.0
        self.changed_at = 0.0   # when the list last changed (a list still growing is not settled)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests = self.failures = 0

    @property
    def members(self) -> dict[str, str] | None:
        """ip -> rack of the downloading workers, as of the last good answer (None: none lately)."""
        with self._lock:
            if self._members is None or time.monotonic() - self._at > self.stale_s:
                return None
            return self._members

    @property
    def others(self) -> dict[str, str]:
        """ip -> rack of the workers downloading other files of this torrent (a partial copy's, or the
        whole when this node wants a part), as of the last good answer: none of them owns a piece of
        this node's plan."""
        with self._lock:
            if self._members is None or time.monotonic() - self._at > self.stale_s:
                return {}
            return self._others

    def settled(self, quiet_s: float) -> dict[str, str] | None:
        """The list, once it has not changed for ``quiet_s`` (workers still joining move slices)."""
        members = self.members
        return members if members is not None and time.monotonic() - self.changed_at >= quiet_s else None

    def start(self) -> "Membership":
        if self.urls:
            self._thread = threading.Thread(target=self._run, name="p2p-members", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop asking, and tell the trackers this node is done (best effort: else it expires)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
            for url in self.urls:
                try:
                    self._request(url + "&done=1", 1.0)
                except (OSError, ValueError, http.client.HTTPException):
                    pass

    def _run(self) -> None:
        gone: set[str] = set()   # trackers that answered 404/403 or not JSON: not asked again
        while not self._stop.is_set():
            for url in self.urls:
                if url in gone:
                    continue
                self.requests += 1
                try:
                    got = self._get(url)
                except _NotOurs as exc:
                    log.info("p2p: %s gives no member list (%s): planning on connected peers", url, exc)
                    gone.add(url)
                    continue
                except (OSError, ValueError) as exc:
                    self.failures += 1
                    log.debug("p2p: member list from %s: %s", url, exc)
                    continue
                got, others = got
                with self._lock:
                    if got != self._members:
                        self.changed_at = time.monotonic()
                    self._members, self._others, self._at = got, others, time.monotonic()
                break
            if len(gone) == len(self.urls):
                return
            self._stop.wait(self.every_s)

    def _request(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        u = urllib.parse.urlsplit(url)
        if u.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                u.hostname or "", u.port, timeout=timeout_s, context=self._ctx, source_address=self.source)
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout_s,
                                              source_address=self.source)
        try:
            conn.request("GET", f"{u.path}?{u.query}")
            r = conn.getresponse()
            return r.status, r.read(MAX_ANSWER + 1)
        finally:
            conn.close()

    def _get(self, url: str) -> tuple[dict[str, str], dict[str, str]]:
        try:
            status, body = self._request(url, self.timeout_s)
        except http.client.HTTPException as exc:
            raise ValueError(str(exc)) from None
        if len(body) > MAX_ANSWER:
            raise ValueError("answer too large")
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):   # (a deeply nested answer)
            raise _NotOurs(f"HTTP {status}, not JSON") from None
        if status != 200:  # weightd's tracker says why: "no such swarm" (yet) is worth asking again
            if not isinstance(doc, dict) or "failure" not in doc or status == 403:
                raise _NotOurs(f"HTTP {status}")
            raise ValueError(f"HTTP {status}: {doc['failure']}")
        rows = doc.get("downloading") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise _NotOurs("not a member list")
        others = doc.get("others")
        return _rows(rows), _rows(others if isinstance(others, list) else [])   # (a tracker before "others": none)


def _rows(rows: list) -> dict[str, str]:
    out: dict[str, str] = {}
    for row in rows:
        if isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) and isinstance(row[1], str):
            out[row[0]] = row[1] if RACK.fullmatch(row[1]) else ""
    return out


class _NotOurs(Exception):
    pass
