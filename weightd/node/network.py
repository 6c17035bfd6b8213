"""Weight traffic yields the link to serving traffic (design §16, issue 37 part 1).

What is measured, every ``SAMPLE_S`` (1 s), as rates over the last ``WINDOW_S`` (2 s: libtorrent
counts a byte when it enters the socket, the link when it leaves the queue, and at a low limit
libtorrent sends in bursts: over one second the two disagree by a burst), on each interface carrying weightd's traffic
(``[network] interfaces``, else found from the routes to the ``[p2p]`` peers, trackers and listen
addresses and the cold tier's host, ``ip -j route get``; a local address counts as the interface
holding it):

- the link's bytes, rx and tx (``/proc/net/dev``);
- weightd's own: the libtorrent session's totals (payload and protocol, ``P2PSession.traffic``) and an
  object-store cold tier's bytes read and written (its client's counters). Counted on the wire as
  ``WIRE`` (1.06) times that, plus ``ACKS`` (3%) of the other direction's (the TCP acknowledgements
  they cause), so weightd's own transfer never passes for someone else's. Not seen: reads of a cold
  tier on a network filesystem (the kernel's NFS client; no counter of weightd's has them), which
  count as others';
- others' = link - own, never below 0.

The rule, for each direction (download = rx, upload = tx) and capacity ``C`` (``[network]
capacity``, else ``/sys/class/net/IF/speed``):

- others' rate (over the 2 s window) is smoothed by an EWMA of time constant ``TAU_S`` (0.5 s) and
  taken as max(this sample, EWMA): a rise is followed at once (yield fast), a fall only as the window
  and the EWMA let go of it (one quiet second halves it, no more);
- quiet: others' below ``QUIET_ENTER`` (3%) of C; quiet ends above ``QUIET_LEAVE`` (6%) (hysteresis,
  so traffic hovering at the edge does not flip the target);
- the target: C while quiet: nobody to yield to, so a transfer alone may fill the link (issue 37 (a),
  >= 85%; the ceiling is headroom for others' traffic, and with none on the link it would only slow
  the weights down); otherwise ceiling * C - others' - weightd's own uncontrolled bytes (object-store
  reads), within [floor * C, C]: the link's total stays under the ceiling, and weights still arrive at
  the floor;
- while the link is full (others' + weightd's over ``FULL``, 90% of C) and not quiet, others' rate
  is only what they could squeeze in beside weightd, not what they want: the target is then at most
  ``BACKOFF`` (half) of weightd's own controlled rate (or of its limit, if lower: libtorrent follows a
  new limit about a second late), so weightd halves each second until the link has room and others'
  demand shows (a 70% flow joining a full link: ~2 s); once under FULL the target is the ceiling's
  again, which leaves the link at ~80%, under FULL, so halving does not repeat;
- the limit falls to the target at once and rises toward it by at most ``RAISE_PER_S`` (40%) of C per
  second: from the floor back to the whole link in under 3 s; after a 70% flow stops, others' rate is
  quiet again after ~2-3 s (the window, then the EWMA), so weightd is back to the whole link in ~3-4 s.

The limits are libtorrent's session limits (``P2PSession.set_yield_limits``; libtorrent ticks every
100 ms instead of its 500, ``p2p.settings.TICK_MS``, so a lowered limit holds within about a second
instead of seconds of silence and bursts).

No oscillation: weightd's own bytes are never others', so lowering its rate does not lower the target;
a step in others' traffic gives one fall, held while the flow lasts (max with the EWMA), and one
bounded rise after it. With several interfaces the session takes the lowest limit (its counters are
not per interface: its bytes are taken as on each); a rule at its own link's capacity sets none. A
limit is never below 1 byte/s (0 is libtorrent's "no limit"); a watched interface gone from
``/proc/net/dev`` holds the last limits. The session's limits are the lower of this and
the fixed ``[p2p] upload_limit``/``download_limit``; intent windows and ``bandwidth`` caps still apply
to each transfer, ``[tiers.cold] bandwidth`` to cold reads (object-store reads are measured, not
slowed: their rate comes off P2P's share).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from .network_routes import endpoints_of, find_interfaces
from .pressure import link_info, parse_netdev, read_text

if TYPE_CHECKING:
    from ..metrics import NetworkGauges

log = logging.getLogger(__name__)

SAMPLE_S = 1.0
WINDOW_S = 2.0
TAU_S = 0.5
RAISE_PER_S = 0.4
QUIET_ENTER, QUIET_LEAVE = 0.03, 0.06
FULL, BACKOFF = 0.9, 0.5
WIRE, ACKS = 1.06, 0.03
DIRECTIONS = ("download", "upload")
LT_MAX_RATE = 2**31 - 1   # libtorrent keeps rate limits in 32-bit ints (a larger one wraps): ~2.1 GB/s is the
                          # highest limit it can hold, so on links above ~17 Gbit/s a yield caps weightd there
RECONFIGURE_S = 60.0   # while off or on interfaces found from the routes: configure again this often


@dataclass
class YieldRule:
    """The control rule of one direction of one link (module docstring); rates in bytes/s."""
    capacity: int
    ceiling: float = 0.8
    floor: float = 0.05
    ewma: float = 0.0
    quiet: bool = True
    limit: float = -1.0     # (-1: not set yet: the first step takes the target)

    def others_seen(self, others: float, dt: float) -> float:
        """Others' rate as the rule uses it: max(sample, EWMA of tau TAU_S)."""
        a = 1.0 - math.exp(-dt / TAU_S) if dt > 0 else 1.0
        self.ewma += a * (others - self.ewma)
        return max(others, self.ewma)

    def step(self, others: float, dt: float, own: float = 0.0, uncontrolled: float = 0.0) -> float:
        """One sample: others' rate, weightd's controlled (``own``) and uncontrolled own rates over the
        last ``dt`` s -> the limit of weightd's controlled traffic (bytes/s; ``capacity``: the whole link)."""
        c = float(self.capacity)
        others = max(0.0, others)
        seen = self.others_seen(others, dt)
        self.quiet = seen < (QUIET_LEAVE if self.quiet else QUIET_ENTER) * c
        if self.quiet:
            target = c
        else:
            target = min(c, max(self.floor * c, self.ceiling * c - seen - uncontrolled))
            if others + own + uncontrolled > FULL * c:
                # the link is full: others' rate is what they could squeeze in, not what they want
                held = own if self.limit < 0 else min(own, self.limit)   # (libtorrent follows a second late)
                target = min(target, max(self.floor * c, BACKOFF * held))
        if self.limit < 0 or target <= self.limit:
            self.limit = target
        else:
            self.limit = min(target, self.limit + RAISE_PER_S * c * dt)
        return self.limit


