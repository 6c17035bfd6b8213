"""What one download's connected peers are to its piece plan, read from libtorrent at each plan tick:
the downloading workers (each with its rack and, for this rack's workers, its bitfield), the seeds
among them, which pieces some worker (not an origin) holds, and (racks) which some worker of another
rack holds. Who counts as what follows the plan's rules (``plan.py``): origins, workers downloading
other files, and peers seeding a partial copy own no piece of the plan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import libtorrent as lt
import numpy as np

from .plan import Peer, PiecePlan


@dataclass(slots=True)
class SwarmView:
    """The inputs of :meth:`PiecePlan.priorities` besides the member list and the clock."""
    have: list[bool]            # this node's pieces
    peers: dict[str, Peer]      # connected workers still downloading, by IP
    held: list[bool]            # some connected worker, not an origin, holds the piece
    seeds: int = 0              # connected workers holding everything ...
    rack_seeds: int = 0         # ... of them, in this node's rack
    origins: set[str] = field(default_factory=set)   # the origins connected
    outside: "np.ndarray | None" = None   # (racks) some connected worker of another rack holds the piece


def read_swarm(h: lt.torrent_handle, st: lt.torrent_status, planner: PiecePlan, origin_ips: set[str],
               members: Mapping[str, str] | None, seen: Mapping[str, str], others: Collection[str],
               racked: bool) -> SwarmView:
    """The swarm of ``h`` as the plan sees it. ``members``: the tracker's list of downloading workers
    (ip -> rack; None: no list); ``seen``: every worker listed during this download (for racks);
    ``others``: workers downloading other files; ``racked``: bitfields are read for this rack's
    workers. The planner learns this node's own address here, from a connection's local endpoint,
    when it did not know it (listen = 0.0.0.0)."""
    view = SwarmView(list(st.pieces), {}, [])
    origins = 0
    racks = members or {}
    for pi in h.get_peer_info():
        ip = pi.ip[0]
        if pi.flags & lt.peer_info.connecting or pi.flags & lt.peer_info.handshake:
            continue   # (not a peer yet: counted in no availability)
        if ip in origin_ips:
            origins += 1
            view.origins.add(ip)
            continue
        if ip in others:
            continue
        local = pi.local_endpoint()
        if local and local[0] not in ("0.0.0.0", "::") and not planner.self_ip:
            planner.self_ip = local[0]
        if ip == planner.self_ip:
            continue
        rack = seen.get(ip, "")
        if pi.flags & lt.peer_info.seed:
            view.seeds += 1
            view.rack_seeds += rack == planner.rack
        elif members is not None and ip not in racks and pi.flags & lt.peer_info.upload_only:
            continue   # a partial copy seeding (off the list of downloading workers): it holds, owns nothing
        elif ip not in view.peers:
            # bitfields only where the plan reads them: this rack's workers, with racks
            bits = list(pi.pieces) if racked and rack == planner.rack else None
            view.peers[ip] = Peer(rack, bits)
    avail = h.piece_availability()
    # (the origins are seeds: every piece they count is not a worker's)
    n = len(view.have)
    view.held = [a - origins > 0 for a in avail] if len(avail) == n else [False] * n
    # (held by others than the origins and this rack's workers; read only by a gateway, as of the last tick)
    if racked and len(avail) == n and planner.self_ip in planner.gateways:
        count = np.asarray(avail, dtype=np.int64) - origins - view.rack_seeds
        for p in view.peers.values():
            if p.rack == planner.rack and p.pieces is not None:
                count -= np.fromiter(p.pieces, dtype=bool, count=n)
        view.outside = count > 0
    return view
