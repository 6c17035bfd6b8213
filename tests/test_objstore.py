"""Object storage as the cold tier (issue #16), the store layer: a real S3-protocol server
(``moto[server]``, ThreadedMotoServer on 127.0.0.1), never a mocked client."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tiering import Dir, build_manifest, verify_checkpoint
from tiering.errors import IntegrityError
from tiering.sample import make_checkpoint

from .conftest import stop_process

MiB = 1 << 20
pytest.importorskip("moto.server", reason="moto[server] missing (pip install -e .[test])")
obstore = pytest.importorskip("obstore")


def cold(endpoint: str, bucket: str, **kw):
    from tiering.sources.s3.cold import ObjectCold
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


def test_every_file_s_sha256_is_taken_in_order_as_its_ranges_arrive(s3_endpoint, bucket, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A signed version's digests from the download itself: ranges arrive out of order (many small
    ones, 4 at a time), some parts are already in the directory (not asked for, read there), and
    each file's SHA-256 is still that of its whole content; nothing is held beyond the hash."""
    import hashlib

    from tiering.sources.ranged.digest import InOrderDigest
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=2, layers=8, seed="sha")
    m = labelled(src, "acme/sha", "v1")
    c = cold(s3_endpoint, bucket, range_bytes=1 * MiB, concurrency=4)
    c.publish(src, m, files_of(src, m))
    want = {f.path: hashlib.sha256((src / f.path).read_bytes()).hexdigest() for f in m.files}
    read_back: list[int] = []
    real = InOrderDigest.hexdigest

    def counted(self) -> str:
        read_back.append(self.read_back)
        return real(self)
    monkeypatch.setattr(InOrderDigest, "hexdigest", counted)
    digests: dict[str, str] = {}
    with open_dir(tmp_path / "dst") as d:
        assert c.fetch(m, d, crypto=hashlib.sha256, digests=digests) == m.total_bytes
    assert digests == want
    assert sum(read_back) < m.total_bytes   # most bytes hashed as they streamed, not read back
    # some parts already here (as a delta or a resumed transfer leaves them): read from the file
    big = max(m.files, key=lambda f: f.size)
    kept = big.parts(m.chunk_size)[::2]
    body, partial = (src / big.path).read_bytes(), bytearray(big.size)   # only the kept parts' bytes here
    for p in kept:
        partial[p.begin:p.end] = body[p.begin:p.end]
    with open_dir(tmp_path / "dst2") as d:
        (tmp_path / "dst2" / big.path).write_bytes(partial)
        digests = {}
        got = c.fetch(m, d, crypto=hashlib.sha256, digests=digests, have={big.path: {p.label for p in kept}})
    assert got < m.total_bytes and digests == want
    # the whole file here: no request for it, its digest read from it
    with open_dir(tmp_path / "dst3") as d:
        (tmp_path / "dst3" / big.path).write_bytes((src / big.path).read_bytes())
        digests = {}
        c.fetch(m, d, crypto=hashlib.sha256, digests=digests,
                have={big.path: {p.label for p in big.parts(m.chunk_size)}})
    assert digests == want


def test_a_version_is_invisible_until_its_manifest_exists(s3_endpoint, bucket, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="half")
    c = cold(s3_endpoint, bucket)
    obstore.put(c.store, "acme/h/v1/model.safetensors", (src / "model.safetensors").read_bytes())
    assert c.versions("acme/h") == [] and c.read_manifest("acme/h", "v1") is None


#: a real publisher process: ROOT ENDPOINT BUCKET SRC NAME, publishing SRC as NAME@v1 (tests/test_objstore_stale_claim.py too)
PUBLISHER = """
import sys
from pathlib import Path
root, endpoint, bucket, src, name = sys.argv[1:6]
sys.path.insert(0, root)
from tiering import build_manifest
from tiering.errors import Busy, VersionConflict
from tiering.sources.s3.cold import ObjectCold
src = Path(src)
m = build_manifest(src).with_labels(name=name, version="v1", published_at="2026-12-04T00:00:00.000000Z")
c = ObjectCold(f"s3://{bucket}/models", endpoint=endpoint, region="us-east-1")
try:
    c.publish(src, m, [(f.path, src / f.path) for f in m.files])
    print("published")
except Busy as exc:
    print("busy", exc)
except VersionConflict as exc:
    print("conflict", exc)
"""


