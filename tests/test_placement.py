"""Eviction planning, property-tested: never protected, LRU order, fits or evicts nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.placement import Candidate, plan_eviction

candidate = st.builds(Candidate, name=st.sampled_from(["a", "b", "org/c"]), version=st.text("v0123456789", min_size=1, max_size=3),
                      bytes=st.integers(0, 1000), last_access=st.floats(0, 1e6), pinned=st.booleans(),
                      leased=st.booleans(), in_use=st.booleans())


@settings(max_examples=500, deadline=None)
@given(st.lists(candidate, max_size=12, unique_by=lambda c: c.ref), st.integers(0, 3000), st.integers(1, 5000),
       st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_plan_properties(cands, need, capacity, high, low_frac) -> None:
    low = high * low_frac
    used = sum(c.bytes for c in cands)
    plan = plan_eviction(capacity=capacity, used=used, need=need, high=high, low=low, candidates=cands)
    assert all(c.protected_by is None for c in plan.evict)
    assert plan.used_after == used - plan.freed
    if plan.fits:
        assert plan.used_after + need <= capacity or (not plan.evict and used + need <= capacity * high)
    else:
        assert plan.evict == []
        free_max = used - sum(c.bytes for c in cands if c.protected_by is None)
        assert free_max + need > capacity
    # LRU: the evicted set is a prefix of the evictable candidates by last access
    evictable = sorted((c for c in cands if c.protected_by is None), key=lambda c: (c.last_access, c.ref))
    assert plan.evict == evictable[:len(plan.evict)]
    # no over-eviction: without the last victim we would still be above the low watermark
    if plan.evict:
        assert plan.used_after + plan.evict[-1].bytes + need > capacity * low


def test_no_eviction_below_high_watermark() -> None:
    c = [Candidate("a", "1", 100, 0.0)]
    assert plan_eviction(capacity=1000, used=100, need=100, high=0.9, low=0.5, candidates=c).evict == []


def test_evicts_oldest_down_to_low_watermark() -> None:
    c = [Candidate("a", "new", 300, 3.0), Candidate("a", "old", 300, 1.0), Candidate("a", "mid", 300, 2.0)]
    plan = plan_eviction(capacity=1000, used=900, need=200, high=0.9, low=0.5, candidates=c)
    assert [x.version for x in plan.evict] == ["old", "mid"] and plan.fits
