"""An origin and three workers whose cold tier is an OCI registry (Debian's docker-registry on 127.0.0.1):
the origin copies a published version into its warm tier, puts its torrent beside it in the registry and
seeds; the workers take the version from the swarm, nothing from the registry, and read it back against
the manifest (in object storage a torrent is an origin's, not the publisher's: its record binds nothing)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from p2p import TORRENT_RELPATH
from tiering.sample import make_checkpoint

from .test_oci import _cold, auth_file, registry  # noqa: F401  (the registry fixtures; skips without one)
from .test_p2p import cluster, preloaded_at_once, started  # noqa: F401  (the loopback cluster)

MiB = 1 << 20


def test_an_origin_and_three_workers_over_a_registry_cold_tier(cluster, registry, auth_file,  # noqa: F811
                                                              isolated_env, tmp_path: Path) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}"
    isolated_env["REGISTRY_AUTH_FILE"] = str(auth_file)
    cold = (f'[tiers.cold]\nurl = "oci://{registry.host}/{prefix}"\ninsecure = true\nrange_size = "1MiB"\n'
            f'concurrency = 4\npart_size = "1MiB"\n')
    origin = cluster("127.0.0.2", role="origin", limit="20MB", p2p_extra='piece_size = "1MiB"\n', cold_toml=cold)
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=2, layers=4, seed="ocip2p")
    pub = origin.cli("publish", str(src), "--name", "org/ocswarm", "--version", "v1", "--json")
    assert pub.returncode == 0, pub.stderr
    c = _cold(registry, prefix, auth_file)
    deadline = time.monotonic() + 60
    while c.read_meta("org/ocswarm", "v1", TORRENT_RELPATH) is None:   # the origin's mirror loop
        assert time.monotonic() < deadline, (origin.dir / "daemon.log").read_text()[-3000:]
        time.sleep(0.25)
    assert (origin.dir / "warm/org/ocswarm/v1/.weightd/manifest.json").is_file()
    workers = started([cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="20MB", cold_toml=cold, wait=False)
                       for i in (3, 4, 5)])
    reports = preloaded_at_once(workers, "org/ocswarm@v1")
    for r in reports:
        by = r["bytes_by_source"]
        assert by["cold"] == 0 and by["origin"] + by["peer"] >= r["bytes"] and r["source_fallbacks"] == [], r
        assert r["swarm"]["read_back"] is True, r
    for w in workers:
        assert w.cli("verify", str(w.dir / "warm/org/ocswarm/v1")).returncode == 0
