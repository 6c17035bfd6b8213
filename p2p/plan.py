"""A piece plan: the origin sends every piece about once, workers fan the pieces out to each other.

Stock libtorrent, with N workers starting at once, makes the origin upload the same rare pieces to
many workers (rarest-first sees near-identical availability everywhere), so the origin stays at its
cap sending duplicates while the workers' upload capacity idles: 2.25x the checkpoint at N = 8 here
(notes/libtorrent.md; super-seeding would fix it but delivers nothing with v2 torrents in 2.1.1).

The plan, recomputed by every worker a few times a second from what it sees of the swarm:

- the workers currently downloading (the connected non-seed peers that are not an origin, plus this
  node) are ranked by address; worker k of M owns the k-th contiguous 1/M of the pieces;
- a worker asks for its own slice first (the only pieces only the origin has), for any piece another
  worker already holds next (it comes from that worker, or from the origin at lower priority), and
  not at all, yet, for pieces that are another worker's slice and nobody but the origin holds;
- when a worker has everything it may ask for and nothing arrives for ``grace_s`` (the owner of a
  slice is slow, gone or unseen), it asks for everything: the plan can only delay, never strand.

Every worker runs the same rule on (nearly) the same view, so the origin's pieces go out in disjoint
sets; views that differ for a moment cost a duplicate piece, not correctness: pieces are still
verified by libtorrent, and the checkpoint by its manifest.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

OWN, HELD, ANY = 7, 4, 1


def _key(ip: str) -> tuple[int, int]:
    try:
        a = ipaddress.ip_address(ip)
        return a.version, int(a)
    except ValueError:
        return 9, hash(ip)


class PiecePlan:
    def __init__(self, num_pieces: int, *, grace_s: float = 2.0) -> None:
        self.num_pieces = num_pieces
        self.grace_s = grace_s
        self.open_all = False
        self._idle_since: float | None = None
        self.origin_limit = 0   # what the session last set for the origin class (bytes/s, 0 = none)
        self.last_progress = 0.0
        self.own: range = range(num_pieces)   # this worker's slice, as of the last priorities() call
        self.workers = 1                      # downloading workers in view (this one included), likewise

    def slice_of(self, self_ip: str, workers: Sequence[str]) -> range:
        ranked = sorted({*workers, self_ip}, key=_key)
        m, k = len(ranked), ranked.index(self_ip)
        return range(k * self.num_pieces // m, (k + 1) * self.num_pieces // m)

    def priorities(self, have: Sequence[bool], self_ip: str, peers: Mapping[str, Sequence[bool]],
                   seeds: int, now: float, progressed: bool) -> list[int]:
        """Piece priorities for libtorrent. ``peers``: bitfields of the non-origin workers still
        downloading, by IP; ``seeds``: how many non-origin peers hold everything; ``progressed``:
        whether bytes arrived since the last call."""
        n = self.num_pieces
        self.workers = 1 + len(peers)
        if self.open_all or not peers:
            # alone with the origin (or gave up planning): everything, own slice = everything
            return [ANY if have[p] or peers else OWN for p in range(n)]
        own = self.own = self.slice_of(self_ip, list(peers))
        prio = [0] * n
        for p in range(n):
            if have[p]:
                prio[p] = ANY  # (what we hold stays wanted: zero would let libtorrent park it aside)
            elif p in own:
                prio[p] = OWN
            elif seeds or any(len(bf) > p and bf[p] for bf in peers.values()):
                prio[p] = HELD
        waiting = any(prio[p] == 0 for p in range(n))
        if waiting and all(have[p] or prio[p] == 0 for p in range(n)) and not progressed:
            if self._idle_since is None:
                self._idle_since = now
            elif now - self._idle_since >= self.grace_s:
                self.open_all = True
                return [ANY] * n
        else:
            self._idle_since = None
        return prio
