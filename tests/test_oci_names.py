"""NAME@VERSION on a registry when a repository or a tag could not hold it as it is (issue 36): the
escaping of tiering/sources/oci/layout.py is injective and reversible for every valid name and label
(Hypothesis), and through the installed CLI against a real registry (tests/test_oci.py's fixture) a
name with capitals, a version starting with '_', one too long for a tag, and a companion
(``V~KIND~KEY``) are published, listed back under their real names and preloaded."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tiering import build_manifest, verify_checkpoint
from tiering.content.names import validate_label, validate_name
from tiering.errors import BadInput
from tiering.sample import make_checkpoint
from tiering.sources.oci import layout
from tiering.sources.oci.client import RegistryLocation

from .conftest import assert_one_line_error
from .test_oci import Registry, auth_file, cli, oci_node, registry  # noqa: F401

MiB = 1 << 20
_CH = "abcXYZ019._-"
components = st.text(alphabet=_CH + "w", min_size=1, max_size=40).filter(lambda s: set(s) != {"."})
versions = st.one_of(components, st.text(alphabet=_CH, min_size=100, max_size=255).filter(lambda s: set(s) != {"."}),
                     st.sampled_from(["_", "__.", "_-", "sha256-" + "a" * 64, "sha256-" + "b" * 64 + ".torrent",
                                      "-rc1", ".5", "v" * 128, "v" * 129]))
labels = st.one_of(versions, st.builds(lambda v, k, key: f"{v}~{k}~{key}", components,
                                       st.from_regex(r"[a-z0-9][a-z0-9-]{0,39}", fullmatch=True), components))


def _valid_label(s: str) -> bool:
    try:
        validate_label(s)
        return True
    except BadInput:
        return False


@settings(max_examples=400, deadline=None)
@given(st.lists(labels, min_size=2, max_size=6, unique=True))
def test_every_label_has_one_tag_and_reads_back(ls: list[str]) -> None:
    ls = [x for x in ls if _valid_label(x)]
    tags = [layout.tag_of(x) for x in ls]
    assert len(set(tags)) == len(ls)                          # injective
    for label, tag in zip(ls, tags):
        assert layout.TAG_RE.fullmatch(tag) and not layout.SIDE_TAG_RE.fullmatch(tag), tag
        back = layout.label_of(tag)
        if back is None:                                      # hashed: only when escaping would not fit
            escaped = layout.TAG_ESCAPE + label.replace("_", "__").replace("~", "_-")
            assert tag.startswith(layout.TAG_HASHED) and len(escaped) > 128
        else:
            assert back == label
        if layout.TAG_RE.fullmatch(label) and not label.startswith("_") and not label.startswith("sha256-"):
            assert tag == label                               # a tag as it is stays (published versions keep theirs)


@settings(max_examples=400, deadline=None)
@given(st.lists(components, min_size=1, max_size=2), st.lists(components, min_size=1, max_size=2))
def test_every_name_has_one_repository_and_reads_back(a: list[str], b: list[str]) -> None:
    loc = RegistryLocation("127.0.0.1:5000", "pre")
    names = []
    for parts in (a, b):
        try:
            names.append(validate_name("/".join(parts)))
        except BadInput:
            pass
    repos = {}
    for name in names:
        repo = loc.repo(name)
        assert all(layout.REPO_COMPONENT.fullmatch(p) for p in repo.split("/")), repo
        assert loc.name_of(repo) == name
        repos[repo] = name
    assert len(repos) == len(set(names))


def test_a_name_too_long_for_a_registry_is_one_line() -> None:
    loc = RegistryLocation("127.0.0.1:5000", "pre")
    long = "M" * 200
    try:
        loc.repo(long)
    except BadInput as exc:
        assert "longer than a registry takes" in str(exc)
    else:
        raise AssertionError("accepted")
    assert loc.name_of("pre/w--zz") is None and loc.name_of("other/acme") is None   # (not ours)
    assert layout.label_of("_x_y") is None and layout.label_of("__.1234") is None


def _cache(root: Path) -> Path:
    for i in range(4):
        p = root / f"rank_0_0/inductor_cache/{i % 2:02d}" / f"k{i}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# {i}\n" * 50)
    (root / "index.json").write_text(json.dumps({"engine": "vllm"}))
    return root


def test_escaped_names_versions_and_a_companion_round_trip_through_the_registry(
        cli, oci_node, registry: Registry, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="names")
    m = build_manifest(src)
    long_version = "r" + "x" * 254   # (255 bytes, the longest: no tag holds it, and the staging names shorten it)
    name = "Acme/Big_Model-"
    for version in ("v1", "_rc1", long_version):
        r = cli("publish", src, "--name", name, "--version", version, "--json")
        assert r.returncode == 0, r.stderr
    # the registry holds escaped repositories and tags, each an OCI name
    repo = f"{oci_node.prefix}/{layout.repo_component('Acme')}/{layout.repo_component('Big_Model-')}"
    st_, _, body = registry.call("GET", f"/v2/{repo}/tags/list")
    assert st_ == 200, body
    tags = set(json.loads(body)["tags"])
    assert {"v1", "___rc1", layout.tag_of(long_version)} <= tags
    assert layout.tag_of(long_version).startswith(layout.TAG_HASHED)
    # a companion of v1 (its label V~KIND~KEY holds '~'), published and preloaded
    cache = _cache(tmp_path / "cache")
    r = cli("publish", cache, "--companion-of", f"{name}@v1", "--kind", "compile-cache", "--key", "vllm-0.6_tp2",
            "--json")
    assert r.returncode == 0, r.stderr
    st_, _, body = registry.call("GET", f"/v2/{repo}/tags/list")
    assert "_v1_-compile-cache_-vllm-0.6__tp2" in json.loads(body)["tags"]
    # ls: the real names, the versions and not the companion
    r = cli("ls", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    rows = rows if isinstance(rows, list) else rows.get("versions", rows)
    got = sorted((x["name"], x["version"]) for x in rows if x["name"] == name)
    assert got == sorted((name, v) for v in ("v1", "_rc1", long_version)), rows
    for version in ("_rc1", long_version):
        r = cli("preload", f"{name}@{version}", "--tier", "warm", "--json")
        assert r.returncode == 0, r.stderr
        assert not verify_checkpoint(Path(json.loads(r.stdout)["path"]), m).problems
    r = cli("preload", f"{name}@v1", "--with", "compile-cache", "--key", "vllm-0.6_tp2", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    where = Path(rep["companions"][0]["path"])
    assert where.name == "v1~compile-cache~vllm-0.6_tp2"
    for p in cache.rglob("*"):
        if p.is_file():
            assert (where / p.relative_to(cache)).read_bytes() == p.read_bytes()
    # another key is not there; a version under another name is not found
    assert_one_line_error(cli("preload", f"{name}@v1", "--with", "compile-cache", "--key", "other"), 3)
    assert_one_line_error(cli("preload", "acme/big_model-@v1"), 3)
