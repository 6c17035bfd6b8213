"""An OCI registry as the cold tier (issue 36), against a real registry: Debian's ``docker-registry``
(distribution 2.8) on 127.0.0.1 with filesystem storage and htpasswd basic auth, started per module,
driven through the installed CLI (``.venv/bin/weightd --no-daemon``) and the tier's own client;
never a mocked client."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tiering import build_manifest, verify_checkpoint
from tiering.sample import local_registry, make_checkpoint

from .conftest import ROOT, assert_one_line_error, stop_process

MiB = 1 << 20
USER, PASSWORD = "alice", "s3cret-pw"
WEIGHTD = ROOT / ".venv/bin/weightd"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

for _tool, _pkg in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils")):
    if shutil.which(_tool) is None:
        pytest.skip(f"{_tool} missing (Debian package {_pkg}; scripts/install-tools.sh installs it)",
                    allow_module_level=True)


class Registry:
    def __init__(self, host: str, root: Path) -> None:
        self.host, self.root = host, root

    def blob_path(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.root / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             auth: bool = True) -> tuple[int, dict[str, str], bytes]:
        url = path if "://" in path else f"http://{self.host}{path}"
        req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        if auth:
            req.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def manifest(self, repo: str, ref: str) -> tuple[dict, bytes]:
        st, _, body = self.call("GET", f"/v2/{repo}/manifests/{ref}", headers={"Accept": OCI_MANIFEST})
        assert st == 200, (st, body)
        return json.loads(body), body

    def put_manifest(self, repo: str, ref: str, raw: bytes) -> None:
        st, _, body = self.call("PUT", f"/v2/{repo}/manifests/{ref}", raw, {"Content-Type": OCI_MANIFEST})
        assert st == 201, (st, body)

    def push_blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        st, h, _ = self.call("POST", f"/v2/{repo}/blobs/uploads/", b"")
        assert st == 202
        loc = h["Location"]
        loc = loc if "://" in loc else f"http://{self.host}{loc}"
        st, _, body = self.call("PUT", loc + ("&" if "?" in loc else "?") + f"digest={digest}", data,
                                {"Content-Type": "application/octet-stream"})
        assert st == 201, (st, body)
        return digest


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    """A real registry on 127.0.0.1 (htpasswd basic auth, filesystem storage), killed after the module."""
    d = tmp_path_factory.mktemp("registry")
    pw = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
    (d / "htpasswd").write_text(pw)
    with local_registry(d, htpasswd=d / "htpasswd") as host:
        yield Registry(host, d / "data")


@pytest.fixture
def auth_file(tmp_path: Path, registry: Registry) -> Path:
    p = tmp_path / "auth.json"
    p.write_text(json.dumps({"auths": {registry.host: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode())
                                                        .decode()}}}))
    return p


@pytest.fixture
def oci_node(node_env, registry: Registry, isolated_env: dict[str, str], auth_file: Path):
    """node_env with [tiers.cold] url on the registry under a prefix of its own; the CLI's
    environment names the auth file."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    text = node_env.config.read_text().replace(
        f'[tiers.cold]\npath = "{node_env.cold}"\n',
        f'[tiers.cold]\nurl = "oci://{registry.host}/{prefix}"\ninsecure = true\nrange_size = "1MiB"\n'
        f'concurrency = 4\npart_size = "1MiB"\n')
    assert "oci://" in text
    node_env.config.write_text(text)
    node_env.prefix = prefix
    isolated_env["REGISTRY_AUTH_FILE"] = str(auth_file)
    return node_env


@pytest.fixture
def cli(oci_node, isolated_env: dict[str, str]):
    """The installed CLI, without a daemon, on the registry node's config."""
    def run(*args: object, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(WEIGHTD), "--no-daemon", "--config", str(oci_node.config), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, env={**isolated_env, **(env or {})})
    return run


_OPEN: list = []


def _cold(registry: Registry, prefix: str, auth_file: Path, **kw):
    """The tier's own client on the registry (closed after the test)."""
    from tiering.sources.oci.cold import OciCold
    c = OciCold(f"oci://{registry.host}/{prefix}", insecure=True, env={"REGISTRY_AUTH_FILE": str(auth_file)}, **kw)
    _OPEN.append(c)
    return c