def test_a_second_publisher_of_the_same_version_cannot_win(s3_endpoint, bucket, tmp_path: Path) -> None:
    """Two publisher processes against the same S3 server: the second starts while the first is
    uploading (the first is stopped once its claim is in the store) and is refused naming the first's
    pid; once the first finishes, the second's other content is a conflict; the store holds the first's."""
    import signal
    import subprocess
    import sys
    import time
    root = str(Path(__file__).resolve().parent.parent)
    a = make_checkpoint(tmp_path / "a", total_bytes=32 * MiB, shards=2, layers=2, seed="a")
    b = make_checkpoint(tmp_path / "b", total_bytes=2 * MiB, shards=1, layers=2, seed="b")
    c = cold(s3_endpoint, bucket)
    claim = "models/acme/c/v1/.weightd/publishing"

    def keys() -> list[str]:
        return [x["path"] for x in obstore.list(c.store, prefix="acme/c/v1/").collect()]
    first = subprocess.Popen([sys.executable, "-c", PUBLISHER, root, s3_endpoint, bucket, str(a), "acme/c"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(k.endswith(".weightd/publishing") for k in keys()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.005)
        first.send_signal(signal.SIGSTOP)   # mid-publish, its claim held
        assert c.read_manifest("acme/c", "v1") is None, claim
        second = subprocess.run([sys.executable, "-c", PUBLISHER, root, s3_endpoint, bucket, str(b), "acme/c"],
                                capture_output=True, text=True, timeout=60)
        assert second.stdout.startswith("busy") and "being published by" in second.stdout, second
        assert f"pid {first.pid}" in second.stdout, (first.pid, second.stdout)   # the racing process, named
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=120)
    assert out.strip() == "published", err
    again = subprocess.run([sys.executable, "-c", PUBLISHER, root, s3_endpoint, bucket, str(b), "acme/c"],
                           capture_output=True, text=True, timeout=60)
    assert again.stdout.startswith("conflict"), again   # published meanwhile with other content
    ma = labelled(a, "acme/c", "v1")
    with open_dir(tmp_path / "dst") as d:
        c.fetch(ma, d)
    assert not verify_checkpoint(tmp_path / "dst", ma).problems  # a's bytes, untouched by b
    assert not any("publishing" in k for k in keys())


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
    from tiering.sources.ranged.cut import groups as _groups
    from tiering.sources.ranged.fetch import Target, fetch_group, fetch_range
    from tiering.sources.s3.client import ObjectChanged
    from tiering.sources.s3.ranged import ObjectRanges, ObjectVersion
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="chg")
    m = labelled(src, "acme/x", "v1")
    c = cold(s3_endpoint, bucket)
    c.publish(src, m, files_of(src, m))
    key = "acme/x/v1/model.safetensors"
    tag = obstore.head(c.store, key)["e_tag"]
    body = (src / "model.safetensors").read_bytes()
    obstore.put(c.store, key, body[::-1])  # replaced after its ETag was known: If-Match refuses it
    f = next(f for f in m.files if f.path == "model.safetensors")
    ranges = ObjectRanges(c)
    with open_dir(tmp_path / "dst") as d:
        fd = d.create("model.safetensors", 0o600, flags=os.O_RDWR)
        try:
            first = _groups(f, m.chunk_size, c.range_bytes)[0]
            with pytest.raises(ObjectChanged, match="changed during the download"):
                fetch_group(ranges, Target(f, fd, ObjectVersion(c.url, key, f.size, tag), [first]), first, None, None)
            # no ETag known ahead (no HEAD is asked): the first range's response fixes it, and a range
            # of the object put again since is refused, whether its request carried If-Match or not
            obstore.put(c.store, key, body)
            halves = _groups(f, m.chunk_size, f.size // 2)
            assert len(halves) >= 2
            obj = ObjectVersion(c.url, key, f.size)
            target = Target(f, fd, obj, halves)
            (start, end, parts), = halves[0].ranges
            fetch_range(ranges, target, start, end, parts, halves[0], None)
            assert obj.etag == obstore.head(c.store, key)["e_tag"]
            obstore.put(c.store, key, body[::-1])
            (start, end, parts), = halves[1].ranges
            with pytest.raises(ObjectChanged, match="changed during the download"):
                fetch_range(ranges, target, start, end, parts, halves[1], None)
            # two ranges sent before either answered (neither carried If-Match): the responses disagree
            both = ObjectVersion(c.url, key, f.size)
            both.check({"size": f.size, "e_tag": obj.etag})
            with pytest.raises(ObjectChanged):
                both.check({"size": f.size, "e_tag": obstore.head(c.store, key)["e_tag"]})
            with pytest.raises(IntegrityError, match="bytes in the store, the manifest says"):
                ObjectVersion(c.url, key, f.size).check({"size": f.size + 1, "e_tag": tag})
        finally:
            os.close(fd)


def test_a_missing_bucket_and_bad_urls_say_so(s3_endpoint, tmp_path: Path) -> None:
    from tiering.errors import BadInput
    from tiering.sources.s3.client import ObjectLocation, StoreSetupError
    c = cold(s3_endpoint, "no-such-bucket-here")
    with pytest.raises(StoreSetupError, match="the bucket no-such-bucket-here does not exist"):
        c.versions("acme/m")
    for bad in ("s3:///x", "http://b/x", "s3://b/../x"):
        with pytest.raises(BadInput):
            ObjectLocation.parse(bad)
    assert ObjectLocation.parse("s3://b/a/b/") == ObjectLocation("b", "a/b")


def test_ranges_follow_the_parts_and_cover_every_byte(tmp_path: Path) -> None:
    from tiering.sources.ranged.cut import groups as _groups
    src = make_checkpoint(tmp_path / "src", total_bytes=12 * MiB, shards=1, layers=4, seed="g")
    m = build_manifest(src)
    for f in m.files:
        for rb in (1 * MiB, 3 * MiB, 5 * MiB, 64 * MiB):
            spans = sorted((s, e) for g in _groups(f, m.chunk_size, rb) for s, e, _ in g.ranges)
            assert spans[0][0] == 0 if f.size else not spans
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])) and (not spans or spans[-1][1] == f.size)
            assert all(e - s <= rb for s, e in spans)
            # as few ranges as fit, of about equal size: no small tail range (moto, like some stores,
            # reads the whole object for every ranged GET; a tail costs as much as a full range)
            largest = max(p.length for p in f.parts(m.chunk_size))
            if f.size > rb >= 4 * largest:
                sizes = [e - s for s, e in spans]
                assert len(sizes) == -(-f.size // rb) and min(sizes) >= max(sizes) * 0.8, (rb, sizes)
            groups = _groups(f, m.chunk_size, rb)
            owned = [{p.label for _, _, ps in g.ranges for p, _, _ in ps} for g in groups]
            # a part is never split across two workers (its hash is fed in order by one)
            assert sum(len(o) for o in owned) == len(set().union(*owned)) == len(f.parts(m.chunk_size))


def test_shared_credentials_file(tmp_path: Path) -> None:
    from tiering.sources.s3.client import shared_credentials
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = A\naws_secret_access_key = B\n[ops]\naws_access_key_id = C\n"
                     "aws_secret_access_key = D\naws_session_token = T\n")
    env = {"AWS_SHARED_CREDENTIALS_FILE": str(creds)}
    assert shared_credentials(env) == {"access_key_id": "A", "secret_access_key": "B"}
    assert shared_credentials({**env, "AWS_PROFILE": "ops"}) == {"access_key_id": "C", "secret_access_key": "D",
                                                                  "token": "T"}
    assert shared_credentials({**env, "AWS_ACCESS_KEY_ID": "env"}) == {}  # the environment wins


