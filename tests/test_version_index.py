"""The index of a tier's versions (tiering/version_index.py) against the tier itself: every change, by
this process, by another weightd process or by hand, shows in the very next listing (no sleep, no
racy window), so space accounting never misses a version that came (and overfills the tier) and the
donor search never lends from one that went. The truth each listing is checked against is a scan that
shares nothing with the index: every NAME/VERSION and org/model/VERSION directory read by name."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiering import version_index
from tiering.sample import edited_copy, make_checkpoint
from tiering.versions import list_versions, read_version


def _truth(root: Path) -> list[tuple[str, int]]:
    """(ref, bytes) of every complete version under ``root``, each read by name."""
    out = []
    for a in sorted(os.listdir(root)) if root.is_dir() else []:
        if a.startswith(".") or not (root / a).is_dir() or (root / a).is_symlink():
            continue
        for b in sorted(os.listdir(root / a)):
            v = _read(root, a, b)
            if v is not None:
                out.append(v)
            elif (root / a / b).is_dir() and not (root / a / b).is_symlink() and not b.startswith("."):
                out += [v for c in sorted(os.listdir(root / a / b)) if (v := _read(root, f"{a}/{b}", c))]
    return sorted(out)


def _read(root: Path, name: str, label: str) -> tuple[str, int] | None:
    try:
        v = read_version(root, name, label)
    except Exception:   # (a name outside the patterns: not a version)
        return None
    return (v.ref, v.size) if v is not None else None


def _listed(root: Path) -> list[tuple[str, int]]:
    return sorted((v.ref, v.size) for v in list_versions(root))


def _publish(node_env, tmp_path, name, versions, size=256 << 10):
    with node_env.node() as n:
        for v in versions:
            src = make_checkpoint(tmp_path / f"src-{name.replace('/', '-')}-{v}", total_bytes=size, shards=1,
                                  layers=1, seed=f"{name}{v}")
            n.publish(src, name, v)


def test_versions_placed_and_evicted_by_another_process_show_at_once(node_env, tmp_path, wd):
    """This process keeps its index warm while `weightd --no-daemon` processes place and evict
    versions in the same tier: each listing right after (no sleep) is the tier as it is."""
    _publish(node_env, tmp_path, "org/m", ["v1", "v2", "v3", "v4"])
    with node_env.node() as n:
        n.preload("org/m", "v1", tier="hot", lease_s=0)
        assert _listed(node_env.hot) == _truth(node_env.hot)
        for v in ["v2", "v3", "v4"]:
            wd("--no-daemon", "preload", f"org/m@{v}", "--tier", "hot", "--lease", "0")
            assert _listed(node_env.hot) == _truth(node_env.hot)
            assert n.tier_used("hot") == sum(b for _, b in _truth(node_env.hot))
        for v in ["v1", "v3"]:
            wd("--no-daemon", "evict", f"org/m@{v}", "--tier", "hot", "--force")
            assert _listed(node_env.hot) == _truth(node_env.hot)
            assert n.tier_used("hot") == sum(b for _, b in _truth(node_env.hot))
        assert [r for r, _ in _listed(node_env.hot)] == ["org/m@v2", "org/m@v4"]


def test_a_tier_another_process_filled_is_never_overfilled(node_env, tmp_path, wd):
    """Room is made for a preload by what is in the tier now: versions another process placed after
    this one last listed the tier count (an index that missed them would place a fourth version in a
    tier with room for three)."""
    size = 1 << 20
    node_env.write_config(hot_capacity=f"{3 * size + (size >> 1)}", warm_capacity="64MiB")
    for name in ["a/x", "b/x", "c/x", "d/x"]:
        _publish(node_env, tmp_path, name, ["v1"], size=size)
    total = _truth(node_env.cold)[0][1]
    with node_env.node() as n:
        n.preload("a/x", "v1", tier="hot", lease_s=0)
        assert _listed(node_env.hot) == _truth(node_env.hot)
        for name in ["b/x", "c/x"]:
            wd("--no-daemon", "preload", f"{name}@v1", "--tier", "hot", "--lease", "0")
        r = n.preload("d/x", "v1", tier="hot", lease_s=0)
        assert r.evicted, "room was not made"
        on_disk = _truth(node_env.hot)
        assert sum(b for _, b in on_disk) <= n.roots.tiers["hot"].capacity() and ("d/x@v1", total) in on_disk


def test_a_donor_another_process_evicted_is_not_lent_from(node_env, tmp_path, wd):
    """v2 shares most of its bytes with v1; v1 is evicted by another process after this one listed it:
    the preload of v2 copies it from cold, whole and checked, and lends nothing from v1."""
    src = make_checkpoint(tmp_path / "v1", total_bytes=1 << 20, shards=1, layers=2, seed="d")
    edited_copy(src, tmp_path / "v2", larger_than=1 << 10, every=4, count=1)
    with node_env.node() as n:
        n.publish(src, "org/m", "v1")
        n.publish(tmp_path / "v2", "org/m", "v2")
        n.preload("org/m", "v1", tier="hot", lease_s=0)
        r = n.preload("org/m", "v2", tier="warm", lease_s=0)   # (v1 there: a delta, as a control)
        assert r.delta is not None and r.delta["donors"] == ["org/m@v1"]
        n.evict("org/m", "v2", "warm", force=True)
        assert [r for r, _ in _listed(node_env.hot)] == ["org/m@v1"]
        wd("--no-daemon", "evict", "org/m@v1", "--tier", "hot", "--force")
        r = n.preload("org/m", "v2", tier="warm", lease_s=0)
        assert r.delta is None and r.bytes_by_source["cold"] == r.bytes and r.bytes_by_source["local_reuse"] == 0
        assert _listed(node_env.hot) == _truth(node_env.hot) == []


def test_changes_by_hand_show_at_once(node_env, tmp_path):
    """An operator's cp -r into the tier (the manifest last, as cp may copy it), rm -rf of a version
    and of a whole org/ directory, a NAME directory renamed and one made again in its place."""
    _publish(node_env, tmp_path, "org/m", ["v1", "v2"])
    _publish(node_env, tmp_path, "solo", ["v1"])
    hot = node_env.hot
    with node_env.node() as n:
        n.preload("org/m", "v1", tier="hot", lease_s=0)
    assert _listed(hot) == _truth(hot)
    meta = Path(".weightd/manifest.json")
    dst = hot / "org/m/v2"
    shutil.copytree(node_env.cold / "org/m/v2", dst, ignore=lambda d, names: ["manifest.json"]
                    if d.endswith(".weightd") else [])
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 1    # (no manifest yet: not a version)
    shutil.copy2(node_env.cold / "org/m/v2" / meta, dst / meta)
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 2
    (hot / "solo/v1").mkdir(parents=True)
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 2   # (solo/v1 is empty: an org/ directory?)
    shutil.copytree(node_env.cold / "solo/v1", hot / "solo/v1", dirs_exist_ok=True,
                    ignore=lambda d, names: ["manifest.json"] if d.endswith(".weightd") else [])
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 2
    shutil.copy2(node_env.cold / "solo/v1" / meta, hot / "solo/v1" / meta)
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 3
    os.rename(hot / "solo", hot / "other")      # (now other/v1: a manifest of solo, not ours)
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 2
    os.rename(hot / "other", hot / "solo")
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 3
    shutil.rmtree(hot / "org/m/v1")
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 2
    shutil.rmtree(hot / "org")
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 1
    shutil.copytree(node_env.cold / "org", hot / "org")
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 3


def test_a_queue_that_overflowed_is_read_again(node_env, tmp_path):
    """More changes than the kernel queues between two listings: the index is built again."""
    _publish(node_env, tmp_path, "org/m", ["v1", "v2"])
    hot = node_env.hot
    with node_env.node() as n:
        n.preload("org/m", "v1", tier="hot", lease_s=0)
    assert _listed(hot) == _truth(hot)
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    for i in range(limit + 10):
        (hot / "org/m" / f"junk{i}").touch()
    shutil.copytree(node_env.cold / "org/m/v2", hot / "org/m/v2")
    assert _listed(hot) == _truth(hot) and len(_truth(hot)) == 2


_SAMPLES: dict[str, Path] = {}


def _sample_versions(base: Path) -> dict[str, Path]:
    """Three published versions to copy in by hand (made once for the Hypothesis examples)."""
    if not _SAMPLES:
        from tiering import LocalNode, TierSpec
        with LocalNode(hot=TierSpec("hot", base / "h", 1 << 30), warm=TierSpec("warm", base / "w", 1 << 30),
                       cold=base / "cold", state_dir=base / "st") as n:
            for name in ["org/a", "org/b", "solo"]:
                for v in ["v1", "v2"]:
                    src = make_checkpoint(base / f"s-{name.replace('/', '-')}-{v}", total_bytes=4096, shards=1,
                                          layers=1, seed=f"{name}{v}")
                    n.publish(src, name, v)
                    _SAMPLES[f"{name}@{v}"] = base / "cold" / name / v
    return _SAMPLES


OPS = st.lists(st.tuples(st.sampled_from(["place", "remove", "rename_name", "remove_top", "junk"]),
                         st.sampled_from(["org/a@v1", "org/a@v2", "org/b@v1", "org/b@v2", "solo@v1", "solo@v2"])),
               min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_any_sequence_of_changes_is_listed_as_it_is(tmp_path_factory, ops):
    """Random places, removals, renames and junk, on tmpfs, each followed at once by a listing."""
    samples = _sample_versions(tmp_path_factory.getbasetemp() / "index-samples")
    root = Path(tempfile.mkdtemp(prefix="weightd-index-", dir="/dev/shm"))
    try:
        assert _listed(root) == _truth(root)
        for op, ref in ops:
            name, v = ref.split("@")
            top = name.split("/")[0]
            if op == "place" and not (root / name / v).exists():
                (root / name).mkdir(parents=True, exist_ok=True)
                tmp = root / f".tmp-{v}"
                shutil.copytree(samples[ref], tmp)
                os.rename(tmp, root / name / v)   # (as weightd places: a rename out of a dot directory)
            elif op == "remove":
                shutil.rmtree(root / name / v, ignore_errors=True)
            elif op == "rename_name" and (root / name).exists():
                os.rename(root / name, root / f".gone-{os.getpid()}")
                os.rename(root / f".gone-{os.getpid()}", root / name)   # (the same directory back)
            elif op == "remove_top":
                shutil.rmtree(root / top, ignore_errors=True)
            elif op == "junk" and (root / name).is_dir():
                (root / name / "junk").mkdir(exist_ok=True)
            assert _listed(root) == _truth(root), (op, ref)
        assert version_index.indexed_roots() >= 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


_MANIFESTS: list = []


def _related_manifests(base: Path) -> list:
    """Five versions that share parts in several ways: v1, two edits of it, an edit of an edit, and an
    unrelated one (made once for the Hypothesis examples)."""
    if not _MANIFESTS:
        from tiering.content.build import build_manifest
        v1 = make_checkpoint(base / "v1", total_bytes=256 << 10, shards=2, layers=4, seed="p")
        edited_copy(v1, base / "v2", larger_than=1 << 10, every=3, count=2, seed="a")
        edited_copy(v1, base / "v3", larger_than=1 << 10, every=2, count=3, seed="b")
        edited_copy(base / "v2", base / "v4", larger_than=1 << 10, every=5, count=2, seed="c")
        make_checkpoint(base / "v5", total_bytes=128 << 10, shards=1, layers=2, seed="q")
        _MANIFESTS.extend(build_manifest(base / v) for v in ["v1", "v2", "v3", "v4", "v5"])
    return _MANIFESTS


def _spans(plan) -> list:
    return [(f.entry.path, s.begin, s.end, None if s.donor is None else plan.donors[s.donor].ref, s.donor_path,
             s.donor_offset) for f in plan.files for s in f.spans]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 4), st.lists(st.tuples(st.sampled_from(["hot", "warm"]),
                                                                       st.integers(0, 4)), unique=True)),
                      min_size=1, max_size=6))
def test_the_donors_from_the_part_index_plan_as_every_version_would(tmp_path_factory, steps):
    """For a target and the local versions in any order (versions coming and going between searches),
    the plan over the versions the part index picks is the plan over all of them, span for span."""
    from tiering.delta import Donor, plan_delta
    from tiering.layout import VersionDir
    from tiering.store.donors import PartHolders
    ms = _related_manifests(tmp_path_factory.getbasetemp() / "donor-manifests")
    holders = PartHolders()
    for target, local in steps:
        cands = [(t, VersionDir(f"org/m{i}", "v1", Path(f"/x/{t}/{i}"), ms[i])) for t, i in local if i != target]
        donors = lambda sub: [Donor(f"{t}:{v.name}", v.path, v.manifest) for t, v in sub]  # noqa: E731
        picked = [cands[i] for i in holders.first_holders(ms[target], cands)]
        assert _spans(plan_delta(ms[target], donors(picked))) == _spans(plan_delta(ms[target], donors(cands)))


def test_a_model_directory_made_again_where_one_was_is_watched_again(node_env, tmp_path):
    """Eviction removes an emptied org/model directory; the next commit makes it again, and ext4 (tmp_path
    here, unlike tmpfs) gives the new one the old inode number: it must not pass for the old one, still
    watched, or every version placed in it afterwards is missed (a tier that overfills)."""
    _publish(node_env, tmp_path, "org/m", ["v1", "v2"])
    root = tmp_path / "tier"
    shutil.copytree(node_env.cold, root, symlinks=True)
    assert _listed(root) == _truth(root) and len(_listed(root)) == 2      # (the index warm, org/m watched)
    keep = tmp_path / "keep"
    keep.mkdir()
    for v in ("v1", "v2"):
        os.rename(root / "org/m" / v, keep / v)
    ino = os.stat(root / "org/m").st_ino
    for _ in range(20):       # (until the file system hands the number out again)
        os.rmdir(root / "org/m")
        os.mkdir(root / "org/m")
        if os.stat(root / "org/m").st_ino == ino:
            break
    else:
        import pytest
        pytest.skip("this file system did not reuse the directory's inode number")
    os.rename(keep / "v1", root / "org/m/v1")
    assert _listed(root) == _truth(root) and len(_listed(root)) == 1
    os.rename(keep / "v2", root / "org/m/v2")
    assert _listed(root) == _truth(root) and len(_listed(root)) == 2


def test_a_manifest_still_being_written_is_looked_at_again(node_env, tmp_path):
    """A version copied in by hand: its manifest exists, empty or half-written, at one listing and whole
    at the next, which must find it (a damaged manifest is absent, never settled as not ours)."""
    _publish(node_env, tmp_path, "org/m", ["v1"])
    root = tmp_path / "tier"
    root.mkdir()
    assert _listed(root) == []
    (root / "org/m").mkdir(parents=True)
    shutil.copytree(node_env.cold / "org/m/v1", root / "org/m/v1", ignore=shutil.ignore_patterns("manifest.json"))
    manifest = root / "org/m/v1/.weightd/manifest.json"
    whole = (node_env.cold / "org/m/v1/.weightd/manifest.json").read_bytes()
    manifest.write_bytes(b"")
    assert _listed(root) == []
    manifest.write_bytes(whole[: len(whole) // 2])
    assert _listed(root) == []
    manifest.write_bytes(whole)
    assert _listed(root) == _truth(root) and len(_listed(root)) == 1
