"""A piece plan: the origin sends every piece about once, workers fan the pieces out to each other,
and with racks each rack pulls each piece across racks about once.

Stock libtorrent, with N workers starting at once, makes the origin upload the same rare pieces to
many workers (rarest-first sees near-identical availability everywhere), so the origin stays at its
cap sending duplicates while the workers' upload capacity idles: 2.25x the checkpoint at N = 8 here
(notes/libtorrent.md; super-seeding would fix it but delivers nothing with v2 torrents in 2.1.1).

**Who owns a piece** (recomputed only when the set of workers changes):

- the workers are the members of the swarm that are still downloading: the tracker's list (every
  worker asks the origin's tracker for it, so every worker plans on the same list), plus any connected
  downloading peer the list does not have yet;
- with racks, each piece has a *home rack* (rendezvous hashing over the racks present) and, in every
  rack, an *owner* (rendezvous hashing over that rack's workers); without racks there is one rack;
- with racks, each rack has k *gateways* (``[p2p] gateways``; the first k of its workers by the
  same hashing, :func:`gateways_of`, ``gateways.py``): the only workers of the rack that take pieces
  from other racks' workers, each the pieces of its share (rendezvous hashing over the k), so a
  piece crosses into a rack once.
  Rendezvous hashing with bounded loads (``rendezvous.py``; no owner more than about 1.1x its
  share), not ranks: a worker that one node does not see yet (or that left) moves its own pieces
  and a few displaced ones, where ranked slices would shift every boundary.

**What a worker asks for** (libtorrent piece priorities, a few times a second):

- ``OWN``: pieces it owns in its home rack: from the origin (the only holder at first);
- ``XRACK`` (a gateway only): pieces of its share some worker of another rack holds and none of its
  own rack (they cross racks once per rack, through one gateway). libtorrent picks the sender of a piece, so
  a worker open to other racks may take from outside a piece its rack already holds: the session
  (``P2PSession.apply_plan``, ``racks.py``) therefore opens the other racks' class only on the gateway
  while it has pieces to take across, paced elsewhere (with choke_other_racks, choked too): what a rack
  receives from outside is then at most the gateways' whole downloads plus the other workers' slices;
- ``HELD``: any other piece a worker of its own rack holds (without racks: any worker); a gateway
  with pieces of its share still to take across asks only for those no connected worker of another
  rack also holds (the rest once its share is in): else it would take from outside the pieces its
  rack's other gateways brought in (two gateways a rack: 1.74-1.79x the checkpoint from outside);
- nothing yet for the rest: pieces only the origin has and another worker owns.

**Recovery**: an owner whose pieces that only the origin holds do not get fewer for ``stall_s`` (it
cannot reach the origin, or died without leaving the list), or that still has some ``stall_s`` after
this worker's own slice was in (it is too slow for its slice), is treated as absent for the rest of
the download: its pieces move to the others by the same hashing, and the trackers tell every other
worker to do the same (``told_dropped``). A gateway whose piece count does not grow for ``stall_s``
while other racks hold pieces it lacks, or that is on the list but not connected for ``stall_s``, is
skipped as gateway (the next worker by the hashing takes its place; the shares are hashed again over
the k left; it keeps its slice, and is taken back once it grows again); the trackers tell the others
(``told_skipped``), so that every worker and the other racks' senders name the same gateways. A
worker that receives nothing at all for ``3 x grace_s`` while it waits asks for everything. The plan
can delay, never strand: pieces are still verified by libtorrent, and the checkpoint by its manifest.

**Partial copies** (some files of the version, ``wanted``): a worker plans only its files' pieces (the
others count as held: nothing to take or wait for there, and none is ever asked for), and with the
workers that want the same files only: the tracker lists downloading workers by what they want
(``want=TAG``), so a worker never owns a slice of pieces it will not fetch. Workers that want other
files, and peers seeding a partial copy (upload only, on no list), own nothing of its plan; what they
hold counts as held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from .gateways import GatewayJudging, Peer
from .rendezvous import rendezvous

OWN, XRACK, HELD, ANY = 7, 6, 4, 1


class PiecePlan(GatewayJudging):
    def __init__(self, num_pieces: int, self_ip: str = "", *, rack: str = "", grace_s: float = 3.0,
                 stall_s: float = 6.0, gather_s: float = 0.0, piece_bytes: int = 1 << 20, cap: int = 0,
                 wanted: Sequence[bool] | None = None, gateways: int = 1) -> None:
        self.num_pieces, self.self_ip, self.rack, self.piece_bytes = num_pieces, self_ip, rack, piece_bytes
        self.wanted = None if wanted is None else np.fromiter(wanted, dtype=bool, count=num_pieces)   # (partial)
        self.cap = cap                 # this node's download cap, bytes/s (0: none): scales stall_s
        self.grace_s, self.stall_s, self.gather_s, self.stall_floor_s = grace_s, stall_s, gather_s, stall_s
        self.rack_limit = 0     # what the session last set for the other racks' class (bytes/s, 0 = none)
        self.open_all, self.last_progress, self.started = False, 0.0, None   # (started: float | None)
        self.own: frozenset[int] = frozenset(range(num_pieces))  # this worker's slice of its home rack's pieces
        self.stalled: set[str] = set()   # owners planned without (see _stale), ``told`` ones included
        self.told: set[str] = set()      # ... of them, dropped by another worker's plan (told_dropped)
        self.why: dict[str, str] = {}    # ... and why, for the log
        self.crossing = 0   # pieces this worker (a gateway) now takes across racks (XRACK), as of the last call
        self.crossed = False   # ... none left of its share (homed in other racks), still lacking some: see _asks
        self.starved_across = False   # ... and nothing came with other racks filtered: not again (racks.done_across)
        self.origin_left = num_pieces if self.wanted is None else int(np.count_nonzero(self.wanted))   # (OWN)
        self.workers = self.rack_size = 1   # downloading workers (of this rack) planned with, this one included
        self.gateway = ""                # this rack's gateway as of the last call (racks only; this node if one)
        self.k = max(1, gateways)        # gateways a rack (each takes its share of the pieces across)
        self.gateways: list[str] = []    # this rack's gateways as of the last call, first by the hashing first
        self.skipped_gateways: set[str] = set()   # gateways this node plans past (see _skip_gateways)
        self.told_skips: frozenset[str] = frozenset()   # ... and those other workers do (told_skipped)
        self._skipped_at: dict[str, float] = {}            # ... when this node skipped each
        self._crossed: tuple[np.ndarray | None, float] = (None, 0.0)   # (XRACK last call, when one came in)
        self._gateway_counts: dict[str, tuple[int, float]] = {}   # gateway -> (its pieces, since)
        self._gateway_missing: dict[str, float] = {}   # gateway on the list, not connected -> since
        self._idle_since: float | None = None
        self._counts: dict[str, tuple[int, float]] = {}   # ip -> (its pieces only the origin holds, since)
        self._first_seen: dict[str, float] = {}          # ip -> when this node first planned with it
        self._history: dict[str, deque[tuple[float, int]]] = {}   # ip -> (when, its pieces only the origin holds)
        self._own_done_at: float | None = None            # when this node's own slice was in (since slices last moved)
        self._planned: frozenset[str] = frozenset()        # the workers last planned with
        self._own_start: tuple[float, int] | None = None   # (when, own pieces only the origin held) at first
        self._pace: float | None = None                    # pieces/s this node took its first slice at
        self._cache: dict[tuple, tuple[np.ndarray | None, np.ndarray, list[str], list[str]]] = {}
        self._shares: tuple[tuple[str, ...], np.ndarray] = ((), np.zeros(0, dtype=np.int32))   # (gateways, share)
        # (racks) the pieces homed in this rack, and this gateway's share of the others, as of the last call
        self.homed: np.ndarray | None = None
        self.across: np.ndarray | None = None

    def _assign(self, members: Mapping[str, str]) -> tuple[np.ndarray | None, np.ndarray, list[str], list[str]]:
        """(home rack per piece or None, owner per piece among this rack's workers, the racks, this
        rack's workers) for ``members`` (ip -> rack); the last few answers are cached."""
        key = tuple(sorted(members.items()))
        hit = self._cache.get(key)
        if hit is None:
            racks = sorted(set(members.values()))
            mine = sorted(ip for ip, r in members.items() if r == self.rack)
            home = rendezvous(self.num_pieces, racks) if len(racks) > 1 else None
            hit = (home, rendezvous(self.num_pieces, mine), racks, mine)
            if len(self._cache) >= 4:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = hit
        return hit

    def _stale(self, owner: np.ndarray, mine: list[str], waiting: np.ndarray, peers: Mapping[str, Peer],
               now: float) -> set[str]:
        """This rack's owners that hold up pieces only the origin has: once found, planned without for
        the rest of the download (their pieces go to the others by the same hashing). Two rules:

        - *stalled*: its pieces that only the origin holds have not got fewer for ``stall_s`` (a worker
          that cannot reach the origin, or died without leaving the list);
        - *late*: it still has such pieces ``stall_s`` after this node's own slice was in (and after
          this node first saw it), at less than half the pace this node took its own slice, and more
          than ``grace_s`` of them at that pace: a worker too slow for its slice (a lower cap, a busy
          CPU, a slow disk) would otherwise hold every other worker to its pace. Healthy owners draw
          their slices side by side at about the same pace (a larger slice only takes longer); at
          most one owner is found late per call, the slowest, and its remaining slice is what the
          origin may send twice.

        ``waiting``: pieces only the origin holds that this node lacks, of this node's home rack."""
        # (never this node: with listen = 0.0.0.0 it learns its own address late, and until then its
        # address on the list looks like another owner's; only connected owners: one this node cannot
        # see deliver might be delivering to others, and leaves the list within seconds if it died)
        self.stalled.discard(self.self_ip)
        counts = np.bincount(owner[waiting], minlength=len(mine))
        my_pace = self._pace or 0.0
        worst: tuple[float, str, str] | None = None
        for i, ip in enumerate(mine):
            if ip == self.self_ip or ip in self.stalled or ip not in peers:
                continue
            left = int(counts[i])
            seen = self._counts.get(ip)
            first = self._first_seen.setdefault(ip, now)
            hist = self._history.setdefault(ip, deque())
            hist.append((now, left))
            while len(hist) > 2 and now - hist[1][0] >= self.stall_s:
                hist.popleft()
            t0, left0 = hist[0]
            # (its pace over the last stall_s, once that much is seen: none yet, or a count that rose
            # because slices moved or a holder left, says nothing; no progress at all is "stalled")
            pace = (left0 - left) / (now - t0) if now - t0 >= self.stall_s / 2 else 0.0
            if left > 0 and my_pace and pace > 0 and self._own_done_at is not None \
                    and now - max(self._own_done_at, first) >= self.stall_s \
                    and pace < my_pace / 2 and left / pace > self.grace_s:
                if worst is None or left / pace > worst[0]:
                    worst = (left / pace, ip, f"late: {left} of its pieces only the origin holds "
                                              f"{self.stall_s:.0f} s after this node's own slice was in, at "
                                              f"{pace:.1f} pieces/s against this node's {my_pace:.1f}")
            if left == 0 or seen is None or left != seen[0]:
                self._counts[ip] = (left, now)
            elif now - seen[1] >= self.stall_s:
                self.stalled.add(ip)
                self.why[ip] = f"stalled: {left} of its pieces only the origin holds, none in {self.stall_s:.0f} s"
        if worst is not None and worst[1] not in self.stalled:
            self.stalled.add(worst[1])
            self.why[worst[1]] = worst[2]
        return self.stalled

    def told_dropped(self, ips: "Collection[str]") -> None:
        """Owners another worker's plan dropped (the trackers' ``dropped``, now): planned without while
        they are said to be, unless this node found them itself (:attr:`found`, what it tells)."""
        now_told = set(ips) - {self.self_ip} - self.found
        for ip in self.told - now_told:
            self.stalled.discard(ip)
        for ip in now_told - self.told:
            self.stalled.add(ip)
            self.why[ip] = "dropped by another worker's plan (the tracker says so)"
        self.told = now_told

    def filters_across(self, starving: bool) -> bool:
        """Whether this gateway, done across (``crossed``), keeps the other racks' workers filtered
        out (``RackClasses.done_across``): not once nothing arrived so (``starving``), for the rest of
        the download (a rack-mate's bitfield that lies would have it filter, starve, open, refilter)."""
        self.starved_across |= self.crossed and starving
        return self.crossed and not self.starved_across

    @property
    def found(self) -> set[str]:
        return self.stalled - self.told   # (this node's own findings: stalled or late)

    def priorities(self, have: Sequence[bool], peers: Mapping[str, Peer], held_any: Sequence[bool],
                   members: Mapping[str, str] | None, seeds: int, rack_seeds: int, now: float,
                   progressed: bool, outside: Sequence[bool] | None = None) -> list[int]:
        """Piece priorities for libtorrent.

        ``peers``: connected workers still downloading, by IP; ``held_any[p]``: some non-origin worker
        holds piece p; ``members``: the tracker's list of downloading workers (ip -> rack; None when
        there is no list); ``seeds`` / ``rack_seeds``: connected workers (of this rack) that hold
        everything; ``progressed``: bytes arrived since the last call; ``outside[p]`` (racks): some
        connected worker of another rack holds piece p.

        A partial copy (``wanted``) plans as if it held every piece it does not want (nothing to take
        there, nothing to wait for: its slice, its pace and its idle time are of its own pieces), and
        asks for none of them, whatever the plan says (open-all included)."""
        if self.wanted is None:
            return self._priorities(have, peers, held_any, members, seeds, rack_seeds, now, progressed, outside)
        have_a = np.fromiter(have, dtype=bool, count=self.num_pieces) | ~self.wanted
        prio = np.asarray(self._priorities(have_a, peers, held_any, members, seeds, rack_seeds, now, progressed,
                                           outside), dtype=np.int8)
        prio[~self.wanted] = 0
        return prio.tolist()

    def _priorities(self, have: Sequence[bool], peers: Mapping[str, Peer], held_any: Sequence[bool],
                    members: Mapping[str, str] | None, seeds: int, rack_seeds: int, now: float,
                    progressed: bool, outside: Sequence[bool] | None) -> list[int]:
        n = self.num_pieces
        self.crossed = False
        self.homed = self.across = None   # (set again below with racks; else nothing to take across now)
        if self.started is None:
            self.started = now
        if self.open_all:
            return [ANY] * n
        workers = dict(members or {})
        for ip, p in peers.items():
            workers.setdefault(ip, p.rack)
        workers.pop(self.self_ip, None)
        if members is None and now - self.started < self.gather_s:
            self.workers = 1
            return [0] * n   # the first moments, before anyone is known: ask for nothing yet
        have_a = np.fromiter(have, dtype=bool, count=n)
        if not workers:
            self.workers, self.own = 1, frozenset(range(n))
            return np.where(have_a, ANY, OWN).tolist()
        held = np.fromiter(held_any, dtype=bool, count=n)
        home, owner, racks, mine = self._plan_with(workers, have_a, held, peers, now)
        out = None if outside is None else np.fromiter(outside, dtype=bool, count=n)
        prio = self._asks(home, owner, racks, mine, have_a, held, peers, seeds, rack_seeds, now, out)
        if self._idle(prio, ~have_a, progressed, now):
            self.open_all, self.crossed = True, False
            return [ANY] * n
        return prio.tolist()

    def _plan_with(self, workers: Mapping[str, str], have_a: np.ndarray, held: np.ndarray,
                   peers: Mapping[str, Peer], now: float) -> tuple[np.ndarray | None, np.ndarray, list[str], list[str]]:
        """The owners of the pieces among ``workers`` (ip -> rack) and this node, without the owners
        found holding up pieces only the origin has (:meth:`_stale`) and with this rack's gateway
        checked (:meth:`_skip_gateways`): :meth:`_assign`'s answer for who is left."""
        planned = {**workers, self.self_ip: self.rack}
        # owners that hold up pieces only the origin has: planned without (see _stale)
        home, owner, racks, mine = self._assign({k: v for k, v in planned.items() if k not in self.stalled})
        waiting = ~held & ~have_a
        if home is not None:   # (an owner answers only for its home rack's pieces)
            waiting &= home == racks.index(self.rack)
        # (the time four pieces take at an owner's share of the origin, if this node's cap is the
        # origin's: a big piece shared by many owners takes longer than the 6 s floor)
        if self.cap:
            self.stall_s = max(self.stall_floor_s, 4 * self.piece_bytes * len(planned) / self.cap)
        stalled = self._stale(owner, mine, waiting, peers, now)
        if home is not None and self.self_ip:
            self._skip_gateways([ip for ip in mine if ip not in stalled], peers, held, now)
        for ip in self.stalled:
            planned.pop(ip, None)
        self.workers = len(planned)
        home, owner, racks, mine = self._assign(planned)
        key = frozenset(planned)
        if key != self._planned:
            # slices moved: owners' counts jump and this node may own more; judge lateness afresh
            # (else dropping one late owner would make the next look late, down to planning alone)
            self._planned, self._own_done_at = key, None
            self._history.clear()
        self.rack_size = len(mine)
        return home, owner, racks, mine

    def _asks(self, home: np.ndarray | None, owner: np.ndarray, racks: list[str], mine: list[str],
              have_a: np.ndarray, held: np.ndarray, peers: Mapping[str, Peer], seeds: int, rack_seeds: int,
              now: float, outside: np.ndarray | None = None) -> np.ndarray:
        """Each piece's priority (OWN, XRACK, HELD, ANY for what this node holds, 0: nothing yet) by
        the owners :meth:`_plan_with` found; this node's slice, gateway, crossing and origin_left with it."""
        n = self.num_pieces
        ours = owner == mine.index(self.self_ip)
        want = ~have_a
        # OWN only while the origin is the only holder: an owned piece some worker already holds (a
        # slice that moved to this worker) is taken like any held piece, not pulled from the origin
        anywhere = held if not seeds else np.ones(n, dtype=bool)
        if home is None:
            own, xrack = ours & want & ~anywhere, np.zeros(n, dtype=bool)
            in_rack = anywhere
        else:
            ours &= home == racks.index(self.rack)
            own = ours & want & ~anywhere
            in_rack = self._held_in_rack(peers, rack_seeds)
            # (no gateway until this node knows its own address: with listen = 0.0.0.0 it learns it from
            # its first connection, and until then its own entry on the list looks like another worker's)
            self.gateways = self._gateways_among(mine) if self.self_ip else []
            gw = self.self_ip in self.gateways   # (then its share of what crosses into the rack)
            self.gateway = self.self_ip if gw else (self.gateways[0] if self.gateways else "")
            share = want & ~in_rack if gw else np.zeros(n, dtype=bool)
            mine_across = np.full(n, gw)   # (its share of every piece, held or not; the crossing session's)
            if gw and len(self.gateways) > 1:
                mine_across = self._share(self.gateways) == self.gateways.index(self.self_ip)
                share &= mine_across
            self.homed = home == racks.index(self.rack)
            self.across = mine_across & ~self.homed
            xrack = share & anywhere
            # (its share all in the rack, pieces of its rack still to take: done with other racks)
            self.crossed = gw and not np.any(share & (home != racks.index(self.rack))) and bool(want.any())
        self.crossing = int(np.count_nonzero(xrack))
        self.origin_left = int(np.count_nonzero(own))
        self._note_pace(now)
        prio = np.zeros(n, dtype=np.int8)
        inside = want & in_rack
        moving = self._crossing_moves(xrack, have_a, now)   # (every call: its clock restarts without any)
        if self.crossing and outside is not None and moving:
            # a gateway with pieces to take across is open to other racks, and libtorrent would take
            # from them pieces its rack holds too: those wait until its share is in (then it is paced)
            inside &= ~outside
        prio[inside] = HELD
        prio[xrack] = XRACK
        prio[own] = OWN
        prio[have_a] = ANY   # (what we hold stays wanted: zero would let libtorrent park it aside)
        self.own = frozenset(np.flatnonzero(ours).tolist())
        return prio

    def _note_pace(self, now: float) -> None:
        """When this node's own slice was in, and (the first time) the pace it took it at: the yardstick
        :meth:`_stale` measures late owners with."""
        if self._own_start is None:
            self._own_start = (now, self.origin_left)
        if self.origin_left == 0 and self._own_done_at is None:
            self._own_done_at = now
            if self._pace is None:   # (this node's pace on its first slice: the yardstick, kept)
                t0, n0 = self._own_start
                self._pace = n0 / max(now - t0, self.grace_s)

    def _idle(self, prio: np.ndarray, want: np.ndarray, progressed: bool, now: float) -> bool:
        """Whether to ask for everything: some piece is asked of no one, none this node lacks is asked
        for, and nothing has arrived for ``3 x grace_s`` (the plan can delay, never strand)."""
        if np.any(prio == 0) and not np.any(want & (prio > 0)) and not progressed:
            if self._idle_since is None:
                self._idle_since = now
            elif now - self._idle_since >= 3 * self.grace_s:
                return True
        else:
            self._idle_since = None
        return False

    def _held_in_rack(self, peers: Mapping[str, Peer], rack_seeds: int) -> np.ndarray:
        n = self.num_pieces
        if rack_seeds:
            return np.ones(n, dtype=bool)
        held = np.zeros(n, dtype=bool)
        for p in peers.values():
            if p.rack == self.rack and p.pieces is not None:
                held |= np.fromiter(p.pieces, dtype=bool, count=n)
        return held
