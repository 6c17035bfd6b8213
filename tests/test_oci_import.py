"""Importing artifacts made elsewhere whose layers are tar archives (issue 36): a KitOps ModelKit and
ModelPack ``.tar``/``.tar+gzip`` layers, against a real registry (Debian's ``docker-registry``, started
by tests/test_oci.py's fixture for this module), the ModelKit pushed from an OCI image layout by
``skopeo``; hostile archives each refused in one line with nothing published and no scratch left."""

from __future__ import annotations

import gzip
import io
import json
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error
from .test_oci import (OCI_MANIFEST, PASSWORD, USER, WEIGHTD, oci_layout, Registry, _flip, auth_file, cli,  # noqa: F401
                       oci_node, registry)

MiB = 1 << 20
KIT = "application/vnd.kitops.modelkit"
KIT_CONFIG = f"{KIT}.config.v1+json"
MP = "application/vnd.cncf.model"
FILEPATH = "org.cncf.model.filepath"


def _tar(entries: list[tuple[tarfile.TarInfo, bytes | None]], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0) if gz else raw


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    return info, data


def _files_tar(src: Path, rels: list[str], gz: bool = False, prefix: str = "") -> bytes:
    """``rels`` from ``src`` as a tar, with their directories as entries first (as kit packs them)."""
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = []
    seen: set[str] = set()
    for rel in rels:
        parts = rel.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            d = "/".join(parts[:k])
            if d not in seen:
                seen.add(d)
                info = tarfile.TarInfo(prefix + d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                entries.append((info, None))
        entries.append(_file(prefix + rel, (src / rel).read_bytes()))
    return _tar(entries, gz)


def _kitfile_layers(src: Path) -> list[tuple[str, str, bytes]]:
    """A ModelKit of ``src``: the safetensors shards in a model layer (.tar), the rest as model parts
    (.tar+gzip, one a directory), the README as docs; (media type, path annotation, blob)."""
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    rest = sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.is_file() and p.suffix != ".safetensors"
                  and p.name != "README.md" and not str(p.relative_to(src)).startswith("original/"))
    layers = [(f"{KIT}.model.v1.tar", shards[0], _files_tar(src, [shards[0]]))]
    layers += [(f"{KIT}.modelpart.v1.tar", s, _files_tar(src, [s])) for s in shards[1:]]
    layers += [(f"{KIT}.modelpart.v1.tar+gzip", rel, _files_tar(src, [rel], gz=True)) for rel in rest]
    layers.append((f"{KIT}.modelpart.v1.tar+gzip", "original", _files_tar(src, ["original/params.json"], gz=True)))
    layers.append((f"{KIT}.docs.v1.tar+gzip", "README.md", _files_tar(src, ["README.md"], gz=True)))
    return layers


def _manifest(layers: list[tuple[str, str | None, str, int]], config: tuple[str, str, int]) -> bytes:
    descs = []
    for mt, path, digest, size in layers:
        d = {"mediaType": mt, "digest": digest, "size": size}
        if path:
            d["annotations"] = {FILEPATH: path}
        descs.append(d)
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": {"mediaType": config[0], "digest": config[1], "size": config[2]},
                       "layers": descs}).encode()


def _kitfile(src: Path) -> bytes:
    return json.dumps({"manifestVersion": "1.0.0", "package": {"name": "tiny", "authors": ["weightd tests"]},
                       "model": {"name": "tiny", "path": "model-00001-of-00002.safetensors",
                                 "parts": [{"path": "model-00002-of-00002.safetensors"}, {"path": "config.json"}]},
                       "docs": [{"path": "README.md"}]}).encode()


def _push(registry: Registry, repo: str, tag: str, layers: list[tuple[str, str | None, bytes]],
          config_type: str = KIT_CONFIG, config: bytes = b"{}") -> list[str]:
    """An artifact pushed straight to the registry (the hostile cases); the layers' digests."""
    descs = [(mt, path, registry.push_blob(repo, data), len(data)) for mt, path, data in layers]
    cfg = registry.push_blob(repo, config)
    registry.put_manifest(repo, tag, _manifest(descs, (config_type, cfg, len(config))))
    return [d[2] for d in descs]


def _src(tmp_path: Path, seed: str) -> Path:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=2, layers=2, seed=seed)
    (src / "README.md").write_text("# tiny\nA checkpoint for the tests.\n")
    return src


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """TMPDIR for the CLI: where an import's scratch directory is made (checked empty afterwards)."""
    d = tmp_path / "scratch"
    d.mkdir()
    return d


