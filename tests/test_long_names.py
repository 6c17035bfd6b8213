"""A name part or a version may take 255 bytes, and so may a file name: the locks, staging areas and
trash entries weightd names after NAME@VERSION would not fit (ENAMETOOLONG, exit 1 at publish). Past
180 bytes they keep their first bytes and a hash of the whole (tiering.layout.fitted)."""

from __future__ import annotations

import json
from pathlib import Path

from tiering import build_manifest, verify_checkpoint
from tiering.layout import SHORT_STEM, fitted, lock_name
from tiering.sample import make_checkpoint
from tiering.store.staging import staging_id

MiB = 1 << 20
LONGEST = "r" + "x" * 254          # 255 bytes: the longest version
NAME = "a" * 255 + "/" + "b" * 255  # the longest name


def test_names_derived_from_the_longest_name_and_version_fit_and_stay_distinct() -> None:
    made = {lock_name(NAME, LONGEST), lock_name(NAME, LONGEST[:-1]), staging_id(NAME, LONGEST),
            staging_id(NAME, LONGEST[:-1]), fitted(LONGEST, ".0123456789ab", "checking.")}
    assert len(made) == 5
    for n in made:
        assert len(n.encode()) <= SHORT_STEM + 30 and "/" not in n, n
    assert lock_name(NAME, LONGEST) == lock_name(NAME, LONGEST)   # (found again: a staging area resumes)
    assert lock_name("acme/m", "v1") == "acme--m@v1.lock" and staging_id("acme/m", "v1") == "acme--m@v1.resumable"
    # a shortened name holds a '#', which no name or version does: never another's plain name
    assert "#" in lock_name(NAME, LONGEST) and "#" not in lock_name("acme/m", "v" * 150)


def test_the_longest_version_publishes_preloads_verifies_and_evicts(wd, node_env, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=1 * MiB, shards=1, layers=1, seed="long")
    m = build_manifest(src)
    ref = f"acme/{'m' * 255}@{LONGEST}"
    r = wd("publish", src, "--name", ref.split("@")[0], "--version", LONGEST, "--json")
    assert r.returncode == 0, r.stderr
    for tier in ("warm", "hot"):
        r = wd("preload", ref, "--tier", tier, "--json")
        assert r.returncode == 0, r.stderr
        assert not verify_checkpoint(Path(json.loads(r.stdout)["path"]), m).problems
    assert wd("verify", ref).returncode == 0
    for tier in ("hot", "warm"):
        r = wd("evict", ref, "--tier", tier, "--force")
        assert r.returncode == 0, r.stderr
    r = wd("preload", ref, "--tier", "warm", "--json")   # (again, after its trash entry)
    assert r.returncode == 0, r.stderr


def test_a_long_versions_staging_area_is_found_by_its_lock_and_kept_while_it_is_held(tmp_path: Path) -> None:
    """Reconciliation finds a staging area's lock from the area's name: shortened or not, they share
    the stem, so a running copy's staging area is never taken for a dead one."""
    for version in ("v1", "r" * 180, "r" * 186, LONGEST):
        for name in ("acme/m", NAME):
            sid = staging_id(name, version)
            assert sid[:-len(".resumable")] + ".lock" == lock_name(name, version), (name, version)
    kept = fitted(LONGEST, ".kept-0123456789ab", ".")   # (what a removal that gave up leaves beside the version)
    assert kept.startswith(".") and len(kept) < 255


def test_an_unmarked_roots_shortened_staging_entries_are_still_weightds() -> None:
    """A tier root without its marker is judged by what it holds: a shortened staging name is weightd's."""
    from tiering.ownership import is_staging_name
    sid = staging_id(NAME, LONGEST)
    assert all(is_staging_name(n) for n in (sid, f"{sid}.json", staging_id("acme/m", "v1")))
    assert not is_staging_name("evil#" + "g" * 32 + ".resumable")
