"""What one download measured: its bytes by peer, its time, and what its piece plan did (``SwarmTrace``),
for ``preload --json`` (``swarm``), the metrics and the bench."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SwarmTrace:
    """What the piece plan did in one download, for ``preload --json`` (``swarm``) and the bench.
    The block figures need ``[p2p] trace`` (every 16 KiB block attributed to its sender)."""
    workers_max: int = 0               # most downloading workers in view at once
    slice_changes: int = 0             # times this worker's slice moved (its view of the swarm changed)
    members_max: int = 0               # most downloading workers on the tracker's list at once
    stalled_owners: int = 0            # owners planned without for the rest of the download ...
    gateways: int = 0                  # rack gateways this worker planned with, one after another (racks)
    late_owners: int = 0               # ... of them, found late (too slow for their slice), not stalled
    alone_s: float = 0.0               # time planned with no other worker in view (everything from the origin)
    open_all_after_s: float | None = None   # the recovery rule asked for everything, this long after the start
    crossed_after_s: float | None = None    # (a gateway) its share was in, this long after the start: the rest
    #                                         from its rack, other racks' workers filtered out (racks.done_across)
    redundant_bytes: int = 0           # libtorrent: received twice (end-game) or thrown away
    failed_bytes: int = 0              # failed their hash check
    traced: bool = False
    origin_bytes: int = 0              # (traced) blocks from an origin ...
    origin_outside_slice_bytes: int = 0   # ... of pieces outside this worker's slice at that moment
    origin_held_bytes: int = 0         # ... of pieces some other worker held (asked as HELD) at that moment
    origin_held_after_own_bytes: int = 0   # ... of those, once this worker had nothing left to take from the origin
    duplicate_bytes: int = 0           # (traced) blocks received more than once
    bytes_by_rack: dict[str, int] = field(default_factory=dict)   # received, by the sender's rack
    crossing_bytes_in: int = 0         # ([p2p] crossing) received by the crossing session (in bytes_by_peer too)
    crossing_bytes_out: int = 0        # ... sent by it
    crossing_peak: float = 0.0         # ... the most the two sessions took together (in or out), x the node's limit

    def to_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__slots__ if not k.startswith("_")}
        d["alone_s"] = round(self.alone_s, 2)
        d["crossing_peak"] = round(self.crossing_peak, 2)
        for k in ("open_all_after_s", "crossed_after_s"):
            if d[k] is not None:
                d[k] = round(d[k], 2)
        return d


@dataclass(slots=True)
class DownloadResult:
    bytes_by_peer: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    hash_failures: int = 0
    banned: list[str] = field(default_factory=list)
    local_bytes: int = -1    # bytes that passed libtorrent's check before any download (prefill, resume)
    flushed: bool = False    # libtorrent confirmed its cache was written out (cache_flushed_alert)
    trace: SwarmTrace = field(default_factory=SwarmTrace)

    def split(self, origins: set[str]) -> tuple[int, int]:
        """(bytes from origins, bytes from other peers)."""
        o = sum(v for k, v in self.bytes_by_peer.items() if k in origins or k.split(":")[0] in origins)
        return o, sum(self.bytes_by_peer.values()) - o


def apportion(shares: dict[str, int], total: int) -> dict[str, int]:
    """Scale ``shares`` to integers that add up to exactly ``total`` (largest remainder: rounding each
    share on its own can leave the sum a byte short, and the report then claims a byte came from nowhere)."""
    sampled = sum(shares.values())
    parts = {k: divmod(v * total, sampled) for k, v in shares.items()}  # (integers: exact at any size)
    out = {k: q for k, (q, _) in parts.items()}
    for k in sorted(parts, key=lambda k: parts[k][1], reverse=True)[:total - sum(out.values())]:
        out[k] += 1
    return out


def received_by_ip(h: Any) -> dict[str, int]:
    """Payload bytes received from each connected peer of torrent ``h``, by IP (one node per address:
    a peer can hold two connections for a moment, and an incoming one shows an ephemeral port)."""
    now: dict[str, int] = {}
    for pi in h.get_peer_info():
        now[pi.ip[0]] = now.get(pi.ip[0], 0) + pi.total_download
    return now
