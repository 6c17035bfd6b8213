"""k gateways a rack (``PiecePlan(gateways=k)``): each piece that crosses into a rack is taken across by
exactly one of the rack's gateways, the rack-mates take everything else inside the rack, and a dead
or stalled gateway's share moves to the others; a node serves another rack through its gateway only
(``racks.py``)."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import libtorrent as lt
import numpy as np
import pytest

from p2p import P2PConfig, P2PSession, load_torrent, make_torrent
from p2p.plan import HELD, OWN, XRACK, Peer, PiecePlan
from p2p.rendezvous import gateway_of, gateways_of, rendezvous
from p2p.swarm_view import SwarmView
from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint


def _racks(r: int, w: int) -> dict[str, str]:
    return {f"127.0.{i}.{j}": f"r{i}" for i in range(r) for j in range(w)}


def test_each_piece_crosses_into_a_rack_through_exactly_one_of_its_gateways() -> None:
    n, k = 600, 2
    members = _racks(4, 4)
    plans = {ip: PiecePlan(n, ip, rack=rack, gateways=k) for ip, rack in members.items()}
    held = [True] * n   # every piece is held somewhere (outside the rack: no worker of it holds one)
    prio = {ip: np.array(p.priorities([False] * n, {}, held, members, 0, 0, 1.0, True)) for ip, p in plans.items()}
    for r in range(4):
        rack = [ip for ip in members if members[ip] == f"r{r}"]
        gws = gateways_of(f"r{r}", rack, k)
        assert gws[0] == gateway_of(f"r{r}", rack) and len(gws) == k
        assert all(plans[ip].gateways == gws for ip in rack)   # every worker names the same ones
        takers = np.zeros(n, dtype=int)
        for ip in rack:
            x = (prio[ip] == XRACK) | (prio[ip] == OWN)
            assert not x.any() or ip in gws                   # rack-mates never take from outside
            takers += x
        assert (takers == 1).all()                            # each piece enters the rack once
        shares = [int(np.count_nonzero(prio[ip] == XRACK)) for ip in gws]
        assert min(shares) > 0.4 * n / k, shares              # split between the gateways


def test_a_gateway_that_leaves_or_stalls_hands_its_share_to_the_others() -> None:
    n, k = 600, 2
    members = _racks(2, 4)
    rack = [ip for ip in members if members[ip] == "r0"]
    ranked = gateways_of("r0", rack, len(rack))
    gws, mate = ranked[:k], ranked[k]   # (mate: the next worker by the hashing)
    plan = PiecePlan(n, gws[1], rack="r0", gateways=k, stall_s=6.0)
    held = [True] * n
    before = np.array(plan.priorities([False] * n, {}, held, members, 0, 0, 0.0, True)) == XRACK
    # the first gateway leaves the list (it died): the next worker by the hashing takes its place; by
    # the hashing the survivor keeps the pieces it beats the newcomer on (2/3 of its share expected)
    # and the leaver's whole share moves to the two
    left = {ip: r for ip, r in members.items() if ip != gws[0]}
    after = np.array(plan.priorities([False] * n, {}, held, left, 0, 0, 1.0, True)) == XRACK
    assert plan.gateways == [gws[1], mate] or plan.gateways == [mate, gws[1]]
    assert np.count_nonzero(before & after) >= 0.55 * np.count_nonzero(before)
    other = PiecePlan(n, mate, rack="r0", gateways=k)
    theirs = np.array(other.priorities([False] * n, {}, held, left, 0, 0, 1.0, True)) == XRACK
    assert not (after & theirs).any() and (after | theirs).all()
    # a gateway that is connected but does not grow while others hold pieces it lacks: skipped after
    # stall_s, its share moves to the others
    me = PiecePlan(n, mate, rack="r0", gateways=k, stall_s=6.0)
    stuck = {ip: Peer("r0", [False] * n) for ip in rack if ip != mate}
    for t in range(0, 9):
        prio = np.array(me.priorities([False] * n, stuck, held, members, 0, 0, float(t), True))
    assert gws[0] in me.skipped_gateways and gws[1] in me.skipped_gateways, me.why
    assert mate in me.gateways and (prio == XRACK).any()


def test_with_crossing_sessions_a_dead_workers_share_across_moves_to_its_rack_mates() -> None:
    """Every worker a gateway (``[p2p] crossing``: ``RACK_WIDE``): the shares across (``across``, what
    each crossing session takes in) split the pieces homed in other racks between a rack's workers, and
    when one leaves the member list the survivors' shares cover its share too, still once each (the
    daemons' test, tests/test_crossing.py, cannot pin this by bytes: under load the rack may get the dead
    one's share another way before the list drops it)."""
    from p2p.transfer import RACK_WIDE
    n = 600
    members = {"127.0.0.3": "r0", "127.0.0.4": "r0", "127.0.0.5": "r0", "127.0.0.6": "r1", "127.0.0.7": "r1"}
    held = [True] * n

    def shares(live: dict[str, str]) -> dict[str, np.ndarray]:
        out = {}
        for ip in (ip for ip in live if live[ip] == "r0"):
            plan = PiecePlan(n, ip, rack="r0", gateways=RACK_WIDE)
            plan.priorities([False] * n, {}, held, live, 0, 0, 1.0, True)
            out[ip] = plan.across
        return out

    before = shares(members)
    homed = PiecePlan(n, "127.0.0.3", rack="r0", gateways=RACK_WIDE)
    homed.priorities([False] * n, {}, held, members, 0, 0, 1.0, True)
    outside = ~homed.homed
    assert 0.3 * n < np.count_nonzero(outside) < 0.7 * n
    assert (sum(a.astype(int) for a in before.values()) == outside.astype(int)).all()   # once each
    assert all(np.count_nonzero(a) > 0.2 * np.count_nonzero(outside) for a in before.values())
    after = shares({ip: r for ip, r in members.items() if ip != "127.0.0.3"})
    assert (sum(a.astype(int) for a in after.values()) == outside.astype(int)).all()    # the dead one's too
    for ip, a in after.items():   # (bounded loads: a survivor keeps most of its share, not all of it)
        assert np.count_nonzero(a) > 1.2 * np.count_nonzero(before[ip])
        assert np.count_nonzero(a & before[ip]) >= 0.55 * np.count_nonzero(before[ip])


