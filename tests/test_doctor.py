"""weightd doctor: recorded /proc and /sys snapshots with known deltas, one scenario per verdict/finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightd.doctor import diagnose, gather_snapshot

GiB, MiB = 1 << 30, 1 << 20
SNMP_HEAD = ("Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab "
             "InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors")


class Snap:
    """Writes a snapshot: t0/ and t1/ counters ``window_s`` apart, static/ facts, meta.json."""

    def __init__(self, root: Path, window_s: float = 2.0) -> None:
        self.root, self.window = root, window_s
        self.disks = {"vda": ((254, 0), (1000, 2000, 80000, 1000)), "vdb": ((254, 16), (500, 500, 4000, 100))}
        self.disk_delta = {"vda": (200, 200, 16000, 100), "vdb": (10, 5, 80, 5)}   # reads, read_ms, sectors, io_ms
        self.nic = {"eth0": (10 ** 9, 10 ** 9)}
        self.nic_delta = {"eth0": (20 * 10 ** 6, 5 * 10 ** 6)}
        self.speed, self.mtu = {"eth0": 100_000}, {"eth0": 9000}
        self.tcp, self.tcp_delta = (10 ** 6, 100), (100_000, 10)
        self.mounts = [("254:0", "/", "ext4", "rw,noatime", "/dev/vda"),
                       ("254:16", "/var/log", "ext4", "rw,noatime", "/dev/vdb"),
                       ("0:25", "/dev/shm", "tmpfs", "rw,nosuid,nodev,size=16777216k", "tmpfs")]
        self.memory_max: str | None = "max"
        self.memlock = "unlimited"
        self.tiers = [{"name": "hot", "path": "/dev/shm/weightd", "capacity": 8 * GiB},
                      {"name": "warm", "path": "/var/lib/weightd/warm", "capacity": 100 * GiB},
                      {"name": "cold", "path": "/mnt/models", "capacity": None}]
        self.meta: dict = {}

    def write(self) -> Path:
        import shutil
        shutil.rmtree(self.root, ignore_errors=True)  # (written again after a change)
        for t, scale in (("t0", 0), ("t1", 1)):
            d = self.root / t / "proc"
            (d / "net").mkdir(parents=True)
            lines = []
            for name, ((ma, mi), base) in self.disks.items():
                dd = self.disk_delta.get(name, (0, 0, 0, 0))
                r, rms, sec, io = (b + scale * x for b, x in zip(base, dd))
                lines.append(f"{ma} {mi} {name} {r} 0 {sec} {rms} 10 0 80 10 0 {io} {io}")
            (d / "diskstats").write_text("\n".join(lines) + "\n")
            net = ["Inter-|   Receive", " face |bytes packets"]
            net.append("    lo: 5 1 0 0 0 0 0 0 5 1 0 0 0 0 0 0")
            for n, (rx, tx) in self.nic.items():
                drx, dtx = self.nic_delta[n]
                net.append(f"  {n}: {rx + scale * drx} 1 0 0 0 0 0 0 {tx + scale * dtx} 1 0 0 0 0 0 0")
            (d / "net/dev").write_text("\n".join(net) + "\n")
            out, ret = (b + scale * x for b, x in zip(self.tcp, self.tcp_delta))
            (d / "net/snmp").write_text(f"{SNMP_HEAD}\nTcp: 1 200 120000 -1 5 5 0 0 3 1000 {out} {ret} 0 0 0\n")
            (d / "softirqs").write_text(f"          CPU0 CPU1\n  NET_TX: {10 * scale} 0\n  NET_RX: {100 + 50 * scale} 7\n")
        s = self.root / "static"
        (s / "proc/self").mkdir(parents=True)
        (s / "proc/self/mountinfo").write_text("".join(
            f"{i + 20} 1 {dev} / {mp} {opts} shared:1 - {fs} {src} {opts}\n"
            for i, (dev, mp, fs, opts, src) in enumerate(self.mounts)))
        (s / "proc/self/limits").write_text(
            "Limit                     Soft Limit           Hard Limit           Units\n"
            f"Max locked memory         {self.memlock}            {self.memlock}            bytes\n")
        for n in self.nic:
            (s / f"sys/class/net/{n}").mkdir(parents=True)
            (s / f"sys/class/net/{n}/speed").write_text(f"{self.speed[n]}\n")
            (s / f"sys/class/net/{n}/mtu").write_text(f"{self.mtu[n]}\n")
        if self.memory_max is not None:
            (s / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
            (s / "sys/fs/cgroup/memory.max").write_text(self.memory_max + "\n")
        (self.root / "meta.json").write_text(json.dumps({"window_s": self.window, "tiers": self.tiers,
                                                         "log_dir": "/var/log", **self.meta}))
        return self.root


def run(snap: Snap):
    return diagnose(gather_snapshot(snap.write(), []))


def ids(report) -> set[str]:
    return {f.id for f in report.findings}


@pytest.fixture
def snap(tmp_path: Path) -> Snap:
    return Snap(tmp_path / "snap")


def test_healthy(snap: Snap) -> None:
    r = run(snap)
    assert r.verdict == "healthy" and not r.findings, r.to_dict()
    d = r.measurements["disks"]["vda"]
    assert d["read_await_ms"] == 1.0 and d["util"] == 0.05 and d["tiers"] == ["warm", "cold"]
    assert r.measurements["nics"]["eth0"]["bytes_per_s"] == 10 ** 7


def test_disk_bound(snap: Snap) -> None:
    snap.disk_delta["vda"] = (400, 4800, 64000, 1900)   # 12 ms per read, 95% busy
    r = run(snap)
    assert r.verdict == "disk" and r.critical
    f = next(f for f in r.findings if f.id == "disk-saturated")
    assert f.evidence["device"] == "vda" and f.evidence["read_await_ms"] == 12.0 and f.evidence["util"] == 0.95
    assert "warm" in f.evidence["tiers"] and "page cache" in f.recommendation


def test_network_bound(snap: Snap) -> None:
    snap.nic_delta["eth0"] = (22 * 10 ** 9, 10 ** 9)       # 11 GB/s on a 100 Gbit/s link: 88%
    snap.mtu["eth0"] = 1500
    snap.tcp_delta = (100_000, 3000)                      # 3% retransmits
    r = run(snap)
    assert r.verdict == "network" and r.critical
    assert {"nic-saturated", "no-jumbo-frames", "no-rdma", "tcp-retransmits"} <= ids(r)
    nic = next(f for f in r.findings if f.id == "nic-saturated")
    assert nic.evidence["util"] == 0.88 and "upload_limit" in nic.recommendation


def test_neither_points_at_the_gpu(snap: Snap) -> None:
    snap.meta["symptom"] = "high TTFT"
    r = run(snap)
    assert r.verdict == "gpu" and not r.critical
    assert "Nsight" in next(f for f in r.findings if f.id == "neither-disk-nor-network").recommendation


def test_overlayfs_tier(snap: Snap) -> None:
    snap.mounts.append(("0:50", "/var/lib/weightd", "overlay", "rw,relatime", "overlay"))
    r = run(snap)
    assert "tier-on-overlayfs" in ids(r) and r.verdict == "healthy"


def test_strictatime_warns_relatime_does_not_and_root_is_never_remounted_live(snap: Snap) -> None:
    snap.mounts[0] = ("254:0", "/", "ext4", "rw,relatime", "/dev/vda")  # the kernel's default: fine
    assert "strictatime" not in ids(run(snap))
    snap.mounts[0] = ("254:0", "/", "ext4", "rw,strictatime", "/dev/vda")  # an access time on every read
    f = next(f for f in run(snap).findings if f.id == "strictatime")
    assert f.evidence["tier"] == "warm" and f.severity == "warning"
    assert "next reboot" in f.recommendation and "do not remount the root file system" in f.recommendation
    assert "mount -o remount" not in f.recommendation
    snap.mounts.append(("254:32", "/var/lib/weightd", "ext4", "rw", "/dev/vdc"))  # a tier's own mount
    f = next(f for f in run(snap).findings if f.id == "strictatime")
    assert "mount -o remount,noatime /var/lib/weightd" in f.recommendation


def test_shm_smaller_than_hot_capacity(snap: Snap) -> None:
    snap.mounts[2] = ("0:25", "/dev/shm", "tmpfs", "rw,size=1g", "tmpfs")
    r = run(snap)
    f = next(f for f in r.findings if f.id == "shm-smaller-than-hot")
    assert f.severity == "critical" and f.evidence["tmpfs_bytes"] == GiB and f.evidence["capacity_bytes"] == 8 * GiB


def test_hot_tier_beyond_the_cgroup_memory_limit(snap: Snap) -> None:
    snap.memory_max = str(4 * GiB)
    r = run(snap)
    f = next(f for f in r.findings if f.id == "hot-beyond-memory-limit")
    assert f.severity == "critical" and f.evidence["memory_limit_bytes"] == 4 * GiB


def test_tiers_on_the_log_device(snap: Snap) -> None:
    snap.mounts = [m for m in snap.mounts if m[1] != "/var/log"]  # /var/log now lives on / (vda), with warm
    r = run(snap)
    f = next(f for f in r.findings if f.id == "tier-shares-log-device")
    assert f.evidence["tier"] == "warm" and f.evidence["device"] == "254:0"


def test_memlock_too_low(snap: Snap) -> None:
    snap.memlock = str(64 << 10)
    snap.meta["lock_wanted"] = 2 * GiB
    r = run(snap)
    f = next(f for f in r.findings if f.id == "memlock-too-low")
    assert f.evidence == {"memlock_bytes": 64 << 10, "wanted_bytes": 2 * GiB}


def test_random_read_probe_against_its_baseline(snap: Snap) -> None:
    snap.meta["probe"] = {"tier": "warm", "p50_us": 1400.0, "p99_us": 5000.0, "baseline_p50_us": 60.0}
    r = run(snap)
    f = next(f for f in r.findings if f.id == "random-read-degraded")
    assert f.severity == "critical" and "1400" in f.summary


# -- the command ---------------------------------------------------------------------------------------
def test_cli_replays_a_snapshot_with_the_documented_schema_and_exit_codes(wd, snap: Snap) -> None:
    healthy = wd("doctor", "--snapshot", str(snap.write()), "--json")
    assert healthy.returncode == 0, healthy.stderr
    doc = json.loads(healthy.stdout)
    assert doc["schema"] == "weightd.doctor/v1" and doc["verdict"] == "healthy" and doc["critical"] is False
    assert set(doc) >= {"findings", "measurements", "source", "window_s"} and doc["window_s"] == 2.0
    bad = Snap(snap.root.parent / "bad")
    bad.disk_delta["vda"] = (400, 4800, 64000, 1900)
    proc = wd("doctor", "--snapshot", str(bad.write()))
    assert proc.returncode == 7  # a critical finding
    assert proc.stdout.startswith("verdict: the DISK is the bottleneck") and "[CRITICAL]" in proc.stdout
    missing = wd("doctor", "--snapshot", str(snap.root.parent / "nope"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "--snapshot" in missing.stderr
    (bad.root / "meta.json").write_text('{"tiers": [{"path": "/x"}]}')   # a tier without a name
    broken = wd("doctor", "--snapshot", str(bad.root))
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1 and "malformed snapshot" in broken.stderr
    (bad.root / "meta.json").write_text("{not json")
    assert wd("doctor", "--snapshot", str(bad.root)).returncode == 2


def test_a_real_run_on_this_machine_is_sane(wd, node_env) -> None:
    proc = wd("doctor", "--sample-s", "0.5", "--json")
    assert proc.returncode in (0, 7), proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] in ("healthy", "disk", "network", "gpu") and 0.4 < doc["window_s"] < 5
    assert doc["measurements"]["disks"], "the tiers' device is measured"
    for f in doc["findings"]:
        assert f["severity"] in ("critical", "warning", "info") and f["evidence"] and f["recommendation"]
    # the warm tier holds nothing yet: the probe measured a temporary file and left nothing behind
    assert "probe" in doc["measurements"] and 0 < doc["measurements"]["probe"]["p50_us"] < 1e6
    assert not list(Path(node_env.warm).parent.glob(".weightd-bench-disk-*"))


def test_bench_disk_records_the_baseline_the_doctor_uses(wd, node_env, tmp_path: Path) -> None:
    proc = wd("bench", "disk", str(tmp_path), "--size", "8MiB", "--seconds", "0.3", "--depths", "1,2", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert set(r["randread_4k"]) == {"1", "2"} and r["randread_4k"]["1"]["reads"] > 10
    assert r["randread_4k"]["2"]["p50_us"] > 0 and r["seqread_16m"]["bytes"] == 8 << 20
    assert Path(r["baseline_file"]).is_file() and not list(tmp_path.glob(".weightd-bench-disk-*"))
    # the warm tier is on the same device: the doctor's probe now has a baseline to compare with
    Path(node_env.warm).mkdir(parents=True, exist_ok=True)
    doc = json.loads(wd("doctor", "--sample-s", "0.2", "--json").stdout)
    assert doc["measurements"]["probe"]["baseline_p50_us"] == r["randread_4k"]["1"]["p50_us"]
    bad = wd("bench", "disk", str(tmp_path), "--depths", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    gone = wd("bench", "disk", str(tmp_path / "missing"))
    assert gone.returncode == 2 and "no such file" in gone.stderr


# -- weightd itself (live runs) ---------------------------------------------------------------------------

def _doc(wd, *args):
    proc = wd("doctor", "--sample-s", "0.2", "--no-probe", "--json", *args)
    assert proc.returncode in (0, 7), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _find(doc, fid):
    return next((f for f in doc["findings"] if f["id"] == fid), None)


def test_doctor_sees_the_daemon_down_and_a_tier_near_its_watermark(wd, node_env, tmp_path: Path) -> None:
    from tiering.sample import make_checkpoint
    src = make_checkpoint(tmp_path / "src", total_bytes=3 * MiB, shards=1, layers=2, seed="w")
    assert wd("publish", src, "--name", "org/w", "--version", "v1").returncode == 0
    size = json.loads(wd("ls", "--json").stdout)["versions"][0]["bytes"]
    node_env.write_config(str(int(size * 1.03)), "512MiB")  # it fits, at 97% of capacity (high watermark 95%)
    r = wd("--no-daemon", "preload", "org/w@v1", "--tier", "hot", "--lease", "0", "--strict")
    assert r.returncode == 0, r.stderr
    code, doc = _doc(wd)
    f = _find(doc, "daemon-not-answering")
    assert f and "no socket" in f["summary"] and "systemctl start weightd" in f["recommendation"]
    f = _find(doc, "tier-near-watermark")
    assert f and f["evidence"]["tier"] == "hot" and "raise [tiers.hot] capacity" in f["recommendation"]
    w = doc["measurements"]["weightd"]
    assert w["daemon"] == "down" and w["spot_checked"][0]["ok"] and w["spot_checked"][0]["bytes"] > 0
    assert _find(doc, "copy-damaged") is None and code == 0
    _, doc = _doc(wd, "--no-verify")
    assert doc["measurements"]["weightd"]["spot_checked"] == []
    doc = json.loads(wd("--no-daemon", "doctor", "--sample-s", "0.2", "--no-probe", "--json").stdout)
    assert _find(doc, "daemon-not-answering") is None  # --no-daemon: not asked, so not reported


def test_doctor_finds_a_damaged_copy(wd, node_env, tmp_path: Path) -> None:
    from tiering.sample import make_checkpoint
    src = make_checkpoint(tmp_path / "src", total_bytes=4 * MiB, shards=1, layers=2, seed="d")
    assert wd("publish", src, "--name", "org/d", "--version", "v1").returncode == 0
    assert wd("--no-daemon", "preload", "org/d@v1", "--tier", "warm").returncode == 0
    shard = next((node_env.warm / "org/d/v1").glob("*.safetensors"))
    with open(shard, "r+b") as fh:  # one flipped byte in the last tensor (bit rot)
        fh.seek(-100, 2)
        b = fh.read(1)
        fh.seek(-100, 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    for _ in range(3):  # a copy within the spot check's budget is read whole: caught every time, not by luck
        code, doc = _doc(wd)
        f = _find(doc, "copy-damaged")
        assert code == 7 and f and f["severity"] == "critical" and f["evidence"]["ref"] == "org/d@v1"
        assert "weightd evict org/d@v1 --tier warm --force" in f["recommendation"]


def test_doctor_through_the_daemon_reports_recent_fallbacks(wd, node_env, isolated_env, tmp_path: Path) -> None:
    """A hot tier too small for the model: the preload falls back to warm; the daemon remembers it and
    the doctor, asking the daemon, says so."""
    from tiering.sample import make_checkpoint
    from .test_daemon import DaemonProc
    node_env.write_config("1MiB", "512MiB")
    src = make_checkpoint(tmp_path / "src", total_bytes=3 * MiB, shards=1, layers=2, seed="f")
    assert wd("publish", src, "--name", "org/f", "--version", "v1").returncode == 0
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        r = wd("preload", "org/f@v1", "--tier", "hot", "--json", "--timeout", "60")
        assert r.returncode == 0 and json.loads(r.stdout)["tier"] == "warm", r.stderr
        code, doc = _doc(wd)
        w = doc["measurements"]["weightd"]
        assert w["daemon"] == "up" and _find(doc, "daemon-not-answering") is None and w["cold_checked_versions"] == 1
        f = _find(doc, "recent-fallbacks")
        assert f and f["evidence"]["kinds"] == ["hot->warm"] and "org/f@v1" in f["summary"]
    finally:
        d.stop()


def test_the_spot_check_keeps_to_its_budget_and_always_sees_a_truncation(tmp_path: Path) -> None:
    import os
    import random
    from tiering import Dir, build_manifest, sample_verify
    from tiering.sample import make_checkpoint
    src = make_checkpoint(tmp_path / "c", total_bytes=8 * MiB, shards=2, layers=4, seed="s")
    m = build_manifest(src)
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    with Dir(fd, src) as d:
        lengths = [p.length for f in m.files for p in f.parts(m.chunk_size) if p.xxh3_128]
        whole = sample_verify(d, m, budget_bytes=1 << 30)
        assert not whole.problems and whole.bytes_checked == sum(lengths)  # within the budget: everything
        part = sample_verify(d, m, budget_bytes=1 * MiB, rng=random.Random(1))
        assert 0 < part.bytes_checked <= max(1 * MiB, max(lengths)) and not part.problems
        shard = next(src.glob("*.safetensors"))
        os.truncate(shard, shard.stat().st_size - 1)
        cut = sample_verify(d, m, budget_bytes=1)  # no part re-hashed, yet the size check catches it
        assert any(p.what == "size" for p in cut.problems)
