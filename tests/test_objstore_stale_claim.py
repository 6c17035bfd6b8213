"""A publisher that crashed holding its claim on NAME@VERSION in object storage does not block that
version for ever: once the claim is older than ``CLAIM_STALE_S`` the next publisher takes it over (a
conditional put on the claim's ETag) and publishes. Against the real moto S3 server: the first publisher
is a process killed with SIGKILL mid-upload; its claim is then dated back past ``CLAIM_STALE_S`` (the
hours a real takeover waits), keeping the dead publisher's host and pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering import Dir, build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

MiB = 1 << 20
pytest.importorskip("moto.server", reason="moto[server] missing (pip install -e .[test])")
obstore = pytest.importorskip("obstore")
from .test_objstore import PUBLISHER  # noqa: E402 (after the skips: it needs the test extra)
ROOT = str(Path(__file__).resolve().parent.parent)



def publisher(endpoint: str, bucket: str, src: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PUBLISHER, ROOT, endpoint, bucket, str(src), "acme/s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_a_stale_claim_of_a_crashed_publisher_is_taken_over(s3_endpoint, bucket, tmp_path: Path) -> None:
    from tiering.sources.s3.cold import ObjectCold
    from tiering.sources.s3.publish import CLAIM_STALE_S
    a = make_checkpoint(tmp_path / "a", total_bytes=32 * MiB, shards=2, layers=2, seed="a")
    b = make_checkpoint(tmp_path / "b", total_bytes=2 * MiB, shards=1, layers=2, seed="b")
    c = ObjectCold(f"s3://{bucket}/models", endpoint=s3_endpoint, region="us-east-1")
    claim = "acme/s/v1/.weightd/publishing"

    crashed = publisher(s3_endpoint, bucket, a)
    try:
        deadline = time.monotonic() + 60
        while not [x for x in obstore.list(c.store, prefix="acme/s/v1/").collect() if x["path"] == claim]:
            assert crashed.poll() is None and time.monotonic() < deadline, crashed.communicate()
            time.sleep(0.005)
        crashed.send_signal(signal.SIGKILL)   # a crash mid-publish: the claim stays in the store
    finally:
        crashed.kill()
        crashed.communicate(timeout=30)
    held = json.loads(bytes(obstore.get(c.store, claim).bytes()))
    assert held["pid"] == crashed.pid

    # while the claim is fresh, the next publisher is refused, naming the dead one
    r = publisher(s3_endpoint, bucket, b)
    out, err = r.communicate(timeout=120)
    assert out.startswith("busy") and f"pid {crashed.pid}" in out, (out, err)

    # hours later (dated back here): the claim is stale, and taken over
    obstore.put(c.store, claim, json.dumps({**held, "at": time.time() - CLAIM_STALE_S - 60}).encode())
    r = publisher(s3_endpoint, bucket, b)
    out, err = r.communicate(timeout=120)
    assert out.strip() == "published", (out, err)
    assert c.read_manifest("acme/s", "v1") is not None
    assert claim not in [x["path"] for x in obstore.list(c.store, prefix="acme/s/v1/").collect()]
    mb = build_manifest(b).with_labels(name="acme/s", version="v1", published_at="2026-12-04T00:00:00.000000Z")
    dst = tmp_path / "dst"
    dst.mkdir()
    with Dir(os.open(dst, os.O_RDONLY | os.O_DIRECTORY), dst) as d:
        c.fetch(mb, d)
    assert not verify_checkpoint(dst, mb).problems   # the taker's bytes, whole