def test_a_kitops_modelkit_pushed_by_skopeo_is_imported_and_preloads_byte_identical(
        cli, oci_node, registry: Registry, tmp_path: Path, scratch: Path) -> None:
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo missing (Debian package skopeo; scripts/install-tools.sh installs it)")
    src = _src(tmp_path, "kit")
    oci_layout(tmp_path / "layout", _kitfile_layers(src), (KIT_CONFIG, _kitfile(src)), "v1")
    repo = f"{oci_node.prefix}-kit/tiny"
    subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", "--dest-creds", f"{USER}:{PASSWORD}",
                    f"oci:{tmp_path / 'layout'}:v1", f"docker://{registry.host}/{repo}:v1"], check=True,
                   capture_output=True, timeout=120)
    doc, _ = registry.manifest(repo, "v1")
    assert {x["mediaType"] for x in doc["layers"]} == {f"{KIT}.model.v1.tar", f"{KIT}.modelpart.v1.tar",
                                                       f"{KIT}.modelpart.v1.tar+gzip", f"{KIT}.docs.v1.tar+gzip"}
    env = {"TMPDIR": str(scratch)}
    r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--name", "acme/kit", "--json", env=env)
    assert r.returncode == 0, r.stderr
    pub = json.loads(r.stdout)
    m = build_manifest(src)
    assert (pub["name"], pub["version"], pub["digest"]) == ("acme/kit", "v1", m.digest)
    assert list(scratch.iterdir()) == []
    r = cli("preload", "acme/kit@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    out = Path(json.loads(r.stdout)["path"])
    assert not verify_checkpoint(out, m).problems
    for f in m.files:
        assert (out / f.path).read_bytes() == (src / f.path).read_bytes(), f.path
    assert {f.path for f in m.files} == {str(p.relative_to(src)) for p in src.rglob("*") if p.is_file()}
    # ModelPack's own archived layers (weight .tar, weight.config .tar+gzip), with links inside the tree
    link = tarfile.TarInfo("tokenizer-link.json")
    link.type, link.linkname = tarfile.SYMTYPE, "tokenizer.json"
    hard = tarfile.TarInfo("original/params-copy.json")
    hard.type, hard.linkname = tarfile.LNKTYPE, "original/params.json"
    layers: list[tuple[str, str | None, bytes]] = [
        (f"{MP}.weight.v1.tar", None, _files_tar(src, sorted(p.name for p in src.glob("*.safetensors")))),
        (f"{MP}.weight.config.v1.tar+gzip", None, _tar([
            _file("config.json", (src / "config.json").read_bytes()),
            _file("tokenizer.json", (src / "tokenizer.json").read_bytes()), (link, None),
            _file("original/params.json", (src / "original/params.json").read_bytes()), (hard, None)], gz=True))]
    _push(registry, f"{oci_node.prefix}-mp/tiny", "v2", layers, f"{MP}.config.v1+json")
    r = cli("publish", f"oci://{registry.host}/{oci_node.prefix}-mp/tiny:v2", "--name", "acme/mp", "--json", env=env)
    assert r.returncode == 0, r.stderr
    r = cli("preload", "acme/mp@v2", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    out = Path(json.loads(r.stdout)["path"])
    assert (out / "tokenizer-link.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    assert (out / "original/params-copy.json").read_bytes() == (src / "original/params.json").read_bytes()
    assert (out / "model-00002-of-00002.safetensors").read_bytes() == \
        (src / "model-00002-of-00002.safetensors").read_bytes()
    assert list(scratch.iterdir()) == []


def _hostile(entry: tarfile.TarInfo, data: bytes | None = None) -> bytes:
    return _tar([_file("config.json", b"{}"), (entry, data)])


def _entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    return info


def _sparse(pax: dict[str, str]) -> bytes:
    """A file whose pax header holds GNU.sparse keys tarfile parses without bounds (or raises on)."""
    info = _entry("w.bin")
    info.pax_headers = pax
    return _tar([(info, b"abcd")])


def _big_meta(kind: bytes, body: bytes) -> bytes:
    """A gzip tar whose pax (x/g) or GNU long-name (L/K) header body is 2 MiB (``body`` padded with
    NULs: tarfile would read it whole into memory), then a file."""
    meta = _entry("././@LongLink" if kind in (b"L", b"K") else "pax", kind)
    meta.size = 2 * MiB
    raw = meta.tobuf(format=tarfile.GNU_FORMAT) + body + bytes(2 * MiB - len(body))
    f = _entry("w.bin")
    f.size = 4
    raw += f.tobuf(format=tarfile.USTAR_FORMAT) + b"abcd" + bytes(508) + bytes(1024)
    return gzip.compress(raw, mtime=0)


@pytest.mark.parametrize("case, layers, code, needle", [
    ("dotdot", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("../x"), b"escape"))], 2, "tar entry '../x'"),
    ("nested-dotdot", [(f"{KIT}.model.v1.tar+gzip", "m", gzip.compress(_hostile(_entry("a/../../x"), b"e")))], 2,
     "tar entry 'a/../../x'"),
    ("absolute", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("/etc/cron.d/x"), b"* * * * *"))], 2,
     "absolute path"),
    ("symlink-out", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("passwd", tarfile.SYMTYPE, "/etc/passwd")))], 2,
     "a symlink to '/etc/passwd', outside the tree"),
    ("symlink-up", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("d/up", tarfile.SYMTYPE, "../../etc")))], 2,
     "outside the tree"),
    ("symlink-chain", [(f"{KIT}.model.v1.tar", "m", _tar([(_entry("d", tarfile.SYMTYPE, "."), None),
                                                          (_entry("e", tarfile.SYMTYPE, "d/../escape"), None)]))],
     2, "outside the tree"),
    ("write-through-symlink", [(f"{KIT}.model.v1.tar", "m", _tar([(_entry("d", tarfile.SYMTYPE, "sub"), None),
                                                                  _file("d/x", b"through")]))], 2,
     "is a file or a symlink"),
    ("hardlink-out", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("h", tarfile.LNKTYPE, "/etc/shadow")))], 2,
     "hard link"),
    ("hardlink-other-layer", [(f"{KIT}.model.v1.tar", "m", _tar([_file("config.json", b"{}")])),
                              (f"{KIT}.modelpart.v1.tar", "h", _tar([(_entry("h", tarfile.LNKTYPE, "config.json"),
                                                                      None)]))], 2, "hard link"),
    ("device", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("dev", tarfile.CHRTYPE)))], 2, "a device"),
    ("fifo", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("fifo", tarfile.FIFOTYPE)))], 2, "a fifo"),
    ("own-files", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry(".weightd/manifest.json"), b"{}"))], 2,
     ".weightd/"),
    ("duplicate", [(f"{KIT}.model.v1.tar", "m", _tar([_file("config.json", b"{}")])),
                   (f"{MP}.weight.config.v1.raw", "config.json", b"[]")], 2, "holds this path twice"),
    ("not-a-tar", [(f"{KIT}.model.v1.tar+gzip", "m", b"plain bytes, not gzip" * 40)], 2, "not a valid gzip"),
    ("unknown-type", [(f"{KIT}.model.v1.tar", "m", _tar([_file("config.json", b"{}")])),
                      ("application/vnd.example.weights", "w.bin", b"123")], 2,
     "unknown media type 'application/vnd.example.weights'"),
    ("zstd", [(f"{MP}.weight.v1.tar+zstd", "w", b"(zstd)")], 2, "zstd-compressed"),
    # headers tarfile would read whole into memory, refused before it does
    ("pax-2mib", [(f"{KIT}.model.v1.tar+gzip", "m", _big_meta(b"x", b"20 path=w2.bin\n"))], 2,
     "a pax header of 2097152 bytes, over 1 MiB"),
    ("pax-global-2mib", [(f"{KIT}.model.v1.tar+gzip", "m", _big_meta(b"g", b"20 path=w2.bin\n"))], 2,
     "a pax header of 2097152 bytes, over 1 MiB"),
    ("longname-2mib", [(f"{KIT}.model.v1.tar+gzip", "m", _big_meta(b"L", b"w2.bin"))], 2,
     "a GNU long name header of 2097152 bytes, over 1 MiB"),
    ("longlink-2mib", [(f"{KIT}.model.v1.tar+gzip", "m", _big_meta(b"K", b"w2.bin"))], 2,
     "a GNU long name header of 2097152 bytes, over 1 MiB"),
    # GNU sparse pax keys: bare ValueErrors in tarfile, or a map read without bounds
    *[(f"sparse-{i}", [(f"{KIT}.model.v1.tar", "m", _sparse(pax))], 2, "GNU.sparse") for i, pax in enumerate([
        {"GNU.sparse.map": "abc"}, {"GNU.sparse.size": "x"}, {"GNU.sparse.realsize": "x"},
        {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}])],
    ("name-too-long", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("d/" + "x" * 300), b"long"))], 2,
     "a name over 255 bytes"),
    ("path-too-long", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("/".join(["d" * 200] * 20)), b"long"))], 2,
     "a path over 3072"),
    ("symlink-too-long", [(f"{KIT}.model.v1.tar", "m", _hostile(_entry("s", tarfile.SYMTYPE, "a/" * 3000)))], 2,
     "a symlink target over 3072 bytes"),
    ("truncated-gzip", [(f"{KIT}.model.v1.tar+gzip", "m",
                         gzip.compress(_hostile(_entry("w.bin"), random.Random(0).randbytes(64 << 10)))[:8192])], 2,
     "not a valid gzip-compressed tar archive"),
])
def test_a_hostile_or_unsupported_artifact_is_one_line_and_nothing_is_published(
        cli, oci_node, registry: Registry, scratch: Path, case: str, layers: list, code: int, needle: str) -> None:
    repo = f"{oci_node.prefix}-bad/{case}"
    _push(registry, repo, "v1", layers)
    r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--name", "acme/bad", "--version", case,
            env={"TMPDIR": str(scratch)})
    assert_one_line_error(r, code, needle)
    assert_one_line_error(cli("preload", f"acme/bad@{case}"), 3)
    assert list(scratch.iterdir()) == []


