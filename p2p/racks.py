"""Racks in libtorrent's terms: who may take pieces across racks is decided where the bytes leave.

The piece plan (``plan.py``) names each rack's gateway, the one worker of the rack that takes pieces
from other racks. libtorrent picks the sender of each block, so the session enforces it with peer
classes, on both ends of a connection:

- **the sender** (``[p2p] choke_other_racks``, on by default): while it runs one download, a node
  unchokes the workers of other racks that are their rack's gateways (by the same hashing over the
  member list less the gateways their racks skipped, told through the trackers: ``gateways_of``) and
  keeps every other worker of another rack choked: those ask it for nothing. Choking is
  libtorrent's own: the local and global classes count against upload slots (0 of them,
  ``unchoke_slots_limit``), and the ``unchoked`` class, which every other peer is in, ignores them
  (libtorrent exempts a peer when any of its classes does);
- **the receiver**: the other racks' class is open on the gateway while it has pieces to take
  across, and a trickle elsewhere (``P2PSession._pace_other_racks``): a sender that does not choke
  (a node seeding the version outside this download, a worker of a partial copy) is still paced.
  Without it, one round of ``bench/swarm.py --racks 4`` had a rack take 1.28x from outside. Once
  its share is in, a gateway filters the other racks' workers out altogether until its download
  ends (``RackClasses.done_across``): on the trickle, some of its rack's pieces were asked of them.

Why the sender (issue 38): a connection carries both directions' messages. With only the receiver's
trickle, an ordinary worker that had asked another rack's gateway for pieces waited for its
trickle's quota for all of them before it read anything more on that connection, the gateway's
requests and interested messages included (libtorrent's ``wanted_transfer``: the bytes of its own
requests outstanding there), for up to 10 s; a gateway took 1-20 kB/s from each ordinary worker of
another rack. A worker choked by the other racks asks them for nothing, so only the trickle's tick
stands before their gateways' requests: 170-200 kB/s each (docs/p2p.md, racks). A trickle at the
sender delays the same requests behind the trickled blocks instead (measured: the same time).

A gateway the hashing names anew (its predecessor left the member list: it finished, or died) is
in the choked class on connections made before: those are dropped once (the IP filter, until
libtorrent shows them gone) and made again with its new class."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import libtorrent as lt

from .rendezvous import gateways_of
from .settings import class_filter

if TYPE_CHECKING:
    from .plan import PiecePlan
    from .swarm_view import SwarmView


def update_class(ses: lt.session, class_id: int, **changes: object) -> None:
    """Change some settings of a peer class, keeping the others. ``set_peer_class`` replaces the
    whole class: given only limits, it zeroes ``connection_limit_factor`` (the local class then
    accepts only ``connections_slack``, 10, incoming connections: measured, an origin serving 16
    workers on one LAN held 10 of them) and clears ``ignore_unchoke_slots``."""
    c = ses.get_peer_class(class_id)
    c.update(changes)
    ses.set_peer_class(class_id, c)


class RackClasses:
    """The other racks' class (paced on receive) and, with a rack, the choking of other racks'
    workers that are not gateways (see the module's doc)."""

    def __init__(self, ses: lt.session, rack: str, gateways: int = 2, *, choke: bool = True) -> None:
        self.ses, self.rack, self.k = ses, rack, max(1, gateways)
        self.rack_class = ses.create_peer_class("other-rack")
        self.open_class = -1
        self.other: frozenset[str] = frozenset()    # workers of other racks, as listed
        self.open: frozenset[str] = frozenset()     # ... of them, the ones unchoked (their racks' gateways)
        if rack and choke:   # ([p2p] choke_other_racks)
            self.open_class = ses.create_peer_class("unchoked")
            update_class(ses, self.open_class, ignore_unchoke_slots=True)
            for cid in (lt.session.global_peer_class_id, lt.session.local_peer_class_id):
                update_class(ses, cid, ignore_unchoke_slots=False)
            # no slots for the choked class; and no allowed-fast pieces (a choked peer may ask for those)
            ses.apply_settings({"unchoke_slots_limit": 0, "allowed_fast_set_size": 0})
        ses.set_peer_class_filter(class_filter(rack_class=self.rack_class, open_class=self.open_class))

    def set_racks(self, racks: Mapping[str, str], members: "Mapping[str, str] | None" = None,
                  others: Collection[str] = (), skipped: Collection[str] = ()) -> frozenset[str]:
        """``racks``: every worker seen (ip -> rack); ``members``: the ones downloading now, whose
        racks' gateways are unchoked; ``others``: workers of partial copies of other files (their
        gateways are hashed over other lists: never choked); ``skipped``: workers their racks plan
        past (the trackers' ``skipped`` gateways and ``dropped`` owners): hashed over the rest, as
        their racks do. Returns the workers of other racks unchoked now and not before: their
        connections made before have the choked class."""
        other = frozenset(ip for ip, r in racks.items() if r != self.rack)
        opened = other
        if self.open_class >= 0 and members is None:   # (no list now: the gateways as last listed)
            opened = self.open & other
        elif self.open_class >= 0:   # (a worker no longer listed has finished or died: it asks for nothing)
            by_rack: dict[str, list[str]] = {}
            for ip, r in members.items():
                if r != self.rack:
                    by_rack.setdefault(r, []).append(ip)
            gws = {ip for r, ips in by_rack.items()
                   for ip in gateways_of(r, ips, self.k, frozenset(skipped))}
            opened = frozenset(ip for ip in other if ip in gws or ip in others)
        if other == self.other and opened == self.open:
            return frozenset()
        new = (opened - self.open) & self.other
        self.other, self.open = other, opened
        self.ses.set_peer_class_filter(class_filter(other, self.rack_class, opened, self.open_class))
        return new

    def done_across(self, racks: Mapping[str, str], planner: "PiecePlan", view: "SwarmView", starving: bool,
                    others: Collection[str] = ()) -> frozenset[str]:
        """The workers of other racks (``racks``: ip -> rack) a gateway filters out of its session once
        its share is in (``PiecePlan.crossed``), while it takes the rest from its rack. Until then it is
        open to them, and libtorrent picks who sends a piece: a gateway that let its rack's pieces be
        asked for then had other racks' workers hold some of them queued at the trickle, and finished
        2.5-3.5 s after its rack-mates (4 racks x 4 workers at 10 MB/s). Filtered, those connections go
        with their requests. Kept: the other racks' gateways it serves (unchoked), unless a rack-mate
        that is no gateway (those filter too) or a rack seed is connected to serve them in its place;
        workers of partial copies of other files (``others``). None once nothing has arrived for 5 s
        with them filtered (``starving``: a rack-mate's bitfield that lies, one gone without a word),
        for the rest of the download (``PiecePlan.filters_across``)."""
        if not planner.filters_across(starving):
            return frozenset()
        mates = view.rack_seeds > 0 or any(p.rack == self.rack and ip not in planner.gateways
                                           for ip, p in view.peers.items())
        return frozenset(ip for ip, r in racks.items()
                         if r and r != self.rack and ip not in others and (mates or ip not in self.open))

    def unchoke_all(self) -> frozenset[str]:
        """Choke no one from now on: when no download, or more than one, decides (a seed's choices
        were its last download's, and one download's list must not decide for another's swarm).
        Returns the workers choked until now: a connection keeps the class it was made with, so
        the session drops theirs once (a finished seed kept a new gateway choked)."""
        if self.open_class < 0 or self.open == self.other:
            return frozenset()
        new, self.open = self.other - self.open, self.other
        self.ses.set_peer_class_filter(class_filter(self.other, self.rack_class, self.other, self.open_class))
        return new

    def wait_gone(self, ips: Collection[str], timeout_s: float = 1.0) -> None:
        """Wait (at most ``timeout_s``) until no torrent of the session is connected to ``ips``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
                pi.ip[0] in ips for h in self.ses.get_torrents() for pi in h.get_peer_info()):
            time.sleep(0.02)
