"""Several origins (``[p2p] peers`` lists N, each a full origin over the same cold storage): which of them
a worker takes its own slice from, so that the origins split the seeding of a version and together
upload about one copy, and any of them can finish it alone.

Every origin holds every piece, and libtorrent picks the sender of each block: a worker connected to
two origins asked both for its own pieces and, while they were in flight, for pieces other workers
already held (measured, 4 workers on 20 MB/s caps: the origins together sent 1.29x the checkpoint
against 1.12x from one origin). So each worker has a **home origin**, and while it is connected to
it the other origins are filtered out of its session:

- the home origins are dealt by rendezvous hashing over the live origins (``rendezvous.home_origins``:
  every worker that plans on the same member list gets the same answer), at most ``ceil(workers /
  origins)`` workers each, on the first member list a worker gets: each origin seeds the slices of
  its share of the workers first, about 1/N of the copy. A worker keeps its home for the download
  (moving it when the list changes would drop connections mid-piece: what an origin had in its send
  buffers is lost: measured, the origins sent 1.36x the checkpoint, the workers got 1.2x from them);
- an origin is *dead* to a worker once it has been let in but not connected for ``dead_after_s`` (a
  SIGKILL or a drain: its connections reset, the worker's dials are refused): a worker whose home is
  dead chooses again among the live ones, and takes the rest of its slice from there (what is still
  missing); meanwhile it takes from the other workers, and if nothing arrives at all, every origin is
  let in (the plan's rule below);
- an origin filtered out cannot be seen alive or dead: it counts as live, so an origin that comes back
  is chosen again by the workers whose home dies next, and by every later download.

The plan's own rule comes first: a worker whose own slice is in filters every origin out (their
upload goes to the workers still on theirs), and one that receives nothing lets every origin in.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from .rendezvous import home_origins

log = logging.getLogger(__name__)

DEAD_AFTER_S = 2.0    # an origin let in but not connected this long is dead to this worker
CHOOSE_AFTER_S = 3.0  # no member list by then: choose the home origin on this worker alone
# a home origin just chosen has this long to connect before it can be dead: libtorrent dials a peer it
# dropped (the filter) again only after min_reconnect_time (2 s), at a connection tick (seen: a new home
# judged dead at 2 s, and the worker moving back to the origin that had died)
DIAL_GRACE_S = 5.0


class OriginShare:
    def __init__(self, origins: Collection[str], dead_after_s: float = DEAD_AFTER_S) -> None:
        self.origins = sorted(set(origins))
        self.dead_after_s = dead_after_s
        self.home = ""          # this worker's home origin ("": none chosen yet)
        self.moves = 0          # times it moved to another (its home died)
        self._seen: dict[str, float] = {}   # origin -> last time it was connected (or filtered out)
        self._blocked: frozenset[str] = frozenset()
        self._start: float | None = None
        self._grace_until = 0.0   # a new home not yet connected is live until then

    def live(self, connected: Collection[str], now: float) -> list[str]:
        """The origins not dead to this worker (all of them if every one is)."""
        for o in self.origins:
            if o in connected or o in self._blocked or o not in self._seen:
                self._seen[o] = now
        if self.home in connected:
            self._grace_until = 0.0
        return [o for o in self.origins if now - self._seen[o] < self.dead_after_s
                or (o == self.home and now < self._grace_until)] or self.origins

    def blocked(self, self_ip: str, workers: Collection[str] | None, connected: Collection[str],
                now: float) -> frozenset[str]:
        """The origins to filter out: all but the home origin, once it is chosen (on the first member
        list, ``workers``: None while there is none; chosen again among the live ones when it dies).
        ``connected``: the origins this worker is connected to now."""
        self._start = now if self._start is None else self._start
        live = self.live(connected, now)
        if len(self.origins) < 2 or not self_ip:
            return frozenset()
        if self.home and self.home not in live:
            log.info("p2p: home origin %s not connected for %.0f s: choosing among %s", self.home,
                     self.dead_after_s, ", ".join(live))
            self.home, self.moves = "", self.moves + 1
        if not self.home:
            if workers is None and now - self._start < CHOOSE_AFTER_S:
                return frozenset()   # (the plan asks for nothing before the list: no origin sends yet)
            self.home = home_origins({*(workers or ()), self_ip}, live)[self_ip]
            self._grace_until = 0.0 if self.home in connected else now + DIAL_GRACE_S
            log.info("p2p: home origin %s (live: %s; %d workers listed)", self.home, ", ".join(live),
                     len(workers or ()))
        self._blocked = frozenset(self.origins) - {self.home}
        return self._blocked


def origins_to_block(share: OriginShare | None, origin_ips: Collection[str], self_ip: str,
                     workers: Collection[str] | None, connected: Collection[str], own_done: bool, starving: bool,
                     now: float) -> frozenset[str]:
    """What a worker's session filters out: nothing while nothing arrives; every origin once its own
    slice is in; else, with several origins, all but its home origin (:class:`OriginShare`)."""
    shared = share.blocked(self_ip, workers, connected, now) if share is not None else frozenset()
    out = frozenset() if starving else frozenset(origin_ips) if own_done else shared
    if share is not None:
        share._blocked = out   # (what is filtered out cannot be seen alive or dead)
    return out
