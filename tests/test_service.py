"""One NodeService behind both the in-process CLI and the daemon: same reports, same validation errors,
the same metrics counted, one home for the lease default."""

from __future__ import annotations

import time

import json
import math
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error
from .test_daemon import daemon  # noqa: F401 (a fixture)

MiB = 1 << 20


def _publish(wd, tmp: Path, version: str = "v1") -> None:
    src = make_checkpoint(tmp / f"src-{version}", total_bytes=4 * MiB, shards=2, layers=2, seed=version)
    assert wd("publish", src, "--name", "org/s", "--version", version).returncode == 0


def test_in_process_and_daemon_preload_report_the_same_keys(daemon, wd, node_env, tmp_path: Path) -> None:  # noqa: F811
    _publish(wd, tmp_path)
    local = wd("--no-daemon", "preload", "org/s@v1", "--tier", "warm", "--json")
    via = wd("--daemon-only", "preload", "org/s@v1", "--tier", "hot", "--json")
    a, b = json.loads(local.stdout), json.loads(via.stdout)
    assert a["bytes_moved"] > 0 and b["bytes_moved"] > 0  # both did the work
    assert set(a) == set(b), set(a) ^ set(b)
    assert a["tier"] == "warm" and b["tier"] == "hot"


BAD_PRELOADS = [
    ({"ref": "../x"}, "invalid name"),
    ({"ref": "org/s@v1", "tier": "cold"}, "tier must be one of"),
    ({"ref": "org/s@v1", "lease_s": -1}, "lease_s"),
    ({"ref": "org/s@v1", "lease_s": math.nan}, "lease_s"),
    ({"ref": "org/s@v1", "lease_s": math.inf}, "lease_s"),
    ({"ref": "org/s@v1", "timeout_s": "10"}, "timeout_s"),
    ({"ref": "org/s@v1", "timeout_s": True}, "timeout_s"),
    ({"ref": "org/s@v1", "lease_s": 7 * 24 * 3600 + 1}, "lease_s"),
]


@pytest.mark.parametrize("body,needle", BAD_PRELOADS)
def test_the_same_validation_errors_in_process_and_from_the_daemon(daemon, node_env, body, needle) -> None:  # noqa: F811
    from weightd.client import DaemonClient, DaemonError
    from weightd.config import load_config
    from weightd.errors import exit_code_for
    from weightd.node.local import open_service
    kw = {k: v for k, v in body.items() if k != "ref"}
    svc = open_service(load_config(str(node_env.config)), reconcile=False)
    try:
        with pytest.raises(Exception) as local:
            svc.preload(body["ref"], **kw)
    finally:
        svc.node.close()
    with pytest.raises(DaemonError) as remote:
        DaemonClient(daemon.socket_path).preload(body["ref"], **kw)
    assert str(local.value) == str(remote.value) and needle in str(remote.value)
    assert exit_code_for(local.value) == remote.value.exit_code == 2


def test_evict_tier_validated_alike(daemon, node_env, wd) -> None:  # noqa: F811
    from weightd.client import DaemonClient, DaemonError
    from weightd.config import load_config
    from weightd.node.local import open_service
    svc = open_service(load_config(str(node_env.config)))
    try:
        with pytest.raises(Exception) as local:
            svc.evict("org/s@v1", "cold")
    finally:
        svc.node.close()
    with pytest.raises(DaemonError) as remote:
        DaemonClient(daemon.socket_path).evict("org/s@v1", "cold")
    assert str(local.value) == str(remote.value) == "tier must be one of hot, warm"


def test_in_process_preload_counts_metrics_and_uses_the_one_lease_default(node_env, wd, tmp_path: Path) -> None:
    from tiering import DEFAULT_LEASE_S
    from weightd.config import load_config
    from weightd.node.local import open_service
    _publish(wd, tmp_path)
    svc = open_service(load_config(str(node_env.config)))
    try:
        r = svc.preload("org/s@v1", tier="warm")
        get = svc.metrics.registry.get_sample_value
        assert get("weightd_bytes_transferred_total", {"source": "cold"}) == r["bytes"]
        one = {"model": "org/s", "version": "v1", "tier": "warm", "source": "cold"}  # (model and version apart)
        assert get("weightd_weight_loading_seconds_count", one) == 1
        t = get("weightd_preload_last_success_timestamp_seconds", {"model": "org/s"})
        assert t is not None and abs(t - time.time()) < 60
        assert svc.preload("org/s@v1", tier="warm")["already_present"]  # a no-op: not a loading time
        assert get("weightd_weight_loading_seconds_count", one) == 1
        with pytest.raises(FileNotFoundError):
            svc.preload("org/none@v1")
        assert get("weightd_preload_failures_total", {"reason": "not_found", "model": "org/none"}) == 1
        req = svc.preload_request("org/s@v1")
        assert req.lease_s == DEFAULT_LEASE_S
    finally:
        svc.node.close()
    # the CLI's --lease has no default of its own: absent, the service's applies (and --help shows it)
    assert f"[default: {DEFAULT_LEASE_S:g}]" in wd("preload", "--help").stdout


def test_daemon_only_without_a_daemon_says_what_to_do(wd) -> None:
    assert_one_line_error(wd("--daemon-only", "status"), 1, "does not answer", "systemctl start weightd")


def test_commands_through_the_daemon_stay_light(daemon, wd, node_env, isolated_env, tmp_path: Path) -> None:  # noqa: F811
    """``path`` and ``status`` through the daemon load neither the daemon's stack nor the tier code."""
    import subprocess
    import sys
    from .conftest import ROOT
    _publish(wd, tmp_path)
    assert wd("preload", "org/s@v1").returncode == 0
    for args in (["status", "--json"], ["path", "org/s@v1"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "weightd", "--daemon-only", "--config",
                               str(node_env.config), *args], capture_output=True, text=True, env=isolated_env,
                              cwd=ROOT, timeout=60)
        assert proc.returncode == 0, proc.stderr[-2000:]
        modules = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
        heavy = {m for m in modules if m.split(".")[0] in ("aiohttp", "libtorrent", "rich", "prometheus_client")
                 or m in ("tiering.node", "tiering.pagecache", "weightd.node.service", "weightd.daemon")}
        assert not heavy, (args, sorted(heavy))


def test_in_process_commands_count_without_prometheus(node_env, wd, isolated_env, tmp_path: Path) -> None:
    """The CLI counts into a Tally (the same calls as the daemon's Metrics), and never imports
    prometheus_client for it (about 50 ms of every in-process command's start)."""
    import subprocess
    import sys

    from weightd.config import load_config
    from weightd.node.local import open_service
    from weightd.tally import Tally

    from .conftest import ROOT
    _publish(wd, tmp_path)
    svc = open_service(load_config(str(node_env.config)), Tally())
    try:
        r = svc.preload("org/s@v1", tier="warm")
        v = svc.metrics.values
        assert v[("bytes", ("cold",))] == r["bytes"]
        assert v[("loading:count", ("org/s", "v1", "warm", "cold"))] == 1
        assert v[("in_flight", ("local",))] == 0
    finally:
        svc.node.close()
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "weightd", "--config", str(node_env.config),
                          "--no-daemon", "preload", "org/s@v1", "--tier", "hot"], capture_output=True, text=True,
                         timeout=120, env=isolated_env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-500:]
    assert "prometheus_client" not in out.stderr
