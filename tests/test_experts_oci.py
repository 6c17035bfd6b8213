"""An expert-parallel copy from an OCI registry as the cold tier (issue 40 part 2): only the rank's
ranges are asked of the registry, through the shared ranged core, then repacked and compared tensor
by tensor with the original. A real registry on 127.0.0.1 (tests/test_oci.py's fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_experts import EXPERT_RE, _check_copy, _ck
from tests.test_oci import auth_file, cli, oci_node, registry  # noqa: F401 (fixtures)
from tiering.content.build import build_manifest
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.content.manifest_parse import load_manifest


def test_from_a_registry_only_the_ranks_ranges_are_asked_for(cli, oci_node, tmp_path: Path) -> None:  # noqa: F811
    ck = _ck(tmp_path)
    r = cli("publish", ck, "--name", "org/moe", "--version", "v1")
    assert r.returncode == 0, r.stderr
    out = cli("preload", "org/moe@v1", "--experts", "1/4", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["version"] == "v1~e1of4"
    _check_copy(Path(d["path"]), ck, 1, 4)
    m = load_manifest(Path(d["path"]) / MANIFEST_RELPATH)
    whole = build_manifest(ck)
    expert_bytes = sum(t.nbytes for _, t in whole.tensors() if EXPERT_RE.search(t.name))
    rank_bytes = sum(t.nbytes for _, t in m.tensors()) + sum(f.size for f in m.files if f.safetensors is None
                                                              and not f.path.endswith(".index.json"))
    assert rank_bytes <= d["bytes_by_source"]["cold"] <= rank_bytes + (1 << 20)
    assert d["bytes_by_source"]["cold"] < whole.total_bytes - expert_bytes // 2
    assert not list(Path(d["path"]).glob(".weightd-ranges*"))
