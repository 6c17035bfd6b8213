"""Delta updates: plans from manifests, builds from donors, never a rotten or vanished donor byte."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiering import build_manifest, verify_checkpoint
from tiering.delta import Donor, build_verified, plan_delta, prefill
from tiering.sample import SampleTensor, edited_copy, fill_bytes, make_checkpoint, write_safetensors

MiB = 1 << 20


# -- a random checkpoint model: files of tensors (name -> (shape, content key)) plus plain files ----------
def write_model(root: Path, model: dict[str, object]) -> None:
    root.mkdir(parents=True)
    for path, spec in model.items():
        if isinstance(spec, bytes):
            (root / path).write_bytes(spec)
            continue
        tensors = [SampleTensor(name, "U8", (n,)) for name, (n, _) in spec.items()]
        keys = {name: key for name, (_, key) in spec.items()}
        write_safetensors(root / path, tensors, lambda t: fill_bytes(keys[t.name], t.nbytes))


@st.composite
def models(draw) -> dict[str, object]:
    n_files = draw(st.integers(1, 3))
    model: dict[str, object] = {}
    for i in range(n_files):
        k = draw(st.integers(1, 6))
        model[f"model-{i}.safetensors"] = {f"t{i}.{j}": (draw(st.integers(1, 40_000)), f"k{i}.{j}") for j in range(k)}
    if draw(st.booleans()):
        model["tokenizer.json"] = draw(st.binary(min_size=0, max_size=3000))
    return model


EDITS = ("change", "add", "remove", "resize", "reorder", "move_file", "add_file", "remove_file", "same")


@st.composite
def edited(draw, model: dict[str, object]) -> dict[str, object]:
    new = {p: (dict(s) if isinstance(s, dict) else s) for p, s in model.items()}
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(EDITS))
        shards = [p for p, s in new.items() if isinstance(s, dict) and s]
        if not shards:
            break
        path = draw(st.sampled_from(sorted(shards)))
        spec: dict = new[path]  # type: ignore[assignment]
        name = draw(st.sampled_from(sorted(spec)))
        if edit == "change":
            spec[name] = (spec[name][0], spec[name][1] + "'")
        elif edit == "add":
            spec[f"{name}+"] = (draw(st.integers(1, 40_000)), f"{name}+new")
        elif edit == "remove" and len(spec) > 1:
            del spec[name]
        elif edit == "resize":
            spec[name] = (spec[name][0] + draw(st.integers(1, 5000)), spec[name][1] + "r")
        elif edit == "reorder":
            items = list(spec.items())
            new[path] = dict(draw(st.permutations(items)))
        elif edit == "move_file":  # re-sharding / renaming
            new[path.replace(".safetensors", "-moved.safetensors")] = new.pop(path)
        elif edit == "add_file":
            new[f"extra-{len(new)}.safetensors"] = {"x.w": (draw(st.integers(1, 20_000)), "x-new")}
        elif edit == "remove_file" and len(shards) > 1:
            del new[path]
    return new


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_edits_rebuild_exactly_and_fetch_only_what_no_donor_holds(data: st.DataObject) -> None:
    a_model = data.draw(models())
    b_model = data.draw(edited(a_model))
    base = Path(tempfile.mkdtemp(prefix="weightd-test-delta-"))
    try:
        write_model(base / "a", a_model)
        write_model(base / "b", b_model)
        ma, mb = build_manifest(base / "a"), build_manifest(base / "b")
        plan = plan_delta(mb, [Donor("a", base / "a", ma)])
        out = base / "out"
        out.mkdir()
        r = build_verified(plan, out, base / "b", fsync=False)
        assert verify_checkpoint(out, mb).ok
        for f in mb.files:
            assert (out / f.path).read_bytes() == (base / "b" / f.path).read_bytes()
        # fetched = exactly the parts of B whose content A does not hold anywhere
        known = {(p.xxh3_128, p.end - p.begin) for f in ma.files for p in f.parts(ma.chunk_size)}
        new = sum(p.end - p.begin for f in mb.files for p in f.parts(mb.chunk_size)
                  if (p.xxh3_128, p.end - p.begin) not in known)
        assert r.fetched == new == plan.fetch_bytes and not r.donor_failures
        assert r.reused + r.fetched == mb.total_bytes
    finally:
        shutil.rmtree(base)


def two_versions(tmp_path: Path, changed: int = 3) -> tuple[Path, Path, list[str]]:
    a = make_checkpoint(tmp_path / "a", total_bytes=24 * MiB, shards=3, layers=4, seed="delta")
    b = tmp_path / "b"
    return a, b, [n for _, n, _ in edited_copy(a, b, larger_than=64 << 10, every=5, count=changed)]


def test_plan_reuses_tensors_that_moved_to_another_file_and_across_checkpoints(tmp_path: Path) -> None:
    a, b, _ = two_versions(tmp_path, changed=0)
    # C: a different checkpoint whose shards are A's tensors re-sharded into one file, in reverse order
    ma = build_manifest(a)
    c = tmp_path / "c"
    c.mkdir()
    tensors = [(f, t) for f, t in ma.tensors()][::-1]
    blobs = {}
    for f, t in tensors:
        with open(a / f.path, "rb") as fh:
            fh.seek(t.begin)
            blobs[t.name] = fh.read(t.end - t.begin)
    write_safetensors(c / "model.safetensors", [SampleTensor(t.name, t.dtype, tuple(t.shape)) for _, t in tensors],
                      lambda s: blobs[s.name])
    mc = build_manifest(c)
    plan = plan_delta(mc, [Donor("org/a@v1", a, ma)])
    header = mc.files[0].safetensors.header_size  # type: ignore[union-attr]
    assert plan.fetch_bytes == header  # only the new header: every tensor comes from A
    out = tmp_path / "out"
    out.mkdir()
    r = build_verified(plan, out, c)
    assert r.fetched == header and r.reused == mc.total_bytes - header and not r.donor_failures
    assert verify_checkpoint(out, mc).ok


def test_a_rotten_donor_never_leaks(tmp_path: Path) -> None:
    a, b, changed = two_versions(tmp_path)
    ma, mb = build_manifest(a), build_manifest(b)
    plan = plan_delta(mb, [Donor("org/a@v1", a, ma)])
    # bit rot in A after its manifest was made: flip one byte inside an unchanged tensor
    f, t = next((f, t) for f, t in ma.tensors() if t.name not in changed and t.nbytes > 4096)
    with open(a / f.path, "r+b") as fh:
        fh.seek(t.begin + 1000)
        byte = fh.read(1)
        fh.seek(t.begin + 1000)
        fh.write(bytes([byte[0] ^ 0x5A]))
    out = tmp_path / "out"
    out.mkdir()
    r = build_verified(plan, out, b)
    assert verify_checkpoint(out, mb).ok
    assert len(r.donor_failures) == 1 and "differs" in r.donor_failures[0] and f.path in r.donor_failures[0]
    assert r.fetched == plan.fetch_bytes + t.nbytes


def test_a_vanished_donor_falls_back_to_fetching(tmp_path: Path) -> None:
    a, b, _ = two_versions(tmp_path)
    ma, mb = build_manifest(a), build_manifest(b)
    plan = plan_delta(mb, [Donor("org/a@v1", a, ma)])
    victim = sorted(a.glob("*.safetensors"))[1]
    victim.unlink()  # evicted or deleted between the plan and the build
    out = tmp_path / "out"
    out.mkdir()
    r = build_verified(plan, out, b)
    assert verify_checkpoint(out, mb).ok
    assert any(victim.name in why for why in r.donor_failures)
    assert r.reused + r.fetched == mb.total_bytes


def test_prefill_puts_donor_bytes_at_their_new_offsets(tmp_path: Path) -> None:
    a, b, changed = two_versions(tmp_path, changed=1)
    ma, mb = build_manifest(a), build_manifest(b)
    plan = plan_delta(mb, [Donor("org/a@v1", a, ma)])
    out = tmp_path / "out"
    out.mkdir()
    r = prefill(plan, out)
    assert r.reused == plan.reuse_bytes and r.fetched == 0
    f, t = next((f, t) for f, t in mb.tensors() if t.name == changed[0])
    data = (out / f.path).read_bytes()
    assert len(data) == f.size and data[t.begin:t.end] == bytes(t.end - t.begin)  # left for P2P to fill
    whole = (b / f.path).read_bytes()
    assert data[:t.begin] == whole[:t.begin] and data[t.end:] == whole[t.end:]


def test_manifest_diff_plan_cli(wd, tmp_path: Path) -> None:
    a, b, changed = two_versions(tmp_path, changed=2)
    proc = wd("manifest", "diff", str(a), str(b), "--plan", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    mb = build_manifest(b)
    nbytes = sum(t.nbytes for _, t in mb.tensors() if t.name in changed)
    assert doc["fetch_bytes"] == nbytes and doc["reuse_bytes"] == mb.total_bytes - nbytes
    assert doc["fetch_regions"] == 2 and doc["p2p"]["bytes"] >= nbytes
    text = wd("manifest", "diff", str(a), str(b), "--plan")
    assert text.returncode == 0 and "fetch from cold" in text.stdout and "fetch over P2P" in text.stdout
    bad = wd("manifest", "diff", str(a), str(b), "--plan", "--piece-size", "lots")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--piece-size" in bad.stderr


def test_preload_of_a_new_version_reuses_the_old_one(wd, tmp_path: Path) -> None:
    """End to end: v1 on the node, v2 with three tensors changed: only those are read from cold."""
    a, b, changed = two_versions(tmp_path)
    assert wd("publish", str(a), "--name", "org/m", "--version", "v1").returncode == 0
    assert wd("publish", str(b), "--name", "org/m", "--version", "v2").returncode == 0
    assert wd("preload", "org/m@v1", "--tier", "warm").returncode == 0
    proc = wd("preload", "org/m@v2", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[0])
    mb = build_manifest(b)
    nbytes = sum(t.nbytes for _, t in mb.tensors() if t.name in changed)
    assert r["bytes_by_source"] == {"local_reuse": mb.total_bytes - nbytes, "peer": 0, "origin": 0, "cold": nbytes}
    assert r["delta"]["donors"] == ["org/m@v1"] and r["delta"]["refetched"] == []
    assert wd("verify", r["path"]).returncode == 0
    # the hot tier: donors on another tier (warm v1, warm v2) lend across file systems
    proc = wd("preload", "org/m@v2", "--tier", "hot", "--json")
    r = json.loads(proc.stdout.splitlines()[0])
    assert r["bytes_by_source"]["local_reuse"] == mb.total_bytes and r["delta"] is None  # same version: a copy


def test_preload_with_a_rotten_donor_fetches_its_ranges(wd, tmp_path: Path, node_env) -> None:
    a, b, changed = two_versions(tmp_path)
    assert wd("publish", str(a), "--name", "org/m", "--version", "v1").returncode == 0
    assert wd("publish", str(b), "--name", "org/m", "--version", "v2").returncode == 0
    p1 = json.loads(wd("preload", "org/m@v1", "--tier", "warm", "--json").stdout.splitlines()[0])["path"]
    ma = build_manifest(a)
    f, t = next((f, t) for f, t in ma.tensors() if t.name not in changed and t.nbytes > 4096)
    with open(Path(p1) / f.path, "r+b") as fh:  # bit rot in the donor copy
        fh.seek(t.begin + 7)
        fh.write(b"\xff\x00\xff")
    proc = wd("preload", "org/m@v2", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[0])
    assert len(r["delta"]["refetched"]) == 1 and f.path in r["delta"]["refetched"][0]
    assert wd("verify", r["path"]).returncode == 0
    assert wd("verify", p1).returncode == 5  # (the donor itself is left for verify/gc to report)
