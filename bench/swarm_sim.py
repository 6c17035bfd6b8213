#!/usr/bin/env python3
"""A time-stepped model of a fleet restart over P2P: an origin, N workers, capped links, racks behind an
oversubscribed spine, and weightd's piece plan (or libtorrent's own picking), calibrated on the real
runs of ``bench/swarm.py``.

    .venv/bin/python bench/swarm_sim.py calibrate --seeds 1,2,3   # the model against the measured runs
    .venv/bin/python bench/swarm_sim.py calibrate --seeds 1,2,3 --held-out   # and the runs it is not fitted on
    .venv/bin/python bench/swarm_sim.py fit                       # the grid the calibration came from
    .venv/bin/python bench/swarm_sim.py predict --nodes 100       # 130 GB, 16 MiB pieces, 100 Gbit

**Rounds are seeds.** The model is deterministic for a seed, so calibrate and predict run it once per
seed (``--seeds``, default 1-5, or ``--rounds N`` for seeds 1..N) and print bench/_rounds.py's
common shape: every figure's median and min-max over the seeds, and ratios of medians with their
per-seed range (calibrate: the model over the measurement for T(N)/T(1) and the origin's upload,
target within 0.85-1.15; predict: the plan against the plan without racks), with the machine's
state; each seed's full output under ``runs``. calibrate takes ~7 s a seed here; predict ~1 min a
contender a seed at 100 nodes.

**The model.** Time advances in ticks of a quarter of a piece's time at a node's rate. Every transfer
moves one piece from one node to another; each tick a transfer gets the smaller of its sender's and
its receiver's capacity divided by their transfers in flight (and, across racks, its share of the
racks' spine links). A worker has at most ``slots`` transfers in flight, ``per_peer`` of them from
one source (libtorrent keeps a few requests per connection), and picks by its mode:

- ``plan`` (weightd): owners and home racks by the same rendezvous hashing the daemon uses
  (``p2p.rendezvous``); a worker takes the pieces it owns from the origin while nobody holds them, and any
  piece its rack holds from the least busy holder in the rack; with racks, the rack's gateways (k,
  ``gateways``; one unless given, the daemon ships two) take from other racks what it does not hold,
  each its share. When the last of its own slice is on the way,
  libtorrent fills its queue to the origin with pieces other workers hold (``origin_tail_s`` x its
  cap, at most what the origin allows a peer to ask: ``_tail_bytes``): that is where the plan's extra origin bytes
  came from in the traces (``origin_held_bytes``, 0.3-1 MB a worker). ``plan-flat``: the plan without
  racks on a network with racks.
- ``stock``: the rarest piece this worker lacks, from the least busy node that has it (not
  calibrated: the model is fitted on the plan's runs only).

**This machine** (``Net.cores``: 33 daemons share 2 cores): every daemon costs ``cpu_per_node`` of a
core while it transfers (measured: 24-26% busy at N = 8, 89-93% at N = 32); as the cores fill, the
daemons learn late what their peers hold (plan ticks and alerts wait), ``lag_s x (1 + cpu_lag x
u/(1-u))``. A rack's gateway takes pieces across at ``gateway_rate`` of its cap: measured in the
debug logs (about 3.5 of 10 MB/s, the senders idle). The cause (per-peer ``peer_info`` once a
second, 4 racks x 4 workers): the other racks' workers that are not gateways read everything from
other racks through their other-rack class, whose download trickle (1/256 of the cap, shared by ~12
peers) also meters the gateway's INTERESTED and REQUEST messages; their connections to other racks
waited on that quota in 14 of 14 samples, a gateway got a median 23 KB/s from each of them with 8
requests queued (choked in 40% of samples) against 497 KB/s from each other gateway. With the
trickle at 1/32 of the cap: 111 KB/s each, 3% choked, 16.1 s against 18.7 s, a rack taking 1.24x
from outside instead of 1.05x. ``gateways``: k gateways a rack, each its share of the pieces.
Since the choke (other racks' workers that are no gateways are choked: that trickle is gone), the
gateways' deferral (a gateway leaves its rack's pieces that other racks hold for after its share)
and a gateway done across (other racks filtered out once its share is in), ``gateway_rate`` is no
rate read from the logs but what makes the racks run of ``MEASURED`` come out as measured, with the
daemon's two gateways a rack: ``fit-gateway-rate`` (0.40 since the 100 ms tick, worst error 2.1% on
the racks run; 0.35 3.4%, 0.45 5.9%, 0.30 11.7%; 0.30 was the fit before the tick).
What it stands for now is mostly the deferral: a gateway's rack's pieces that other racks hold wait
until its share is in (20-25 MB of 53.5 MB when it is, on loopback), then come at its cap; the
per-peer logs (``bench/swarm_peers.py``) show the gateways at 0.28 of their cap and their senders at
0.23 of theirs while the share crosses. Modelling the deferral itself (the gateway asks only for
pieces no other rack holds while its share is outside, gateway_rate 1.0; an unshipped patch, no JSON
kept) does not make the racks run come out as measured (T(16)/T(1) 1.35 in the model against 1.76
with the 500 ms tick): the lag it stands on (~10 pieces of its share outside and not in, ~0.6-0.85 s
a request) is not in the model.

**Calibration** (``CALIBRATION``): ``efficiency`` and ``start_s`` from T(1) at 2.5, 5 and 10 MB/s
(22.71 and 43.03 s for 99.5 MB, 7.82 s for 53.5 MB: the caps hold exactly, ~2.7 s fixed; not refitted
since: the 100 ms tick's T(1) at 10 MB/s, 7.65 s, has ~2.3 s fixed);
``cpu_per_node`` from the CPU figures; ``gateway_rate`` from ``fit-gateway-rate``; ``origin_tail_s`` and
``cpu_lag`` from the first points of ``fit``'s grid (the whole grid takes ~20 min; ``late``, owners
dropped as late, is left at 0). The three runs at 10 MB/s were measured again on 2026-12-06, 18:58-19:05,
in one run with the daemon's racks as shipped and its 100 ms tick (``bench/swarm.py --n 1,16 --size
64MiB --cap 10MB --piece-size 256KiB --racks 4 --baseline no-racks --rounds 5``: T(1) 7.65 s (no racks,
as before; 8.41 s in a rack), T(16) 9.60 s, with 4 racks 12.17 s, the worst rack 1.12x from outside;
13:17-13:29 with the 500 ms tick: 8.01, 10.04 and 14.09 s), and N = 32 at 2.5 MB/s at 18:43-18:49 (``--n 1,32 --size 100MiB
--piece-size 16KiB --cap 2500KB --trace --baseline none --rounds 3``: 42.74 and 49.35 s, origin
1.08x; 43.03 and 51.58 s, 1.10x before). The runs at 5 MB/s are the 500 ms tick's.
Against the 6 measured runs of ``MEASURED`` (N = 8, 16, 32 at 5 MB/s, N = 32 at 2.5 MB/s, N = 16 at
10 MB/s with and without 4 racks) the worst error is 0.105 (seeds 1, 2 and 3: 0.103-0.105, N = 16 at
5 MB/s; the same with the 500 ms tick's runs and 0.30): T(N)/T(1) within 11% flat and 1.7-2.4% with
racks (1.59 measured, 1.55-1.56 modelled), origin upload within 9%. The model has each rack take
1.05-1.07x the checkpoint from outside; the run's worst rack took 1.12x (median of its rounds).

**Fitted and held out.** The calibration above is fitted on ``MEASURED`` only (``fit`` and
``calibrate`` without flags never read anything else). ``HELD_OUT`` holds runs measured after it and
never used to set a parameter; ``calibrate --held-out`` prints them apart with their error. N = 24
and 48 at 2.5 MB/s (``bench/swarm.py --n 1,24,48 --size 100MiB --piece-size 16KiB --cap 2500KB
--trace --baseline none --rounds 3``; T(1) 42.98 s, 42.41-43.01): N = 24, T(N)/T(1) 1.14 measured
(per round 1.14-1.16) against 1.20-1.21 by the model (error 5.4-5.7%), origin 1.08x (1.08-1.09)
against 1.06 (1.9%); N = 48, 1.31 (1.31-1.48) against 1.32-1.33 (1.5-1.6%), origin 1.22x
(1.21-1.38) against 1.12 (8.2%): within the 15% target with the calibration as fitted (nothing
refitted). Four gateways a rack (4 racks x 4 at 10 MB/s, ``bench/swarm.py --n 1,16 --size 64MiB
--cap 10MB --piece-size 256KiB --racks 4 --gateways 2,4 --baseline no-racks --rounds 5``): T(16)/T(1)
1.92 measured (14.47 s over the no-racks T(1) 7.55 s) against 1.43-1.46 (error 24-25%), a rack
taking 1.54x from outside against 1.08: the model has more gateways faster, the run has them slower
(two: 12.50 s). The deferral is in the model only as ``gateway_rate``, the same for any k, so its figures
for k other than the daemon's 2 are unchecked (worst held-out error 25.3%; 8.2% without that run).
Crossing sessions (``[p2p] crossing``: every worker of a rack a gateway, in a session of its own, so
nothing is deferred: ``gateway_rate`` 1.0; the row says ``"crossing": True``), the same 4 racks x 4 at
10 MB/s (``bench/swarm.py --n 1,16 ... --racks 4 --baseline no-racks --crossing --rounds 5``,
2026-12-07 00:26-00:36): T(16)/T(1) 1.32 measured (10.16 s over the no-racks T(1) 7.71 s) against
1.29 (error 1.8-2.3%), origin 1.23x against 1.30-1.31x (5.7-6.5%), a rack 1.07x against 1.08x.
The machine was 77.5% busy at N = 24 (74-92%; the
model assumes 69%) and 98.6% at N = 48 (the model's share stops at 97%): no rate keeps N = 48 below
90% here (1 MB/s: 97.5%), a daemon's CPU does not fall with its rate. An older held-out run, N =
64 at 5 MB/s (99% busy, 218 owners dropped), is off by 49% (1.67 against 3.3): past about 98% busy
the model is not to be trusted.
The checkpoint is simulated in at most ``SIM_PIECES_MAX`` pieces (the 6,400 real ones would cost
6x the time).

**Prediction** (``predict``): the calibrated model without this machine's CPU, on the issue's fleet
(130 GB in 16 MiB pieces, 100 Gbit NICs at 80%, NVMe at 7 GB/s, 25 nodes a rack, a 4:1 spine). Up to
100 nodes it runs node by node; beyond, ``simulate_by_symmetry`` runs one rack in full and the other
racks by symmetry (every rack receives its home pieces alike, so each holds as many of its own as
this one does of its own, and takes from this rack as much as this rack takes from outside), which
costs what one rack costs: on 4 racks of 8 the two agree within 10% (``test_swarm_sim``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from p2p.rendezvous import gateways_of  # noqa: E402
from p2p.rendezvous import rendezvous  # noqa: E402

#: fitted on the real runs (see the module docstring and ``calibrate``)
CALIBRATION = {"efficiency": 1.0, "start_s": 2.7, "slots": 16, "per_peer": 2, "lag_s": 0.25, "cpu_per_node": 0.055,
               "cpu_lag": 1.0, "origin_tail_s": 0.1, "late": 0.0, "stall_s": 6.0,
               "gateway_rate": 0.40}

#: what bench/swarm.py measured on this 2-core machine (docs/p2p.md's tables; medians of 3 interleaved
#: rounds): (cap bytes/s, mode, racks, N, T(N) s, origin upload x, payload bytes, real pieces)
MEASURED = [
    (5e6, "plan", 0, 1, 22.71, 1.00, 99_537_572, 6400), (5e6, "plan", 0, 8, 26.36, 1.08, 99_537_572, 6400),
    (5e6, "plan", 0, 16, 28.80, 1.11, 99_537_572, 6400), (5e6, "plan", 0, 32, 30.97, 1.27, 99_537_572, 6400),
    (2.5e6, "plan", 0, 1, 42.74, 1.00, 99_537_572, 6400), (2.5e6, "plan", 0, 32, 49.35, 1.08, 99_537_572, 6400),
    (10e6, "plan", 0, 1, 7.65, 1.00, 53_524_708, 256), (10e6, "plan", 0, 16, 9.60, 1.25, 53_524_708, 256),
    (10e6, "plan", 4, 16, 12.17, 1.19, 53_524_708, 256),
]
#: runs the model is NOT fitted on (same shape as ``MEASURED``; ``calibrate --held-out``): each checks
#: the calibration on a run it never saw, and is never used to tune it. N = 1, 24, 48 at 2.5 MB/s, 16 KiB
#: pieces, medians of 3 interleaved rounds (bench/results/2026-12-06T0657; N = 24: 74-92% busy, N = 48: 98-99%)
HELD_OUT: list[tuple] = [
    (2.5e6, "plan", 0, 1, 42.98, 1.00, 99_537_572, 6400), (2.5e6, "plan", 0, 24, 49.11, 1.08, 99_537_572, 6400),
    (2.5e6, "plan", 0, 48, 56.12, 1.22, 99_537_572, 6400),
    # 4 racks x 4 at 10 MB/s with every worker a gateway (k = 4), its own gateways and measured intake from
    # outside last; T(1) the same run's, without racks (bench/results/2026-12-06T2050, 5 rounds)
    (10e6, "plan", 0, 1, 7.55, 1.00, 53_524_708, 256),
    (10e6, "plan", 4, 16, 14.47, 1.10, 53_524_708, 256, {"gateways": 4, "cross_rack": 1.54}),
    # the same with crossing sessions ([p2p] crossing: every worker a gateway in a session of its own, nothing
    # deferred, so at its full rate); T(1) the same run's, without racks (bench/results/2026-12-06T2330,
    # swarm-racks-crossing-n1-16-5rounds-after-review.json, 5 rounds)
    (10e6, "plan", 0, 1, 7.71, 1.00, 53_524_708, 256),
    (10e6, "plan", 4, 16, 10.16, 1.23, 53_524_708, 256, {"gateways": 4, "crossing": True, "cross_rack": 1.07}),
]
SHIPPED_GATEWAYS = 2   # [p2p] gateways as the daemon ships it: the racks runs of MEASURED ran with it
# [p2p] origin_request_queue as the daemon ships it since 2026-12-07 (predict's contenders run with it);
# the runs of MEASURED and HELD_OUT ran with libtorrent's 2,000 (a calibration has no origin_queue)
SHIPPED_ORIGIN_QUEUE = 128
SIM_PIECES_MAX = 1024   # the checkpoint is simulated in at most this many equal pieces (6,400 cost 6x the time)
CROSS_RACK_MEASURED = 1.12   # the racks run: the most any rack received from outside it, x checkpoint


def _tail_bytes(cal: dict, cap: float) -> float:
    """What a worker's tail from the origin holds: ``origin_tail_s`` of its cap, at most what the origin
    allows a peer to ask (``origin_queue`` blocks of 16 KiB: its max_allowed_in_request_queue, sent as
    ``reqq`` in the extended handshake: ``[p2p] origin_request_queue``; none or 0: libtorrent's 2,000).
    The peer's own 500 (max_out_request_queue) does not bound it: libtorrent replaces it with the
    sender's ``reqq`` (``bt_peer_connection::on_extended_handshake``: ``if (reqq > 0)
    max_out_request_queue(reqq)``; read in arvidn/libtorrent). Before 2026-12-07 this model took the
    smaller of the two, 500."""
    return min(cal["origin_tail_s"] * cap, int(cal.get("origin_queue") or 2000) * 16384)


def _tail_pieces(workers: int, most: float, piece: float, gen: np.random.Generator) -> np.ndarray:
    """How many pieces each worker's tail from the origin holds: ``most`` bytes in whole pieces, the
    remainder as one more piece with the odds that keep the expected bytes at ``most`` (a 16 MiB piece
    does not fit libtorrent's 8 MB queue whole, but parts of it do)."""
    whole, frac = divmod(most, piece)
    return (int(whole) + (gen.random(workers) < frac / piece)).astype(np.int64)


@dataclass
class Net:
    nodes: int
    racks: int = 0                 # 0: one flat network
    node_cap: float = 10e6         # bytes/s, up and down, every worker
    origin_cap: float = 10e6
    spine_oversub: float = 0.0     # 4.0: a rack's uplink carries a quarter of its nodes' caps (0: none)
    cores: float = 0.0             # CPUs all the daemons share (this machine: 2); 0: every node has its own


def simulate(net: Net, size: float, pieces: int, mode: str = "plan", *, seed: int = 1,
             cal: dict | None = None, write_bps: float = 0.0) -> dict:
    """Time until every worker holds every piece (plus the calibrated fixed time), the origin's upload
    and the most any rack received from outside it, as multiples of ``size``. ``write_bps``: a local
    write ceiling (NVMe) per worker."""
    cal = {**CALIBRATION, **(cal or {})}
    gen = np.random.default_rng(seed)
    n, P, slots, per_peer = net.nodes, pieces, int(cal["slots"]), int(cal["per_peer"])
    piece = size / P
    eff = cal["efficiency"]
    down = (min(net.node_cap, write_bps) if write_bps else net.node_cap) * eff
    up = np.full(n + 1, net.node_cap * eff)
    up[n] = net.origin_cap * eff                          # node n is the origin
    R = max(1, net.racks)
    rack = np.array([i % R for i in range(n)] + [-1])
    rack_link = (np.bincount(rack[:n], minlength=R) * net.node_cap * eff / net.spine_oversub) \
        if net.spine_oversub else None
    # this machine: every daemon costs cpu_per_node of a core while it transfers; as the shared cores
    # fill up, the daemons learn late what their peers hold (plan ticks and alerts wait for CPU)
    u = min(0.97, (n + 1) * cal["cpu_per_node"] / net.cores) if net.cores else 0.0
    load = u / (1 - u)
    lag = cal["lag_s"] * (1 + cal["cpu_lag"] * load)
    have = np.zeros((n + 1, P), dtype=bool)
    have[n, :] = True
    inflight = np.zeros((n, P), dtype=bool)
    ips = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(n)]
    # the plan's owners and gateways, as the daemons compute them (rendezvous hashing)
    # (``plan-flat``: the plan without racks on a network with racks; ``prack`` is the rack the plan sees)
    racked = bool(net.racks) and mode == "plan"
    PR = R if racked else 1
    prack = rack if racked else np.array([0] * n + [-1])
    home = rendezvous(P, [f"r{r}" for r in range(R)]) if racked else np.zeros(P, dtype=np.int64)
    owner = np.zeros(P, dtype=np.int64)   # the worker of the piece's home rack that takes it from the origin
    # ``gateways``: k gateways a rack (``PiecePlan(gateways=k)``), each taking its share of the pieces
    # across (rendezvous hashing over the rack's gateways, as the daemon computes it)
    k = max(1, int(cal.get("gateways", 1)))
    gw_piece = np.full((PR, P), -1, dtype=np.int64)   # the gateway of the rack that takes each piece across
    is_gw = np.zeros(n + 1, dtype=bool)
    for r in range(PR):
        members = sorted((i for i in range(n) if prack[i] == r), key=lambda i: ips[i])
        if not members:
            continue
        idx = rendezvous(P, [ips[i] for i in members])
        here = home == r
        owner[here] = np.array(members)[idx[here]]
        names = [ips[i] for i in members]
        gws = [members[names.index(ip)] for ip in gateways_of(f"r{r}", names, k)]
        gw_piece[r] = np.array(gws)[rendezvous(P, [ips[i] for i in gws])] if len(gws) > 1 else gws[0]
        is_gw[gws] = True
    flows_src: list[int] = []
    flows_dst: list[int] = []
    flows_piece: list[int] = []
    flows_left: list[float] = []
    rack_hold = np.zeros((PR, P), dtype=np.int64)     # workers holding each piece, by the plan's rack
    n_up = np.zeros(n + 1, dtype=np.int64)
    n_down = np.zeros(n + 1, dtype=np.int64)
    origin_sent, from_outside = 0.0, np.zeros(R)
    done_at = np.full(n, np.nan)
    own_done = np.zeros(n, dtype=bool)
    tail_used = np.zeros(n)
    tail_n = _tail_pieces(n, _tail_bytes(cal, net.node_cap), piece, gen)
    dt = piece / down / 4
    t = 0.0
    seen = rack_hold.copy()   # availability as the pickers know it (HAVE messages and plan ticks arrive late)
    seen_any = seen.sum(axis=0)
    next_seen = 0.0

    pair: dict[tuple[int, int], int] = {}   # (worker, source) -> transfers in flight

    def source(v: int, cand: np.ndarray, rarity: np.ndarray, holders_of) -> tuple[int, int] | None:
        """The rarest of ``cand`` (ties at random) that some holder can send now: the least busy of
        its holders that ``v`` asks fewer than ``per_peer`` pieces of (libtorrent keeps a few requests
        per connection); the next rarest when none can (up to 16 tried)."""
        for p in cand[np.argsort(rarity + gen.random(cand.size) * 0.5)][:16].tolist():
            hs = [h for h in holders_of(p).tolist() if h != v and pair.get((v, h), 0) < per_peer]
            if hs:
                return p, min(hs, key=lambda h: (n_up[h], gen.random()))
        return None   # (held, but by no holder it may ask more of now: wait)

    def pick(v: int) -> tuple[int, int] | None:
        """The next (piece, source) worker ``v`` asks for, by its mode's rules."""
        want = ~have[v] & ~inflight[v]
        if not want.any():
            return None
        r = prack[v]
        if mode == "stock":
            cand = np.flatnonzero(want)
            return source(v, cand, seen_any[cand], lambda p: np.flatnonzero(have[:, p]))
        mine = want & (owner == v) & (seen_any == 0)
        if mine.any() and pair.get((v, n), 0) < per_peer:   # its own slice, from the origin, while nobody holds it
            cand = np.flatnonzero(mine)
            return int(cand[gen.integers(cand.size)]), n
        # the last of its own slice on the way: libtorrent fills its queue to the origin with pieces
        # other workers hold (measured: 0.3-1 MB a worker, more at a higher cap)
        tail = not mine.any() and not own_done[v] and tail_used[v] < tail_n[v]
        inside = want & (seen[r] > 0)
        cross = want & (seen_any > 0) & (seen[r] == 0) & (gw_piece[r] == v) if (racked and is_gw[v]) else None
        if cross is not None and cross.any():
            cand = np.flatnonzero(cross)
            got = source(v, cand, seen_any[cand], lambda p: np.flatnonzero(have[:n, p]))
            if got is not None:
                return got
        if inside.any():
            cand = np.flatnonzero(inside)
            if tail:
                tail_used[v] += 1
                return int(cand[np.argmin(seen[r][cand] + gen.random(cand.size) * 0.5)]), n
            return source(v, cand, seen[r][cand], lambda p: np.flatnonzero(have[:n, p] & (prack[:n] == r)))
        return None

    # owners the plan drops as late (on this machine: CPU-starved ones, 6-10 a run at N = 32): each with
    # probability late x load, stall_s after the first worker's own slice is in; what it still lacks of
    # its slice moves to the others (the origin sends it twice)
    late = [i for i in range(n) if n > 1 and gen.random() < cal["late"] * load]
    late_at: float | None = None
    while np.isnan(done_at).any():
        if late and late_at is None and own_done.any():
            late_at = t + cal["stall_s"]
        if late and late_at is not None and t >= late_at:
            keep_owners = np.array([i for i in range(n) if i not in late])
            for d in late:
                moved = np.flatnonzero((owner == d) & (seen_any == 0) & ~have[d])
                if keep_owners.size:
                    owner[moved] = gen.choice(keep_owners, moved.size)
            own_done[:] = [bool(have[v][owner == v].all()) for v in range(n)]
            late = []
        for v in range(n):
            while np.isnan(done_at[v]) and n_down[v] < slots:
                got = pick(v)
                if got is None:
                    break
                p, s = got
                inflight[v, p] = True
                pair[(v, s)] = pair.get((v, s), 0) + 1
                n_up[s] += 1
                n_down[v] += 1
                flows_src.append(s), flows_dst.append(v), flows_piece.append(p), flows_left.append(piece)
        t += dt
        if t >= next_seen:
            seen[:] = rack_hold
            seen_any = seen.sum(axis=0)
            next_seen = t + lag
        if not flows_src:
            if t > 36000:
                raise RuntimeError("stuck: no transfer can start")
            continue
        src, dst = np.array(flows_src), np.array(flows_dst)
        rate = np.minimum(up[src] / n_up[src], down / n_down[dst])
        if racked:   # (gateway_rate: fitted on the racks run, see the module doc)
            into_gw = (rack[src] != rack[dst]) & (src != n) & is_gw[dst]
            rate = np.where(into_gw, rate * cal["gateway_rate"], rate)
        if rack_link is not None:
            cross = (rack[src] != rack[dst]) & (src != n)
            if cross.any():
                out_cnt = np.bincount(rack[src][cross], minlength=R)
                in_cnt = np.bincount(rack[dst][cross], minlength=R)
                cap = np.minimum(rack_link[rack[src]] / np.maximum(1, out_cnt[rack[src]]),
                                 rack_link[rack[dst]] / np.maximum(1, in_cnt[rack[dst]]))
                rate = np.where(cross, np.minimum(rate, cap), rate)
        left = np.array(flows_left) - rate * dt
        moved = np.minimum(rate * dt, np.array(flows_left))
        origin_sent += float(moved[src == n].sum())
        outside = (rack[src] != rack[dst]) | (src == n)
        np.add.at(from_outside, rack[dst][outside], moved[outside])
        finished = left <= 1e-9
        for k in np.flatnonzero(finished):
            s, v, p = int(src[k]), int(dst[k]), flows_piece[k]
            have[v, p], inflight[v, p] = True, False
            rack_hold[prack[v], p] += 1
            pair[(v, s)] -= 1
            n_up[s] -= 1
            n_down[v] -= 1
            if have[v].all():
                done_at[v] = t
        for v in set(dst[finished].tolist()):
            own_done[v] = bool(have[v][owner == v].all())
        keep = np.flatnonzero(~finished)
        flows_src = src[keep].tolist()
        flows_dst = dst[keep].tolist()
        flows_piece = [flows_piece[k] for k in keep]
        flows_left = left[keep].tolist()
    return {"nodes": n, "mode": mode, "racks": net.racks,
            "seconds": round(float(done_at.max()) + cal["start_s"], 2),
            "origin_upload_x": round(origin_sent / size, 2),
            "cross_rack_max_x": round(float(from_outside.max()) / size, 2) if net.racks else None}