def test_a_gateway_takes_what_its_rack_holds_from_outside_only_once_its_share_is_in() -> None:
    """An open gateway would take from other racks pieces its rack holds too (libtorrent picks the
    sender): while it has pieces of its share to take across it asks only for those its rack alone
    holds; once its share is in it asks for the rest (its other-racks class is paced then)."""
    n, k = 400, 2
    members = _racks(2, 4)
    rack = sorted(ip for ip in members if members[ip] == "r0")
    me, mate = gateways_of("r0", rack, k)[0], gateways_of("r0", rack, len(rack))[k]
    held = [True] * n
    mate_has = np.zeros(n, dtype=bool)
    mate_has[: n // 2] = True                   # a rack-mate holds the first half ...
    outside = np.zeros(n, dtype=bool)
    outside[n // 4:] = True                     # ... other racks hold everything from a quarter on
    peers = {mate: Peer("r0", mate_has.tolist())}
    plan = PiecePlan(n, me, rack="r0", gateways=k)
    prio = np.array(plan.priorities([False] * n, peers, held, members, 0, 0, 1.0, True, outside.tolist()))
    assert plan.crossing > 0 and (prio == XRACK).any()
    assert set(np.flatnonzero(prio == HELD)) == set(range(n // 4))   # its rack alone holds these
    # without the other racks' bitfields the plan asks for everything its rack holds, as before
    plain = np.array(PiecePlan(n, me, rack="r0", gateways=k).priorities([False] * n, peers, held, members, 0, 0,
                                                                         1.0, True))
    assert set(np.flatnonzero(plain == HELD)) == set(range(n // 2))
    # its share in (every piece it does not hold is in its rack): the rest is asked for
    have = (prio == XRACK).tolist()
    peers = {mate: Peer("r0", [not h for h in have])}
    prio = np.array(plan.priorities(have, peers, held, members, 0, 0, 2.0, True, outside.tolist()))
    assert plan.crossing == 0 and set(np.flatnonzero(prio == HELD)) == set(np.flatnonzero(~np.array(have)))


def test_a_gateway_whose_crossing_stands_still_asks_for_its_racks_pieces_again() -> None:
    """The deferral holds only while pieces of its share come in: a gateway the other racks do not
    serve (they name another from an older list, or a skip was not heeded) gets nothing across, and
    after grace_s asks for what its rack holds again (else it would wait with those unasked, and the
    plan's open-all never fires while something is asked for)."""
    n, k = 400, 2
    members = _racks(2, 4)
    rack = sorted(ip for ip in members if members[ip] == "r0")
    me, mate = gateways_of("r0", rack, k)[0], gateways_of("r0", rack, len(rack))[k]
    mate_has = [p < n // 2 for p in range(n)]
    peers, held, outside = {mate: Peer("r0", mate_has)}, [True] * n, [True] * n
    plan = PiecePlan(n, me, rack="r0", gateways=k)
    have = [False] * n
    for t in (0.0, 1.0, 2.0):   # its crossing moves: one of its pieces across comes in a second
        prio = np.array(plan.priorities(have, peers, held, members, 0, 0, t, True, outside))
        assert not (prio == HELD).any(), t
        have[int(np.flatnonzero(prio == XRACK)[0])] = True
    for t in (3.0, 5.0, 6.1):   # nothing more comes in
        prio = np.array(plan.priorities(have, peers, held, members, 0, 0, t, False, outside))
    assert plan.crossing > 0 and (prio == HELD).sum() == n // 2 - sum(have[: n // 2])


def test_a_gateway_whose_share_is_in_takes_the_rest_from_its_rack_alone() -> None:
    """Once every piece of its share homed in other racks is in its rack, a gateway is done across
    (``PiecePlan.crossed``) and the session filters the other racks' workers out until its download
    ends (``racks.done_across``): open to them (they unchoke a gateway), it had its rack's pieces
    asked of them and queued at the trickle, and finished 2.5-3.5 s after its rack-mates (bench/swarm.py
    --racks 4). Not while one piece of its share is still to cross, not on a worker that is no
    gateway, not once it holds everything, and the filter holds other racks' workers only."""
    n, k = 400, 2
    members = _racks(2, 4)
    rack = sorted(ip for ip in members if members[ip] == "r0")
    me, mate = gateways_of("r0", rack, k)[0], gateways_of("r0", rack, len(rack))[k]
    home = rendezvous(n, ["r0", "r1"])
    held, outside = [True] * n, [True] * n
    plan = PiecePlan(n, me, rack="r0", gateways=k)
    prio = np.array(plan.priorities([False] * n, {mate: Peer("r0", [False] * n)}, held, members, 0, 0, 1.0, True,
                                    outside))
    share = (prio == XRACK) & (home == 1)   # (its share of the pieces homed in r1)
    assert share.sum() > 0.3 * n / k and not plan.crossed
    last = int(np.flatnonzero(share)[-1])
    have = share.copy()
    have[last] = False                      # all of its share in but one piece; its rack-mate holds the rest
    mate_has = ~share
    plan.priorities(have.tolist(), {mate: Peer("r0", mate_has.tolist())}, held, members, 0, 0, 2.0, True, outside)
    assert not plan.crossed
    mate_has[last] = True                   # the last one is in its rack (the rack-mate took it)
    prio = np.array(plan.priorities(have.tolist(), {mate: Peer("r0", mate_has.tolist())}, held, members, 0, 0, 3.0,
                                    True, outside))
    assert plan.crossed and set(np.flatnonzero(prio == HELD)) == set(np.flatnonzero(~have))
    # the rack-mate left: that piece of its share is in no one's hands in its rack again
    plan.priorities(have.tolist(), {}, held, members, 0, 0, 4.0, True, outside)
    assert not plan.crossed
    have[last] = True
    # a rack-mate that is no gateway, with the same pieces in hand, is never done across; nor is a
    # gateway that holds everything
    other = PiecePlan(n, mate, rack="r0", gateways=k)
    other.priorities(have.tolist(), {me: Peer("r0", (~have).tolist())}, held, members, 0, 0, 1.0, True, outside)
    assert not other.crossed
    plan.priorities([True] * n, {mate: Peer("r0", mate_has.tolist())}, held, members, 0, 0, 5.0, True, outside)
    assert not plan.crossed


def test_a_gateway_done_across_filters_other_racks_but_the_gateways_it_alone_serves() -> None:
    """What the session filters out of a gateway done across (``RackClasses.done_across``): every
    worker of another rack while a rack-mate that is no gateway, or a rack seed, is connected (it
    serves the other racks' gateways in its place); else the other racks' gateways it unchokes stay
    (a rack whose only downloaders are its two gateways filtered each other's peers: the other
    racks got its pieces only from the origin), and so do workers of partial copies of other files.
    Nothing before its share is in, never a worker whose rack is not known, and nothing for the rest
    of the download once nothing arrived with them filtered (a rack-mate whose bitfield lies would
    have it filter, starve 5 s, open, and filter again)."""
    members = _racks(3, 3)
    rack = sorted(ip for ip in members if members[ip] == "r0")
    gws = gateways_of("r0", rack, 2)
    plain = next(ip for ip in rack if ip not in gws)
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r0"))
    try:
        seen = {**members, "127.9.9.9": "", "127.9.9.8": "r2"}   # (.8: a partial copy of other files)
        s.racks.set_racks(seen, members, others=["127.9.9.8"])
        other = {ip for ip, r in members.items() if r != "r0"}
        served = {ip for r in ("r1", "r2") for ip in gateways_of(r, sorted(i for i in members if members[i] == r), 2)}
        assert s.racks.open == served | {"127.9.9.8"}
        plan = PiecePlan(100, gws[0], rack="r0", gateways=2)
        plan.gateways = gws

        def away(peers: dict[str, Peer], rack_seeds: int = 0, starving: bool = False) -> frozenset[str]:
            view = SwarmView([False] * 100, peers, [False] * 100, rack_seeds=rack_seeds)
            return s.racks.done_across(seen, plan, view, starving, others=["127.9.9.8"])

        assert away({plain: Peer("r0")}) == frozenset()           # (its share not in yet)
        plan.crossed = True
        assert away({plain: Peer("r0")}) == other
        assert away({}, rack_seeds=1) == other
        assert away({gws[1]: Peer("r0")}) == other - served        # (the other gateway filters them too)
        assert away({}) == other - served
        assert away({plain: Peer("r0")}, starving=True) == frozenset() and plan.starved_across
        assert away({plain: Peer("r0")}) == frozenset()
    finally:
        s.close()


def test_two_downloads_at_once_filter_no_one(tmp_path: Path) -> None:
    """The filters are the session's and a download's plan sets them only while it runs alone: once a
    second download runs, whatever the first had filtered (a gateway done across: other racks'
    workers; its own slice in: the origins) is let back in (before, it stayed until the first ended,
    and the second could not reach those peers)."""
    mib = 1 << 20
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=2 * mib, shards=1, layers=1)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m, piece_size=mib), m)
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r0"))
    try:
        assert s.seed(ti, ckpt)
        h = next(iter(s.seeding.values()))
        s.block_peers(frozenset({"127.0.1.1", "127.0.1.2"}))
        plan = PiecePlan(ti.num_pieces(), "127.0.0.2", rack="r0")
        s.active_downloads = 2   # (as two downloads' threads leave it)
        s.apply_plan(h, plan, h.status(), set(), time.monotonic(), False, None, {"127.0.1.1": "r1"})
        assert s.blocked == frozenset()
    finally:
        s.close()


def test_gateways_told_skipped_are_planned_past_by_every_worker_and_served_in_their_place() -> None:
    """A gateway one worker skipped is told through the trackers (``skipped``): the others plan past
    it at once (the skipped one itself too: it takes nothing across then), and the other racks'
    senders (``RackClasses``, the same hashing over the rest) serve its replacement instead."""
    n, k = 300, 2
    members = _racks(2, 4)
    rack = sorted(ip for ip in members if members[ip] == "r0")
    ranked = gateways_of("r0", rack, len(rack))
    held = [True] * n
    plans = {ip: PiecePlan(n, ip, rack="r0", gateways=k) for ip in rack}
    for ip, plan in plans.items():
        plan.told_skipped(frozenset({ranked[0]}))
        prio = np.array(plan.priorities([False] * n, {}, held, members, 0, 0, 1.0, True))
        assert plan.gateways == ranked[1:k + 1], ip
        assert ((prio == XRACK).any()) == (ip in ranked[1:k + 1]), ip
    plans[ranked[0]].told_skipped(frozenset())   # (no longer said: its own gateway again)
    plans[ranked[0]].priorities([False] * n, {}, held, members, 0, 0, 2.0, True)
    assert plans[ranked[0]].gateways == ranked[:k]
    s = P2PSession(P2PConfig(listen="127.0.0.200:0", rack="r1", choke_other_racks=True, gateways=k))
    try:
        s.set_other_racks(members, members)
        assert s.racks.open == frozenset(ranked[:k])
        s.set_other_racks(members, members, skipped={ranked[0]})
        assert s.racks.open == frozenset(ranked[1:k + 1])
    finally:
        s.close()


def _swarm(racks: int, per_rack: int, k: int, n: int, seed: int, kill_at: int | None) -> dict[str, float]:
    """A step-by-step swarm of PiecePlans: every step each live worker takes up to 4 pieces by its
    priorities: OWN from the origin, XRACK from a holder in another rack, HELD from a holder in its
    rack (the peer classes' rule: only a worker crossing takes from outside). With ``kill_at`` the
    first gateway of rack r0 dies at that step (it leaves the list). Returns what each rack received
    from outside it (the origin included), in checkpoints."""
    rnd = random.Random(seed)
    members = _racks(racks, per_rack)
    plans = {ip: PiecePlan(n, ip, rack=r, gateways=k, stall_s=6.0) for ip, r in members.items()}
    have = {ip: np.zeros(n, dtype=bool) for ip in members}
    outside = dict.fromkeys(set(members.values()), 0)
    dead = gateways_of("r0", [ip for ip in members if members[ip] == "r0"], k)[0]
    live = dict(members)
    for step in range(400):
        if kill_at is not None and step == kill_at:
            live.pop(dead, None)
        todo = [ip for ip in live if not have[ip].all()]
        if not todo:
            break
        held_any = np.zeros(n, dtype=bool)
        for ip in live:
            held_any |= have[ip]
        seeds = [ip for ip in live if have[ip].all()]
        got: list[tuple[str, int, bool]] = []
        for ip in rnd.sample(todo, len(todo)):
            rack = live[ip]
            peers = {o: Peer(r, have[o].tolist() if r == rack else None) for o, r in live.items()
                     if o != ip and o not in seeds}
            rack_seeds = sum(live[o] == rack for o in seeds)
            prio = np.array(plans[ip].priorities(have[ip].tolist(), peers, held_any.tolist(),
                                                 {o: r for o, r in live.items() if o not in seeds},
                                                 len(seeds), rack_seeds, float(step), True))
            in_rack = np.zeros(n, dtype=bool)
            for o, r in live.items():
                if r == rack and o != ip:
                    in_rack |= have[o]
            for level in (OWN, XRACK, HELD):
                cand = np.flatnonzero((prio == level) & ~have[ip])
                if level == HELD:
                    cand = cand[in_rack[cand]]
                if level == XRACK:
                    cand = cand[(held_any & ~in_rack)[cand]]
                for p in rnd.sample(cand.tolist(), min(4, len(cand))):
                    got.append((ip, p, level != HELD))
                if len(cand):
                    break
        for ip, p, from_outside in got:
            if not have[ip][p]:
                have[ip][p] = True
                outside[live[ip]] += from_outside
    assert all(have[ip].all() for ip in live), "the swarm did not finish"
    return {r: c / n for r, c in outside.items()}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rack_takes_in_about_one_checkpoint_in_every_round_even_when_a_gateway_dies(seed: int) -> None:
    for kill_at in (None, 6):
        per_rack = _swarm(3, 4, 2, 240, seed, kill_at)
        assert max(per_rack.values()) <= 1.25, (kill_at, per_rack)


def _asking_in_background(s: P2PSession, w: P2PSession, w_ip: str, ti: lt.torrent_info, dest: Path,
                          got: dict[str, object], timeout_s: float) -> threading.Thread:
    """W downloads ``ti`` from S (seeding it) on a thread of its own, its result or error into
    ``got["w"]``; returned once S sees W interested (10 s at most)."""
    def w_download() -> None:
        try:
            got["w"] = w.download(ti, dest, peers=(f"127.0.0.2:{s.port}",), stall_s=30, timeout_s=timeout_s,
                                  plan=False)
        except Exception as exc:  # noqa: BLE001 (the caller's assertion says what happened)
            got["w"] = exc

    t = threading.Thread(target=w_download)
    t.start()
    seed = next(iter(s.seeding.values()))
    deadline = time.monotonic() + 10
    while not any(p.ip[0] == w_ip and p.flags & lt.peer_info.remote_interested for p in seed.get_peer_info()):
        assert time.monotonic() < deadline, "W never asked S for pieces"
        time.sleep(0.1)
    return t


def test_a_node_serves_another_rack_through_its_gateway_only(tmp_path: Path) -> None:
    """Real sessions on loopback: S (rack r1) holds the version; G and W of rack r0 both dial it and
    ask for every piece. S unchokes G, r0's gateway by the hashing over the member list, and keeps W
    choked: W asks it for nothing (it is to take the pieces inside its rack; a worker that asked
    another rack for pieces read that connection through its trickle, the gateway's requests
    included: issue 38). Once G leaves the list, W is r0's gateway: S drops W's connection, made with
    the choked class, and serves it on the next one."""
    mib = 1 << 20
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=6 * mib, shards=2, layers=2)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m, piece_size=mib), m)
    g_ip, w_ip = gateways_of("r0", ["127.0.0.3", "127.0.0.4"], 2)
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r1", choke_other_racks=True, gateways=1))
    g, w = (P2PSession(P2PConfig(listen=f"{ip}:0", rack="r0")) for ip in (g_ip, w_ip))
    got: dict[str, object] = {}
    t = threading.Thread()
    try:
        assert s.seed(ti, ckpt)
        racks = {g_ip: "r0", w_ip: "r0"}
        s.set_other_racks(racks, racks)
        t = _asking_in_background(s, w, w_ip, ti, tmp_path / "w" / "v1", got, 60)
        seed = next(iter(s.seeding.values()))
        g.download(ti, tmp_path / "g" / "v1", peers=(f"127.0.0.2:{s.port}",), stall_s=10, timeout_s=30, plan=False)
        assert verify_checkpoint(tmp_path / "g" / "v1", m).ok
        time.sleep(1.5)   # (W keeps asking meanwhile; libtorrent's counters tick once a second)
        assert t.is_alive() and "w" not in got, f"W took the version from another rack's worker: {got}"
        to_w = [p for p in seed.get_peer_info() if p.ip[0] == w_ip]
        assert to_w and all(p.flags & lt.peer_info.choked and p.total_upload < 64 << 10 for p in to_w), \
            [(p.flags, p.total_upload) for p in to_w]
        s.set_other_racks(racks, {w_ip: "r0"})   # G finished and left the list: W is r0's gateway now
        t.join(60)
        assert not isinstance(got.get("w"), Exception), got
        assert verify_checkpoint(tmp_path / "w" / "v1", m).ok
    finally:
        for x in (s, g, w):
            x.close()
        if t.is_alive():
            t.join(5)



def test_a_node_that_stops_choking_drops_the_choked_connections_once(tmp_path: Path) -> None:
    """Once no download decides (this node's finished), it chokes no one, on connections made before
    too: libtorrent classes a connection when it is made, so S drops W's once and W, dialling again,
    is served (before, a finished seed kept a worker that had become its rack's gateway choked)."""
    mib = 1 << 20
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=4 * mib, shards=1, layers=1)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m, piece_size=mib), m)
    racks = {"127.0.0.3": "r0", "127.0.0.4": "r0"}
    _, w_ip = gateways_of("r0", sorted(racks), 2)
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r1", gateways=1))
    w = P2PSession(P2PConfig(listen=f"{w_ip}:0", rack="r0"))
    got: dict[str, object] = {}
    t = threading.Thread()
    try:
        assert s.seed(ti, ckpt)
        s.set_other_racks(racks, racks)   # (as a download's plan does: W is not r0's gateway)
        t = _asking_in_background(s, w, w_ip, ti, tmp_path / "w" / "v1", got, 40)
        time.sleep(1.0)
        assert t.is_alive(), got
        s._redial(s.racks.unchoke_all())   # (what the end of S's download does)
        t.join(30)
        assert not isinstance(got.get("w"), Exception) and "w" in got, got
        assert verify_checkpoint(tmp_path / "w" / "v1", m).ok
    finally:
        for x in (s, w):
            x.close()
        if t.is_alive():
            t.join(5)


