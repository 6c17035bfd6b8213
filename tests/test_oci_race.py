"""Two publishers of one version racing on a registry that has no conditional manifest PUT
(distribution 2.8, tests/test_oci.py's fixture): the last tag PUT wins, and the publisher whose
manifest is not under the tag when it reads it back (at once, and again ``SETTLE_S`` later) is
told so (VersionConflict), never that it published."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest

from tiering import build_manifest
from tiering.errors import VersionConflict
from tiering.sample import make_checkpoint
from tiering.sources.oci import publish as publishing

from .test_oci import OCI_MANIFEST, Registry, _cold, auth_file, registry  # noqa: F401

MiB = 1 << 20


def _labelled(src: Path, name: str, version: str):
    return build_manifest(src).with_labels(name=name, version=version, published_at="2026-12-05T00:00:00Z")


def test_a_tag_put_over_ours_after_we_read_it_back_is_a_conflict_not_a_publish(
        registry: Registry, auth_file: Path, tmp_path: Path) -> None:
    """B's last check came before A's PUT, and B's PUT lands after A's first read-back: A's second read
    (SETTLE_S after its PUT) sees B's manifest, so A is not told it published."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    a = make_checkpoint(tmp_path / "a", total_bytes=1 * MiB, shards=1, layers=2, seed="race-a")
    b = make_checkpoint(tmp_path / "b", total_bytes=1 * MiB, shards=1, layers=2, seed="race-b")
    ma, mb = _labelled(a, "acme/race", "v1"), _labelled(b, "acme/race", "v1")
    # B's artifact made ready beside it (another repository, its blobs mounted into A's): its PUT is one request
    other = _cold(registry, prefix + "b", auth_file)
    assert other.publish(b, mb, [(f.path, b / f.path) for f in mb.files])
    doc, raw_b = registry.manifest(f"{prefix}b/acme/race", "v1")
    repo = f"{prefix}/acme/race"
    for d in [doc["config"]] + doc["layers"]:
        st, _, _ = registry.call("POST", f"/v2/{repo}/blobs/uploads/?mount={d['digest']}&from={prefix}b/acme/race",
                                 b"")
        assert st in (201, 202)
    c = _cold(registry, prefix, auth_file)
    outcome: dict[str, object] = {}

    def publish_a() -> None:
        try:
            outcome["a"] = c.publish(a, ma, [(f.path, a / f.path) for f in ma.files])
        except VersionConflict as exc:
            outcome["a"] = exc
    t = threading.Thread(target=publish_a)
    t.start()
    deadline = time.monotonic() + 30
    while registry.call("GET", f"/v2/{repo}/manifests/v1", headers={"Accept": OCI_MANIFEST})[0] != 200:
        assert time.monotonic() < deadline and t.is_alive()
        time.sleep(0.005)
    time.sleep(publishing.SETTLE_S / 5)   # (after A's first read-back, well before its second)
    registry.put_manifest(repo, "v1", raw_b)
    t.join(30)
    assert isinstance(outcome["a"], VersionConflict), outcome
    assert "another publisher pushed the tag at the same time" in str(outcome["a"])
    assert registry.manifest(repo, "v1")[1] == raw_b


@pytest.mark.parametrize("round_", range(3))
def test_two_publishers_racing_on_one_version_one_wins_the_other_is_told(
        registry: Registry, auth_file: Path, tmp_path: Path, round_: int) -> None:
    """Both pass every check (a barrier just before the last one), both PUT the tag: exactly one
    publish succeeds, and it is the content under the tag."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    srcs = [make_checkpoint(tmp_path / k, total_bytes=1 * MiB, shards=1, layers=2, seed=f"{k}{round_}")
            for k in ("a", "b")]
    ms = [_labelled(s, "acme/duel", "v1") for s in srcs]
    clients = [_cold(registry, prefix, auth_file) for _ in srcs]
    barrier = threading.Barrier(2, timeout=30)
    results: list[object] = [None, None]

    def run(i: int) -> None:
        try:
            results[i] = clients[i].publish(srcs[i], ms[i], [(f.path, srcs[i] / f.path) for f in ms[i].files],
                                            before_manifest=barrier.wait)
        except VersionConflict as exc:
            results[i] = exc
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    won = [i for i in range(2) if results[i] is True]
    assert len(won) == 1 and isinstance(results[1 - won[0]], VersionConflict), results
    got = clients[0].read_manifest("acme/duel", "v1")
    assert got is not None and got.digest == ms[won[0]].digest
    assert json.loads(registry.manifest(f"{prefix}/acme/duel", "v1")[1])["annotations"][
        "io.weightd.manifest.digest"] == ms[won[0]].digest