def simulate_by_symmetry(net: Net, size: float, pieces: int, *, seed: int = 1, cal: dict | None = None,
                         write_bps: float = 0.0) -> dict:
    """The plan with racks for a fleet too large to simulate node by node: one rack in full, the others
    by symmetry. Every rack has the same number of workers and receives its home pieces from the
    origin at the same pace, so at any moment each other rack holds as many of its home pieces as
    this rack holds of its own: the gateway may take across at most that many pieces of each other
    home rack. Whatever this rack's gateway takes across, some other rack's gateway takes from this
    rack at the same time; a crossing is therefore modelled as one transfer from the least busy
    worker of this rack that holds one of its home pieces to its gateway, through the spine both
    ways (out and back in), at the gateway's measured rate. The origin's cap is shared by all racks
    alike. ``simulate`` on the same network should agree (``test_swarm_sim`` checks it on 4 racks of
    8; at 100 nodes the two are within 6%)."""
    cal = {**CALIBRATION, **(cal or {})}
    gen = np.random.default_rng(seed)
    R = max(1, net.racks)
    K = net.nodes // R
    P, slots, per_peer = pieces, int(cal["slots"]), int(cal["per_peer"])
    piece = size / P
    eff = cal["efficiency"]
    down = (min(net.node_cap, write_bps) if write_bps else net.node_cap) * eff
    up = np.full(K + 1, net.node_cap * eff)
    up[K] = net.origin_cap * eff / R                      # node K: this rack's share of the origin
    link = K * net.node_cap * eff / net.spine_oversub if net.spine_oversub else np.inf
    home = rendezvous(P, [f"r{r}" for r in range(R)])
    ours = home == 0
    ips = [f"10.0.0.{i}" for i in range(K)]
    owner = np.full(P, -1)
    owner[ours] = np.array(sorted(range(K), key=lambda i: ips[i]))[rendezvous(P, sorted(ips))[ours]]
    # ``gateways``: how many workers of the rack take pieces across, each its share of the pieces by
    # the same hashing (the daemon has one; more is what the predictions ask of a larger rack)
    k = max(1, min(K, int(cal.get("gateways", 1))))
    gws = [ips.index(ip) for ip in gateways_of("r0", ips, k)]
    gw_of_piece = np.array(gws)[rendezvous(P, [ips[i] for i in gws])] if k > 1 else np.full(P, gws[0])
    per_home = max(1, int(ours.sum()))
    have = np.zeros((K, P), dtype=bool)
    inflight = np.zeros((K, P), dtype=bool)
    hold = np.zeros(P, dtype=np.int64)                    # workers of this rack holding each piece
    seen = hold.copy()
    flows: list[list] = []   # [src, dst, piece, left, crossing]
    pair: dict[tuple[int, int], int] = {}
    n_up, n_down = np.zeros(K + 1, dtype=np.int64), np.zeros(K, dtype=np.int64)
    origin_sent, outside_in = 0.0, 0.0
    done_at = np.full(K, np.nan)
    own_done = np.zeros(K, dtype=bool)
    tail_used = np.zeros(K)
    tail_n = _tail_pieces(K, _tail_bytes(cal, net.node_cap), piece, gen)
    crossed = 0   # pieces of other home racks the gateway has taken or is taking
    dt, t, next_seen = piece / down / 4, 0.0, 0.0
    while np.isnan(done_at).any():
        for v in range(K):
            while np.isnan(done_at[v]) and n_down[v] < slots:
                want = ~have[v] & ~inflight[v]
                mine = want & (owner == v) & (seen == 0)
                pick = None
                if mine.any() and pair.get((v, K), 0) < per_peer:
                    cand = np.flatnonzero(mine)
                    pick = (int(cand[gen.integers(cand.size)]), K, False)
                else:
                    held_home = int(np.count_nonzero(seen[ours] > 0))
                    cross = want & ~ours & (seen == 0) & (gw_of_piece == v) \
                        if v in gws and crossed < held_home * (R - 1) else None
                    if cross is not None and cross.any():
                        holders = np.flatnonzero(have[:, ours].any(axis=1))
                        holders = [h for h in holders.tolist() if h != v]
                        if holders:
                            cand = np.flatnonzero(cross)
                            p = int(cand[gen.integers(cand.size)])
                            s_ = min(holders, key=lambda h: (n_up[h], gen.random()))
                            pick = (p, s_, True)
                            crossed += 1
                    if pick is None:
                        inside = want & (seen > 0)
                        if inside.any():
                            cand = np.flatnonzero(inside)
                            p = int(cand[np.argmin(seen[cand] + gen.random(cand.size) * 0.5)])
                            if not mine.any() and not own_done[v] and tail_used[v] < tail_n[v]:
                                tail_used[v] += 1
                                pick = (p, K, False)
                            else:
                                holders = [h for h in np.flatnonzero(have[:, p]).tolist()
                                           if h != v and pair.get((v, h), 0) < per_peer]
                                if holders:
                                    pick = (p, min(holders, key=lambda h: (n_up[h], gen.random())), False)
                if pick is None:
                    break
                p, s_, is_cross = pick
                inflight[v, p] = True
                pair[(v, s_)] = pair.get((v, s_), 0) + 1
                n_up[s_] += 1
                n_down[v] += 1
                flows.append([s_, v, p, piece, is_cross])
        t += dt
        if t >= next_seen:
            seen[:] = hold
            next_seen = t + cal["lag_s"]
        if not flows:
            if t > 36000:
                raise RuntimeError("stuck: no transfer can start")
            continue
        src = np.array([f[0] for f in flows])
        dst = np.array([f[1] for f in flows])
        xc = np.array([f[4] for f in flows])
        rate = np.minimum(up[src] / n_up[src], down / n_down[dst])
        if xc.any():
            rate = np.where(xc, np.minimum(rate * cal["gateway_rate"], link / xc.sum()), rate)
        keep = []
        for f, r_ in zip(flows, rate):
            moved = min(f[3], r_ * dt)
            f[3] -= moved
            if f[0] == K:
                origin_sent += moved
                outside_in += moved
            elif f[4]:
                outside_in += moved
            if f[3] <= 1e-9:
                s_, v, p = f[0], f[1], f[2]
                have[v, p], inflight[v, p] = True, False
                hold[p] += 1
                pair[(v, s_)] -= 1
                n_up[s_] -= 1
                n_down[v] -= 1
                own_done[v] = bool(have[v][owner == v].all())
                if have[v].all():
                    done_at[v] = t
            else:
                keep.append(f)
        flows = keep
    return {"nodes": K * R, "mode": "plan", "racks": R, "by_symmetry": True,
            "seconds": round(float(done_at.max()) + cal["start_s"], 2),
            # (every rack takes its home pieces alike: this rack's share of them scales to the fleet)
            "origin_upload_x": round(float(origin_sent) * P / per_home / size, 2),
            "cross_rack_max_x": round(float(outside_in) / size, 2)}


