"""A preload reads every byte of its source once and writes it once (issue 35), observed: the real CLI
runs under ``strace -f -y``, and every read and write system call is summed per file. The staged copy
is never read back to verify it (its parts were hashed on the way in, the signature's SHA-256 too),
and no byte is copied by the kernel unseen (``copy_file_range``/``sendfile``). A part that differs, or
bytes a signature does not cover, still fail the preload before the version is visible."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tiering import build_manifest, mutate_tensor, read_header
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.content.signature import generate_keypair
from tiering.sample import make_checkpoint
from tiering.verified_copy import IN_MEMORY_MAX

from .conftest import ROOT, assert_one_line_error

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace missing (scripts/install-tools.sh)")

MiB = 1 << 20
CALLS = "read,pread64,readv,preadv,preadv2,write,pwrite64,writev,pwritev,pwritev2,copy_file_range,sendfile,splice"
LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<call>\w+)\((?P<fd>\d+)<(?P<path>[^>]*)>(?P<rest>.*)\)\s+=\s+(?P<rc>-?\d+)")


def traced(isolated_env: dict[str, str], config: Path, log: Path, *args: str) -> tuple[subprocess.CompletedProcess,
                                                                                          dict[str, dict[str, int]]]:
    """``weightd --no-daemon ARGS`` under strace: (the process, {call kind: {path: bytes}}) with kinds
    ``read``, ``write`` and ``kernel`` (copy_file_range, sendfile, splice: by their first descriptor)."""
    cmd = ["strace", "-f", "-qq", "-y", "-s", "0", "-e", "signal=none", "-e", f"trace={CALLS}", "-o", str(log),
           sys.executable, "-m", "weightd", "--config", str(config), "--no-daemon", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=isolated_env, cwd=ROOT)
    out: dict[str, dict[str, int]] = {"read": defaultdict(int), "write": defaultdict(int), "kernel": defaultdict(int)}
    unfinished: dict[str, str] = {}
    for line in log.read_text().splitlines():
        pid, _, rest = line.partition(" ")
        rest = rest.lstrip()
        if rest.endswith("<unfinished ...>"):   # another thread's call came between: joined when it resumes
            unfinished[pid] = rest.removesuffix("<unfinished ...>").rstrip()
            continue
        if rest.startswith("<... ") and pid in unfinished:
            line = f"{pid} {unfinished.pop(pid)}{rest.split('resumed>', 1)[1]}"
        m = LINE.match(line)
        if m is None or int(m["rc"]) <= 0:
            continue
        call = m["call"]
        kind = "kernel" if call in ("copy_file_range", "sendfile", "splice") else \
            "read" if "read" in call else "write"
        out[kind][m["path"]] += int(m["rc"])
    return r, out


@pytest.fixture
def published(wd, node_env, tmp_path: Path) -> dict:
    """A signed checkpoint whose two shards stream (each above IN_MEMORY_MAX) beside small files."""
    src = make_checkpoint(tmp_path / "src", total_bytes=160 * MiB, shards=2, layers=4, seed="one-pass")
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_keypair(keys / "k.pem", keys / "k.pub.pem")
    r = wd("publish", str(src), "--name", "org/m", "--version", "v1", "--sign", str(keys / "k.pem"))
    assert r.returncode == 0, r.stderr
    cold = node_env.cold / "org/m/v1"
    files = {str(p.relative_to(cold)): p.stat().st_size for p in cold.rglob("*")
             if p.is_file() and ".weightd" not in p.parts}
    assert sum(s > IN_MEMORY_MAX for s in files.values()) == 2
    return {"cold": cold, "files": files, "pub": keys / "k.pub.pem"}


def _require_signature(node_env, pub: Path) -> None:
    with open(node_env.config, "a") as f:
        f.write(f'[trust]\nrequire_signature = true\npublic_keys = ["{pub}"]\n')


def _under(io: dict[str, int], root: Path, rel: str | None = None) -> int:
    """Bytes of ``io`` on files beneath ``root`` (whose path ends with ``rel`` when given)."""
    return sum(n for p, n in io.items() if p.startswith(str(root) + "/") and (rel is None or p.endswith("/" + rel)))


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_cold_to_warm_then_hot_reads_and_writes_each_byte_once(node_env, isolated_env, published, tmp_path: Path,
                                                               signed: bool) -> None:
    if signed:
        _require_signature(node_env, published["pub"])
    files, total = published["files"], sum(published["files"].values())
    for tier, src_root, dst_root in (("warm", published["cold"], node_env.warm), ("hot", node_env.warm / "org/m/v1",
                                                                                   node_env.hot)):
        r, io = traced(isolated_env, node_env.config, tmp_path / f"{tier}.strace", "preload", "org/m@v1",
                       "--tier", tier, "--lease", "0", "--json")
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["bytes_by_source"]["cold" if tier == "warm" else "local_reuse"] == total
        assert (rep["signature"] is not None) == signed
        for rel, size in files.items():
            assert _under(io["read"], src_root, rel) == size, (tier, rel)     # each source byte read once
            assert _under(io["write"], dst_root, rel) == size, (tier, rel)    # ... and written once
        # nothing read back from the copy (warming faults pages in without read(); its latency probe reads
        # 4 KiB now and then), nothing copied by the kernel out of sight
        assert _under(io["read"], dst_root) < 256 << 10, {p: n for p, n in io["read"].items() if str(dst_root) in p}
        assert not io["kernel"], dict(io["kernel"])


def test_a_bad_tensor_in_a_streamed_shard_fails_before_anything_is_visible(wd, node_env, published) -> None:
    """A tensor changed in cold storage behind the manifest's back: exit 5 naming it; no version, no
    staging left."""
    cold = published["cold"]
    shard = max(cold.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    t = read_header(shard).tensors[-1]
    with open(shard, "r+b") as fh:
        fh.seek(t.end - 3)
        b = fh.read(1)
        fh.seek(t.end - 3)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert_one_line_error(wd("preload", "org/m@v1", "--tier", "warm"), 5, "mismatch", t.name)
    assert not (node_env.warm / "org/m/v1").exists()
    assert not [p for p in (node_env.warm / ".staging").iterdir() if p.is_dir()]


def test_bytes_the_signature_does_not_cover_are_refused_in_the_same_pass(wd, node_env, published) -> None:
    """A cold writer changes a tensor of a streamed shard and writes a manifest that matches it (a valid
    xxh3 digest is no signature): the copy's own SHA-256 refuses it (exit 5, digest_mismatch), nothing
    placed."""
    cold = published["cold"]
    shard = max(cold.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    mutate_tensor(shard, read_header(shard).tensors[1].name, seed="tampered")
    old = json.loads((cold / MANIFEST_RELPATH).read_text())
    m = build_manifest(cold).with_labels(name=old["name"], version=old["version"], published_at=old["published_at"])
    (cold / MANIFEST_RELPATH).write_text(m.to_json())
    _require_signature(node_env, published["pub"])
    assert_one_line_error(wd("preload", "org/m@v1", "--tier", "warm"), 5, shard.name)
    assert not (node_env.warm / "org/m/v1").exists()
    assert not [p for p in (node_env.warm / ".staging").iterdir() if p.is_dir()]