@pytest.fixture(autouse=True)
def _clients_closed():
    yield
    while _OPEN:
        _OPEN.pop().close()


def test_publish_preload_round_trip_through_the_installed_cli(cli, oci_node, registry: Registry,
                                                              tmp_path: Path) -> None:
    if not WEIGHTD.exists():
        pytest.skip(f"{WEIGHTD} missing (make install-venv)")
    src = make_checkpoint(tmp_path / "src", total_bytes=12 * MiB, shards=2, layers=4, seed="oci")
    r = cli("publish", src, "--name", "acme/m", "--version", "v1", "--json")
    assert r.returncode == 0, r.stderr
    pub = json.loads(r.stdout)
    repo = f"{oci_node.prefix}/acme/m"
    assert pub["path"] == f"oci://{registry.host}/{repo}:v1" and not pub["unchanged"]
    again = cli("publish", src, "--name", "acme/m", "--version", "v1", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["unchanged"], again.stderr
    # the artifact is a ModelPack one: artifactType, the config, one layer per file with its path
    doc, _ = registry.manifest(repo, "v1")
    m = build_manifest(src)
    assert doc["artifactType"] == ARTIFACT_TYPE
    assert doc["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    layers = {x["annotations"]["org.cncf.model.filepath"]: x for x in doc["layers"]}
    assert set(layers) == {f.path for f in m.files} | {".weightd/manifest.json"}
    for f in m.files:
        assert layers[f.path]["size"] == f.size
        assert layers[f.path]["digest"] == "sha256:" + hashlib.sha256((src / f.path).read_bytes()).hexdigest()
        if f.path.endswith(".safetensors"):
            assert layers[f.path]["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
    assert layers[".weightd/manifest.json"]["mediaType"] == "application/vnd.weightd.manifest.v1+json"
    ls = cli("ls", "--json")
    assert ls.returncode == 0 and "acme/m" in ls.stdout, ls.stderr
    r = cli("preload", "acme/m@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["bytes_by_source"]["cold"] == m.total_bytes and rep["store"]["bytes_read"] >= m.total_bytes
    assert not verify_checkpoint(Path(rep["path"]), m).problems
    # a version another publisher holds under the same tag is refused, nothing pushed over it
    other = make_checkpoint(tmp_path / "other", total_bytes=2 * MiB, shards=1, layers=2, seed="o")
    assert_one_line_error(cli("publish", other, "--name", "acme/m", "--version", "v1"), 2,
                          "already published with different content")
    assert registry.manifest(repo, "v1")[0] == doc
    assert_one_line_error(cli("preload", "acme/m@v9"), 3, "acme/m@v9")


def test_a_second_version_pushes_only_the_blobs_the_registry_lacks(registry: Registry, auth_file: Path,
                                                                   tmp_path: Path) -> None:
    from tiering.sample import edited_copy
    a = make_checkpoint(tmp_path / "a", total_bytes=8 * MiB, shards=2, layers=4, seed="skip")
    b = tmp_path / "b"
    assert edited_copy(a, b, larger_than=64 << 10, every=1, count=1)
    c = _cold(registry, f"t{uuid.uuid4().hex[:8]}", auth_file, chunk_bytes=1 * MiB)
    ma = build_manifest(a).with_labels(name="acme/s", version="v1", published_at="2026-12-05T00:00:00Z")
    mb = build_manifest(b).with_labels(name="acme/s", version="v2", published_at="2026-12-05T00:00:00Z")
    assert c.publish(a, ma, [(f.path, a / f.path) for f in ma.files])
    before = c.stats.snapshot()["bytes_written"]
    assert c.publish(b, mb, [(f.path, b / f.path) for f in mb.files])
    sent = c.stats.snapshot()["bytes_written"] - before
    same = {f.path for f in mb.files if (a / f.path).read_bytes() == (b / f.path).read_bytes()}
    changed = sum(f.size for f in mb.files if f.path not in same)
    assert same and changed <= sent < changed + 64 * 1024, (sent, changed)   # (+ the manifests and config)
    assert c.versions("acme/s") == ["v1", "v2"]


def _flip(path: Path, offset: int) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_a_damaged_blob_in_the_registrys_storage_is_refused(cli, oci_node, registry: Registry,
                                                              tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="rot")
    assert cli("publish", src, "--name", "acme/rot", "--version", "v1").returncode == 0
    doc, _ = registry.manifest(f"{oci_node.prefix}/acme/rot", "v1")
    layers = {x["annotations"]["org.cncf.model.filepath"]: x for x in doc["layers"]}
    weights = layers["model.safetensors"]
    _flip(registry.blob_path(weights["digest"]), weights["size"] // 2)
    r = cli("preload", "acme/rot@v1", "--tier", "warm")
    assert_one_line_error(r, 5, "does not match the manifest")
    assert not (oci_node.warm / "acme/rot/v1").exists()
    # weightd's own manifest blob damaged: its sha256 refuses it before it is parsed
    own = layers[".weightd/manifest.json"]
    _flip(registry.blob_path(own["digest"]), 10)
    assert_one_line_error(cli("preload", "acme/rot@v1", "--tier", "warm"), 5, "not that digest")


def test_a_blob_whose_bytes_are_not_its_digest_is_refused_even_when_every_part_matches(
        cli, oci_node, registry: Registry, tmp_path: Path) -> None:
    """The sha256 check on its own: a layer points at a blob whose stored bytes are the right file's
    (every xxh3 part matches) but not that blob's digest."""
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="sha")
    assert cli("publish", src, "--name", "acme/sha", "--version", "v1").returncode == 0
    repo = f"{oci_node.prefix}/acme/sha"
    doc, _ = registry.manifest(repo, "v1")
    layer = next(x for x in doc["layers"] if x["annotations"]["org.cncf.model.filepath"] == "model.safetensors")
    decoy = registry.push_blob(repo, os.urandom(layer["size"]))
    shutil.copyfile(registry.blob_path(layer["digest"]), registry.blob_path(decoy))
    layer["digest"] = decoy
    registry.put_manifest(repo, "v1", json.dumps(doc).encode())
    r = cli("preload", "acme/sha@v1", "--tier", "warm")
    assert_one_line_error(r, 5, "not the blob's digest", decoy)
    assert not (oci_node.warm / "acme/sha/v1").exists()


def test_a_tag_moved_to_other_content_is_refused(cli, oci_node, registry: Registry, auth_file: Path,
                                                 tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "a", total_bytes=2 * MiB, shards=1, layers=2, seed="ta")
    b = make_checkpoint(tmp_path / "b", total_bytes=2 * MiB, shards=1, layers=2, seed="tb")
    assert cli("publish", a, "--name", "acme/t", "--version", "v1").returncode == 0
    assert cli("publish", b, "--name", "acme/t", "--version", "v2").returncode == 0
    repo = f"{oci_node.prefix}/acme/t"
    c = _cold(registry, oci_node.prefix, auth_file)
    m1 = c.read_manifest("acme/t", "v1")
    _, raw_v1 = registry.manifest(repo, "v1")
    _, raw_v2 = registry.manifest(repo, "v2")
    # v1's tag moved onto v2's artifact: its manifest names another version, refused by every reader
    registry.put_manifest(repo, "v1", raw_v2)
    assert_one_line_error(cli("preload", "acme/t@v1", "--tier", "warm"), 2, "describes acme/t@v2, not acme/t@v1")
    assert_one_line_error(cli("publish", a, "--name", "acme/t", "--version", "v1"), 2, "already published")
    # v1's tag moved onto other content labelled v1 (b's bytes): a reader that has read v1 refuses it, and a
    # publish of v1's content is refused (versions are immutable), never pushed over it
    from tiering.sources.oci.publish import publish
    other = _cold(registry, oci_node.prefix + "x", auth_file)
    mb1 = build_manifest(b).with_labels(name="acme/t", version="v1", published_at="2026-12-05T00:00:00Z")
    registry.put_manifest(repo, "v1", raw_v1)
    assert publish(other, b, mb1, [(f.path, b / f.path) for f in mb1.files])
    doc, raw = registry.manifest(f"{oci_node.prefix}x/acme/t", "v1")
    for d in [doc["config"]] + doc["layers"]:   # (the blobs into the first repository)
        registry.call("POST", f"/v2/{repo}/blobs/uploads/?mount={d['digest']}&from={oci_node.prefix}x/acme/t", b"")
    registry.put_manifest(repo, "v1", raw)
    from tiering.errors import VersionConflict
    with pytest.raises(VersionConflict, match="moved"):
        c.read_manifest("acme/t", "v1")
    assert m1 is not None
    assert_one_line_error(cli("publish", a, "--name", "acme/t", "--version", "v1"), 2,
                          "already published with different content")


def test_credentials_refused_missing_or_a_registry_down_are_one_line_each(cli, oci_node, registry: Registry,
                                                                          tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=1 * MiB, shards=1, layers=2, seed="auth")
    assert cli("publish", src, "--name", "acme/a", "--version", "v1").returncode == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"auths": {f"http://{registry.host}": {"username": USER, "password": "wrong"}}}))
    for args in (("preload", "acme/a@v1", "--tier", "warm"), ("ls",), ("publish", src, "--name", "acme/a",
                                                                        "--version", "v2")):
        r = cli(*args, env={"REGISTRY_AUTH_FILE": str(bad)})
        assert_one_line_error(r, 2, "refused the credentials of user alice", str(bad))
        assert "wrong" not in r.stderr
    none = tmp_path / "none.json"
    none.write_text('{"auths": {}}')
    assert_one_line_error(cli("preload", "acme/a@v1", env={"REGISTRY_AUTH_FILE": str(none)}), 2,
                          "asks for credentials", "docker login")
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert_one_line_error(cli("preload", "acme/a@v1", env={"REGISTRY_AUTH_FILE": str(junk)}), 2,
                          "not a registry auth file")
    # nothing listens there: one line, never an empty catalog
    down = oci_node.config.read_text().replace(registry.host, f"127.0.0.1:{_free_port()}")
    oci_node.config.write_text(down)
    for args in (("preload", "acme/a@v1"), ("ls",)):
        t0 = time.monotonic()
        assert_one_line_error(cli(*args), 2, "cannot reach the registry", "connection refused")
        assert time.monotonic() - t0 < 20


def test_a_preload_killed_midway_resumes_with_the_verified_parts(cli, oci_node, isolated_env,
                                                                  tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=2, layers=6, seed="resume")
    assert cli("publish", src, "--name", "acme/k", "--version", "v1").returncode == 0
    text = oci_node.config.read_text()
    oci_node.config.write_text(text.replace("concurrency = 4\n", 'concurrency = 4\nbandwidth = "6MiB"\n'))
    staging = oci_node.warm / ".staging" / "acme--k@v1.resumable"
    proc = subprocess.Popen([str(WEIGHTD), "--no-daemon", "--config", str(oci_node.config), "preload", "acme/k@v1",
                             "--tier", "warm"], env=isolated_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if staging.is_dir() and sum(1 for _ in staging.rglob("*.safetensors")) == 2:
                break
            time.sleep(0.05)
        time.sleep(1.5)   # some ranges in, most not
        assert proc.poll() is None, "finished before it could be killed: lower the bandwidth"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop_process(proc)
    assert staging.is_dir()
    oci_node.config.write_text(text)
    r = cli("preload", "acme/k@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    m = build_manifest(src)
    assert 0 < rep["resumed_bytes"] < m.total_bytes, rep
    assert rep["bytes_by_source"]["cold"] + rep["resumed_bytes"] <= m.total_bytes
    assert not verify_checkpoint(Path(rep["path"]), m).problems and not staging.exists()


def test_a_preload_is_bounded_by_its_timeout(cli, oci_node, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=1, layers=4, seed="slow")
    assert cli("publish", src, "--name", "acme/slow", "--version", "v1").returncode == 0
    text = oci_node.config.read_text()
    oci_node.config.write_text(text.replace("concurrency = 4\n", 'concurrency = 4\nbandwidth = "2MiB"\n'))
    t0 = time.monotonic()
    r = cli("preload", "acme/slow@v1", "--tier", "warm", "--timeout", "2")
    assert_one_line_error(r, 4)
    assert time.monotonic() - t0 < 10


def test_names_come_from_the_catalog_and_skip_what_is_not_weightds(registry: Registry, auth_file: Path,
                                                                   tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    c = _cold(registry, prefix, auth_file)
    src = make_checkpoint(tmp_path / "src", total_bytes=1 * MiB, shards=1, layers=2, seed="names")
    for name in ("acme/one", "solo"):
        m = build_manifest(src).with_labels(name=name, version="v1", published_at="2026-12-05T00:00:00Z")
        assert c.publish(src, m, [(f.path, src / f.path) for f in m.files])
    # another tool's artifact in the prefix: not a version, not a name
    repo = f"{prefix}/foreign"
    cfg = registry.push_blob(repo, b"{}")
    lay = registry.push_blob(repo, b"hello")
    registry.put_manifest(repo, "v1", json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": "application/vnd.example",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": cfg, "size": 2},
        "layers": [{"mediaType": "text/plain", "digest": lay, "size": 5}]}).encode())
    assert c.names() == ["acme/one", "solo"]
    assert c.versions("foreign") == [] and c.versions("nothing") == []
    from tiering.errors import BadInput
    with pytest.raises(BadInput, match="without weightd's manifest"):
        c.read_manifest("foreign", "v1")
    # a name no repository could hold is escaped (tests/test_oci_names.py), not refused: here it is absent
    assert c.read_manifest("Acme/Up", "v1") is None


def test_a_delta_update_fetches_only_the_changed_ranges(cli, oci_node, tmp_path: Path) -> None:
    """v2 differs from v1 in two tensors: with v1 on the node, the registry serves those bytes only (the
    report's cold bytes are what the registry sent, counted as the bodies arrive)."""
    from tiering.sample import edited_copy
    a = make_checkpoint(tmp_path / "a", total_bytes=16 * MiB, shards=2, layers=4, seed="da")
    b = tmp_path / "b"
    changed = sum(n for _, _, n in edited_copy(a, b, larger_than=64 << 10, every=3, count=2))
    assert cli("publish", a, "--name", "acme/d", "--version", "v1").returncode == 0
    assert cli("publish", b, "--name", "acme/d", "--version", "v2").returncode == 0
    assert cli("preload", "acme/d@v1", "--tier", "warm").returncode == 0
    r = cli("preload", "acme/d@v2", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    mb = build_manifest(b)
    assert rep["bytes_by_source"]["cold"] == changed == rep["store"]["bytes_read"], rep
    assert rep["bytes_by_source"]["local_reuse"] == mb.total_bytes - changed
    assert rep["delta"]["donors"] == ["acme/d@v1"] and rep["store"]["requests"]["get"] <= 2 + 3
    assert not verify_checkpoint(Path(rep["path"]), mb).problems


def test_publish_and_preload_through_a_daemon(oci_node, isolated_env, tmp_path: Path) -> None:
    from .test_daemon import DaemonProc
    d = DaemonProc(oci_node, isolated_env, tmp_path)
    try:
        def wd(*args: object) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "weightd", "--daemon-only", "--config", str(oci_node.config),
                                   *map(str, args)], capture_output=True, text=True, timeout=120, env=isolated_env,
                                  cwd=ROOT)
        src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="daemon")
        r = wd("publish", src, "--name", "acme/dm", "--version", "v1")
        assert r.returncode == 0, (r.stderr, d.log_path.read_text()[-2000:])
        r = wd("preload", "acme/dm@v1", "--tier", "hot", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["bytes_by_source"]["cold"] == build_manifest(src).total_bytes
        assert_one_line_error(wd("preload", "acme/dm@v2"), 3, "acme/dm@v2")
        assert d.metric('weightd_objstore_requests_total{op="get"}') > 0
    finally:
        d.stop()


def oci_layout(layout_dir: Path, layers: list[tuple[str, "str | None", bytes]], config: tuple[str, bytes], tag: str,
               artifact_type: str | None = None) -> None:
    """An OCI image layout directory made by hand (what skopeo copies from): ``layers`` as (media type,
    path annotation or None, bytes), ``config`` as (media type, bytes), one manifest tagged ``tag``."""
    blobs = layout_dir / "blobs/sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes) -> dict:
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        return {"digest": f"sha256:{h}", "size": len(data)}
    descs = [{"mediaType": mt, **blob(data), **({"annotations": {"org.cncf.model.filepath": path}} if path else {})}
             for mt, path, data in layers]
    doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, **({"artifactType": artifact_type} if artifact_type else {}),
           "config": {"mediaType": config[0], **blob(config[1])}, "layers": descs}
    ref = {"mediaType": OCI_MANIFEST, **blob(json.dumps(doc).encode()),
           "annotations": {"org.opencontainers.image.ref.name": tag}}
    (layout_dir / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout_dir / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [ref]}))


