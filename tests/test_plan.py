"""The piece plan: disjoint slices of the origin's pieces, never a stranded piece."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.plan import ANY, HELD, OWN, PiecePlan

ips = st.lists(st.integers(1, 250).map(lambda i: f"127.0.0.{i}"), min_size=1, max_size=40, unique=True)


@settings(max_examples=200, deadline=None)
@given(workers=ips, n=st.integers(1, 5000))
def test_slices_partition_the_pieces(workers: list[str], n: int) -> None:
    """Every worker computing its slice from the same view: each piece belongs to exactly one."""
    plan = PiecePlan(n)
    owned = [p for ip in workers for p in plan.slice_of(ip, [w for w in workers if w != ip])]
    assert sorted(owned) == list(range(n))


@settings(max_examples=200, deadline=None)
@given(workers=ips, n=st.integers(1, 400), data=st.data())
def test_priorities(workers: list[str], n: int, data: st.DataObject) -> None:
    me, others = workers[0], workers[1:]
    have = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    peers = {ip: data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) for ip in others}
    plan = PiecePlan(n)
    prio = plan.priorities(have, me, peers, 0, 0.0, True)
    own = plan.slice_of(me, others) if others else range(n)
    for p in range(n):
        held = any(bf[p] for bf in peers.values())
        if have[p]:
            assert prio[p] == ANY
        elif p in own:
            assert prio[p] == OWN          # the own slice comes first, from the origin
        elif held:
            assert prio[p] == HELD         # a piece another worker holds is always wanted
        else:
            assert prio[p] == 0            # another worker's slice, only at the origin: not yet


def test_alone_with_the_origin_wants_everything() -> None:
    assert PiecePlan(5).priorities([True, False, False, False, False], "127.0.0.5", {}, 0, 0.0, True) \
        == [ANY, OWN, OWN, OWN, OWN]


def test_a_seed_among_the_peers_makes_every_piece_held() -> None:
    prio = PiecePlan(4).priorities([False] * 4, "127.0.0.5", {"127.0.0.6": [False] * 4}, 1, 0.0, True)
    assert prio == [OWN, OWN, HELD, HELD]


def test_idle_waiting_on_a_slice_owner_opens_everything_after_the_grace() -> None:
    """The owner of the second half is gone silent: after grace_s without progress, take it all."""
    plan = PiecePlan(4, grace_s=2.0)
    have, peers = [True, True, False, False], {"127.0.0.9": [False] * 4}
    assert plan.priorities(have, "127.0.0.5", peers, 0, 0.0, False) == [ANY, ANY, 0, 0]
    assert plan.priorities(have, "127.0.0.5", peers, 0, 1.0, False) == [ANY, ANY, 0, 0]
    assert plan.priorities(have, "127.0.0.5", peers, 0, 2.5, False) == [ANY] * 4
    assert plan.open_all
    # and stays open: a plan can only delay a piece, never strand it
    assert plan.priorities(have, "127.0.0.5", peers, 0, 3.0, True) == [ANY] * 4


def test_progress_resets_the_grace() -> None:
    plan = PiecePlan(4, grace_s=2.0)
    have, peers = [True, True, False, False], {"127.0.0.9": [False] * 4}
    plan.priorities(have, "127.0.0.5", peers, 0, 0.0, False)
    plan.priorities(have, "127.0.0.5", peers, 0, 1.5, True)   # bytes arrived: not idle
    assert plan.priorities(have, "127.0.0.5", peers, 0, 2.5, False) == [ANY, ANY, 0, 0]
    assert not plan.open_all