def _uploads(endpoint: str, bucket: str) -> list:
    import boto3
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def _everything(c) -> dict[str, bytes]:
    return {o["path"]: bytes(obstore.get(c.store, o["path"]).bytes()) for o in obstore.list(c.store).collect()}


@pytest.mark.parametrize("size", [2 * MiB, 12 * MiB], ids=["single-put", "multipart"])
@pytest.mark.parametrize("swap", ["symlink", "hardlink"])
def test_a_file_swapped_after_the_scan_is_never_uploaded(s3_endpoint, bucket, tmp_path: Path, size: int,
                                                         swap: str) -> None:
    """The race a hostile writer of the source directory wins against a path-based upload: the scan
    and the manifest see the real file, then it becomes a symlink (or a hard link) to a secret of
    the publisher's."""
    from tiering import scan_checkpoint
    from tiering.errors import FileChanged, UnsafePath
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOP-SECRET-" * (size // 11 + 1))
    src = make_checkpoint(tmp_path / "src", total_bytes=size, shards=1, layers=2, seed=f"swap{size}")
    scanned = scan_checkpoint(src)
    m = labelled(src, "acme/sw", "v1")
    target = src / "model.safetensors"
    target.unlink()
    if swap == "symlink":
        target.symlink_to(secret)
    else:
        os.link(secret, target)
    c = cold(s3_endpoint, bucket, part_bytes=5 * MiB)
    with pytest.raises((FileChanged, UnsafePath), match="replaced after it was scanned|is a symlink"):
        c.publish(src, m, [(f.relpath, f.path) for f in scanned])
    stored = _everything(c)
    assert not any(b"TOP-SECRET" in v for v in stored.values()), sorted(stored)
    assert c.read_manifest("acme/sw", "v1") is None and _uploads(s3_endpoint, bucket) == []