def _modelpack_layout(src: Path, layout_dir: Path, tag: str) -> None:
    """``src`` as a ModelPack artifact (one raw layer per file) in an OCI image layout directory."""
    files = [(str(p.relative_to(src)), p.read_bytes()) for p in sorted(x for x in src.rglob("*") if x.is_file())]
    layers = [(f"application/vnd.cncf.model.{'weight' if rel.endswith('.safetensors') else 'weight.config'}.v1.raw",
               rel, data) for rel, data in files]
    config = json.dumps({"descriptor": {"name": "tiny"}, "config": {}, "modelfs": {
        "type": "layers", "diffIds": [f"sha256:{hashlib.sha256(d).hexdigest()}" for _, d in files]}}).encode()
    oci_layout(layout_dir, layers, ("application/vnd.cncf.model.config.v1+json", config), tag, ARTIFACT_TYPE)


def test_publish_imports_a_modelpack_artifact_another_tool_pushed(cli, oci_node, registry: Registry,
                                                                    tmp_path: Path) -> None:
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo missing (Debian package skopeo; scripts/install-tools.sh installs it)")
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=2, layers=2, seed="import")
    _modelpack_layout(src, tmp_path / "layout", "v1")
    repo = f"{oci_node.prefix}-src/tiny"
    subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", "--dest-creds", f"{USER}:{PASSWORD}",
                    f"oci:{tmp_path / 'layout'}:v1", f"docker://{registry.host}/{repo}:v1"], check=True,
                   capture_output=True, timeout=120)
    r = cli("publish", f"oci://{registry.host}/{repo}:v1", "--json")
    assert r.returncode == 0, r.stderr
    pub = json.loads(r.stdout)
    assert (pub["name"], pub["version"]) == (f"{oci_node.prefix}-src/tiny", "v1") and not pub["unchanged"]
    assert pub["digest"] == build_manifest(src).digest
    r = cli("preload", f"{oci_node.prefix}-src/tiny@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    assert not verify_checkpoint(Path(json.loads(r.stdout)["path"]), build_manifest(src)).problems
    # by digest, under a name and version of its own; a damaged blob is refused and nothing is published
    _, raw = registry.manifest(repo, "v1")
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    doc = json.loads(raw)
    weights = next(x for x in doc["layers"] if x["annotations"]["org.cncf.model.filepath"].endswith(".safetensors"))
    _flip(registry.blob_path(weights["digest"]), weights["size"] - 1)
    r = cli("publish", f"oci://{registry.host}/{repo}@{digest}", "--name", "acme/imported", "--version", "v2")
    assert_one_line_error(r, 5, "not the blob's digest")
    assert_one_line_error(cli("preload", "acme/imported@v2"), 3)
    assert_one_line_error(cli("publish", f"oci://{registry.host}/{repo}"), 2, "expected oci://REGISTRY/REPO:TAG")
    assert_one_line_error(cli("publish", f"oci://{registry.host}/{repo}:v404"), 3, "no such artifact")