def _rows(runs: list[tuple], cal: dict | None, seed: int, quiet: bool) -> tuple[list[dict], float]:
    """The model against ``runs`` (rows like ``MEASURED``'s, each N > 1 with its N = 1 at the same cap
    and checkpoint among them): T(N)/T(1), the origin's upload, the busy share the model assumes, and
    each row's error; with the worst error."""
    rows, worst = [], 0.0
    t1: dict[tuple, tuple[float, float]] = {}
    c = {**CALIBRATION, **(cal or {})}
    for cap, mode, racks, n, t_meas, o_meas, size, real_pieces, *given in runs:
        # (racks: the daemon's gateways as shipped, or the row's own, with the intake from outside it measured;
        # a row of crossing sessions: every worker a gateway, at its full rate: nothing deferred)
        own = given[0] if given else {}
        row_k, cross = own.get("gateways", SHIPPED_GATEWAYS), own.get("cross_rack", CROSS_RACK_MEASURED)
        row_cal = {"gateways": row_k, **({"gateway_rate": 1.0} if own.get("crossing") else {}), **(cal or {})} \
            if racks else cal
        r = simulate(Net(n, racks, cap, cap, cores=2), size, min(real_pieces, SIM_PIECES_MAX), mode, cal=row_cal,
                     seed=seed)
        if not quiet:
            print(f"{mode} racks={racks} n={n} cap={cap / 1e6:g}MB/s: {r}", file=sys.stderr)
        if n == 1:
            t1[(cap, size)] = (r["seconds"], t_meas)
            continue
        s1, m1 = t1[(cap, size)]
        ratio_sim, ratio_meas = r["seconds"] / s1, t_meas / m1
        err_t, err_o = abs(ratio_sim / ratio_meas - 1), abs(r["origin_upload_x"] / o_meas - 1)
        row = {"cap_MBps": cap / 1e6, "mode": mode, "racks": racks, "n": n,
               "t_over_t1": {"measured": round(ratio_meas, 2), "model": round(ratio_sim, 2)},
               "origin_x": {"measured": o_meas, "model": r["origin_upload_x"]},
               "model_cpu_busy": round(min(0.97, (n + 1) * c["cpu_per_node"] / 2), 3),
               "error": {"t_over_t1": round(err_t, 3), "origin_x": round(err_o, 3)}}
        if racks:
            row["gateways"] = row_cal["gateways"]   # (a caller's cal may name its own)
            if own.get("crossing"):
                row["crossing"] = True
            row["cross_rack_max_x"] = {"measured": cross, "model": r["cross_rack_max_x"]}
        worst = max(worst, err_t, err_o)
        rows.append(row)
    return rows, round(worst, 3)