@dataclass
class Sample:
    """Counters at one moment: per interface (rx, tx) bytes; weightd's own (rx, tx) that it controls
    (P2P) and that it only measures (object store)."""
    t: float
    links: dict[str, tuple[int, int]]
    p2p: tuple[int, int] = (0, 0)
    store: tuple[int, int] = (0, 0)


def wire(own: tuple[float, float]) -> tuple[float, float]:
    """weightd's own (rx, tx) rates as the link sees them: TCP/IP headers and the other way's ACKs."""
    rx, tx = own
    return rx * WIRE + tx * ACKS, tx * WIRE + rx * ACKS


def rates(a: Sample, b: Sample) -> dict[str, Any]:
    """Rates between two samples: per interface link (rx, tx), own controlled and uncontrolled."""
    dt = max(b.t - a.t, 1e-3)

    def per_s(x: tuple[int, int], y: tuple[int, int]) -> tuple[float, float]:
        return max(0, y[0] - x[0]) / dt, max(0, y[1] - x[1]) / dt
    links = {n: per_s(a.links[n], b.links[n]) for n in b.links if n in a.links}
    return {"dt": dt, "links": links, "p2p": per_s(a.p2p, b.p2p), "store": per_s(a.store, b.store)}


@dataclass
class NetworkYield:
    """The controller: samples, the rules per (interface, direction), the limits it sets, its state
    for status and the metrics (``gauges``). ``tick`` is called from one thread at a time."""
    gauges: "NetworkGauges | None" = None   # (weightd.metrics: where every metric is declared)
    rules: dict[tuple[str, str], YieldRule] = field(default_factory=dict)
    last: Sample | None = None
    settings: Any = None
    interfaces: tuple[str, ...] = ()
    capacity: dict[str, int] = field(default_factory=dict)
    enabled: bool = False
    reason: str = "starting"
    view: dict[str, Any] = field(default_factory=dict)
    applied: tuple[int, int, bool] | None = None   # (download, upload, on) set on the session; None: never
    history: list[Sample] = field(default_factory=list)   # the samples of the last WINDOW_S

    def configure(self, settings: Any, endpoints: Iterable[str], sys_net: str = "/sys/class/net") -> None:
        """(Re)read ``[network]``: interfaces, capacities, whether the rule is on, and why not. Again with
        the same outcome (every RECONFIGURE_S while off or on found interfaces), the rules and the
        samples carry on."""
        before = (self.interfaces, dict(self.capacity), self.reason)
        interfaces = tuple(settings.interfaces) or find_interfaces(endpoints)
        if not interfaces and not settings.interfaces and self.enabled and self.settings is settings:
            interfaces = self.interfaces   # (a re-discovery that found nothing, a DNS blip: keep what worked)
        self.settings = settings
        absent = [n for n in interfaces if not os.path.isdir(os.path.join(sys_net, n))]
        self.capacity = {}
        for n in interfaces:
            c = settings.capacity or (link_info(sys_net, n)[0] or 0)
            if c and n not in absent:
                self.capacity[n] = c
        unknown = [n for n in interfaces if n not in self.capacity]
        old = self.rules
        self.rules = {}
        for n, c in self.capacity.items():
            for d in DIRECTIONS:
                rule = old.get((n, d))
                same = rule is not None and (rule.capacity, rule.ceiling, rule.floor) == \
                    (c, settings.ceiling, settings.floor)
                self.rules[(n, d)] = rule if same else YieldRule(c, settings.ceiling, settings.floor)
        if interfaces != self.interfaces:
            self.last, self.history = None, []
        self.interfaces = interfaces
        if settings.enabled is False:
            self.enabled, self.reason = False, "off ([network] enabled = false)"
        elif not self.interfaces:
            self.enabled, self.reason = False, "off: no interface carries weightd's traffic (set [network] interfaces)"
        elif absent:
            self.enabled = False
            self.reason = f"off: no such interface {absent[0]} ([network] interfaces)"
            log.warning("network: %s", self.reason.removeprefix("off: "))
        elif unknown:
            self.enabled = False
            self.reason = f"off: {unknown[0]} reports no speed (set [network] capacity)"
            if settings.enabled:
                log.warning("network: [network] enabled, but %s", self.reason.removeprefix("off: "))
        else:
            self.enabled, self.reason = True, "on"
        if (self.interfaces, self.capacity, self.reason) != before:
            log.info("network: interfaces=%s capacity=%s %s", ",".join(self.interfaces) or "-", self.capacity,
                     self.reason)

    @property
    def rediscover(self) -> bool:
        """Configure again every RECONFIGURE_S: while off (an interface may appear, a route change) or
        on interfaces found from the routes; not when ``[network] enabled = false``."""
        s = self.settings
        return s is None or (s.enabled is not False and (not self.enabled or not s.interfaces))

    def off(self, reason: str, session: Any) -> None:
        """The rule off (configure failed, the loop stopped): no limit of the rule's on ``session``."""
        self.enabled, self.reason, self.rules, self.last, self.history = False, reason, {}, None, []
        self._apply({d: math.inf for d in DIRECTIONS}, session)
        self.view = self._view(None, None)

    def tick(self, sample: Sample, session: Any) -> dict[str, Any]:
        """One sample in: rates over the last ``WINDOW_S``, the rule's limits (stepped by the time since
        the last sample), applied to ``session`` (a P2PSession or None)."""
        prev, self.last = self.last, sample
        if prev is None:
            self.history = [sample]
            if not self.enabled:
                self._apply({d: math.inf for d in DIRECTIONS}, session)
            self.view = self._view(None, None)
            return self.view
        # the samples of the window, and always the one before this (a late sample must not leave this
        # one alone: rates over nothing are 0, everyone would look quiet and the limits lift)
        kept = [s for s in self.history[:-1] if sample.t - s.t < WINDOW_S + SAMPLE_S / 2]
        self.history = [*kept, prev][-8:] + [sample]
        r = rates(self.history[0], sample)
        r["dt"] = sample.t - prev.t
        own = wire(tuple(a + b for a, b in zip(r["p2p"], r["store"])))   # type: ignore[arg-type]
        store = wire(r["store"])
        limits = {d: math.inf for d in DIRECTIONS}
        view: dict[str, Any] = {d: {"link": 0.0, "weightd": 0.0, "others": 0.0} for d in DIRECTIONS}
        for n, link in r["links"].items():
            if n not in self.interfaces:
                continue
            for i, d in enumerate(DIRECTIONS):
                others = max(0.0, link[i] - own[i])
                v = view[d]
                v["link"], v["weightd"], v["others"] = v["link"] + link[i], own[i], v["others"] + others
                rule = self.rules.get((n, d))
                if rule is not None:
                    lim = rule.step(others, r["dt"], own[i] - store[i], store[i])
                    # (a rule at its own link's capacity sets no limit: a quiet fast NIC's whole link
                    # must not read as a limit, nor hide a busy slower NIC's)
                    limits[d] = min(limits[d], lim if lim < rule.capacity else math.inf)
        missing = [n for n in self.interfaces if n not in r["links"]]
        if self.enabled and missing:
            # a watched interface is gone (or just back): nothing to measure it by, the last limits hold
            self.view = self._view(view, None, f"on, but {missing[0]} is missing: the last limits hold")
            return self.view
        self._apply(limits, session)
        self.view = self._view(view, limits)
        return self.view

    def _apply(self, limits: dict[str, float], session: Any) -> None:
        """The rule's limits on the session (0: no limit of the rule's: at capacity, or the rule off;
        a limit is never below 1 byte/s, since 0 is libtorrent's "no limit")."""
        want = tuple(0 if not self.enabled or lim == math.inf else min(LT_MAX_RATE, max(1, int(lim)))
                     for lim in (limits["download"], limits["upload"]))
        state = (*want, self.enabled)
        if session is None or state == self.applied:
            return
        if self.applied is None and state == (0, 0, False):
            self.applied = state   # (nothing to change: the session starts with its fixed limits)
            return
        got = session.set_yield_limits(*want)
        log.info("network: weightd's limits download=%d upload=%d bytes/s (in force: %s)", want[0], want[1], got)
        self.applied = state

    def _view(self, view: dict[str, Any] | None, limits: dict[str, float] | None,
              state: str | None = None) -> dict[str, Any]:
        """The state for ``status --json`` and the metrics; ``view`` None: no rates yet; ``limits`` None:
        those in force on the session."""
        cap = min(self.capacity.values(), default=0)
        if view is None:
            view = {d: {"link": 0.0, "weightd": 0.0, "others": 0.0} for d in DIRECTIONS}
        if limits is None:
            now = self.applied if self.applied is not None and self.applied[2] else (0, 0, False)
            limits = {d: float(now[i]) or math.inf for i, d in enumerate(DIRECTIONS)}
        s = self.settings
        out: dict[str, Any] = {"enabled": self.enabled, "state": state or self.reason,
                               "interfaces": list(self.interfaces), "capacity_bytes_per_s": cap,
                               "ceiling": s.ceiling if s is not None else None,
                               "floor": s.floor if s is not None else None}
        yielding = False
        for d in DIRECTIONS:
            lim = limits[d]
            limit = max(1, int(lim)) if self.enabled and lim != math.inf else None
            yielding = yielding or limit is not None
            out[d] = {"link_bytes_per_s": round(view[d]["link"]), "weightd_bytes_per_s": round(view[d]["weightd"]),
                      "others_bytes_per_s": round(view[d]["others"]), "limit_bytes_per_s": limit}
            if self.gauges is not None:
                for who in ("weightd", "others"):
                    self.gauges.share.labels(d, who).set(view[d][who])
                self.gauges.limit.labels(d).set(limit if limit is not None else 0)
        out["yielding"] = yielding
        return out


