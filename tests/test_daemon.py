"""The daemon as systemd runs it: a real subprocess, a real NOTIFY_SOCKET, the CLI through its socket."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tiering import parse_size

from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error, reserve_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def free_port() -> int:
    """A port on 127.0.0.1 held for the daemon until the test ends (conftest.reserve_port)."""
    return reserve_port("127.0.0.1")


class DaemonProc:
    """``weightd serve`` with its own NOTIFY_SOCKET; always stopped at teardown."""

    def __init__(self, node_env, env: dict[str, str], tmp: Path, watchdog_usec: int = 1_000_000,
                 serve_args: tuple[str, ...] = ()) -> None:
        self.node_env, self.env = node_env, env
        self.port = free_port()
        self.socket_path = node_env.state / "weightd.sock"
        cfg = node_env.config.read_text() + f'[metrics]\nlisten = "127.0.0.1:{self.port}"\n'
        node_env.config.write_text(cfg)
        self.notify_path = tmp / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        self.messages: list[str] = []
        self.log_path = tmp / "daemon.log"
        self.log = open(self.log_path, "w")  # a file, not a pipe nobody reads (a full pipe blocks the daemon)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "weightd", "-v", "--config", str(node_env.config), "serve", *serve_args],
            env={**env, "NOTIFY_SOCKET": str(self.notify_path), "WATCHDOG_USEC": str(watchdog_usec)},
            stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.wait_for("READY=1", 30)

    def drain(self) -> None:
        while True:
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except (socket.timeout, BlockingIOError):
                return

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages:
                if needle in m:
                    return m
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log_path.read_text()}")
            self.drain()
        raise AssertionError(f"no {needle!r} from the daemon in {timeout} s: {self.messages}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, line_prefix: str) -> float:
        for line in self.metrics().splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no metric {line_prefix}")

    def stop(self) -> int | None:
        stop_process(self.proc)
        self.log.close()
        self.notify.close()
        return self.proc.returncode


@pytest.fixture
def daemon(node_env, isolated_env, tmp_path: Path):
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        yield d
    finally:
        d.stop()


def publish(wd, tmp: Path, name="org/d", version="v1", size=8 * MiB) -> Path:
    src = make_checkpoint(tmp / f"src-{version}", total_bytes=size, shards=2, layers=2, seed=version)
    assert wd("publish", src, "--name", name, "--version", version).returncode == 0
    return src


def test_ready_socket_mode_and_cli_through_daemon(daemon, wd, node_env, tmp_path: Path) -> None:
    mode = stat.S_IMODE(daemon.socket_path.stat().st_mode)
    assert mode == 0o660 and stat.S_ISSOCK(daemon.socket_path.stat().st_mode)
    publish(wd, tmp_path)
    proc = wd("preload", "org/d@v1", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)  # with --json, stdout is one JSON document
    assert r["path"] == str(node_env.hot / "org/d/v1")
    # it went through the daemon: its metrics saw the bytes
    assert daemon.metric('weightd_bytes_transferred_total{source="cold"}') == r["bytes"]
    assert daemon.metric("weightd_weight_loading_seconds_count") == 1
    assert wd("preload", "org/d@v1").stdout.strip().splitlines()[-1] == r["path"]  # without it: the path last
    # same output and exit codes as in-process
    local = wd("--no-daemon", "preload", "org/d@v1", "--json")
    assert json.loads(local.stdout)["path"] == r["path"]
    for args, code in ((["preload", "org/none@v1"], 3), (["path", "../x"], 2), (["evict", "org/none", "--all"], 3),
                       (["evict", "org/none"], 2), (["pin", "org/none@v1"], 3)):
        via, direct = wd(*args), wd("--no-daemon", *args)
        assert via.returncode == direct.returncode == code
        assert via.stderr == direct.stderr
    assert wd("status").returncode == 0 and "org/d@v1" in wd("status").stdout
    assert wd("pin", "org/d@v1").stdout.strip() == "org/d@v1: pinned"
    assert_one_line_error(wd("evict", "org/d@v1"), 1, "pinned")


def test_single_flight(daemon, wd, node_env, isolated_env, tmp_path: Path) -> None:
    publish(wd, tmp_path, size=48 * MiB)
    size = json.loads(wd("--no-daemon", "status", "--json").stdout)  # nothing local yet
    assert size["checkpoints"] == []
    cmd = [sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload", "org/d@v1", "--tier", "warm",
           "--json"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=isolated_env, cwd=ROOT)
             for _ in range(16)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        reports.append(json.loads(out.splitlines()[0]))
    total = reports[0]["bytes"]
    assert daemon.metric('weightd_bytes_transferred_total{source="cold"}') == total  # the bytes moved once
    assert all(r["path"] == reports[0]["path"] for r in reports)


def test_wait_until_published_through_daemon(daemon, wd, node_env, isolated_env, tmp_path: Path) -> None:
    waiter = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload",
                               "org/late@v1", "--wait", "--timeout", "60"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=isolated_env, cwd=ROOT)
    try:
        time.sleep(1.5)
        assert waiter.poll() is None
        publish(wd, tmp_path, name="org/late")
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert out.strip().splitlines()[-1] == str(node_env.hot / "org/late/v1")
    finally:
        waiter.kill()
        waiter.communicate()
    assert_one_line_error(wd("preload", "org/never@v1", "--wait", "--timeout", "1"), 4, "not published before")


def raw_request(path: Path, data: bytes) -> bytes:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(path))
    s.sendall(data)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def test_bad_requests_get_4xx_and_the_daemon_keeps_serving(daemon, wd, tmp_path: Path) -> None:
    publish(wd, tmp_path, size=32 * MiB)
    bad_json = raw_request(daemon.socket_path, b"POST /v1/preload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                                               b"Connection: close\r\n\r\n{bad!")
    assert bad_json.startswith(b"HTTP/1.1 400") and b"not valid JSON" in bad_json
    unknown = raw_request(daemon.socket_path, b"GET /v1/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert unknown.startswith(b"HTTP/1.1 404") and b"Not Found" in unknown
    wrong = raw_request(daemon.socket_path, b'POST /v1/preload HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n'
                                            b'Connection: close\r\n\r\n{"ref": 123}')
    assert wrong.startswith(b"HTTP/1.1 400") and b"must be a string" in wrong
    # a client that disconnects mid-request: the transfer goes on for the others
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(daemon.socket_path))
    body = b'{"ref": "org/d@v1", "tier": "warm"}'
    s.sendall(b"POST /v1/preload HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.05)
    s.close()
    proc = wd("preload", "org/d@v1", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    assert daemon.metric('weightd_bytes_transferred_total{source="cold"}') == json.loads(proc.stdout.splitlines()[0])["bytes"]
    assert wd("status").returncode == 0


def test_watchdog_reload_and_stop(daemon, node_env) -> None:
    daemon.wait_for("WATCHDOG=1", 5)
    good = node_env.config.read_text()
    node_env.config.write_text(good + "[bogus]\nkey = 1\n")
    daemon.proc.send_signal(signal.SIGHUP)
    msg = daemon.wait_for("config reload failed", 10)
    assert "bogus" in msg
    assert daemon.metric("weightd_config_reload_failures_total") == 1
    node_env.config.write_text(good.replace('capacity = "256MiB"', 'capacity = "128MiB"'))
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for("config reloaded", 10)
    assert daemon.metric('weightd_tier_capacity_bytes{tier="hot"}') == 128 * MiB
    t0 = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - t0 < 10
    assert not daemon.socket_path.exists()


def test_a_reload_names_the_p2p_keys_that_wait_for_a_restart(node_env, isolated_env, tmp_path: Path) -> None:
    """SIGHUP with [p2p] changed, on a daemon whose P2P session runs: what only the session reads is
    named as waiting for a restart, what new downloads also read as half applied, what applies at once
    not at all; against what the session started with (a second reload still names them, one that
    goes back to it names nothing). On a daemon with P2P off, a change says P2P starts at a restart."""
    good = node_env.config.read_text().replace("[p2p]\n", '[p2p]\npeers = ["127.0.0.1:1"]\n')
    node_env.config.write_text(good)
    d = DaemonProc(node_env, isolated_env, tmp_path)
    good = node_env.config.read_text()   # (with the metrics port DaemonProc added)

    def reload(text: str) -> list[str]:
        node_env.config.write_text(text)
        n = sum("config reloaded" in m for m in d.messages)
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while sum("config reloaded" in m for m in d.messages) == n:
            assert d.proc.poll() is None and time.monotonic() < deadline, d.messages
            d.drain()
        return [line.split("reload: ", 1)[1] for line in d.log_path.read_text().splitlines()
                if "weightd.daemon.reload: p2p." in line]
    try:
        changed = good.replace("[p2p]\n", '[p2p]\nupload_limit = "5MB"\nrack = "r1"\nfallback_after_s = 9\n'
                                           'threshold = "1MiB"\norigin_request_queue = 0\n')   # (a worker's: no effect)
        said = reload(changed)
        assert len(said) == 2 and said[0].startswith("p2p.upload_limit: take effect at the next restart"), said
        assert said[1].startswith("p2p.rack: new downloads use the new value at once"), said
        assert reload(changed) == said * 2             # (still waiting: said again)
        assert reload(good) == said * 2                # (back to what the session runs: nothing)
    finally:
        d.stop()


def test_a_reload_with_p2p_off_says_p2p_starts_at_a_restart(daemon, node_env) -> None:
    """A worker that started with P2P off (nothing to join): a reload that only changes what P2P would
    use says nothing (it stays off); one that names peers says P2P starts at the next restart."""
    good = node_env.config.read_text()
    for text, says in ((good.replace("[p2p]\n", '[p2p]\nupload_limit = "5MB"\norigin_request_queue = 0\n'), []),
                       (good.replace("[p2p]\n", '[p2p]\npeers = ["127.0.0.1:1"]\n'),
                        ["p2p.peers: P2P is off in this daemon"])):
        node_env.config.write_text(text)
        n = sum("config reloaded" in m for m in daemon.messages)
        daemon.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while sum("config reloaded" in m for m in daemon.messages) == n:
            assert time.monotonic() < deadline, daemon.messages
            daemon.drain()
        said = [line for line in daemon.log_path.read_text().splitlines() if "weightd.daemon.reload: p2p." in line]
        assert [s for s in says if not any(s in line for line in said)] == [] and len(said) == len(says), said


def test_stopping_is_notified(node_env, isolated_env, tmp_path: Path) -> None:
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        d.proc.send_signal(signal.SIGTERM)
        d.wait_for("STOPPING=1", 10)
        assert d.proc.wait(timeout=10) == 0
    finally:
        d.stop()


def test_second_daemon_refuses(daemon, node_env, isolated_env) -> None:
    proc = subprocess.run([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve"],
                          capture_output=True, text=True, timeout=30, env=isolated_env, cwd=ROOT)
    assert_one_line_error(proc, 2, "another weightd daemon", str(node_env.state))


CONTRACT_METRICS = ["weightd_weight_loading_seconds", "weightd_bytes_transferred_total", "weightd_tier_used_bytes",
                    "weightd_tier_capacity_bytes", "weightd_checkpoints", "weightd_pagecache_resident_bytes",
                    "weightd_p2p_upload_bytes_total", "weightd_p2p_download_bytes_total", "weightd_p2p_peers",
                    "weightd_hash_failures_total", "weightd_evictions_total", "weightd_node_disk_read_time_seconds_total",
                    "weightd_node_disk_io_time_seconds_total", "weightd_node_network_receive_bytes_total"]


def test_metrics_contract(daemon, wd, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    assert wd("preload", "org/d@v1", "--tier", "warm").returncode == 0
    assert wd("evict", "org/d@v1", "--force").returncode == 0
    text = daemon.metrics()
    for name in CONTRACT_METRICS:
        assert f"\n# TYPE {name.removesuffix('_total')}" in text or f"\n{name}" in text, name
    assert 'weightd_evictions_total{reason="admin",tier="warm"} 1.0' in text
    # the shipped rules use only metrics the daemon exports (or documented external ones)
    import yaml
    rules = yaml.safe_load((ROOT / "deploy/prometheus/weightd-alerts.yml").read_text())
    import re
    used = {m for g in rules["groups"] for r in g["rules"] for m in re.findall(r"\b(weightd_[a-z0-9_]+)", r["expr"])}
    exported = set(re.findall(r"^(weightd_[a-z0-9_]+)", text, re.M))
    missing = {m for m in used if m not in exported and not any(e.startswith(m) for e in exported)}
    # p2p-only and histogram series appear once there is traffic; the rest must be there now
    # (a virtual NIC reports no speed; series with labels appear at their first event)
    assert missing <= {"weightd_weight_loading_seconds_sum", "weightd_weight_loading_seconds_count",
                       "weightd_preload_failures_total", "weightd_node_network_speed_bytes"}, missing


# -- shipped files --------------------------------------------------------------------------------------

def promtool() -> str | None:
    local = ROOT / "tools/bin/promtool"
    return str(local) if local.exists() else shutil.which("promtool")


@pytest.mark.skipif(promtool() is None, reason="promtool not installed (make tools)")
def test_alert_rules_check_and_unit_tests() -> None:
    subprocess.run([promtool(), "check", "rules", str(ROOT / "deploy/prometheus/weightd-alerts.yml")], check=True,
                   capture_output=True, timeout=60)
    proc = subprocess.run([promtool(), "test", "rules", str(ROOT / "tests/promtool/weightd-alerts.test.yml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(promtool() is None, reason="promtool not installed (make tools)")
def test_grafana_dashboard_parses(tmp_path: Path) -> None:
    """deploy/grafana/weightd.json: valid JSON, every panel's PromQL parses (promtool, as recording rules,
    with Grafana's variables filled in), and every metric it names is one weightd exports."""
    import re

    import yaml
    dash = json.loads((ROOT / "deploy/grafana/weightd.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 8 and all(exprs)
    filled = [e.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$instance", ".*") for e in exprs]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:panel_{i}", "expr": e}
                                                         for i, e in enumerate(filled)]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool(), "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    exported = set(re.findall(r'"(weightd_[a-z0-9_]+)"', (ROOT / "weightd/metrics.py").read_text()))
    for name in {m for e in exprs for m in re.findall(r"weightd_[a-z0-9_]+", e)}:
        base = re.sub(r"_(bucket|total|count|sum)$", "", name)
        assert name in exported or base in exported, name
    needed = {"weightd_weight_loading_seconds_bucket", "weightd_bytes_transferred_total", "weightd_tier_used_bytes",
              "weightd_tier_capacity_bytes", "weightd_tier_high_watermark_ratio", "weightd_pagecache_resident_bytes",
              "weightd_preload_failures_total", "weightd_transfers_in_flight", "weightd_p2p_upload_bytes_total",
              "weightd_p2p_download_bytes_total", "weightd_p2p_peers"}
    assert needed <= {m for e in exprs for m in re.findall(r"weightd_[a-z0-9_]+", e)}


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (ROOT / "systemd/weightd.service").read_text()
    exe = shutil.which("weightd") or str(Path(sys.executable).parent / "weightd")
    (tmp_path / "weightd.service").write_text(unit.replace("/usr/bin/weightd", exe))
    proc = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "weightd.service")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "weightd.service" not in proc.stderr, proc.stderr
    for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "RuntimeDirectory=", "StateDirectory=",
                "CacheDirectory=", "LimitMEMLOCK=", "IOSchedulingClass="):
        assert key in unit
    # the example config is a valid weightd config
    from weightd.config import load_config
    assert str(load_config(ROOT / "systemd/weightd.toml").tiers.hot.path) == "/dev/shm/weightd"


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="no systemd-sysusers")
def test_sysusers_and_tmpfiles_parse(tmp_path: Path) -> None:
    proc = subprocess.run(["systemd-sysusers", "--dry-run", str(ROOT / "systemd/weightd.sysusers")],
                          capture_output=True, text=True, timeout=60)
    if "unrecognized option" in proc.stderr:
        pytest.skip("systemd-sysusers without --dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in (ROOT / "systemd/weightd.tmpfiles").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == ["d /dev/shm/weightd 0750 weightd weightd -"]


def test_kubernetes_manifests_validate() -> None:
    pytest.importorskip("kubernetes_validate")
    import yaml
    exe = Path(sys.executable).parent / "kubernetes-validate"
    kdir = ROOT / "deploy/kubernetes"
    kust = yaml.safe_load((kdir / "kustomization.yaml").read_text())
    files = [str(kdir / f) for f in kust["resources"]]  # (every resource the kustomization names exists)
    assert sorted(files) == sorted(str(f) for f in kdir.glob("*.yaml") if f.name != "kustomization.yaml")
    # the example serving workload is not part of `kubectl apply -k deploy/kubernetes`: deploy/examples/
    edir = ROOT / "deploy/examples"
    ekust = yaml.safe_load((edir / "vllm/kustomization.yaml").read_text())
    examples = [str(edir / "vllm" / f) for f in ekust["resources"]] + [str(edir / "vllm-init-container.yaml")]
    proc = subprocess.run([str(exe), "--strict", "-k", "1.37.0", *files, *examples], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("passed") == 8 + 4, proc.stdout + proc.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d}
    assert ("Namespace", "weightd") in set(docs) and ("Namespace", "inference") not in set(docs)
    assert {d["metadata"].get("namespace") for d in docs.values() if d["kind"] != "Namespace"} == {"weightd"}
    assert not any("nvidia.com/gpu" in str(c.get("resources")) for d in docs.values() if "template" in d.get("spec", {})
                   for c in d["spec"]["template"]["spec"]["containers"])   # (no GPU workload deployed with weightd)
    edocs = {(d["kind"], d["metadata"]["name"]): d for f in examples[:-1] for d in yaml.safe_load_all(Path(f).read_text())
             if d}
    dep = edocs[("Deployment", "llama-3-8b")]
    # the restart-safe default: `weightd hold` as a native sidecar, started (probe) once the path file is there
    pod = dep["spec"]["template"]["spec"]
    side = pod["initContainers"][0]
    assert side["restartPolicy"] == "Always" and side["image"] == "ghcr.io/weightd/weightd:0.1.0"
    args = side["args"]
    assert args[:2] == ["--config", "/etc/weightd/weightd.toml"] and args[2] == "hold" and "--no-daemon" not in args
    path_file = args[args.index("--path-file") + 1]
    assert side["startupProbe"]["exec"]["command"] == ["test", "-s", path_file]
    handoff = {m["name"]: m["mountPath"] for m in side["volumeMounts"]}["handoff"]
    assert Path(path_file).parent == Path(handoff)
    vllm = pod["containers"][0]
    assert f"cat {path_file}" in vllm["args"][0] and f"-s {path_file}" in vllm["args"][0]
    # the client config names the socket and tiers of the node daemon's config (a path outside the tiers
    # the client knows is refused)
    from weightd.config import load_config
    ccfg = Path(f"/tmp/weightd-test-k8s-client-{os.getpid()}.toml")
    try:
        ccfg.write_text(edocs[("ConfigMap", "weightd-client-config")]["data"]["weightd.toml"])
        client_cfg = load_config(ccfg).settings
    finally:
        ccfg.unlink()
    alt = yaml.safe_load((edir / "vllm-init-container.yaml").read_text())
    init = alt["spec"]["template"]["spec"]["initContainers"][0]
    assert "preload" in init["args"][0] and "--wait" in init["args"][0] and "--daemon-only" in init["args"][0]
    assert "pin" in (edir / "vllm-init-container.yaml").read_text().split("apiVersion")[0]   # (when it is safe)
    for kind, name, cm in (("DaemonSet", "weightd", "weightd-config"), ("StatefulSet", "weightd-origin",
                                                                        "weightd-origin-config")):
        spec = docs[(kind, name)]["spec"]["template"]["spec"]
        c = spec["containers"][0]
        # probes ask the daemon itself (never `weightd status`, which answers in-process when it is dead)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] in ("/healthz", "/readyz") and c[probe]["httpGet"]["port"] == "metrics"
        sc = c["securityContext"]
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False
        assert set(sc["capabilities"]["add"]) <= {"DAC_READ_SEARCH", "SYS_PTRACE", "IPC_LOCK"}
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert c["image"] == "ghcr.io/weightd/weightd:0.1.0"
        # the shipped config loads, and its ports are the container's
        cfg_text = docs[("ConfigMap", cm)]["data"]["weightd.toml"]
        tmp = Path(f"/tmp/weightd-test-k8s-{os.getpid()}.toml")
        try:
            tmp.write_text(cfg_text)
            cfg = load_config(tmp).settings
        finally:
            tmp.unlink()
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert cfg.metrics.listen.endswith(f":{ports['metrics']}") and cfg.p2p.listen.endswith(f":{ports['p2p']}")
        if kind == "DaemonSet":
            assert str(client_cfg.api.socket) == str(cfg.api.socket)
            assert (str(client_cfg.tiers.hot.path), str(client_cfg.tiers.warm.path)) == \
                (str(cfg.tiers.hot.path), str(cfg.tiers.warm.path))
            # the server reads the copy wherever it lands (hot, or warm when hot is full), from the host
            hosts = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
            served = {hosts[m["name"]] for m in vllm["volumeMounts"] if m["name"] in hosts}
            assert {str(cfg.tiers.hot.path), str(cfg.tiers.warm.path)} <= served
            assert str(Path(str(cfg.api.socket)).parent) in {hosts[m["name"]] for m in side["volumeMounts"]
                                                              if m["name"] in hosts}
            # tmpfs pages are charged to the writer: the memory limit covers the hot tier and then some
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
            limit = parse_size(c["resources"]["limits"]["memory"].replace("Gi", "GiB"))
            assert cfg.tiers.hot.capacity.bytes is not None and limit >= cfg.tiers.hot.capacity.bytes + (1 << 30)
            assert cfg.p2p.peers and cfg.p2p.trackers
        else:
            assert cfg.p2p.tracker_listen.endswith(f":{ports['tracker']}")
    # the intent ConfigMap parses and is mounted where the config says; the example Deployment's node
    # affinity names the labels weightd writes for its model
    from weightd.intent import nfd
    from weightd.intent.spec import parse_text
    ds = docs[("DaemonSet", "weightd")]["spec"]["template"]["spec"]
    for name, text in docs[("ConfigMap", "weightd-intent")]["data"].items():
        assert parse_text(name, text)
    mounts = {m["name"]: m["mountPath"] for m in ds["containers"][0]["volumeMounts"]}
    tmp = Path(f"/tmp/weightd-test-k8s-{os.getpid()}.toml")
    try:
        tmp.write_text(docs[("ConfigMap", "weightd-config")]["data"]["weightd.toml"])
        icfg = load_config(tmp).settings.intent
    finally:
        tmp.unlink()
    assert str(icfg.dir) == mounts["intent"] and str(icfg.nfd_dir) == mounts["nfd-features"]
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms for e in t["preference"]["matchExpressions"]}
    assert keys == {nfd.label_name("meta/llama-3-8b")}
    assert {v for t in terms for e in t["preference"]["matchExpressions"] for v in e["values"]} == {"hot", "warm", "ready"}
    # the PodMonitor selects the pods and port the Service does
    pm = yaml.safe_load((kdir / "monitoring/podmonitor.yaml").read_text())
    svc = docs[("Service", "weightd-metrics")]
    assert pm["kind"] == "PodMonitor" and pm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    if shutil.which("kubectl"):  # (not on a fresh machine: the check above stands without it)
        out = subprocess.run(["kubectl", "kustomize", str(kdir)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.count("\nkind: ") + out.stdout.startswith("kind: ") == 8, out.stderr
        out = subprocess.run(["kubectl", "kustomize", str(edir / "vllm")], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "kind: Deployment" in out.stdout, out.stderr


def test_dockerfile_builds_the_image_the_manifests_name() -> None:
    """The Dockerfile as text: the image name the manifests use, weightd as the entrypoint, nothing
    copied that the context lacks (its build steps are run by tests/test_install.py)."""
    text = (ROOT / "deploy/docker/Dockerfile").read_text()
    assert "ghcr.io/weightd/weightd:0.1.0" in text.splitlines()[0] + text.splitlines()[1]
    copies = [src for ln in text.splitlines() if ln.startswith("COPY ") and "--from" not in ln
              for src in ln.split()[1:-1]]
    for src in copies:
        assert (ROOT / src).exists(), src
    assert {"pyproject.toml", "LICENSE", "weightd", "tiering", "p2p", "scripts/install-venv.sh"} <= set(copies)
    assert 'ENTRYPOINT ["weightd"]' in text and "scripts/install-venv.sh /opt/weightd" in text
    ignore = (ROOT / "deploy/docker/Dockerfile.dockerignore").read_text().split()
    assert not {"weightd", "tiering", "p2p", "pyproject.toml", "README.md", "LICENSE", "scripts"} & set(ignore)


def test_a_full_notify_socket_never_blocks(tmp_path: Path) -> None:
    """systemd (or a test) that does not read its notify socket must not freeze the daemon's loop."""
    from weightd.daemon.sdnotify import Notifier
    path = tmp_path / "n.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    try:
        n = Notifier({"NOTIFY_SOCKET": str(path)})
        t0 = time.monotonic()
        for i in range(500):
            n.notify(STATUS=f"message {i}")
        assert time.monotonic() - t0 < 5 and n.dropped > 0
        n.close()
    finally:
        receiver.close()


def test_doctor_reads_the_daemons_history_instead_of_sampling(daemon, wd) -> None:
    """The daemon keeps the raw node counters every 5 s; the doctor uses them when it answers."""
    deadline = time.monotonic() + 20
    while True:
        proc = wd("doctor", "--sample-s", "0.2", "--no-probe", "--json")
        assert proc.returncode in (0, 7), proc.stderr
        doc = json.loads(proc.stdout)
        if doc["source"].startswith("the daemon's history"):
            break
        assert time.monotonic() < deadline, doc["source"]  # a second sample arrives after 5 s
        time.sleep(1)
    assert 4 < doc["window_s"] < 20 and doc["measurements"]["disks"]
    direct = json.loads(wd("--no-daemon", "doctor", "--sample-s", "0.2", "--no-probe", "--json").stdout)
    assert "sampling" in direct["source"]


def test_daemon_only_never_falls_back_to_in_process(daemon, wd, tmp_path: Path) -> None:
    """An init-container with --daemon-only goes through the daemon, and fails cleanly without it."""
    publish(wd, tmp_path)
    proc = wd("--daemon-only", "preload", "org/d@v1", "--tier", "warm", "--json")
    assert proc.returncode == 0, proc.stderr
    daemon.stop()
    down = wd("--daemon-only", "preload", "org/d@v1", "--tier", "warm")
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and "does not answer" in down.stderr
    both = wd("--daemon-only", "--no-daemon", "status")
    assert both.returncode == 2 and "contradict" in both.stderr


def test_probes_answer_from_the_daemon_itself(daemon) -> None:
    """/healthz and /readyz on the metrics port (what kubelet probes): 200 from a serving daemon, and
    nothing once it is gone (a probe that ran `weightd status` passed with the daemon dead: it falls back
    to in-process)."""
    import urllib.error
    # (this node names no peers or trackers: it opens no P2P port at all)
    assert "p2p off: no [p2p] peers or trackers configured" in daemon.log_path.read_text()
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}{path}", timeout=10) as r:
            body = json.loads(r.read())
            assert r.status == 200 and body["ok"] is True and body["pid"] == daemon.proc.pid, body
    daemon.proc.send_signal(signal.SIGSTOP)  # wedged: the probe times out (kubelet restarts it)
    try:
        with pytest.raises((urllib.error.URLError, TimeoutError, socket.timeout)):
            urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/healthz", timeout=2)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    daemon.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/readyz", timeout=5)


def test_restart_under_a_waiting_client(daemon, wd, node_env, isolated_env, tmp_path: Path) -> None:
    """A rollout: an init-container blocked in `preload --wait` through the daemon; SIGTERM stops the
    daemon within the promised 10 s anyway; the client hears "restarting", reconnects to the next daemon
    and completes once the version is published, within its own --timeout."""
    client = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--daemon-only",
                               "preload", "org/r@v1", "--wait", "--timeout", "90", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=isolated_env, cwd=ROOT)
    nxt = None
    try:
        deadline = time.monotonic() + 30  # the client's request reached the daemon (its log names it) and waits
        while not re.search(r"request route=preload .*ref=org/r@v1 .*wait=True", daemon.log_path.read_text()):
            assert client.poll() is None and time.monotonic() < deadline, (client.poll(), daemon.log_path.read_text())
            time.sleep(0.05)
        assert client.poll() is None, client.communicate()
        t0 = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.wait(timeout=30)
        stopped = time.monotonic() - t0
        assert stopped < 10, f"the daemon took {stopped:.1f} s to stop under a waiting client"
        assert client.poll() is None  # the client did not give up: it waits for the next daemon
        time.sleep(1.0)
        log = open(tmp_path / "daemon2.log", "w")
        nxt = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "serve"],
                               stdout=log, stderr=subprocess.STDOUT, env=isolated_env, cwd=ROOT)
        deadline = time.monotonic() + 30
        while not daemon.socket_path.exists():
            assert time.monotonic() < deadline and nxt.poll() is None, (tmp_path / "daemon2.log").read_text()
            time.sleep(0.1)
        publish(wd, tmp_path, name="org/r", version="v1")
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        assert json.loads(out)["path"] == str(node_env.hot / "org/r/v1")
        assert "restarting" in err and "Traceback" not in err, err
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate()
        if nxt is not None:
            stop_process(nxt)
            log.close()


