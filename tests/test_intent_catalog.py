"""The intent catalog's partial-copy labels (weightd/daemon/intent_catalog.py): a version whose label
cannot be made now (its manifest unreadable, not there yet) is asked again after LABEL_RETRY_S, not
every round (a 90,000-tensor manifest costs a second of cold reads and parsing each time)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tiering import selection_from
from tiering.sample import make_checkpoint
from weightd.daemon.intent_catalog import LABEL_RETRY_S, IntentCatalog


class _Counting:
    """A real node whose ``resolve`` is counted (and fails while ``broken``)."""

    def __init__(self, node) -> None:
        self.node, self.calls, self.broken = node, 0, True

    def resolve(self, name: str, version: str | None):
        self.calls += 1
        if self.broken:
            raise OSError("cold storage: Input/output error")
        return self.node.resolve(name, version)

    def object_of(self, *a, **kw):
        return self.node.object_of(*a, **kw)


def test_a_label_that_cannot_be_made_is_asked_again_only_after_a_while(node_env, tmp_path: Path) -> None:
    node = node_env.node()
    try:
        node.publish(make_checkpoint(tmp_path / "ck", total_bytes=1 << 20, shards=2, layers=2), "org/m", "v1")
        counting = _Counting(node)
        cat = IntentCatalog(SimpleNamespace(node=counting))
        clock = [1000.0]
        cat.monotonic = lambda: clock[0]
        entry = SimpleNamespace(name="org/m", version="v1", versions=0, selection=selection_from(include=["*.json"]))
        for _ in range(5):   # five rounds within the retry time: one read
            cat.find_labels([entry], {"org/m": ["v1"]})
            clock[0] += 1.0
        assert counting.calls == 1 and cat.labels == {}
        counting.broken = False
        clock[0] += LABEL_RETRY_S
        cat.find_labels([entry], {"org/m": ["v1"]})
        assert counting.calls == 2 and list(cat.labels.values())[0].startswith("v1~p")
        cat.find_labels([entry], {"org/m": ["v1"]})   # (made: kept, not asked again)
        assert counting.calls == 2
    finally:
        node.close()
