"""How a worker judges its rack's gateways (a part of the piece plan, ``plan.py``): a gateway that
stops growing while other racks hold pieces it lacks, or that is listed but never connects, is
skipped for this node's plan (the next worker by the hashing takes across in its place) and taken
back once it grows again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .rendezvous import gateways_of, rendezvous


@dataclass(slots=True)
class Peer:
    """What the plan needs of one connected worker still downloading."""
    rack: str = ""
    pieces: Sequence[bool] | None = None   # its bitfield (asked for only for workers of this rack)


class GatewayJudging:
    """:class:`~p2p.plan.PiecePlan`'s judging of its rack's gateways. The plan holds the state (the
    annotations below): ``k`` gateways a rack, ``skipped_gateways`` (this node's findings) and
    ``told_skips`` (the trackers'), ``_gateway_counts`` (gateway -> (its pieces, since)),
    ``_gateway_missing`` (listed, not connected -> since), ``_crossed`` (see ``_crossing_moves``)."""

    num_pieces: int
    self_ip: str
    rack: str
    k: int
    stall_s: float
    why: dict[str, str]
    skipped_gateways: set[str]
    told_skips: frozenset[str]
    _gateway_counts: dict[str, tuple[int, float]]
    _gateway_missing: dict[str, float]
    _shares: tuple[tuple[str, ...], np.ndarray]
    _skipped_at: dict[str, float]
    _crossed: tuple[np.ndarray | None, float]
    grace_s: float
    piece_bytes: int
    cap: int

    def _gateways_among(self, mine: Sequence[str]) -> list[str]:
        """The rack's ``k`` gateways: by the hashing, over the rack's workers neither this node nor
        (through the trackers) another skipped."""
        return gateways_of(self.rack, mine, self.k, self.skipped_gateways | self.told_skips)

    def told_skipped(self, ips: "frozenset[str]") -> None:
        """Gateways another worker's plan skipped (the trackers' ``skipped``, now): planned past while
        they are said to be, this node included (the other racks serve its replacement then: the
        session's classes hash over the same list)."""
        self.told_skips = frozenset(ips)

    def _share(self, gws: Sequence[str]) -> np.ndarray:
        """Which of ``gws`` takes each piece across (rendezvous hashing over them, bounded loads)."""
        if self._shares[0] != tuple(gws):
            self._shares = (tuple(gws), rendezvous(self.num_pieces, list(gws)))
        return self._shares[1]

    def _crossing_moves(self, xrack: np.ndarray, have: np.ndarray, now: float) -> bool:
        """Whether this gateway's pieces to take across come in: one of last call's came in within
        ``grace_s`` (or two pieces' time at its cap, if longer), or it was given pieces to take
        across less than that ago. Only then does it leave for later the pieces its rack holds that
        other racks hold too: a gateway the other racks do not serve (they name another one, say
        from a list a round older) must not wait on them with its rack's pieces unasked (nothing
        would ever arrive, and asking for something keeps the plan's open-all from firing)."""
        last, since = self._crossed
        if last is None or not last.any() or (have & last).any():
            since = now
        self._crossed = (xrack.copy(), since)
        return now - since < max(self.grace_s, 2 * self.piece_bytes / self.cap if self.cap else 0.0)

    def _skip_gateways(self, mine: Sequence[str], peers: Mapping[str, Peer], held: np.ndarray,
                       now: float) -> None:
        """Skip the gateway (the next worker by the hashing takes across for this node's plan) when:

        - *stalled*: the pieces it holds have not grown for ``stall_s`` while other racks held some
          it lacked (it cannot reach them, or stopped); a gateway with nothing to take is never
          judged;
        - *missing*: it has been on the list but not connected to this node for ``stall_s`` (a
          blocked port, a node that registers but never takes part).

        A skipped gateway is still an owner of its slice (the rule for owners is ``_stale``), and it
        is taken back when it grows again, at least ``2 x stall_s`` after it was skipped: the skip is
        told to every worker and to the other racks' senders (each of which drops and redials it),
        and the skipped one, no gateway in its own plan then either, grows from its rack at once."""
        for ip in list(self.skipped_gateways):   # (one that grows again is back)
            p = peers.get(ip)
            if p is None or p.pieces is None:
                continue
            count = sum(map(bool, p.pieces))
            if ip not in self._gateway_counts or now - self._skipped_at.get(ip, now) < 2 * self.stall_s:
                self._gateway_counts[ip] = (count, now)   # (counted from here: not connected, or held)
            elif count > self._gateway_counts[ip][0]:
                self.skipped_gateways.discard(ip)
                self._gateway_counts.pop(ip, None)
                self._gateway_missing.pop(ip, None)
                self._skipped_at.pop(ip, None)
        for gw in self._gateways_among(mine):
            if gw != self.self_ip:
                self._judge_gateway(gw, peers, held, now)

    def _judge_gateway(self, gw: str, peers: Mapping[str, Peer], held: np.ndarray, now: float) -> None:
        """One gateway of this rack (not this node): skipped if stalled or missing (:meth:`_skip_gateways`)."""
        p = peers.get(gw)
        if p is None or p.pieces is None:
            since = self._gateway_missing.setdefault(gw, now)
            if now - since >= self.stall_s:
                self.skipped_gateways.add(gw)
                self._skipped_at[gw] = now
                self.why[gw] = f"gateway not connected to this node for {self.stall_s:.0f} s; the next worker takes across"
            return
        self._gateway_missing.pop(gw, None)
        bits = np.fromiter(p.pieces, dtype=bool, count=self.num_pieces)
        count = int(np.count_nonzero(bits))
        # (pieces some worker holds that the gateway lacks: something for it to take; none, no clock)
        seen = self._gateway_counts.get(gw)
        if count >= self.num_pieces or not np.any(held & ~bits) or seen is None or count != seen[0]:
            self._gateway_counts[gw] = (count, now)
        elif now - seen[1] >= self.stall_s:
            self.skipped_gateways.add(gw)
            self._skipped_at[gw] = now
            self.why[gw] = (f"stalled gateway: {count} of {self.num_pieces} pieces, none more in "
                            f"{self.stall_s:.0f} s; the next worker of the rack takes across")