def test_a_tar_layer_whose_bytes_are_not_its_digest_is_refused_after_unpacking(
        cli, oci_node, registry: Registry, tmp_path: Path, scratch: Path) -> None:
    src = _src(tmp_path, "rot")
    repo = f"{oci_node.prefix}-rot/tiny"
    layers = [(mt, path, data) for mt, path, data in _kitfile_layers(src)]
    digests = _push(registry, repo, "v1", layers)
    # a byte of the first shard's tar (uncompressed: the archive still unpacks) flipped on the registry's disk
    _flip(registry.blob_path(digests[0]), len(layers[0][2]) // 2)
    r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--name", "acme/rot", "--version", "v1",
            env={"TMPDIR": str(scratch)})
    assert_one_line_error(r, 5, "not the blob's digest", digests[0])
    assert_one_line_error(cli("preload", "acme/rot@v1"), 3)
    assert list(scratch.iterdir()) == []
    # a gzip layer damaged: refused as not its digest, not as a broken archive
    _flip(registry.blob_path(digests[-1]), len(layers[-1][2]) // 2)
    _flip(registry.blob_path(digests[0]), len(layers[0][2]) // 2)
    r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--name", "acme/rot", "--version", "v1",
            env={"TMPDIR": str(scratch)})
    assert_one_line_error(r, 5, "not the blob's digest", digests[-1])
    assert list(scratch.iterdir()) == []


_BOMB = r"""
import hashlib, io, json, resource, sys, tarfile, time, zlib
from pathlib import Path
from tiering.errors import NoSpace
from tiering.sources.oci import importer, unpack
from tiering.sources.oci.layout import Layer
info = tarfile.TarInfo("zeros.bin")
info.size = 256 << 20
co = zlib.compressobj(9, zlib.DEFLATED, 31)
out = [co.compress(info.tobuf(format=tarfile.USTAR_FORMAT))]
for _ in range(256):
    out.append(co.compress(bytes(1 << 20)))
out += [co.compress(bytes(1024)), co.flush()]
data = b"".join(out)
layer = Layer("application/vnd.kitops.modelkit.model.v1.tar+gzip", "sha256:" + hashlib.sha256(data).hexdigest(),
              len(data), "")
staging = unpack.Staging(Path(sys.argv[1]), int(sys.argv[2]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.monotonic()
try:
    unpack.untar(importer._Checked(None, io.BytesIO(data), layer, "bomb"), True, staging, "bomb")
    outcome = "unpacked"
except NoSpace:
    outcome = "NoSpace"
print(json.dumps({"layer": len(data), "outcome": outcome, "files": staging.files, "secs": time.monotonic() - t,
                  "rss_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10}))
"""


@pytest.mark.parametrize("budget, outcome", [(1 * MiB, "NoSpace"), (1 << 30, "unpacked")])
def test_a_gzip_bomb_is_inflated_in_bounded_pieces(tmp_path: Path, budget: int, outcome: str) -> None:
    """A 256 KiB gzip layer that inflates to 256 MiB: refused by a 1 MiB budget with the header read
    (tarfile's own gzip inflated the whole layer at once to read it), or unpacked within the budget,
    memory flat (tarfile's own gzip held each inflated chunk and copied it on every read)."""
    import sys
    r = subprocess.run([sys.executable, "-c", _BOMB, str(tmp_path), str(budget)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["layer"] < 1 * MiB and got["outcome"] == outcome, got
    assert got["files"] == ({"zeros.bin": 256 * MiB} if outcome == "unpacked" else {}), got
    assert got["rss_mib"] < 64, got
    assert got["secs"] < 30, got
    if outcome == "unpacked":
        assert (tmp_path / "zeros.bin").stat().st_size == 256 * MiB


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="mounts a small tmpfs (root only)")
def test_a_gzip_bomb_is_bounded_by_the_scratch_free_space(cli, oci_node, registry: Registry,
                                                           tmp_path: Path) -> None:
    """32 KiB of gzip that unpacks to 64 MiB, into a 4 MiB scratch file system: exit 6, nothing left."""
    small = tmp_path / "small"
    _mount_tmpfs(small, "4m")
    try:
        bomb = _tar([_file("zeros.bin", bytes(64 * MiB))], gz=True)
        assert len(bomb) < 256 << 10
        repo = f"{oci_node.prefix}-bomb/tiny"
        _push(registry, repo, "v1", [(f"{KIT}.model.v1.tar+gzip", "zeros.bin", bomb)])
        r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--name", "acme/bomb", "--version", "v1",
                env={"TMPDIR": str(small)})
        assert_one_line_error(r, 6, "import staging", "free space")
        assert list(small.iterdir()) == []
        assert_one_line_error(cli("preload", "acme/bomb@v1"), 3)
        # layers whose declared sizes do not fit: refused before a byte is pulled
        big = bytes(range(256)) * (24 * 1024)   # 6 MiB, a raw layer declared as such
        _push(registry, repo, "v2", [(f"{MP}.weight.v1.raw", "w.bin", big)])
        r = cli("publish", f"oci://{registry.host}/{repo}:v2", "--name", "acme/bomb", "--version", "v2",
                env={"TMPDIR": str(small)})
        assert_one_line_error(r, 6, "before a byte was pulled")
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


def test_the_scratch_tree_is_readable_by_a_daemon_whatever_the_umask(oci_node, registry: Registry,
                                                                       auth_file: Path) -> None:
    """Directories 0755 and files 0644 under umask 077 (a daemon of another user publishes from there)."""
    import os
    import stat
    from tiering.sources.oci.importer import pull_artifact
    repo = f"{oci_node.prefix}-umask/tiny"
    _push(registry, repo, "v1", [(f"{KIT}.model.v1.tar+gzip", "deep", _tar([_file("deep/er/w.bin", b"w" * 1000)],
                                                                            gz=True)),
                                 (f"{MP}.weight.config.v1.raw", "cfg/config.json", b"{}")])
    old = os.umask(0o077)
    try:
        with pull_artifact(f"oci://{registry.host}/{repo}:v1", insecure=True,
                           env={"REGISTRY_AUTH_FILE": str(auth_file)}) as got:
            assert sorted(got.files) == ["cfg/config.json", "deep/er/w.bin"] and got.bytes == 1002
            modes = {str(p.relative_to(got.dir)): stat.S_IMODE(p.stat().st_mode) for p in got.dir.rglob("*")}
            assert stat.S_IMODE(got.dir.stat().st_mode) == 0o755
    finally:
        os.umask(old)
    assert modes == {"cfg": 0o755, "cfg/config.json": 0o644, "deep": 0o755, "deep/er": 0o755,
                     "deep/er/w.bin": 0o644}, modes
    assert not got.dir.exists()


def test_a_failed_layer_stops_the_layers_in_flight(oci_node, registry: Registry, auth_file: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile layer refused while a slow one streams: the slow one stops at its next read (it is not
    read to its end first), the hostile layer's error is the one raised, and the scratch is removed."""
    import time
    from tiering.errors import UnsafePath
    from tiering.sources.oci import importer
    repo = f"{oci_node.prefix}-stop/tiny"
    slow = random.Random(1).randbytes(4 * MiB)
    _push(registry, repo, "v1", [(f"{MP}.weight.v1.raw", "slow.bin", slow),
                                 (f"{KIT}.model.v1.tar", "m", _hostile(_entry("../x"), b"escape"))])
    reads: list[int] = []
    read = importer._Checked.read
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def slow_read(self: importer._Checked, n: int = -1) -> bytes:   # a registry at 640 KiB/s for slow.bin
        if self.layer.size == len(slow):
            time.sleep(0.1)
            reads.append(self.n)
            return read(self, min(n, 64 << 10) if n is not None and n >= 0 else 64 << 10)
        return read(self, n)

    monkeypatch.setattr(importer._Checked, "read", slow_read)
    t = time.monotonic()
    with pytest.raises(UnsafePath, match=r"tar entry '\.\./x'"):
        with importer.pull_artifact(f"oci://{registry.host}/{repo}:v1", insecure=True, scratch_parent=scratch,
                                    env={"REGISTRY_AUTH_FILE": str(auth_file)}) as got:
            raise AssertionError(f"published {got}")
    assert list(scratch.iterdir()) == []
    assert time.monotonic() - t < 3, (time.monotonic() - t, len(reads))
    assert 0 < len(reads) < 20 and reads[-1] < len(slow) // 2, (len(reads), reads[-1:])


def test_a_killed_imports_scratch_is_removed_by_the_next_import_and_a_running_ones_is_not(
        cli, oci_node, registry: Registry, auth_file: Path, tmp_path: Path, scratch: Path) -> None:
    """An import SIGKILLed mid-way leaves its scratch directory (up to a checkpoint's size) behind; the
    next import removes it. A running import's directory, another user's and a symlink stay."""
    import os
    import signal
    import stat
    import sys
    import time
    from .conftest import NOBODY
    repo = f"{oci_node.prefix}-swept/tiny"
    _push(registry, repo, "v1", [(f"{MP}.weight.config.v1.raw", "config.json", b"{}"),
                                 (f"{MP}.weight.v1.raw", "w.bin", b"w" * 100_000)])
    holder = ("import sys, time\nfrom tiering.sources.oci.importer import pull_artifact\n"
              f"with pull_artifact({f'oci://{registry.host}/{repo}:v1'!r}, insecure=True,\n"
              f"                   env={{'REGISTRY_AUTH_FILE': {str(auth_file)!r}}}) as got:\n"
              "    print(got.dir, flush=True)\n    time.sleep(120)\n")
    env = {**os.environ, "TMPDIR": str(scratch)}
    kids = [subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    try:
        killed, running = (Path(k.stdout.readline().strip()) for k in kids)
        assert killed.parent == running.parent == scratch and (killed / "w.bin").stat().st_size == 100_000
        assert stat.S_IMODE(Path(f"{running}.lock").stat().st_mode) == 0o600   # (no other user can hold it)
        kids[0].send_signal(signal.SIGKILL)
        kids[0].wait(10)
        assert (killed / "w.bin").exists()   # (what the kill leaves behind)
        old = time.time() - 120   # (made over a minute ago: a younger one may be an import not locked yet)
        for d in (killed, running):
            os.utime(d, (old, old))
        young = scratch / "weightd-oci-import-young"
        young.mkdir()
        theirs = scratch / "weightd-oci-import-theirs"
        (theirs / "sub").mkdir(parents=True)
        os.chown(theirs, NOBODY, NOBODY)
        keep = tmp_path / "keep"
        keep.mkdir()
        (keep / "precious").write_text("x")
        (scratch / "weightd-oci-import-link").symlink_to(keep)
        r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--name", "acme/swept", "--json",
                env={"TMPDIR": str(scratch)})
        assert r.returncode == 0, r.stderr
        assert not killed.exists() and not Path(f"{killed}.lock").exists()
        assert (running / "w.bin").exists() and (theirs / "sub").is_dir() and (keep / "precious").exists()
        assert sorted(p.name for p in scratch.iterdir()) == sorted([running.name, f"{running.name}.lock", theirs.name,
                                                                    young.name, "weightd-oci-import-link"])
    finally:
        for k in kids:
            k.kill()
            k.wait(10)
            k.stdout.close()
