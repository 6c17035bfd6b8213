"""Object storage as the cold tier (issue #16), the store layer: a real S3-protocol server
(``moto[server]``, ThreadedMotoServer on 127.0.0.1), never a mocked client."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tiering import Dir, build_manifest, verify_checkpoint
from tiering.errors import Busy, IntegrityError, VersionConflict
from tiering.sample import make_checkpoint

MiB = 1 << 20
moto_server = pytest.importorskip("moto.server", reason="moto[server] missing (pip install -e .[test])")
obstore = pytest.importorskip("obstore")


@pytest.fixture(scope="module")
def s3_endpoint():
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    old = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    try:
        yield f"http://{host}:{port}"
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def bucket(s3_endpoint) -> str:
    import boto3
    name = f"weightd-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


def cold(endpoint: str, bucket: str, **kw):
    from tiering.objstore import ObjectCold
    return ObjectCold(f"s3://{bucket}/models", endpoint=endpoint, region="us-east-1", **kw)


def labelled(src: Path, name: str, version: str):
    return build_manifest(src).with_labels(name=name, version=version, published_at="2026-12-04T00:00:00.000000Z")


def files_of(src: Path, m) -> list[tuple[str, Path]]:
    return [(f.path, src / f.path) for f in m.files]


def open_dir(p: Path) -> Dir:
    p.mkdir(parents=True, exist_ok=True)
    return Dir(os.open(p, os.O_RDONLY | os.O_DIRECTORY), p)


def test_publish_then_fetch_round_trip_hashing_as_bytes_arrive(s3_endpoint, bucket, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=3, layers=6, seed="rt")
    m = labelled(src, "acme/m", "v1")
    c = cold(s3_endpoint, bucket, range_bytes=4 * MiB, concurrency=4, part_bytes=5 * MiB)
    assert c.publish(src, m, files_of(src, m)) is True
    assert c.versions("acme/m") == ["v1"] and c.read_manifest("acme/m", "v1").digest == m.digest
    assert c.read_manifest("acme/m", "v2") is None
    assert c.publish(src, m, files_of(src, m)) is False  # the same content again: a no-op
    before = c.stats.bytes_read
    with open_dir(tmp_path / "dst") as d:
        got = c.fetch(m, d, progress=lambda n: None)
    assert got == m.total_bytes and c.stats.bytes_read - before == m.total_bytes + 0  # (heads carry no bytes)
    assert not verify_checkpoint(tmp_path / "dst", m).problems
    # the claim object is gone and nothing but the layout is under the version
    keys = sorted(x["path"] for x in obstore.list(c.store, prefix="acme/m/v1/").collect())
    assert "acme/m/v1/.weightd/manifest.json" in keys and not any("publishing" in k for k in keys)


def test_a_version_is_invisible_until_its_manifest_exists(s3_endpoint, bucket, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="half")
    c = cold(s3_endpoint, bucket)
    obstore.put(c.store, "acme/h/v1/model.safetensors", (src / "model.safetensors").read_bytes())
    assert c.versions("acme/h") == [] and c.read_manifest("acme/h", "v1") is None


def test_a_second_publisher_of_the_same_version_cannot_win(s3_endpoint, bucket, tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "a", total_bytes=2 * MiB, shards=1, layers=2, seed="a")
    b = make_checkpoint(tmp_path / "b", total_bytes=2 * MiB, shards=1, layers=2, seed="b")
    ma, mb = labelled(a, "acme/c", "v1"), labelled(b, "acme/c", "v1")
    c = cold(s3_endpoint, bucket)
    # another publisher holds the claim (uploading): refused before a byte is written
    c._claim("acme/c/v1/.weightd/publishing", "acme/c", "v1")
    with pytest.raises(Busy, match="being published by"):
        c.publish(b, mb, files_of(b, mb))
    obstore.delete(c.store, "acme/c/v1/.weightd/publishing")
    assert c.publish(a, ma, files_of(a, ma))
    with pytest.raises(VersionConflict):  # published meanwhile with other content
        c.publish(b, mb, files_of(b, mb))
    with open_dir(tmp_path / "dst") as d:
        c.fetch(ma, d)
    assert not verify_checkpoint(tmp_path / "dst", ma).problems  # a's bytes, untouched by b


def test_rot_in_the_store_is_caught_naming_the_part(s3_endpoint, bucket, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="rot")
    m = labelled(src, "acme/r", "v1")
    c = cold(s3_endpoint, bucket)
    c.publish(src, m, files_of(src, m))
    data = bytearray((src / "model.safetensors").read_bytes())
    data[-10] ^= 0xFF  # same size, one flipped byte
    obstore.put(c.store, "acme/r/v1/model.safetensors", bytes(data))
    with open_dir(tmp_path / "dst") as d, pytest.raises(IntegrityError, match="tensor .* does not match the manifest"):
        c.fetch(m, d)


def test_an_object_replaced_mid_download_is_an_error(s3_endpoint, bucket, tmp_path: Path) -> None:
    from tiering.objstore import ObjectChanged, _groups
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="chg")
    m = labelled(src, "acme/x", "v1")
    c = cold(s3_endpoint, bucket)
    c.publish(src, m, files_of(src, m))
    key = "acme/x/v1/model.safetensors"
    tag = obstore.head(c.store, key)["e_tag"]
    obstore.put(c.store, key, (src / "model.safetensors").read_bytes()[::-1])  # replaced after the HEAD
    f = next(f for f in m.files if f.path == "model.safetensors")
    with open_dir(tmp_path / "dst") as d:
        fd = d.create("model.safetensors", 0o600, flags=os.O_RDWR)
        try:
            with pytest.raises(ObjectChanged, match="changed during the download"):
                c._fetch_group(f, key, fd, _groups(f, m.chunk_size, c.range_bytes)[0], tag, None, None)
        finally:
            os.close(fd)


def test_a_missing_bucket_and_bad_urls_say_so(s3_endpoint, tmp_path: Path) -> None:
    from tiering.errors import BadInput
    from tiering.objstore import ObjectLocation, StoreSetupError
    c = cold(s3_endpoint, "no-such-bucket-here")
    with pytest.raises(StoreSetupError, match="the bucket no-such-bucket-here does not exist"):
        c.versions("acme/m")
    for bad in ("s3:///x", "http://b/x", "s3://b/../x"):
        with pytest.raises(BadInput):
            ObjectLocation.parse(bad)
    assert ObjectLocation.parse("s3://b/a/b/") == ObjectLocation("b", "a/b")


def test_ranges_follow_the_parts_and_cover_every_byte(tmp_path: Path) -> None:
    from tiering.objstore import _groups
    src = make_checkpoint(tmp_path / "src", total_bytes=12 * MiB, shards=1, layers=4, seed="g")
    m = build_manifest(src)
    for f in m.files:
        for rb in (1 * MiB, 3 * MiB, 64 * MiB):
            spans = sorted((s, e) for g in _groups(f, m.chunk_size, rb) for s, e, _ in g.ranges)
            assert spans[0][0] == 0 if f.size else not spans
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and (not spans or spans[-1][1] == f.size)
            assert all(e - s <= rb for s, e in spans)
            groups = _groups(f, m.chunk_size, rb)
            owned = [{p.label for _, _, ps in g.ranges for p, _, _ in ps} for g in groups]
            # a part is never split across two workers (its hash is fed in order by one)
            assert sum(len(o) for o in owned) == len(set().union(*owned)) == len(f.parts(m.chunk_size))


def test_shared_credentials_file(tmp_path: Path) -> None:
    from tiering.objstore import shared_credentials
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n[ops]\naws_access_key_id = C\n"
                     "aws_secret_access_key = D\naws_session_token = T\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(creds)}
    assert shared_credentials(env) == {"access_key_id": "A", "secret_access_key": "B"}
    assert shared_credentials({**env, "AWS_PROFILE": "ops"}) == {"access_key_id": "C", "secret_access_key": "D",
                                                                  "token": "T"}
    assert shared_credentials({**env, "AWS_ACCESS_KEY_ID": "env"}) == {}  # the environment wins


# -- the whole CLI on an object-store cold tier -----------------------------------------------------------

@pytest.fixture
def s3_node(node_env, s3_endpoint, bucket, isolated_env):
    """node_env with [tiers.cold] url on the moto server; the CLI's environment carries the keys."""
    text = node_env.config.read_text().replace(f'[tiers.cold]\npath = "{node_env.cold}"\n',
                                               f'[tiers.cold]\nurl = "s3://{bucket}/models"\nendpoint = "{s3_endpoint}"\n'
                                               f'region = "us-east-1"\nrange_size = "1MiB"\nconcurrency = 4\n')
    assert "url = " in text
    node_env.config.write_text(text)
    isolated_env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    return node_env