def read_sample(interfaces: Iterable[str], session: Any, store_stats: Any, path: str = "/proc/net/dev") -> Sample:
    """The counters now: the interfaces' bytes, the P2P session's and the object store's."""
    names = set(interfaces)
    links = {n: (rx, tx) for n, rx, tx in parse_netdev(read_text(path)) if n in names}
    p2p = session.traffic() if session is not None else (0, 0)
    store = (0, 0)
    if store_stats is not None:
        with store_stats.lock:
            store = (store_stats.bytes_read, store_stats.bytes_written)
    return Sample(time.monotonic(), links, p2p, store)


async def network_loop(d: Any) -> None:
    """The daemon's duty: configure from ``d.config`` (again after a reload, and every RECONFIGURE_S
    while off or on interfaces found from the routes), sample every SAMPLE_S, apply the limits to
    ``d.session``; the state is ``d.network.view``. It never stops on an error: each new one is logged
    once, the rule is off while configure fails, and when the loop ends the rule's limits are lifted
    (a session left at a low limit would starve the weights with nobody watching the link)."""
    ctl: NetworkYield = d.network
    pool = ThreadPoolExecutor(1, "weightd-network")   # (never behind the daemon's busy pools)
    loop = asyncio.get_running_loop()
    seen, again, logged = None, 0.0, set()

    def once(what: str, exc: BaseException) -> None:
        key = f"{what}: {type(exc).__name__}: {exc}"
        if key in logged:
            log.debug("network: %s", key)
            return
        logged.add(key)
        log.warning("network: %s failed: %s: %s", what, type(exc).__name__, exc,
                    exc_info=not isinstance(exc, (OSError, ValueError)))
    try:
        while not d.stopping.is_set():
            try:
                settings = d.config.settings
                if settings is not seen or (ctl.rediscover and time.monotonic() >= again):
                    seen, again = settings, time.monotonic() + RECONFIGURE_S
                    try:
                        await loop.run_in_executor(pool, ctl.configure, settings.network, endpoints_of(settings))
                    except Exception as exc:
                        once("configure", exc)
                        await loop.run_in_executor(pool, ctl.off, f"off: [network] could not be set up: {exc}",
                                                   d.session)
                store = d.node.roots.object.stats if d.node.roots.object is not None else None
                sample = await loop.run_in_executor(pool, read_sample, ctl.interfaces, d.session, store)
                await loop.run_in_executor(pool, ctl.tick, sample, d.session)
            except Exception as exc:   # (one bad sample: logged, the next one tries again)
                once("sample", exc)
            try:
                await asyncio.wait_for(d.stopping.wait(), SAMPLE_S)
            except asyncio.TimeoutError:
                pass
    finally:
        pool.shutdown(wait=False)
        try:
            ctl.off("off: the network loop stopped", d.session)
        except Exception as exc:
            log.warning("network: lifting weightd's limits failed: %s", exc)
