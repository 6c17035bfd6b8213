"""The manifest parse cache (tiering/content/parse_cache.py): a large manifest's checked parse kept in
the state directory by the SHA-256 of its bytes, for the next process (issue 40: in-process ``path``
on a 90,000-tensor version)."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import pytest

from tiering.content import manifest_parse, parse_cache
from tiering.content.manifest import Manifest
from tiering.content.tensor_table import TensorTable
from tiering.errors import ManifestError
from tiering.sample_moe import make_moe_checkpoint

from .test_manifest_compact import synthetic_moe


@pytest.fixture
def cache(tmp_path: Path):
    (tmp_path / "state").mkdir(mode=0o700)
    parse_cache.use(tmp_path / "state" / "manifests")
    yield tmp_path / "state" / "manifests"
    parse_cache.use(None)


def fresh_parse(raw: bytes, monkeypatch: pytest.MonkeyPatch | None = None) -> Manifest:
    """``parse_manifest`` as a new process sees it: nothing shared in memory; with ``monkeypatch``, a JSON
    parse is an error (so the manifest can only come from the cache)."""
    gc.collect()
    assert manifest_parse._SHARED.get(hashlib.sha256(raw).digest()) is None
    if monkeypatch is not None:
        monkeypatch.setattr(manifest_parse, "manifest_from_dict", lambda *a: pytest.fail("parsed, not cached"))
    return manifest_parse.parse_manifest(raw, "m.json")


@pytest.fixture(scope="module")
def moe_raw() -> bytes:
    return synthetic_moe(layers=16, experts=128, shards=12).to_json().encode()


def test_a_large_manifest_read_again_comes_from_the_cache_equal_to_its_parse(cache, moe_raw, monkeypatch) -> None:
    assert len(moe_raw) >= parse_cache.MIN_BYTES
    first = fresh_parse(moe_raw)
    want = (first.digest, first.to_json(), first.tensor_count)
    del first
    assert [p.name for p in cache.iterdir()] == [hashlib.sha256(moe_raw).hexdigest()]
    again = fresh_parse(moe_raw, monkeypatch)
    assert (again.digest, again.to_json(), again.tensor_count) == want


def test_an_edited_manifest_is_checked_whatever_the_cache_holds(cache, moe_raw) -> None:
    """The entry vouches only for the exact bytes it was made from: a manifest edited after (its
    digest, or a tensor's offset) is read and refused as before."""
    m = fresh_parse(moe_raw)
    other_digest = moe_raw.replace(m.digest.encode(), b"0" * 32, 1)
    moved = moe_raw.replace(b'"begin": 4096', b'"begin": 4097', 1)
    del m
    gc.collect()
    for edited, why in ((other_digest, "does not match the content"), (moved, "must tile the file")):
        assert edited != moe_raw
        with pytest.raises(ManifestError, match=why):
            manifest_parse.parse_manifest(edited, "m.json")


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "old magic"])
def test_a_damaged_entry_is_dropped_and_the_manifest_parsed(cache, moe_raw, damage) -> None:
    want = fresh_parse(moe_raw).to_json()
    entry = cache / hashlib.sha256(moe_raw).hexdigest()
    blob = bytearray(entry.read_bytes())
    if damage == "flip":
        blob[len(blob) // 2] ^= 0x40
    elif damage == "truncate":
        del blob[len(blob) - 100:]
    elif damage == "empty":
        blob = bytearray()
    else:
        blob[:8] = b"WDMPC00\n"
    entry.write_bytes(bytes(blob))
    assert fresh_parse(moe_raw).to_json() == want
    assert entry.read_bytes() != bytes(blob)  # (dropped, then kept again from the parse)


@pytest.mark.parametrize("column", [2, 5, 7])  # dtypes, begins, digests: one tensor short
def test_columns_that_do_not_fit_are_refused_even_under_a_good_checksum(cache, moe_raw, monkeypatch, column) -> None:
    """An entry whose checksum holds but whose columns disagree (a writer's bug, not bit rot) is dropped."""
    real = TensorTable.columns
    width = {2: 1, 5: 8, 7: 16}[column]
    monkeypatch.setattr(TensorTable, "columns", lambda t: [c[:-width] if k == column else c
                                                           for k, c in enumerate(real(t))])
    fresh_parse(moe_raw)
    entry = cache / hashlib.sha256(moe_raw).hexdigest()
    assert entry.exists()
    assert parse_cache.load(hashlib.sha256(moe_raw).digest()) is None
    assert not entry.exists()


def test_small_manifests_are_not_kept(cache) -> None:
    raw = synthetic_moe(layers=1, experts=2, shards=1).to_json().encode()
    assert len(raw) < parse_cache.MIN_BYTES
    fresh_parse(raw)
    assert not cache.exists() or not list(cache.iterdir())


def test_a_cache_directory_open_to_others_is_not_used(tmp_path, moe_raw) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    d = tmp_path / "state" / "manifests"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o777)
    parse_cache.use(d)
    try:
        fresh_parse(moe_raw)
        assert list(d.iterdir()) == []
    finally:
        parse_cache.use(None)


def test_no_cache_directory_is_made_in_another_users_state_directory(tmp_path, moe_raw) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the state directory to another uid")
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chown(state, 65534, 65534)
    parse_cache.use(state / "manifests")
    try:
        fresh_parse(moe_raw)
        assert not (state / "manifests").exists()
    finally:
        parse_cache.use(None)


def test_only_the_most_recently_used_entries_are_kept(cache, monkeypatch) -> None:
    monkeypatch.setattr(parse_cache, "KEEP", 2)
    monkeypatch.setattr(parse_cache, "MIN_BYTES", 1)
    raws = [synthetic_moe(layers=1, experts=2, shards=1, name=f"o/m{i}").to_json().encode() for i in range(4)]
    for i, raw in enumerate(raws):
        fresh_parse(raw)
        os.utime(cache / hashlib.sha256(raw).hexdigest(), ns=(i * 10**9, i * 10**9))
    assert sorted(p.name for p in cache.iterdir()) == sorted(hashlib.sha256(r).hexdigest() for r in raws[2:])


def test_in_process_path_uses_the_cache_through_the_cli(wd, node_env, tmp_path) -> None:
    """Through the installed CLI: the first in-process command keeps the parse, the next reads it."""
    ck = make_moe_checkpoint(tmp_path / "ck", layers=16, experts=128, shards=12)
    assert wd("--no-daemon", "publish", str(ck), "--name", "ds/v3", "--version", "v1").returncode == 0
    assert wd("--no-daemon", "preload", "ds/v3@v1", "--tier", "warm").returncode == 0
    entries = list((node_env.state / "manifests").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".")
    before = entries[0].stat().st_mtime_ns
    out = wd("--no-daemon", "path", "ds/v3@v1")
    assert out.returncode == 0 and out.stdout.strip().endswith("ds/v3/v1")
    assert entries[0].stat().st_mtime_ns > before  # (read, so marked as recently used)