def test_publish_preload_ls_and_wait_from_s3_through_the_cli(s3_node, wd, isolated_env, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys
    src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=4, seed="cli")
    r = wd("publish", src, "--name", "acme/s3", "--version", "v1", "--json")
    assert r.returncode == 0, r.stderr
    pub = json.loads(r.stdout)
    assert pub["path"].endswith("/models/acme/s3/v1") and pub["path"].startswith("s3://") and not pub["unchanged"]
    assert json.loads(wd("publish", src, "--name", "acme/s3", "--version", "v1", "--json").stdout)["unchanged"]
    other = make_checkpoint(tmp_path / "other", total_bytes=2 * MiB, shards=1, layers=2, seed="o")
    r = wd("publish", other, "--name", "acme/s3", "--version", "v1")
    assert r.returncode == 2 and "already published with different content" in r.stderr, r.stderr
    r = wd("preload", "acme/s3", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["version"] == "v1" and rep["bytes_by_source"]["cold"] == rep["bytes"] == pub["bytes"]
    assert not verify_checkpoint(Path(rep["path"]), build_manifest(src)).problems
    ls = json.loads(wd("ls", "--json").stdout)["versions"]
    assert [(v["name"], v["version"], v["local"]) for v in ls] == [("acme/s3", "v1", ["warm"])]
    assert wd("preload", "acme/none@v1").returncode == 3
    # --wait polls for the manifest object: published by another process while it waits
    waiter = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(s3_node.config), "preload",
                               "acme/s3@v2", "--tier", "hot", "--wait", "--timeout", "60"],
                              env=isolated_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        import time
        time.sleep(1.5)
        assert waiter.poll() is None
        v2 = make_checkpoint(tmp_path / "v2", total_bytes=4 * MiB, shards=1, layers=2, seed="v2")
        assert wd("publish", v2, "--name", "acme/s3", "--version", "v2").returncode == 0
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, err
    assert out.strip().splitlines()[-1] == str(s3_node.hot / "acme/s3/v2")
    doc = json.loads(wd("doctor", "--sample-s", "0.1", "--no-probe", "--json").stdout)
    assert doc["measurements"]["weightd"]["cold_checked_versions"] == 2
    assert not [f for f in doc["findings"] if f["id"] == "cold-unreadable"]


def test_s3_config_errors_name_the_key(weightd, tmp_path: Path) -> None:
    from .conftest import NodeEnv
    env = NodeEnv(tmp_path)
    base = env.config.read_text()
    for cold, needle in (
            (f'[tiers.cold]\npath = "{env.cold}"\nurl = "s3://b/p"\n', "give path (shared storage) or url"),
            ('[tiers.cold]\nurl = "http://b/p"\n', "expected s3://BUCKET[/PREFIX]"),
            ('[tiers.cold]\nurl = "s3://b/p"\npart_size = "1MiB"\n', "part_size must be from 5MiB to 5GiB")):
        env.config.write_text(base.replace(f'[tiers.cold]\npath = "{env.cold}"\n', cold))
        r = weightd("--config", env.config, "config", "show")
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