def test_daemon_logs_json_lines_with_key_values(node_env, isolated_env, wd, tmp_path: Path) -> None:
    """--log-format json: one object per line, a UTC timestamp, and the message's key=value pairs as
    fields: start, every request with the caller's pid, the preload's outcome by source."""
    d = DaemonProc(node_env, isolated_env, tmp_path, serve_args=("--log-format", "json"))
    try:
        publish(wd, tmp_path, name="org/l")
        me = wd("preload", "org/l@v1", "--tier", "warm", "--json")
        assert me.returncode == 0, me.stderr
    finally:
        d.stop()
    lines = [json.loads(ln) for ln in d.log_path.read_text().splitlines() if ln.startswith("{")]
    assert lines and all(set(ln) >= {"ts", "level", "logger", "msg"} and ln["ts"].endswith("Z") for ln in lines)
    req = next(ln for ln in lines if ln.get("route") == "preload")
    assert req["ref"] == "org/l@v1" and req["tier"] == "warm" and isinstance(req["pid"], int) and req["pid"] > 0
    done = next(ln for ln in lines if ln["msg"].startswith("preloaded ") and ln["logger"] == "weightd.node.service")
    assert done["name"] == "org/l" and done["cold"] == done["bytes"] > 0 and done["already_present"] == "false"
    assert any(ln["msg"].startswith("serving role=") for ln in lines)


def test_time_to_ready_in_metrics_and_status(daemon, wd, tmp_path: Path) -> None:
    """From a request's arrival to its copy verified, placed and warm: the histogram per model and tier,
    and exact p50/p95 of the recent requests in ``status --json`` (a request finding the copy in place
    counts too: its caller waited as well)."""
    publish(wd, tmp_path)
    for _ in range(3):
        assert wd("preload", "org/d@v1", "--tier", "warm").returncode == 0
    text = daemon.metrics()
    assert 'weightd_time_to_ready_seconds_count{model="org/d",tier="warm"} 3.0' in text
    st = json.loads(wd("status", "--json").stdout)
    row = next(r for r in st["time_to_ready"] if r["model"] == "org/d")
    assert row["tier"] == "warm" and row["requests"] == 3
    assert 0 < row["p50_s"] <= row["p95_s"] <= row["max_s"] < 120
    # the first request moved the bytes; the others found them in place, faster
    assert row["max_s"] > row["p50_s"]
