"""Partial copies (file patterns, layers, ranks), companion artefacts and sets (issue #19, design §15).

Real files, real tiers (hot on /dev/shm), the real ``weightd`` CLI in subprocesses, in-process and
through a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_one_line_error, stop_process
from tiering import BadInput, InvalidName, make_checkpoint, make_ranked_checkpoint, selection_from
from tiering.content.build import build_manifest, verify_checkpoint
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.content.manifest_parse import load_manifest
from tiering.content.select import choose

# -- patterns: huggingface_hub's allow_patterns / ignore_patterns -------------------------------------

PATHS = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
         "original/consolidated.00.pth", "original/params.json", "onnx/model.onnx", "gguf/Model-Q4.gguf",
         "tokenizer.json", "sub/dir/deep.safetensors"]


def _m(tmp_path: Path, paths: list[str] = PATHS):
    from tiering.sample import SampleTensor, fill_bytes, write_safetensors
    root = tmp_path / "ck"
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        if p.endswith(".safetensors"):
            write_safetensors(root / p, [SampleTensor("w", "F16", (8, 8))], lambda t: fill_bytes(p, t.nbytes))
        else:
            (root / p).write_bytes(p.encode())
    return build_manifest(root)


def _hf_filter(items: list[str], allow: list[str] | None, ignore: list[str] | None) -> list[str]:
    """huggingface_hub.utils.filter_repo_objects (v0.2x), transcribed: the reference semantics."""
    from fnmatch import fnmatch

    def add_wildcard(p: str) -> str:
        return p + "*" if p[-1] == "/" else p
    allow = [add_wildcard(p) for p in allow] if allow else None
    ignore = [add_wildcard(p) for p in ignore] if ignore else None
    return [i for i in items if (allow is None or any(fnmatch(i, r) for r in allow))
            and not (ignore is not None and any(fnmatch(i, r) for r in ignore))]


@pytest.mark.parametrize("include,exclude", [
    (None, ["original/"]),
    (None, ["original/*", "*.onnx", "gguf/*"]),
    (["*.safetensors", "*.json"], None),
    (["*.safetensors"], ["sub/*"]),
    (["original/**"], None),
    (["*.json"], ["original/*"]),
    (["config.json"], None),
    (["*/deep.*"], None),
])
def test_patterns_mean_what_huggingface_hub_means(tmp_path, include, exclude):
    m = _m(tmp_path)
    want = _hf_filter(sorted(f.path for f in m.files), include, exclude)
    c = choose(m, selection_from(include, exclude))
    assert sorted(c.paths) == want
    assert c.whole == (len(want) == len(m.files))
    assert c.bytes == sum(f.size for f in m.files if f.path in want)


def test_patterns_are_case_sensitive_and_a_selection_of_nothing_is_refused(tmp_path):
    m = _m(tmp_path)
    assert choose(m, selection_from(["CONFIG.JSON", "tokenizer.json"], None)).paths == {"tokenizer.json"}
    with pytest.raises(BadInput, match="keeps none of its 9 files"):
        choose(m, selection_from(["*.bin"], None))


@pytest.mark.parametrize("bad", ["/etc/passwd", "", "x" * 600, "a\x00b"])
def test_bad_patterns_are_refused(bad):
    with pytest.raises(BadInput, match="include"):
        selection_from([bad], None)


def test_the_label_is_the_file_set(tmp_path):
    m = _m(tmp_path)
    a = choose(m, selection_from(None, ["original/", "onnx/", "gguf/", "sub/"]))
    b = choose(m, selection_from(["*.json", "model-*"], ["original/*"]))
    assert a.paths == b.paths and a.label("v1") == b.label("v1")
    assert a.label("v1").startswith("v1~p") and len(a.label("v1")) == len("v1~p") + 32


# -- layers and ranks ---------------------------------------------------------------------------------

@pytest.fixture
def staged(tmp_path):
    """A llama-like checkpoint: 8 layers over 4 shards (model.layers.N.* naming, an index json)."""
    return build_manifest(make_checkpoint(tmp_path / "llama", total_bytes=8 << 20, shards=4, layers=8))


def _tensors_in(m, paths):
    return {t.name for f, t in m.tensors() if f.path in paths}


def test_a_pipeline_stage_moves_only_the_shards_holding_its_layers(staged):
    m = staged
    first = choose(m, selection_from(layers="0-1"))
    last = choose(m, selection_from(layers="6-7"))
    mid = choose(m, selection_from(layers="3-4"))
    for c, lo, hi in ((first, 0, 1), (last, 6, 7), (mid, 3, 4)):
        names = _tensors_in(m, c.paths)
        for n in range(lo, hi + 1):  # every tensor of the stage's layers is held
            assert {t.name for _, t in m.tensors() if t.name.startswith(f"model.layers.{n}.")} <= names
        assert "config.json" in c.paths and "model.safetensors.index.json" in c.paths
        assert c.bytes < m.total_bytes
    assert "model.embed_tokens.weight" in _tensors_in(m, first.paths)
    assert {"lm_head.weight", "model.norm.weight"} <= _tensors_in(m, last.paths)
    assert "lm_head.weight" not in _tensors_in(m, mid.paths)
    # a shard that also holds other layers moves whole, and --json says why
    for c in (first, last, mid):
        shard_files = [p for p in c.paths if p.endswith(".safetensors")]
        for mixed in c.mixed:
            assert mixed["file"] in shard_files and 0 < mixed["wanted_bytes"] < mixed["bytes"]
            assert "moves whole" in mixed["why"] and mixed["other_tensors"] > 0
    assert any(c.mixed for c in (first, last, mid))


def test_the_index_json_agrees_with_what_a_stage_moves(staged, tmp_path):
    index = json.loads((tmp_path / "llama" / "model.safetensors.index.json").read_text())["weight_map"]
    c = choose(staged, selection_from(layers="2-5"))
    needed = {f for t, f in index.items() if any(t.startswith(f"model.layers.{n}.") for n in range(2, 6))}
    assert needed <= c.paths


def test_bad_layer_ranges_say_what_the_checkpoint_has(staged, tmp_path):
    with pytest.raises(BadInput, match="has layers 0-7; --layers 4-9 goes beyond"):
        choose(staged, selection_from(layers="4-9"))
    for bad in ("7-3", "x", "-1-2", "1-2-3"):
        with pytest.raises(BadInput, match="--layers"):
            selection_from(layers=bad)
    flat = build_manifest(_flat(tmp_path))
    with pytest.raises(BadInput, match="no tensor names with layer numbers"):
        choose(flat, selection_from(layers="0-1"))


def _flat(tmp_path: Path) -> Path:
    from tiering.sample import SampleTensor, fill_bytes, write_safetensors
    root = tmp_path / "flat"
    root.mkdir()
    write_safetensors(root / "adapter_model.safetensors", [SampleTensor("lora_A.weight", "F16", (64, 8))],
                      lambda t: fill_bytes(t.name, t.nbytes))
    return root


def test_a_tp_rank_moves_its_own_shards(tmp_path):
    m = build_manifest(make_ranked_checkpoint(tmp_path / "r", ranks=4, parts=2, total_bytes=8 << 20))
    c = choose(m, selection_from(tp_rank="2/4"))
    assert sorted(c.paths) == ["config.json", "model-rank-2-part-0.safetensors", "model-rank-2-part-1.safetensors"]
    with pytest.raises(BadInput, match="laid out for 4 ranks .*not 8"):
        choose(m, selection_from(tp_rank="1/8"))
    with pytest.raises(BadInput, match="0 <= R < N"):
        selection_from(tp_rank="4/4")
    plain = build_manifest(make_checkpoint(tmp_path / "p", total_bytes=2 << 20, shards=2, layers=2))
    with pytest.raises(BadInput, match="not laid out per rank"):
        choose(plain, selection_from(tp_rank="0/2"))


# -- a partial copy is a local object of its own --------------------------------------------------------

def test_a_partial_copy_is_its_own_object_never_the_version(node_env, tmp_path):
    ck = make_checkpoint(tmp_path / "ck", total_bytes=6 << 20, shards=3, layers=6)
    with node_env.node() as n:
        n.publish(ck, "org/m", "v1")
        sel = selection_from(None, ["original/"])
        r = n.preload("org/m", "v1", tier="hot", selection=sel)
        part = Path(r.path)
        assert part.name.startswith("v1~p") and part.parent.name == "m"
        held = sorted(str(p.relative_to(part)) for p in part.rglob("*") if p.is_file()
                      and ".weightd" not in p.parts)
        assert "original/params.json" not in held and "config.json" in held
        m = load_manifest(part / MANIFEST_RELPATH)   # restricted, saying what it is part of
        assert sorted(f.path for f in m.files) == held
        assert m.of["version"] == "v1" and m.of["kind"] == "partial" and m.of["selection"] == {"exclude": ["original/*"]}
        assert m.of["digest"] == n.resolve("org/m", "v1").manifest.digest
        assert verify_checkpoint(part, m).ok
        # never served as the whole version; served for its own selection and by its own label
        with pytest.raises(FileNotFoundError):
            n.path("org/m", "v1")
        assert n.path("org/m", "v1", selection=sel) == ("hot", part)
        assert n.path("org/m", m.version) == ("hot", part)
        st = {(c["name"], c["version"]): c for c in n.status()["checkpoints"]}
        assert st[("org/m", m.version)]["part_of"]["version"] == "v1" and st[("org/m", m.version)]["files"] == len(held)
        # the whole version is then a delta: everything but what the partial copy lacks is local
        w = n.preload("org/m", "v1", tier="warm")
        assert w.delta and w.delta["donors"] == [f"org/m@{m.version}"]
        assert w.bytes_by_source["cold"] == (tmp_path / "ck" / "original" / "params.json").stat().st_size
        assert n.path("org/m", "v1")[0] == "warm"
        # a second preload of the same selection is already there; evicting it leaves the version
        assert n.preload("org/m", "v1", tier="hot", selection=sel).already_present
        assert n.evict("org/m", m.version, "hot", force=True)
        assert not part.exists() and n.path("org/m", "v1")[0] == "warm"


def test_a_tampered_partial_copy_is_found_by_verify(node_env, tmp_path, wd):
    ck = make_checkpoint(tmp_path / "ck", total_bytes=4 << 20, shards=2, layers=4)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1").returncode == 0
    r = wd("--no-daemon", "preload", "org/m@v1", "--layers", "0-1", "--json")
    assert r.returncode == 0, r.stderr
    part = Path(json.loads(r.stdout)["path"])
    shard = next(part.glob("*.safetensors"))
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as fh:
        fh.seek(-10, 2)
        fh.write(b"\xff" * 10)
    assert_one_line_error(wd("verify", part), 5, shard.name)


def test_preload_and_path_from_the_cli(wd, node_env, tmp_path):
    ck = make_checkpoint(tmp_path / "ck", total_bytes=6 << 20, shards=3, layers=6)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1").returncode == 0
    r = wd("--no-daemon", "preload", "org/m@v1", "--layers", "4-5", "--exclude", "original/", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["version"].startswith("v1~p") and d["part_of"]["selection"] == {"exclude": ["original/*"], "layers": [4, 5]}
    assert d["part_of"]["mixed_shards"] and d["part_of"]["bytes"] < d["part_of"]["of_bytes"]
    # (the path and the refusals only read: at once)
    cases = [(["path", "org/m@v1"], 3, "not on this node"),
             (["path", "org/m@v1", "--all", "--layers", "1-2"], 2, "--all"),
             (["preload", "org/m@v1", "--tp-rank", "0/2"], 2, "not laid out per rank"),
             (["preload", "org/m@v1", "--include", "/etc/*"], 2, "not a pattern"),
             (["preload", "org/m@v1~p0123456789ab"], 2, "version"), (["path", "org/m@v1~p../../x"], 2, "version")]
    p, *refused = wd.at_once(["--no-daemon", "path", "org/m@v1", "--layers", "4-5", "--exclude", "original/"],
                             *(["--no-daemon", *args] for args, _, _ in cases))
    assert p.returncode == 0 and p.stdout.strip() == d["path"]
    for r, (_, code, needle) in zip(refused, cases):
        assert_one_line_error(r, code, needle)
    ev = wd("--no-daemon", "evict", d["name"] + "@" + d["version"], "--force")
    assert ev.returncode == 0, ev.stderr
    assert not Path(d["path"]).exists()


def test_default_patterns_per_model_and_all(wd, node_env, tmp_path):
    with open(node_env.config, "a") as fh:
        fh.write('[models."org/*"]\nexclude = ["original/"]\n[models."org/full"]\n')
    ck = make_checkpoint(tmp_path / "ck", total_bytes=4 << 20, shards=2, layers=2)
    for name in ("org/m", "org/full"):
        assert wd("publish", ck, "--name", name, "--version", "v1").returncode == 0
    a = json.loads(wd("--no-daemon", "preload", "org/m@v1", "--json").stdout)
    assert a["version"].startswith("v1~p") and a["part_of"]["selection"] == {"exclude": ["original/*"]}
    assert wd("--no-daemon", "path", "org/m@v1").stdout.strip() == a["path"]   # (path applies the same default)
    b = json.loads(wd("--no-daemon", "preload", "org/full@v1", "--json").stdout)   # its own table: no patterns
    assert b["version"] == "v1"
    c = json.loads(wd("--no-daemon", "preload", "org/m@v1", "--all", "--json").stdout)
    assert c["version"] == "v1" and wd("--no-daemon", "path", "org/m@v1", "--all").stdout.strip() == c["path"]


@pytest.mark.parametrize("how", ["--no-daemon", "--daemon-only"])
@pytest.mark.parametrize("flag,says", [("--layers", "--layers: expected A-B"), ("--tp-rank", "--tp-rank: expected R/N"),
                                       ("--experts", "--experts: expected R/N")])
def test_an_empty_selection_flag_is_refused_not_taken_for_the_whole_version(wd, how, flag, says):
    """``--layers ""`` (an unset shell variable) is a usage error, never the whole version, whichever way
    the command runs (a request without flags is built without the selection code)."""
    for cmd in ("preload", "path"):
        assert_one_line_error(wd(how, cmd, "org/m@v1", flag, ""), 2, says)


def test_a_bad_models_table_is_a_config_error(wd, node_env):
    with open(node_env.config, "a") as fh:
        fh.write('[models."org/m"]\nexclude = ["/abs"]\n')
    assert_one_line_error(wd("status"), 2, "models")


# -- companion artefacts --------------------------------------------------------------------------------

def _cache(root: Path, n: int = 50, seed: str = "a") -> Path:
    for i in range(n):
        p = root / f"rank_0_0/inductor_cache/{i % 7:02d}" / f"k{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {seed} {i}\n" * 20)
    return root


def test_a_compile_cache_travels_with_its_version(wd, node_env, tmp_path):
    ck = make_checkpoint(tmp_path / "ck", total_bytes=2 << 20, shards=1, layers=2)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1").returncode == 0
    cache = _cache(tmp_path / "cache")
    p = wd("publish", cache, "--companion-of", "org/m@v1", "--kind", "compile-cache", "--key", "vllm-0.8.4-h100-tp1",
           "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["version"] == "v1~compile-cache~vllm-0.8.4-h100-tp1"
    # immutable like a version: the same bytes again is a no-op, other bytes a conflict
    assert json.loads(wd("publish", cache, "--companion-of", "org/m@v1", "--kind", "compile-cache", "--key",
                         "vllm-0.8.4-h100-tp1", "--json").stdout)["unchanged"]
    (cache / "rank_0_0/extra.py").write_text("x")
    assert_one_line_error(wd("publish", cache, "--companion-of", "org/m@v1", "--kind", "compile-cache", "--key",
                             "vllm-0.8.4-h100-tp1"), 2, "v1~compile-cache~vllm-0.8.4-h100-tp1")
    # a companion is never a version: latest stays v1, ls shows no label
    ls = json.loads(wd("--no-daemon", "ls", "org/m", "--json").stdout)
    assert [v["version"] for v in ls["versions"]] == ["v1"]
    engine = tmp_path / "engine-cache"
    (engine / "other-model").mkdir(parents=True)
    (engine / "other-model" / "keep.py").write_text("mine")
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "vllm-0.8.4-h100-tp1",
           "--companion-dir", engine, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    c = d["companions"][0]
    assert c["part_of"] == {"kind": "compile-cache", "key": "vllm-0.8.4-h100-tp1", "version": "v1", "files": 50}
    assert c["installed"]["copied"] == 50 and (engine / "other-model" / "keep.py").read_text() == "mine"
    got = sorted(str(p.relative_to(engine)) for p in engine.rglob("*.py") if "other-model" not in p.parts)
    assert got == sorted(str(p.relative_to(cache)) for p in cache.rglob("*.py") if p.name != "extra.py")
    assert not (engine / ".weightd").exists()
    st = json.loads(wd("--no-daemon", "status", "--json").stdout)
    kinds = {c["version"]: c.get("part_of", {}).get("kind") for c in st["checkpoints"]}
    assert kinds["v1~compile-cache~vllm-0.8.4-h100-tp1"] == "compile-cache" and kinds["v1"] is None
    # again: nothing copied, nothing moved
    r2 = json.loads(wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key",
                       "vllm-0.8.4-h100-tp1", "--companion-dir", engine, "--json").stdout)
    assert r2["companions"][0]["already_present"] and r2["companions"][0]["installed"]["unchanged"] == 50
    cases = [(["--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "a100"], 3,
               "no compile-cache with key 'a100'"),
             (["--no-daemon", "preload", "org/m@v1", "--with", "compile-cache"], 2, "--key"),
             (["publish", cache, "--companion-of", "org/m@v1", "--kind", "Bad/Kind", "--key", "k"], 2, "kind"),
             (["publish", cache, "--companion-of", "org/m@v9", "--kind", "compile-cache", "--key", "k"], 3,
              "not published"),
             (["publish", cache, "--companion-of", "org/m@v1", "--kind", "p", "--key", "k"], 2, "reserved")]
    for r, (_, code, needle) in zip(wd.at_once(*(args for args, _, _ in cases)), cases):   # (refusals: at once)
        assert_one_line_error(r, code, needle)


def test_a_companion_for_other_content_is_refused(node_env, tmp_path):
    """NAME@V deleted from cold and published again with other bytes: its old cache is not valid."""
    import shutil
    with node_env.node() as n:
        n.publish(make_checkpoint(tmp_path / "a", total_bytes=1 << 20, shards=1, layers=1, seed="a"), "org/m", "v1")
        n.publish_companion(_cache(tmp_path / "c", 5), "org/m", "v1", "compile-cache", "k1")
        shutil.rmtree(node_env.cold / "org/m/v1")
        n.publish(make_checkpoint(tmp_path / "b", total_bytes=1 << 20, shards=1, layers=1, seed="b"), "org/m", "v1")
        with pytest.raises(FileNotFoundError, match="published for other content"):
            n.preload("org/m", "v1", companion=("compile-cache", "k1"))


# -- sets (LoRA adapters) ---------------------------------------------------------------------------

def _adapters(tmp_path: Path, n: int) -> list[str]:
    from tiering.sample import SampleTensor, fill_bytes, write_safetensors
    refs = []
    for i in range(n):
        root = tmp_path / f"lora{i}"
        root.mkdir()
        write_safetensors(root / "adapter_model.safetensors",
                          [SampleTensor(f"base_model.model.layers.{j}.q_proj.lora_A.weight", "F16", (256, 16))
                           for j in range(4)], lambda t, i=i: fill_bytes(f"{i}/{t.name}", t.nbytes))
        (root / "adapter_config.json").write_text(json.dumps({"r": 16, "peft_type": "LORA", "i": i}))
        refs.append(f"lora/a{i}@v1")
    return refs


def _publish_adapters(node_env, tmp_path: Path, n: int) -> list[str]:
    refs = _adapters(tmp_path, n)
    with node_env.node() as node:   # (published in-process: faster than n subprocesses)
        for i, ref in enumerate(refs):
            node.publish(tmp_path / f"lora{i}", ref.split("@")[0], "v1")
    return refs


def test_a_set_is_one_operation_with_one_summary(wd, node_env, tmp_path):
    refs = _publish_adapters(node_env, tmp_path, 12)
    setfile = tmp_path / "adapters.txt"
    setfile.write_text("# the adapters of chat-v3\n" + "\n".join(refs[:10]) + "\n\nlora/missing@v1  # not published\n")
    r = wd("--no-daemon", "preload", "--set", setfile, "--json")
    assert r.returncode == 3, r.stderr   # one missing: the set's exit code is the first failure's
    d = json.loads(r.stdout)
    assert d["models"] == 11 and d["ready"] == 10 and d["tier"] == "hot"
    assert d["failed"] == [{"ref": "lora/missing@v1", "error": d["failed"][0]["error"], "exit_code": 3}]
    assert all(Path(i["path"]).is_dir() and i["path"].startswith(str(node_env.hot)) for i in d["items"])
    toml = tmp_path / "set.toml"
    toml.write_text("models = [" + ", ".join(f'"{x}"' for x in refs) + "]\n")
    r = wd("--no-daemon", "preload", "--set", toml)
    assert r.returncode == 0, r.stderr
    assert "12 of 12 ready in hot (10 already there)" in r.stderr
    assert len(r.stdout.splitlines()) == 12
    for bad, why in (("lora/a@v1\nlora/a@v1\n", "listed twice"), ("lora/../x\n", "line 1"), ("", "1 to")):
        setfile.write_text(bad)
        assert_one_line_error(wd("--no-daemon", "preload", "--set", setfile), 2, why)
    toml.write_text('models = "lora/a@v1"\n')
    assert_one_line_error(wd("--no-daemon", "preload", "--set", toml), 2, "models = [")
    assert_one_line_error(wd("--no-daemon", "preload", "--set", "/dev/zero"), 2, "not a regular file")
    assert_one_line_error(wd("--no-daemon", "preload", "lora/a0@v1", "--set", toml), 2, "--set")


# -- through the daemon ---------------------------------------------------------------------------

@pytest.fixture
def daemon(weightd, node_env, tmp_path):
    sock = node_env.state / "weightd.sock"
    log = tmp_path / "daemon.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve"],
                                env=weightd.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.1)
        yield proc
    finally:
        stop_process(proc)


def test_partial_companion_and_set_through_the_daemon(daemon, weightd, wd, node_env, tmp_path):
    ck = make_checkpoint(tmp_path / "ck", total_bytes=6 << 20, shards=3, layers=6)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1").returncode == 0
    assert wd("publish", _cache(tmp_path / "cache", 30), "--companion-of", "org/m@v1", "--kind", "compile-cache",
              "--key", "k1").returncode == 0
    # a partial copy and the whole version at once are two flights, two objects
    procs = [subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--daemon-only",
                               "preload", "org/m@v1", *extra, "--json"], env=weightd.env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for extra in (["--layers", "0-1"], [])]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    part, whole = outs
    assert part["version"].startswith("v1~p") and whole["version"] == "v1" and part["path"] != whole["path"]
    assert wd("--daemon-only", "path", "org/m@v1", "--layers", "0-1").stdout.strip() == part["path"]
    assert wd("--daemon-only", "path", "org/m@v1").stdout.strip() == whole["path"]
    engine = tmp_path / "engine"
    r = wd("--daemon-only", "preload", "org/m@v1", "--with", "compile-cache", "--key", "k1", "--companion-dir", engine,
           "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["companions"][0]["installed"]["copied"] == 30 and len(list(engine.rglob("*.py"))) == 30
    refs = _publish_adapters(node_env, tmp_path, 6)
    setfile = tmp_path / "s.txt"
    setfile.write_text("\n".join(refs))
    r = wd("--daemon-only", "preload", "--set", setfile, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ready"] == 6 and not d["failed"]
    # the daemon's one request: a hostile body gets a one-line 400, nothing moves
    from weightd.client import DaemonClient
    c = DaemonClient(node_env.state / "weightd.sock")
    for body, why in (({"refs": "x"}, "models"), ({"refs": ["a@b", 3]}, "string"),
                      ({"refs": ["lora/a0@v1"], "tier": "cold"}, "tier"),
                      ({"refs": ["lora/a0@v1"], "selection": {"include": ["/x"]}}, "pattern")):
        with pytest.raises(Exception, match=why):
            c.call("POST", "preload-set", body)
    for body, why in (({"ref": "org/m@v1", "selection": {"layers": "9-1"}}, "layers"),
                      ({"ref": "org/m@v1", "selection": ["x"]}, "selection"),
                      ({"ref": "org/m@v1", "companion": {"kind": "../x", "key": "k"}}, "companion"),
                      ({"ref": "org/m@v1", "whole": "yes"}, "whole")):
        with pytest.raises(Exception, match=why):
            c.call("POST", "preload", body)


@pytest.mark.parametrize("tier", ["hot", "warm"])
def test_small_files_are_checked_on_the_way_and_bad_bytes_place_nothing(node_env, tmp_path, tier):
    """Many small files (a compile cache) are copied through memory and hashed on the way (one read
    each); a file changed in cold storage is an integrity failure and nothing is placed."""
    from tiering import IntegrityError
    with node_env.node() as n:
        n.publish(make_checkpoint(tmp_path / "m", total_bytes=1 << 20, shards=1, layers=1), "org/m", "v1")
        n.publish_companion(_cache(tmp_path / "c", 400), "org/m", "v1", "compile-cache", "k")
        r = n.preload("org/m", "v1", tier=tier, companion=("compile-cache", "k"))
        assert r.part_of["files"] == 400 and verify_checkpoint(Path(r.path), load_manifest(
            Path(r.path) / MANIFEST_RELPATH)).ok
        n.evict("org/m", r.version, tier, force=True)
        victim = node_env.cold / "org/m" / r.version / "rank_0_0/inductor_cache/03/k3.py"
        os.chmod(victim, 0o644)
        victim.write_text(victim.read_text().replace("#", "%", 1))
        with pytest.raises(IntegrityError, match="k3.py"):
            n.preload("org/m", "v1", tier=tier, companion=("compile-cache", "k"))
        assert not (getattr(node_env, tier) / "org/m" / r.version).exists()


def test_signatures_cover_partial_copies_and_companions(wd, node_env, tmp_path):
    """With trust.require_signature: a partial copy of a signed version is checked file by file
    against the signature; a companion must be signed itself (as NAME@V~KIND~KEY), else refused."""
    from tiering.content.signature import generate_keypair
    generate_keypair(tmp_path / "pub.pem", tmp_path / "pub.pub.pem")
    ck = make_checkpoint(tmp_path / "ck", total_bytes=2 << 20, shards=2, layers=2)
    assert wd("publish", ck, "--name", "org/m", "--version", "v1", "--sign", tmp_path / "pub.pem").returncode == 0
    cache = _cache(tmp_path / "cache", 20)
    assert wd("publish", cache, "--companion-of", "org/m@v1", "--kind", "compile-cache", "--key", "signed",
              "--sign", tmp_path / "pub.pem").returncode == 0
    assert wd("publish", cache, "--companion-of", "org/m@v1", "--kind", "compile-cache", "--key", "unsigned"
              ).returncode == 0
    with open(node_env.config, "a") as fh:
        fh.write(f'[trust]\nrequire_signature = true\npublic_keys = ["{tmp_path / "pub.pub.pem"}"]\n')
    r = wd("--no-daemon", "preload", "org/m@v1", "--exclude", "original/", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["version"].startswith("v1~p") and d["signature"]["checked"]
    assert wd("--no-daemon", "path", "org/m@v1", "--exclude", "original/").stdout.strip() == d["path"]
    r = wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "signed", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["companions"][0]["signature"]["checked"]
    assert_one_line_error(wd("--no-daemon", "preload", "org/m@v1", "--with", "compile-cache", "--key", "unsigned"),
                          5, "not signed")


def test_companion_dir_never_follows_a_planted_symlink(tmp_path):
    from weightd.node.companion import install
    from weightd.errors import InvalidRequest
    src = _cache(tmp_path / "src", 5)
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "rank_0_0").symlink_to(elsewhere)
    with pytest.raises(InvalidRequest, match="not a directory"):
        install(str(src), str(dest))
    assert list(elsewhere.iterdir()) == []


def test_a_manifest_cannot_claim_to_be_a_part_under_a_version_label(tmp_path):
    """A cold-storage writer adding "of" to a published version's manifest (to drop signed files) is
    refused: "of" goes only with a V~... label, and a partial's only with V~p<hex>."""
    from tiering import ManifestError
    from tiering.content.manifest_parse import manifest_from_dict
    m = build_manifest(make_checkpoint(tmp_path / "ck", total_bytes=1 << 20, shards=1, layers=1))
    d = m.with_labels(name="org/m", version="v1").to_dict()
    for version, of in (("v1", {"version": "v1", "digest": m.digest, "kind": "partial"}),
                        ("v1~compile-cache~k", {"version": "v1", "digest": m.digest, "kind": "partial"}),
                        ("v1~p0123", {"version": "v1", "digest": m.digest, "kind": "compile-cache"}),
                        ("v1~p0123", None)):
        bad = {**d, "version": version, **({"of": of} if of else {})}
        with pytest.raises((ManifestError, InvalidName)):
            manifest_from_dict(bad)
