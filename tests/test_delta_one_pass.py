"""A delta build reads every byte once and writes it once (issue 35), observed: the real CLI runs under
``strace -f -y`` and every read and write system call is summed per file. Each donor byte is read once
from the donor, each changed byte once from cold, the new version is written once and never read back
(its parts were hashed on the way in, a signature's SHA-256 too), and nothing is copied by the kernel
unseen. A donor that rotted after it was verified is caught in that pass and its part read from cold;
a cold source that changes during the build fails it with nothing placed."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from tiering import build_manifest, verify_checkpoint
from tiering.content.signature import generate_keypair
from tiering.delta import Donor, build_verified, plan_delta
from tiering.errors import ChecksumMismatch, IntegrityError
from tiering.sample import edited_copy, make_checkpoint

from .test_promote_one_pass import _require_signature, _under, traced

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace missing (scripts/install-tools.sh)")

MiB = 1 << 20


def versions(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """v1, and v2 with four tensors changed (spread over the shards) and a new 1 MiB file."""
    a = make_checkpoint(tmp_path / "a", total_bytes=96 * MiB, shards=3, layers=6, seed="delta-one-pass")
    b = tmp_path / "b"
    changed = [n for _, n, _ in edited_copy(a, b, larger_than=256 << 10, every=7, count=4, seed="v2")]
    (b / "extra.bin").write_bytes(hashlib.sha256(b"extra").digest() * (MiB // 32))
    return a, b, changed


@pytest.fixture
def published(wd, node_env, tmp_path: Path) -> dict:
    a, b, changed = versions(tmp_path)
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_keypair(keys / "k.pem", keys / "k.pub.pem")
    for d, v in ((a, "v1"), (b, "v2")):
        r = wd("publish", str(d), "--name", "org/m", "--version", v, "--sign", str(keys / "k.pem"))
        assert r.returncode == 0, r.stderr
    return {"a": a, "b": b, "changed": changed, "pub": keys / "k.pub.pem"}


def _expected(a: Path, b: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(bytes each v1 file lends, bytes each v2 file fetches), by file, from the plan."""
    plan = plan_delta(build_manifest(b), [Donor("v1", a, build_manifest(a))])
    lent: dict[str, int] = defaultdict(int)
    for fp in plan.files:
        for s in fp.spans:
            if s.donor is not None:
                lent[s.donor_path] += s.size
    return dict(lent), {fp.entry.path: fp.fetch_bytes for fp in plan.files}


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_delta_build_reads_each_donor_and_cold_byte_once_and_nothing_back(wd, node_env, isolated_env, published,
                                                                            tmp_path: Path, signed: bool) -> None:
    if signed:
        _require_signature(node_env, published["pub"])
    assert wd("preload", "org/m@v1", "--tier", "warm", "--lease", "0").returncode == 0
    lent, fetched = _expected(published["a"], published["b"])
    m2 = build_manifest(published["b"])
    r, io = traced(isolated_env, node_env.config, tmp_path / "delta.strace", "preload", "org/m@v2", "--tier", "warm",
                   "--lease", "0", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["delta"]["donors"] == ["org/m@v1"] and rep["delta"]["refetched"] == []
    assert rep["bytes_by_source"]["cold"] == sum(fetched.values()) and (rep["signature"] is not None) == signed
    v1, cold2 = node_env.warm / "org/m/v1", node_env.cold / "org/m/v2"
    for rel, n in lent.items():
        assert _under(io["read"], v1, rel) == n, rel            # each donor byte read once
    for f in m2.files:
        assert _under(io["read"], cold2, f.path) == fetched[f.path], f.path   # each changed byte once from cold
        assert _under(io["write"], node_env.warm, f.path) == f.size, f.path    # every byte written once
    # nothing read back from the new version, in staging or placed (warming faults pages in without
    # read(); its latency probe reads 4 KiB now and then), nothing copied by the kernel out of sight
    back = {p: n for p, n in io["read"].items()
            if p.startswith((str(node_env.warm / ".staging"), str(node_env.warm / "org/m/v2")))}
    assert sum(back.values()) < 256 << 10, back
    assert not io["kernel"], dict(io["kernel"])
    assert wd("verify", rep["path"]).returncode == 0


def test_a_donor_that_rotted_after_it_was_verified_is_fetched_in_the_same_pass(tmp_path: Path) -> None:
    """Bytes of v1 change in place after its manifest was made: that part is read from the source
    instead, the version is exact, the signature's digests are those of the right bytes, and progress
    counts every byte of the version once."""
    a, b, changed = versions(tmp_path)
    ma, mb = build_manifest(a), build_manifest(b)
    f, t = next((f, t) for f, t in ma.tensors() if t.name not in changed and t.nbytes > MiB)
    with open(a / f.path, "r+b") as fh:   # (past the first buffer: some of the part is written first)
        fh.seek(t.end - 5)
        fh.write(b"\x00\xff\x00")
    out = tmp_path / "out"
    out.mkdir()
    plan = plan_delta(mb, [Donor("org/m@v1", a, ma)])
    reported: list[int] = []
    r = build_verified(plan, out, b, crypto=hashlib.sha256, fsync=False, progress=reported.append)
    assert sum(reported) == mb.total_bytes   # (the rotted part's bytes counted once, not once more from cold)
    assert len(r.donor_failures) == 1 and f.path in r.donor_failures[0] and repr(t.name) in r.donor_failures[0]
    assert "differs" in r.donor_failures[0]
    assert r.fetched == plan.fetch_bytes + t.nbytes and r.reused + r.fetched == mb.total_bytes
    assert verify_checkpoint(out, mb).ok
    assert r.crypto_digests == {g.path: hashlib.sha256((b / g.path).read_bytes()).hexdigest() for g in mb.files}


def test_a_source_that_changes_during_the_build_fails_it(tmp_path: Path) -> None:
    a, b, _ = versions(tmp_path)
    ma, mb = build_manifest(a), build_manifest(b)
    plan = plan_delta(mb, [Donor("org/m@v1", a, ma)])
    # largest first, one file at a time: extra.bin (fetched whole) is built after the shards
    seen: list[int] = []

    def progress(n: int) -> None:
        if not seen:
            with open(b / "extra.bin", "r+b") as fh:
                fh.write(b"changed")
        seen.append(n)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ChecksumMismatch) as e:
        build_verified(plan, out, b, threads=1, progress=progress, fsync=False)
    assert "extra.bin" in str(e.value)


def test_a_cold_source_that_changes_during_a_delta_preload_places_nothing(wd, node_env, published) -> None:
    node = node_env.node()
    node.preload("org/m", "v1", tier="warm", lease_s=0)
    cold2 = node_env.cold / "org/m/v2"
    shard = max(cold2.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    seen: list[int] = []

    def progress(n: int) -> None:   # (after the first bytes: every other file is still to be built)
        if not seen:
            with open(cold2 / "extra.bin", "r+b") as fh:
                fh.seek(1000)
                fh.write(b"changed")
            with open(shard, "r+b") as fh:
                fh.truncate(shard.stat().st_size - 1)
        seen.append(n)
    with pytest.raises(IntegrityError) as e:
        node.preload("org/m", "v2", tier="warm", lease_s=0, progress=progress, strict=True)
    assert "extra.bin" in str(e.value) or shard.name in str(e.value), e.value
    assert seen and not (node_env.warm / "org/m/v2").exists()
    assert not [p for p in (node_env.warm / ".staging").iterdir() if p.is_dir()]
