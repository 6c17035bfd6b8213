"""Several origins: every worker's home origin (dealt by rendezvous hashing, balanced), and when a worker
lets which origin in: its home only, a new home once that one is dead, every origin while nothing
arrives, none once its own slice is in."""

from __future__ import annotations

from p2p.origins import DEAD_AFTER_S, DIAL_GRACE_S, OriginShare, origins_to_block
from p2p.rendezvous import home_origins

A, B, C = "10.1.0.1", "10.1.0.2", "10.1.0.3"


def test_home_origins_are_balanced_and_the_same_on_every_node() -> None:
    workers = [f"10.0.{i // 250}.{i % 250}" for i in range(1000)]
    got = home_origins(workers, [A, B, C])
    assert got == home_origins(list(reversed(workers)), [A, B, C])   # (order of the lists: no matter)
    counts = [list(got.values()).count(o) for o in (A, B, C)]
    assert max(counts) <= 334 and min(counts) >= 332, counts
    # an origin that goes moves its own workers (and a few displaced by the bound), not the others'
    without_c = home_origins(workers, [A, B])
    moved = sum(got[w] != without_c[w] for w in workers if got[w] != C)
    assert moved < 0.1 * len(workers), moved
    assert sorted(home_origins(workers[:4], [A, B]).values()) == [A, A, B, B]


def test_a_worker_lets_in_its_home_origin_and_moves_when_it_dies() -> None:
    share = OriginShare([A, B])
    me, others = "10.0.0.1", ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert share.blocked(me, None, {A, B}, 0.0) == frozenset()   # (no list yet: no origin sends)
    home = home_origins([me, *others], [A, B])[me]
    other = B if home == A else A
    assert share.blocked(me, others, {A, B}, 1.0) == {other} and share.home == home
    # its home killed: not connected; still its home until DEAD_AFTER_S have passed, then the other
    assert share.blocked(me, others, set(), 1.5) == {other}
    assert share.blocked(me, others, set(), 1.5 + DEAD_AFTER_S) == {home} and share.home == other
    assert share.moves == 1
    # a new home has DIAL_GRACE_S to connect (libtorrent redials a dropped peer after 2 s): not dead yet
    assert share.blocked(me, others, set(), 1.5 + DEAD_AFTER_S + DIAL_GRACE_S - 0.1) == {home}
    # the filtered-out origin counts as live (it cannot be seen): when the new home dies too, back to it
    assert share.blocked(me, others, {other}, 10.0) == {home}
    assert share.blocked(me, others, set(), 10.0 + DEAD_AFTER_S + 0.1) == {other} and share.home == home


def test_the_plans_rule_comes_first() -> None:
    share = OriginShare([A, B])
    me = "10.0.0.1"
    both = frozenset({A, B})
    assert origins_to_block(share, both, me, [me], both, own_done=True, starving=False, now=5.0) == both
    assert origins_to_block(share, both, me, [me], both, own_done=False, starving=True, now=5.1) == frozenset()
    assert len(origins_to_block(share, both, me, [me], both, own_done=False, starving=False, now=5.2)) == 1
    # one origin: nothing to share, the plan's rule alone
    assert origins_to_block(None, {A}, me, [me], {A}, own_done=False, starving=False, now=1.0) == frozenset()
    single = OriginShare([A])
    assert origins_to_block(single, {A}, me, [me], {A}, own_done=False, starving=False, now=9.0) == frozenset()