def calibrate(cal: dict | None = None, *, quiet: bool = False, seed: int = 1, held_out: bool = False) -> dict:
    """The model against every measured run it is fitted on (``MEASURED``): T(N)/T(1) (T(1) from the
    same cap and checkpoint) and the origin's upload, and with racks the most any rack received from
    outside it. ``held_out``: also against ``HELD_OUT``, the runs it was not fitted on, kept apart
    (their error is not in ``worst_error``, and ``fit`` never sees them)."""
    rows, worst = _rows(MEASURED, cal, seed, quiet)
    out = {"benchmark": "swarm-sim-calibration", "seed": seed, "calibration": {**CALIBRATION, **(cal or {})},
           "rows": rows, "worst_error": worst, "target_error": 0.15}
    if held_out:
        h_rows, h_worst = _rows(HELD_OUT, cal, seed, quiet)
        out["held_out"] = {"rows": h_rows, "worst_error": h_worst}
    return out


def fit() -> dict:
    """A grid over the parameters the runs cannot give directly; the best by worst error."""
    best: tuple[float, dict] | None = None
    for late in (0.0, 0.02, 0.05):
        for tail in (0.08, 0.1, 0.12):
            for cpu_lag in (1.0, 2.0):
                cal = {"late": late, "origin_tail_s": tail, "cpu_lag": cpu_lag}
                out = calibrate(cal, quiet=True)
                print(json.dumps({**cal, "worst": out["worst_error"]}), file=sys.stderr)
                if best is None or out["worst_error"] < best[0]:
                    best = (out["worst_error"], out)
    assert best is not None
    return best[1]