@pytest.mark.parametrize("abort", ["aborted", "abort-refused"])
def test_a_file_rewritten_in_place_during_the_upload_aborts_it(s3_endpoint, bucket, tmp_path: Path, abort: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Same file, new bytes (mtime put back), written once its multipart upload is under way: the
    hashes taken as the bytes go out catch it, the multipart upload is aborted (nothing billed is
    left), and nothing becomes visible. When the store refuses the abort (a 500), the file that
    changed is still the error, and the upload is not started over (it was, once: a second multipart
    upload, and the first one left behind)."""
    import threading
    import time

    from moto.s3.models import S3Backend
    from tiering import scan_checkpoint
    from tiering.errors import FileChanged
    created: list[str] = []
    create = S3Backend.create_multipart_upload

    def counted(self, *a, **k):
        created.append(a[1] if len(a) > 1 else "")
        return create(self, *a, **k)
    monkeypatch.setattr(S3Backend, "create_multipart_upload", counted)
    if abort == "abort-refused":
        def refused(self, *a, **k):
            raise RuntimeError("the store refuses the abort (a test)")
        monkeypatch.setattr(S3Backend, "abort_multipart_upload", refused)
    src = make_checkpoint(tmp_path / "src", total_bytes=48 * MiB, shards=1, layers=2, seed="inplace")
    scanned = scan_checkpoint(src)
    m = labelled(src, "acme/ip", "v1")
    f = src / "model.safetensors"
    st = f.stat()
    c = cold(s3_endpoint, bucket, part_bytes=5 * MiB, concurrency=2)
    outcome: list[BaseException | None] = []

    def publish() -> None:
        try:
            c.publish(src, m, [(x.relpath, x.path) for x in scanned])
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (handed to the test thread)
            outcome.append(exc)
    t = threading.Thread(target=publish)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not [u for u in _uploads(s3_endpoint, bucket) if u["Key"].endswith("acme/ip/v1/model.safetensors")]:
            assert t.is_alive() and time.monotonic() < deadline, outcome   # (the upload never started)
            time.sleep(0.005)
        with open(f, "r+b") as fh:   # the upload is under way: its last part has not gone out yet
            fh.seek(st.st_size - 100)
            fh.write(b"\xff" * 50)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        t.join(120)
    assert len(outcome) == 1 and isinstance(outcome[0], FileChanged), outcome
    assert "changed after it was hashed" in str(outcome[0]), outcome
    assert c.read_manifest("acme/ip", "v1") is None and c.versions("acme/ip") == []
    assert len(created) == 1, created   # (never started over)
    # (an abort the store refused leaves that one upload: the lifecycle rule docs/sources.md names)
    assert len(_uploads(s3_endpoint, bucket)) == (0 if abort == "aborted" else 1)
    assert not [k for k in _everything(c) if k.startswith("acme/ip/v1/")]  # (the claim went too)


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


def test_publish_preload_ls_and_wait_from_s3_through_the_cli(s3_node, wd, isolated_env, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    import json
    import logging
    import re
    import time
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
    # --wait polls for the manifest object: published by another process while it waits. The server's
    # request log (the in-process moto server's werkzeug lines) shows it asking, and not finding it, twice
    v2_manifest = re.compile(r'"(GET|HEAD) /\S*/models/acme/s3/v2/\.weightd/manifest\.json\S* HTTP/[\d.]+" 404 ')
    caplog.set_level(logging.INFO, logger="werkzeug")

    def v2_not_found() -> int:   # (werkzeug colours its request lines)
        return sum(bool(v2_manifest.search(re.sub(r"\x1b\[[\d;]*m", "", r.getMessage()))) for r in caplog.records)
    waiter = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(s3_node.config), "preload",
                               "acme/s3@v2", "--tier", "hot", "--wait", "--timeout", "60"],
                              env=isolated_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while v2_not_found() < 2:
            assert waiter.poll() is None and time.monotonic() < deadline, \
                ([r.getMessage() for r in caplog.records][-20:], waiter.poll())
            time.sleep(0.05)
        assert waiter.poll() is None
        v2 = make_checkpoint(tmp_path / "v2", total_bytes=4 * MiB, shards=1, layers=2, seed="v2")
        assert wd("publish", v2, "--name", "acme/s3", "--version", "v2").returncode == 0
        out, err = waiter.communicate(timeout=60)
    finally:
        stop_process(waiter)
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


def _two_versions(tmp_path: Path) -> tuple[Path, Path, int]:
    from tiering.sample import edited_copy
    a = make_checkpoint(tmp_path / "a", total_bytes=24 * MiB, shards=3, layers=4, seed="s3delta")
    b = tmp_path / "b"
    return a, b, sum(n for _, _, n in edited_copy(a, b, larger_than=64 << 10, every=5, count=3))


def test_a_delta_update_from_s3_asks_only_for_the_changed_ranges(s3_node, wd, tmp_path: Path) -> None:
    """v1 on the node, v2 with three tensors changed: only their bytes come from the store (the
    report's cold bytes are what the server sent: counted as the response bodies arrive)."""
    import json
    a, b, changed = _two_versions(tmp_path)
    assert wd("publish", a, "--name", "acme/d", "--version", "v1").returncode == 0
    assert wd("publish", b, "--name", "acme/d", "--version", "v2").returncode == 0
    assert wd("preload", "acme/d@v1", "--tier", "warm").returncode == 0
    r = wd("preload", "acme/d@v2", "--tier", "hot", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    mb = build_manifest(b)
    assert rep["bytes_by_source"]["cold"] == changed == rep["store"]["bytes_read"], rep
    assert rep["store"]["requests"]["get"] <= 3 + 1  # one ranged GET per changed region (+ the manifest's)
    assert rep["bytes_by_source"]["local_reuse"] == mb.total_bytes - changed
    assert rep["delta"]["donors"] == ["acme/d@v1"] and rep["delta"]["refetched"] == []
    assert wd("verify", rep["path"]).returncode == 0
    # a rotten donor: its part is fetched instead, never copied into v2
    p1 = s3_node.warm / "acme/d/v1"
    same = {t.xxh3_128 for _, t in mb.tensors()}
    f, t = next((f, t) for f, t in build_manifest(a).tensors() if t.nbytes > 4096 and t.xxh3_128 in same)
    with open(p1 / f.path, "r+b") as fh:
        fh.seek(t.begin + 7)
        fh.write(b"\xff\x00\xff")
    assert wd("evict", "acme/d@v2", "--force").returncode == 0
    rep = json.loads(wd("preload", "acme/d@v2", "--tier", "warm", "--json").stdout)
    assert rep["delta"]["refetched"] and rep["bytes_by_source"]["cold"] >= changed + t.nbytes
    assert wd("verify", rep["path"]).returncode == 0


def _slow(node, bandwidth: str) -> None:
    import re
    text = re.sub(r'bandwidth = "[^"]*"\n', "", node.config.read_text())
    node.config.write_text(text.replace('concurrency = 4\n', f'concurrency = 4\nbandwidth = "{bandwidth}"\n', 1))


def test_a_preload_killed_midway_resumes_with_the_verified_parts(s3_node, wd, isolated_env, tmp_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys
    import time
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=2, layers=6, seed="resume")
    assert wd("publish", src, "--name", "acme/k", "--version", "v1").returncode == 0
    _slow(s3_node, "6MiB")
    staging = s3_node.warm / ".staging" / "acme--k@v1.resumable"
    proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(s3_node.config), "preload", "acme/k@v1",
                             "--tier", "warm"], env=isolated_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if staging.is_dir() and sum(1 for _ in staging.rglob("*.safetensors")) == 2:
                break
            time.sleep(0.05)
        time.sleep(1.5)  # some ranges in, most not
        assert proc.poll() is None, "finished before it could be killed: lower the bandwidth"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        stop_process(proc)
    assert staging.is_dir()
    _slow(s3_node, "0")
    r = wd("preload", "acme/k@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    total = build_manifest(src).total_bytes
    assert 0 < rep["resumed_bytes"] < total, rep
    assert rep["resumed_bytes"] + rep["bytes_by_source"]["cold"] == total
    assert wd("verify", rep["path"]).returncode == 0 and not staging.exists()


def test_a_timed_out_preload_keeps_its_parts_and_a_corrupted_one_is_fetched_again(s3_node, wd, tmp_path: Path) -> None:
    import json
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=1, layers=4, seed="tmo")
    assert wd("publish", src, "--name", "acme/t", "--version", "v1").returncode == 0
    _slow(s3_node, "4MiB")
    r = wd("preload", "acme/t@v1", "--tier", "warm", "--timeout", "2")
    assert r.returncode == 4 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    staging = s3_node.warm / ".staging" / "acme--t@v1.resumable"
    shard = staging / "model.safetensors"
    assert shard.is_file()
    with open(shard, "r+b") as fh:  # someone (or a disk) damaged what was kept: checked, fetched again
        fh.seek(200)
        fh.write(b"\x00" * 16)
    _slow(s3_node, "0")
    rep = json.loads(wd("preload", "acme/t@v1", "--tier", "warm", "--json").stdout)
    assert 0 < rep["resumed_bytes"] < rep["bytes"] and wd("verify", rep["path"]).returncode == 0


# -- what the store can do wrong: refuse, cut a response short ------------------------------------------

@pytest.fixture
def s3_with_auth(tmp_path: Path):
    """A second moto server, in a subprocess, that checks credentials and IAM policies (after the three
    set-up calls): a user with no policy is denied, an unknown key refused."""
    import socket
    import subprocess
    import sys
    import time

    import boto3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "moto did not start"
                time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        kw = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="AKIAIOSFODNN7EXAMPLE",
                  aws_secret_access_key="setup")
        iam = boto3.client("iam", **kw)
        iam.create_user(UserName="no-policy")
        key = iam.create_access_key(UserName="no-policy")["AccessKey"]
        boto3.client("s3", **kw).create_bucket(Bucket="locked")
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        stop_process(proc)


def test_access_denied_and_refused_keys_are_one_line_with_the_fix(s3_with_auth, weightd, isolated_env,
                                                                   tmp_path: Path) -> None:
    from .conftest import NodeEnv
    endpoint, key_id, secret = s3_with_auth
    env = NodeEnv(tmp_path)
    env.config.write_text(env.config.read_text().replace(
        f'[tiers.cold]\npath = "{env.cold}"\n',
        f'[tiers.cold]\nurl = "s3://locked/models"\nendpoint = "{endpoint}"\nregion = "us-east-1"\n'))
    src = make_checkpoint(tmp_path / "src", total_bytes=1 * MiB, shards=1, layers=2, seed="deny")
    for keys, needle in (((key_id, secret), "access denied: give the daemon's credentials s3:GetObject"),
                         (("AKIANOTAKEY", "nope"), "the store refused the credentials")):
        isolated_env.update(AWS_ACCESS_KEY_ID=keys[0], AWS_SECRET_ACCESS_KEY=keys[1])
        for args in (("preload", "acme/x@v1"), ("ls",), ("publish", str(src), "--name", "acme/x", "--version", "v1")):
            r = weightd("--config", env.config, *args)
            assert r.returncode == 2, (args, r.returncode, r.stderr)
            assert needle in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (args, r.stderr)


class TruncatingProxy:
    """A TCP proxy in front of the S3 server that cuts the first ``cuts`` responses to a GET of a
    ``.safetensors`` object short: headers and ``keep`` body bytes, then the connection closes (a
    store, or a middlebox, that returns fewer bytes than the Content-Length promised)."""

    def __init__(self, upstream: str, cuts: int, keep: int = 4096) -> None:
        import socket
        import threading
        from urllib.parse import urlparse
        u = urlparse(upstream)
        self.upstream = (u.hostname, u.port)
        self.cuts, self.keep, self.cut = cuts, keep, 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        import socket
        import threading
        while not self.stopping.is_set():
            try:
                client, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client) -> None:
        import socket
        import threading
        up = socket.create_connection(self.upstream, timeout=30)
        armed = threading.Event()

        def client_to_up() -> None:
            try:
                while data := client.recv(65536):
                    if data.startswith(b"GET ") and b".safetensors" in data.split(b"\r\n", 1)[0]:
                        with self.lock:
                            if self.cut < self.cuts:
                                self.cut += 1
                                armed.set()
                    up.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    up.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        t = threading.Thread(target=client_to_up, daemon=True)
        t.start()
        buf = b""
        try:
            while data := up.recv(65536):
                if armed.is_set():
                    buf += data
                    head = buf.find(b"\r\n\r\n")
                    if head < 0:
                        continue
                    import re
                    length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", buf[:head + 2])
                    keep = min(self.keep, max(0, int(length.group(1)) - 1)) if length else self.keep
                    if len(buf) >= head + 4 + keep:
                        client.sendall(buf[:head + 4 + keep])
                        break  # cut: close both
                    continue
                client.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, up):  # shutdown first: a close alone does not end a recv blocked in the other thread
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.stopping.set()
        self.sock.close()
        self.thread.join(5)


