"""The list of workers downloading one torrent, read from every origin's tracker (``GET /swarm``) in
the background while the download runs, so every worker's piece plan starts from the same list.

Connected peers alone are a poor list: at the start of a restart storm a worker knows only the peers
that announced before it, and a connection whose handshake waits behind a capped upload can take
seconds (measured: at N = 16 on 10 MB/s caps, ten of sixteen workers never saw more than ten others
during the whole download). The tracker sees every announce.

**Several trackers** (one per origin): each round asks every tracker, and the list is the union of
the answers not older than ``stale_s``. Every worker registers with every tracker it reaches, so
while one tracker answers, every worker plans on the same union; a tracker that dies, or comes back
empty and fills within a round, changes nothing. What differs: a worker that reaches only some
trackers is on the union anyway, and one that died stays on it until the last answer naming it is
``stale_s`` old (the plan's stalled-owner rule covers that time).

**Dropped owners**: each request also says which owners this node's plan dropped (``drop=``), and
each answer which owners two workers dropped (``dropped``, only workers of that list): every worker
then plans without them within a round, where each used to judge lateness on its own clock (a
worker that dropped a slow owner early waited on a share another had not taken yet, 15-25 s).
Likewise the gateways this node's plan skipped (``skip=``, stalled or never connected; answered as
``skipped``): the other racks then serve the worker that takes across in their place
(``racks.py``), and this rack's workers hash their shares over the same gateways.

One request per tracker per ``every_s`` (a small JSON answer), bounded by ``timeout_s`` as a whole (a
tracker that trickles its answer a byte a second is cut at the deadline, not only one that says
nothing); a list keeps only addresses inside ``[p2p] allow`` and at most the tracker's own
``PER_SWARM`` of them (a rogue tracker cannot fill the plan with addresses no worker has); a tracker
that is not weightd's (404, not JSON) is asked no more; when no tracker has answered for ``stale_s``,
``members`` is None again and the plan falls back to the connected peers. With fleet TLS the request
presents this node's certificate and checks the tracker's against the fleet CA, as libtorrent does.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from typing import TYPE_CHECKING, Sequence

from tiering import Cutoff

from .config import RACK, address_allowed

if TYPE_CHECKING:
    from .certs import FleetTLS

log = logging.getLogger(__name__)

MAX_ANSWER = 4 << 20   # bytes read of an answer (10,000 workers are ~300 KB)
MAX_MEMBERS = 10_000   # addresses kept of one answer (the tracker's PER_SWARM)
MAX_DROPS = 64         # owners said dropped in one request (the tracker's MAX_DROPS)
MAX_SKIPS = 16         # gateways said skipped in one request (both lists fit the tracker's MAX_QUERY)


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
                 stale_s: float = 10.0, allow: Sequence[str] = ()) -> None:
        """``allow``: the CIDRs a member's address must be in (``[p2p] allow``; empty: any address)."""
        # (the tracker lists the address a request comes from: from the node's own address, the one
        # its peers know it by, as libtorrent's connections do with ``outgoing_interfaces``)
        self.source = (source_ip, 0) if source_ip and source_ip not in ("0.0.0.0", "::") else None
        self.urls = [u for u in (swarm_url(t, info_hash, rack, want) for t in trackers) if u]
        self.every_s, self.timeout_s, self.stale_s = every_s, timeout_s, stale_s
        self.allow = tuple(ipaddress.ip_network(c, strict=False) for c in allow)
        self._ctx = None
        if tls is not None:
            ctx = ssl.create_default_context(cadata=tls.ca_pem.decode())
            ctx.check_hostname = False   # (fleet certificates name IPs or nodes; the CA is what is checked)
            if tls.cert_path and tls.key_path:
                ctx.load_cert_chain(tls.cert_path, tls.key_path)
            self._ctx = ctx
        # per tracker: (downloading workers, workers downloading other files of the torrent: ip -> rack,
        # when it answered)
        self._lists: dict[str, tuple[dict[str, str], dict[str, str], float]] = {}
        self.dropping: frozenset[str] = frozenset()   # owners this node's plan dropped: said to the trackers
        self.skipping: frozenset[str] = frozenset()   # gateways this node's plan skipped: said likewise
        # per tracker: (owners others dropped, gateways others skipped, when)
        self._told: dict[str, tuple[frozenset[str], frozenset[str], float]] = {}
        self.changed_at = 0.0   # when the list last changed (a list still growing is not settled)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.requests = self.failures = 0

    @property
    def members(self) -> dict[str, str] | None:
        """ip -> rack of the downloading workers, as of the last good answer (None: none lately)."""
        with self._lock:
            return self._merged(0)

    @property
    def others(self) -> dict[str, str]:
        """ip -> rack of the workers downloading other files of this torrent (a partial copy's, or the
        whole when this node wants a part), as of the last good answer: none of them owns a piece of
        this node's plan."""
        with self._lock:
            return self._merged(1) or {}

    def _merged(self, which: int) -> dict[str, str] | None:
        """The union of the trackers' answers not older than ``stale_s`` (``which``: 0 the list, 1 the
        others); None when there is none. With the lock held."""
        now = time.monotonic()
        fresh = [got for got in self._lists.values() if now - got[2] <= self.stale_s]
        if not fresh:
            return None
        out: dict[str, str] = {}
        for got in fresh:
            for ip, rack in got[which].items():
                out.setdefault(ip, rack)
        return out

    @property
    def dropped(self) -> frozenset[str] | None:
        """Owners some other worker's plan dropped (stalled or late), as the trackers answering lately
        say: this node plans without them too, at once. None when no tracker answered lately: an
        outage says nothing of them (what was told stands)."""
        return self._told_now(0)

    @property
    def skipped(self) -> frozenset[str] | None:
        """Gateways some worker's plan skipped (stalled, or listed and never connected), as the
        trackers answering lately say (None: none answered lately)."""
        return self._told_now(1)

    def _told_now(self, which: int) -> frozenset[str] | None:
        now = time.monotonic()
        with self._lock:
            fresh = [told[which] for told in self._told.values() if now - told[2] <= self.stale_s]
            return frozenset().union(*fresh) if fresh else None

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
                if url not in gone and not self._ask(url):
                    gone.add(url)
            if len(gone) == len(self.urls):
                return
            self._stop.wait(self.every_s)

    def _ask(self, url: str) -> bool:
        """One request to one tracker, its answer kept; False: the tracker is not weightd's."""
        self.requests += 1
        drops, skips = sorted(self.dropping)[:MAX_DROPS], sorted(self.skipping)[:MAX_SKIPS]
        try:
            got, others, dropped, skipped = self._get(url + (f"&drop={','.join(drops)}" if drops else "")
                                                      + (f"&skip={','.join(skips)}" if skips else ""))
        except _NotOurs as exc:
            log.info("p2p: %s gives no member list (%s): planning on connected peers", url, exc)
            return False
        except (OSError, ValueError) as exc:
            self.failures += 1
            log.debug("p2p: member list from %s: %s", url, exc)
            return True
        with self._lock:
            before = self._merged(0)
            self._lists[url] = (got, others, time.monotonic())
            self._told[url] = (dropped, skipped, time.monotonic())
            if self._merged(0) != before:
                self.changed_at = time.monotonic()
        return True

    def _request(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        u = urllib.parse.urlsplit(url)
        if u.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                u.hostname or "", u.port, timeout=timeout_s, context=self._ctx, source_address=self.source)
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout_s,
                                              source_address=self.source)
        cut = Cutoff(conn, time.monotonic() + timeout_s)   # (the whole request, not each read)
        try:
            conn.request("GET", f"{u.path}?{u.query}")
            r = conn.getresponse()
            body = r.read(MAX_ANSWER + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise (TimeoutError(f"no whole answer within {timeout_s:g} s") if cut.fired else exc) from None
        finally:
            cut.stop()
            conn.close()
        if cut.fired:   # (cut while the body was read: what came is not all of it)
            raise TimeoutError(f"no whole answer within {timeout_s:g} s")
        return r.status, body

    def _get(self, url: str) -> tuple[dict[str, str], dict[str, str], frozenset[str], frozenset[str]]:
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
        others, dropped, skipped = doc.get("others"), doc.get("dropped"), doc.get("skipped")
        listed = self._rows(rows)
        # (only addresses of the answer's own list: anything else, a nested list included, is not one)
        named, skips = (frozenset(ip for ip in (x if isinstance(x, list) else [])[:MAX_MEMBERS]
                                  if isinstance(ip, str) and ip in listed) for x in (dropped, skipped))
        # (a tracker of ours lists at most a quarter per worker that said so; more, from a rogue
        # tracker, would make this node plan alone and pull everything from the origin: not heeded;
        # skipped gateways: at most half a rack, each said by two rack-mates; a rack with more: none)
        size, said = Counter(listed.values()), Counter(listed[ip] for ip in skips)
        over = {r for r, k in said.items() if k > max(1, size[r] // 2)}
        return listed, self._rows(others if isinstance(others, list) else []), \
            named if len(named) <= max(1, len(listed) // 4) else frozenset(), \
            frozenset(ip for ip in skips if listed[ip] not in over)

    def _rows(self, rows: list) -> dict[str, str]:
        """ip -> rack of an answer's ``[ip, rack]`` rows: addresses only, inside ``allow``, at most
        :data:`MAX_MEMBERS` (what a tracker of ours would ever list)."""
        out: dict[str, str] = {}
        for row in rows:
            if len(out) >= MAX_MEMBERS:
                break
            if isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) and isinstance(row[1], str) \
                    and (address_allowed(row[0], self.allow) if self.allow else is_ip(row[0])):
                out[row[0]] = row[1] if RACK.fullmatch(row[1]) else ""
        return out


def is_ip(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class _NotOurs(Exception):
    pass