def fit_gateway_rate(values: list[float], seeds: list[int]) -> dict:
    """``gateway_rate`` alone, the other parameters as calibrated: each value's worst error on the
    racks runs of ``MEASURED`` (T(N)/T(1) and the origin's upload, T(1) from the same cap and
    checkpoint) over ``seeds``; the best by the median over the seeds."""
    racked = [r for r in MEASURED if r[2]]
    runs = [r for r in MEASURED if r[3] == 1 and any(r[0] == x[0] and r[6] == x[6] for x in racked)] + racked
    out = []
    for v in values:
        errs = [_rows(runs, {"gateway_rate": v}, seed, True)[1] for seed in seeds]
        out.append({"gateway_rate": v, "worst_error_median": statistics.median(errs), "worst_errors": errs})
        print(json.dumps(out[-1]), file=sys.stderr)
    best = min(out, key=lambda x: x["worst_error_median"])
    return {"benchmark": "swarm-sim-fit-gateway-rate", "seeds": seeds, "values": out, "best": best["gateway_rate"]}


def gateways_for(rack_size: int, spine_share: float = 0.25) -> int:
    """Gateways a rack of ``rack_size`` workers needs for its gateways' NICs to fill its uplink, which
    is ``spine_share`` of the rack's NICs (a 4:1 spine: 0.25): ``ceil(rack_size * spine_share)``
    (25 workers, 4:1: 7); fewer leave the uplink idle while each gateway's NIC is the bottleneck."""
    return max(1, min(rack_size, -(-round(rack_size * spine_share * 1000) // 1000)))


def predict(nodes: list[int], pieces: int, seed: int = 1, gateways: list[int] | None = None,
            origin_queues: list[int] | None = None) -> dict:
    """130 GB, 16 MiB pieces (simulated as ``pieces`` equal parts), 100 Gbit NICs at 80%, NVMe writes
    at 7 GB/s, 25 nodes per rack behind a 4:1 spine, the origin on the same NIC; every node its own
    CPU. Against the lower bound max(S/c_origin, S/c, N*S/(c_origin + N*c)), c = min(NIC, NVMe).
    Up to 100 nodes node by node; beyond, one rack and the others by symmetry. ``gateways``: the
    what-if counts of gateways a rack (default: the 7 whose NICs fill a rack's uplink, also at full
    rate); the model was checked against measured runs with the daemon's 2 only: with 4 a rack of 4
    it is 24% off and on the wrong side (``HELD_OUT``). "plan with crossing sessions": every worker of a
    rack a gateway at its full rate (``[p2p] crossing``; held out on its loopback run within 2.3%).
    Every contender's origin tells its workers ``SHIPPED_ORIGIN_QUEUE`` blocks (as the daemon ships);
    ``origin_queues``: what-if values of that (``[p2p] origin_request_queue``: blocks of 16 KiB, 0 for
    libtorrent's 2,000 as before 2026-12-07), each a contender with crossing sessions."""
    size, nic, nvme = 130e9, 100e9 / 8 * 0.8, 7e9
    k = gateways_for(25, 0.25)   # (7: their NICs fill the rack's uplink)
    # ("plan": as the daemon ships, [p2p] gateways = 2; one gateway a rack was the default before)
    contenders = [("plan", "plan", {"gateways": SHIPPED_GATEWAYS}), ("plan, one gateway a rack", "plan", {})]
    for g in gateways or [k]:
        contenders.append((f"plan, {g} gateways a rack", "plan", {"gateways": g}))
    if not gateways:
        contenders.append((f"plan, {k} gateways a rack at full rate", "plan", {"gateways": k, "gateway_rate": 1.0}))
    # ([p2p] crossing: every worker of a rack takes its share across in a session of its own, nothing
    # deferred; checked against the crossing run of HELD_OUT)
    contenders.append(("plan with crossing sessions", "plan", {"gateways": 25, "gateway_rate": 1.0}))
    for q in origin_queues or []:
        contenders.append((f"plan with crossing sessions, the origin's queue {q or 'libtorrent' + chr(39) + 's 2,000'} "
                           "blocks a worker", "plan",
                           {"gateways": 25, "gateway_rate": 1.0, "origin_queue": q}))
    contenders.append(("plan without racks", "plan-flat", {}))
    out = []
    for n in nodes:
        c = min(nic, nvme)
        bound = max(size / nic, size / c, n * size / (nic + n * c))
        for name, mode, extra in contenders:
            net = Net(n, max(1, n // 25), nic, nic, 4.0)
            cal = {"start_s": 0.0, "origin_queue": SHIPPED_ORIGIN_QUEUE, **extra}
            if n <= 100:
                r = simulate(net, size, pieces, mode, cal=cal, write_bps=nvme, seed=seed)
            elif mode == "plan":
                r = simulate_by_symmetry(net, size, pieces, cal=cal, write_bps=nvme, seed=seed)
            else:
                continue   # (without racks there is no symmetry to lean on)
            print(f"seed {seed} {name} n={n}: {r}", file=sys.stderr)
            out.append({**r, "contender": name, "lower_bound_s": round(bound, 2),
                        "over_bound": round(r["seconds"] / bound, 2)})
    return {"benchmark": "swarm-sim-predict", "seed": seed, "bytes": size, "piece_bytes": 16 << 20,
            "simulated_pieces": pieces, "nic_bytes_per_s": nic, "nvme_bytes_per_s": nvme, "nodes_per_rack": 25,
            "spine_oversub": 4, "results": out,
            "published": {"dragonfly": "10 GB to 990 nodes in 6m28s",
                          "kraken": "3 GB to 2,600 hosts, p99 18 s at 300 MB/s caps"}}


def over_seeds(what: str, runs: list[dict], max_spread: float, machine: tuple[dict, dict]) -> dict:
    """The runs of every seed in bench/_rounds.py's common shape (a simulation's rounds are its seeds):
    calibrate: the model's T(N)/T(1) and origin upload against the measured ones per row, the model
    over the measurement as a ratio of medians with its per-seed range (target: within the 15% error
    the calibration is held to); predict: each contender's seconds, the plan against the plan
    without racks."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _rounds import report, speedup
    times: dict[str, list[float]] = {}
    ratios = []
    if what == "calibrate":
        held = "held_out" in runs[0]
        for part, tag in (("rows", ""), ("held_out", "held-out ")) if held else (("rows", ""),):
            rows_of = [r[part] if part == "rows" else r[part]["rows"] for r in runs]
            for i, row in enumerate(rows_of[0]):
                label = (f"{tag}{row['mode']} racks={row['racks']} N={row['n']} cap={row['cap_MBps']:g}MB/s"
                         + (f" gateways={row['gateways']}" if "gateways" in row else "")
                         + (" crossing" if row.get("crossing") else ""))
                for fig in ("t_over_t1", "origin_x"):
                    for who in ("model", "measured"):
                        times[f"{who} {fig} {label}"] = [rs[i][fig][who] for rs in rows_of]
                    ratios.append(speedup(times, f"measured {fig} {label}", f"model {fig} {label}",
                                          max_spread=max_spread, target=0.85, target_at_most=1.15))
        worst = [r["worst_error"] for r in runs]
        extra = {"worst_error": max(worst), "worst_error_over_seeds": {"median": statistics.median(worst),
                 "min": min(worst), "max": max(worst)}, "target_error": 0.15}
        if held:   # (kept apart: the model was not fitted on these runs)
            h = [r["held_out"]["worst_error"] for r in runs]
            extra["held_out_worst_error"] = max(h)
            extra["held_out_worst_error_over_seeds"] = {"median": statistics.median(h), "min": min(h), "max": max(h)}
    else:
        for r in runs:
            for row in r["results"]:
                times.setdefault(f"{row['contender']} N={row['nodes']}", []).append(row["seconds"])
        ratios = [speedup(times, k, k.replace("plan N=", "plan without racks N="), max_spread=max_spread)
                  for k in times if k.startswith("plan N=") and k.replace("plan N=", "plan without racks N=") in times]
        extra = {}
    return report(f"swarm-sim-{what}", times, ratios, rounds=len(runs), max_spread=max_spread, machine=machine,
                  unit="x" if what == "calibrate" else "s",
                  seeds=[r["seed"] for r in runs], figure="simulated (the rounds are seeds)", **extra, runs=runs)


def _positive_ints(text: str) -> list[int]:
    """A comma-separated list of positive integers, for argparse (a bad one: a usage error, exit 2)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def _origin_queues(text: str) -> list[int]:
    """Values of ``[p2p] origin_request_queue`` (0, or 16 to 2000), comma-separated, for argparse."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if any(not (q == 0 or 16 <= q <= 2000) for q in out):
        raise argparse.ArgumentTypeError(f"expected 0 or from 16 to 2000 (as [p2p] origin_request_queue), got {text!r}")
    return out


def _fractions(text: str) -> list[float]:
    """A comma-separated list of numbers in (0, 1], for argparse (a bad one, nan included: a usage
    error, exit 2)."""
    try:
        out = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not out or not all(0 < x <= 1 for x in out):
        raise argparse.ArgumentTypeError(f"expected numbers in (0, 1], got {text!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["calibrate", "fit", "fit-gateway-rate", "predict"])
    ap.add_argument("--values", type=_fractions, default=[0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.65, 1.0],
                    help="fit-gateway-rate: the values of gateway_rate to try, comma-separated, each in (0, 1]")
    ap.add_argument("--nodes", type=_positive_ints, default=[100, 1000])
    ap.add_argument("--pieces", type=lambda t: _positive_ints(t)[0], default=1024,
                    help="equal parts the checkpoint is simulated as (predict)")
    ap.add_argument("--seeds", type=_positive_ints, default=[1, 2, 3, 4, 5],
                    help="calibrate, predict: the model's random seeds (a simulation's rounds are its seeds)")
    ap.add_argument("--rounds", type=lambda t: _positive_ints(t)[0], default=None,
                    help="seeds 1..N (instead of --seeds)")
    ap.add_argument("--held-out", action="store_true",
                    help="calibrate: also the runs the model was not fitted on (HELD_OUT), with their error apart")
    ap.add_argument("--gateways", type=_positive_ints, default=None, metavar="K[,K...]",
                    help="predict: what-if gateways a rack, each a contender, 3 to 25 (default: 7, and 7 at full "
                         "rate; a rack of fewer workers has them all); the model is checked with the daemon's 2 only")
    ap.add_argument("--origin-queue", type=_origin_queues, default=None, metavar="Q[,Q...]",
                    help=f"predict: what-if values of [p2p] origin_request_queue (16 KiB blocks a worker may have "
                         f"asked of the origin: 16 to 2000, 0 for libtorrent's 2,000; {SHIPPED_ORIGIN_QUEUE}, as "
                         f"shipped, always runs), each a contender with crossing sessions")
    ap.add_argument("--max-spread", type=float, default=0.5,
                    help="no ratio when a figure varies more than this over the seeds (IQR over median)")
    args = ap.parse_args()
    if args.gateways and args.what != "predict":
        ap.error("--gateways: with predict only")
    if args.origin_queue and (args.what != "predict" or SHIPPED_ORIGIN_QUEUE in args.origin_queue
                              or len({q or 2000 for q in args.origin_queue}) < len(args.origin_queue)):
        ap.error(f"--origin-queue: with predict only, distinct values (0 is 2000) other than {SHIPPED_ORIGIN_QUEUE} "
                 f"(as shipped: always run)")
    seeds = args.seeds if args.rounds is None else list(range(1, args.rounds + 1))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _rounds import machine_state
    m0 = machine_state()
    if args.what == "calibrate":
        runs = [calibrate(seed=x, held_out=args.held_out) for x in seeds]
        print(json.dumps(over_seeds("calibrate", runs, args.max_spread, (m0, machine_state())), indent=2))
    elif args.what == "fit":
        print(json.dumps(fit(), indent=2))
    elif args.what == "fit-gateway-rate":
        print(json.dumps(fit_gateway_rate(args.values, seeds), indent=2))
    else:
        if args.gateways and (max(args.gateways) > 25 or len(set(args.gateways)) < len(args.gateways)
                              or {1, SHIPPED_GATEWAYS} & set(args.gateways)):
            ap.error(f"--gateways: distinct values from 3 to 25 (the workers of a rack in the predicted fleet; "
                     f"1 and {SHIPPED_GATEWAYS} always run)")
        runs = [predict(args.nodes, args.pieces, seed=x, gateways=args.gateways, origin_queues=args.origin_queue)
                for x in seeds]
        print(json.dumps(over_seeds("predict", runs, args.max_spread, (m0, machine_state())), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