@pytest.mark.parametrize("cuts", [2, 1000], ids=["retried", "gives-up"])
def test_a_response_cut_short_is_retried_then_a_one_line_error(s3_endpoint, bucket, tmp_path: Path, cuts: int) -> None:
    from tiering.sources.s3.client import ObjectStoreError
    src = make_checkpoint(tmp_path / "src", total_bytes=6 * MiB, shards=1, layers=2, seed="cut")
    m = labelled(src, "acme/cut", "v1")
    cold(s3_endpoint, bucket).publish(src, m, files_of(src, m))
    proxy = TruncatingProxy(s3_endpoint, cuts)
    try:
        # 3 ranges of 2 MiB: 2 workers where the cut is survived (a range asked again while another is in
        # flight); one worker per range where every try is cut, so the ranges spend their retries (0.2 +
        # 0.4 + 0.8 + 1.6 s of back-off) side by side, not a third after the first two (3 s more)
        c = cold(proxy.endpoint, bucket, range_bytes=2 * MiB, concurrency=2 if cuts < 5 else 3)
        with open_dir(tmp_path / "dst") as d:
            if cuts < 5:
                import hashlib
                digests: dict[str, str] = {}
                assert c.fetch(m, d, crypto=hashlib.sha256, digests=digests) == m.total_bytes
                assert sum(c.stats.errors.values()) >= cuts  # each cut seen, counted, and the range asked again
                assert not verify_checkpoint(tmp_path / "dst", m).problems
                # the file's SHA-256 was being taken from the range that broke: restored, not fed twice
                assert digests == {f.path: hashlib.sha256((src / f.path).read_bytes()).hexdigest() for f in m.files}
            else:
                with pytest.raises(ObjectStoreError) as ei:
                    c.fetch(m, d)
                msg = str(ei.value)
                assert "\n" not in msg and "acme/cut/v1/model.safetensors: asked for bytes 0-" in msg \
                    and "the response broke after" in msg, msg
                assert proxy.cut >= 5  # RETRIES + 1 tries of the first range
    finally:
        proxy.close()