def test_choking_other_racks_is_on_by_default_and_ends_with_the_download(tmp_path: Path) -> None:
    """[p2p] choke_other_racks is on unless set false (then nobody is choked: receivers pace alone).
    A node's chokes are its download's: S (rack r1), whose last download listed W (rack r0, not its
    gateway), later seeds the version, and W fetching it then is served (before, S kept its last
    list's chokes for every torrent it seeds: W got nothing)."""
    racks = {"127.0.0.3": "r0", "127.0.0.4": "r0"}
    _, w_ip = gateways_of("r0", sorted(racks), 2)
    assert P2PConfig(rack="r1").choke_other_racks and P2PConfig(rack="r1").gateways == 2
    off = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r1", choke_other_racks=False))
    try:
        off.set_other_racks(racks, racks)
        assert off.racks.open_class < 0 and off.ses.get_settings()["unchoke_slots_limit"] != 0
    finally:
        off.close()
    mib = 1 << 20
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=2 * mib, shards=1, layers=1)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m, piece_size=mib), m)
    origin = P2PSession(P2PConfig(listen="127.0.0.5:0"))
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", rack="r1", gateways=1))   # (W: not r0's gateway)
    w = P2PSession(P2PConfig(listen=f"{w_ip}:0", rack="r0"))
    try:
        assert origin.seed(ti, ckpt)
        s.set_other_racks(racks, racks)   # (as its download's plan does: W is not r0's gateway)
        s.download(ti, tmp_path / "s" / "v1", peers=(f"127.0.0.5:{origin.port}",), stall_s=20, timeout_s=30,
                   plan=False)
        origin.close()
        assert s.seed(ti, tmp_path / "s" / "v1")
        w.download(ti, tmp_path / "w" / "v1", peers=(f"127.0.0.2:{s.port}",), stall_s=8, timeout_s=30, plan=False)
        assert verify_checkpoint(tmp_path / "w" / "v1", m).ok
    finally:
        for x in (w, s, origin):
            x.close()