def test_a_kept_staging_area_is_not_resumed_for_other_content(s3_node, wd, tmp_path: Path, bucket, s3_endpoint) -> None:
    """NAME@VERSION deleted from the bucket and published again with other bytes while a kept staging
    area waits: nothing of it is reused (its digest differs), no stale tail or stray file survives."""
    import json
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=1, layers=4, seed="old")
    assert wd("publish", src, "--name", "acme/re", "--version", "v1").returncode == 0
    _slow(s3_node, "4MiB")
    assert wd("preload", "acme/re@v1", "--tier", "warm", "--timeout", "2").returncode == 4
    staging = s3_node.warm / ".staging" / "acme--re@v1.resumable"
    (staging / "stray").mkdir()
    (staging / "config.json").write_bytes(b"x" * 100_000)  # longer than the new one
    c = cold(s3_endpoint, bucket)
    for o in obstore.list(c.store, prefix="acme/re/v1/").collect():
        obstore.delete(c.store, o["path"])
    other = make_checkpoint(tmp_path / "other", total_bytes=8 * MiB, shards=1, layers=2, seed="new")
    assert wd("publish", other, "--name", "acme/re", "--version", "v1").returncode == 0
    _slow(s3_node, "0")
    r = wd("preload", "acme/re@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["resumed_bytes"] == 0 and rep["digest"] == build_manifest(other).digest
    assert wd("verify", rep["path"]).returncode == 0 and not (Path(rep["path"]) / "stray").exists()


def test_signed_versions_in_s3_are_checked_on_every_node(s3_node, wd, tmp_path: Path) -> None:
    """publish --sign into a bucket: the digests are taken from the bytes as they are sent and the
    bundle is put before the manifest; a node requiring signatures loads it (and refuses an
    unsigned version, and one whose object was replaced by a bucket writer)."""
    import json
    from tiering.content.signature import generate_keypair
    d = tmp_path / "keys"
    d.mkdir()
    generate_keypair(d / "fleet.pem", d / "fleet.pub.pem")
    src = make_checkpoint(tmp_path / "src", total_bytes=12 * MiB, shards=2, layers=2, seed="signed")
    r = wd("publish", src, "--name", "acme/sig", "--version", "v1", "--sign", d / "fleet.pem", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signed_by"] == "fleet.pem"
    plain = make_checkpoint(tmp_path / "plain", total_bytes=2 * MiB, shards=1, layers=2, seed="plain")
    assert wd("publish", plain, "--name", "acme/plain", "--version", "v1").returncode == 0
    with open(s3_node.config, "a") as f:
        f.write(f'[trust]\nrequire_signature = true\npublic_keys = ["{d / "fleet.pub.pem"}"]\n')
    r = wd("preload", "acme/sig@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["signature"]["checked"] and (Path(rep["path"]) / ".weightd/model.sig").is_file()
    r = wd("preload", "acme/plain@v1", "--tier", "warm")
    assert r.returncode == 5 and "not signed" in r.stderr, r.stderr
    # a bucket writer replaces a signed object with other bytes of the same size and fixes the
    # manifest to match: the signature still refuses it
    from tiering import build_manifest as bm
    from tiering.content.manifest import MANIFEST_RELPATH
    evil = tmp_path / "evil"
    import shutil
    shutil.copytree(src, evil)
    target = next(p for p in sorted(evil.glob("*.safetensors")))
    data = bytearray(target.read_bytes())
    data[-5] ^= 0xFF
    target.write_bytes(bytes(data))
    em = bm(evil).with_labels(name="acme/sig", version="v2", published_at="2026-12-04T00:00:00.000000Z")
    c = cold(s3_node.config.read_text().split('endpoint = "')[1].split('"')[0],
             s3_node.config.read_text().split('url = "s3://')[1].split("/")[0])
    for f in em.files:
        obstore.put(c.store, f"acme/sig/v2/{f.path}", (evil / f.path).read_bytes())
    sig = bytes(obstore.get(c.store, "acme/sig/v1/.weightd/model.sig").bytes())
    obstore.put(c.store, "acme/sig/v2/.weightd/model.sig", sig)
    obstore.put(c.store, f"acme/sig/v2/{MANIFEST_RELPATH}", em.to_json().encode())
    r = wd("preload", "acme/sig@v2", "--tier", "warm")
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr


def test_an_attached_signature_must_cover_the_bytes_sent_to_s3(s3_node, wd, tmp_path: Path) -> None:
    import hashlib
    import json
    from tiering import scan_checkpoint
    from tiering.content.signature import generate_keypair, sign
    d = tmp_path / "keys"
    d.mkdir()
    generate_keypair(d / "ci.pem", d / "ci.pub.pem")
    src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=2, seed="att")
    digests = {f.relpath: hashlib.sha256(Path(os.fspath(f.path)).read_bytes()).hexdigest() for f in scan_checkpoint(src)}
    good = tmp_path / "good.sig"
    good.write_bytes(sign(d / "ci.pem", "acme/att@v1", digests))
    bad_digests = dict(digests, **{next(iter(digests)): "00" * 32})
    bad = tmp_path / "bad.sig"
    bad.write_bytes(sign(d / "ci.pem", "acme/att@v1", bad_digests))
    r = wd("publish", src, "--name", "acme/att", "--version", "v1", "--signature", bad)
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(wd("ls", "--json").stdout)["versions"] == []  # nothing published, nothing left visible
    r = wd("publish", src, "--name", "acme/att", "--version", "v1", "--signature", good, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signed_by"].startswith("key ")


@pytest.mark.parametrize("torrent", [b"not bencode at all", b"d" + b"x" * (17 << 20)], ids=["garbage", "oversized"])
def test_a_bad_torrent_object_in_the_bucket_means_no_p2p_not_a_failure(s3_node, wd, tmp_path: Path, bucket,
                                                                       s3_endpoint, torrent: bytes) -> None:
    """A bucket writer puts garbage (or 17 MiB) where the torrent belongs: the worker says why it
    does not use the swarm and copies from the bucket; nothing of the object is trusted."""
    import json
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="badtorrent")
    assert wd("publish", src, "--name", "acme/bt", "--version", "v1").returncode == 0
    obstore.put(cold(s3_endpoint, bucket).store, "acme/bt/v1/.weightd/checkpoint.torrent", torrent)
    s3_node.config.write_text(s3_node.config.read_text().replace(
        '[p2p]\nlisten = "127.0.0.1:0"\n', '[p2p]\nlisten = "127.0.0.1:0"\nthreshold = "1MiB"\npeers = ["127.0.0.1:9"]\n'))
    r = wd("preload", "acme/bt@v1", "--tier", "warm", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rep = json.loads(r.stdout)
    assert rep["bytes_by_source"]["cold"] == rep["bytes"]
    assert [(f["from"], f["to"]) for f in rep["source_fallbacks"]] == [("p2p", "cold")], rep["source_fallbacks"]
    assert wd("verify", rep["path"]).returncode == 0
