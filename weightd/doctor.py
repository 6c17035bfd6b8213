"""``weightd doctor``: the seed reports' bottleneck decision tree, with evidence.

Two samples of the node's counters ``sample_s`` apart (``/proc/diskstats``, ``/proc/net/dev``,
``/proc/net/snmp``, ``/proc/softirqs``), the static facts (NIC speed and MTU, InfiniBand devices,
mounts, the cgroup memory limit, RLIMIT_MEMLOCK) and per-tier checks become findings, each with a
severity, the numbers behind it and a recommendation. Then the tree:

    disk saturated (read await > 5 ms and util > 70% on a tier's device)  -> "disk"
    else NIC > 80% of its speed                                           -> "network"
    else, if loads are reported slow (--symptom)                          -> "gpu" (outside weightd)
    else                                                                  -> "healthy"

Everything is read below a root directory (``/`` normally), so recorded snapshots replay exactly: a
snapshot directory holds ``t0/`` and ``t1/`` trees (``proc/diskstats`` ...) and ``static/`` (``sys``,
``proc/self/mountinfo``, ``proc/self/limits``, cgroup files), plus ``meta.json`` (window, probes).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UsageError
from .pressure import link_info, parse_diskstats, parse_netdev, parse_tcp, read_text

SCHEMA = 1
AWAIT_MS, UTIL, NIC_UTIL, RETRANS = 5.0, 0.70, 0.80, 0.01
SEVERITIES = ("critical", "warning", "info")


@dataclass(slots=True)
class Finding:
    id: str
    severity: str
    subsystem: str          # disk | network | memory | tier | gpu
    summary: str
    evidence: dict[str, Any]
    recommendation: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "subsystem": self.subsystem, "summary": self.summary,
                "evidence": self.evidence, "recommendation": self.recommendation}


@dataclass(slots=True)
class Counters:
    disks: dict[str, tuple[int, int, int, int]]       # name -> (reads, read_ms, sectors_read, io_ms)
    devnums: dict[str, str]                           # "maj:min" -> name
    nics: dict[str, tuple[int, int]]                  # name -> (rx_bytes, tx_bytes)
    tcp: tuple[int, int]                              # (OutSegs, RetransSegs)
    net_softirq: int                                  # NET_RX + NET_TX over all CPUs


COUNTER_FILES = ("proc/diskstats", "proc/net/dev", "proc/net/snmp", "proc/softirqs")


def read_counter_texts(root: Path) -> dict[str, str]:
    """The raw counter files (what the daemon keeps a history of)."""
    return {rel: read_text(root / rel) for rel in COUNTER_FILES}


def read_counters(root: Path) -> Counters:
    return parse_counters(read_counter_texts(root))


def parse_counters(texts: dict[str, str]) -> Counters:
    disks = parse_diskstats(texts.get("proc/diskstats", ""))
    tcp = parse_tcp(texts.get("proc/net/snmp", ""))
    soft = 0
    for line in texts.get("proc/softirqs", "").splitlines():
        f = line.split()
        if f and f[0] in ("NET_RX:", "NET_TX:"):
            soft += sum(int(x) for x in f[1:] if x.isdigit())
    return Counters({d.device: (d.reads, d.read_ms, d.sectors_read, d.io_ms) for d in disks},
                    {d.devnum: d.device for d in disks},
                    {name: (rx, tx) for name, rx, tx in parse_netdev(texts.get("proc/net/dev", ""))},
                    (tcp.get("OutSegs", 0), tcp.get("RetransSegs", 0)), soft)


@dataclass(slots=True)
class Mount:
    mountpoint: str
    fstype: str
    options: set[str]
    devnum: str
    source: str


def read_mounts(root: Path) -> list[Mount]:
    out = []
    for line in read_text(root / "proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 6 or len(r) < 2:
            continue
        opts = set(f[5].split(",")) | set((r[2] if len(r) > 2 else "").split(","))
        out.append(Mount(f[4].replace("\\040", " "), r[0], opts, f[2], r[1]))
    return out


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    best = None
    p = os.path.abspath(path)
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        if p == mp or p.startswith(mp + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mountpoint.rstrip("/") or "/"):
                best = m
    return best


def memory_limit(root: Path) -> int | None:
    """The cgroup memory limit of this process (v2 memory.max, else v1), None when unlimited."""
    for rel in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        text = read_text(root / rel).strip()
        if text and text != "max":
            try:
                n = int(text)
            except ValueError:
                continue
            if n < (1 << 60):
                return n
    return None


def memlock_limit(root: Path) -> int | None:
    """RLIMIT_MEMLOCK soft limit in bytes (None = unlimited), from proc/self/limits."""
    for line in read_text(root / "proc/self/limits").splitlines():
        if line.startswith("Max locked memory"):
            v = line.split()[3]
            return None if v == "unlimited" else int(v)
    return None


def tmpfs_size(m: Mount) -> int | None:
    for o in m.options:
        if o.startswith("size="):
            v = o[5:]
            mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(v[-1:].lower(), 1)
            try:
                return int(v.rstrip("kKmMgG")) * mult
            except ValueError:
                return None
    return None


@dataclass(slots=True)
class Tier:
    name: str
    path: str
    capacity: int | None


@dataclass(slots=True)
class Inputs:
    """Everything the tree looks at; ``gather`` reads it from a live node or a recorded snapshot."""
    window_s: float
    before: Counters
    after: Counters
    mounts: list[Mount]
    nic_speed: dict[str, int]         # bytes/s
    nic_mtu: dict[str, int]
    rdma: list[str]
    mem_limit: int | None
    memlock: int | None
    tiers: list[Tier]
    log_dir: str = "/var/log"
    lock_wanted: int = 0              # bytes the config asks to mlock (0 = no)
    probe: dict[str, Any] | None = None       # {"tier", "p50_us", "p99_us", "baseline_p50_us"}
    symptom: str | None = None


def _static(root: Path) -> tuple[dict[str, int], dict[str, int], list[str]]:
    speed, mtu = {}, {}
    net = root / "sys/class/net"
    if net.is_dir():
        for d in sorted(net.iterdir()):
            if d.name == "lo":
                continue
            s, m = link_info(net, d.name)
            if s:
                speed[d.name] = s
            if m:
                mtu[d.name] = m
    ib = root / "sys/class/infiniband"
    rdma = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
    return speed, mtu, rdma


def gather_snapshot(snap: Path, tiers: list[Tier], *, log_dir: str = "/var/log", lock_wanted: int = 0,
                    probe: dict[str, Any] | None = None, symptom: str | None = None) -> Inputs:
    """A recorded scenario: ``snap/{t0,t1,static}`` and ``snap/meta.json``, whose keys (``window_s``,
    ``tiers``, ``log_dir``, ``lock_wanted``, ``probe``, ``symptom``) win over the arguments. A
    malformed snapshot is a UsageError naming it."""
    try:
        return _gather_snapshot(snap, tiers, log_dir, lock_wanted, probe, symptom)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise UsageError(f"--snapshot {snap}: malformed snapshot ({type(exc).__name__}: {exc})") from None


def _gather_snapshot(snap: Path, tiers: list[Tier], log_dir: str, lock_wanted: int,
                     probe: dict[str, Any] | None, symptom: str | None) -> Inputs:
    meta = json.loads(read_text(snap / "meta.json") or "{}")
    static = snap / "static"
    speed, mtu, rdma = _static(static)
    if "tiers" in meta:
        tiers = [Tier(t["name"], t["path"], t.get("capacity")) for t in meta["tiers"]]
    return Inputs(float(meta.get("window_s", 1.0)), read_counters(snap / "t0"), read_counters(snap / "t1"),
                  read_mounts(static), speed, mtu, rdma, memory_limit(static), memlock_limit(static), tiers,
                  log_dir=meta.get("log_dir", log_dir), lock_wanted=int(meta.get("lock_wanted", lock_wanted)),
                  probe=meta.get("probe", probe), symptom=meta.get("symptom", symptom))


def gather_live(tiers: list[Tier], sample_s: float, *, history: dict[str, Any] | None = None,
                **kw: Any) -> Inputs:
    """Sample this node for ``sample_s``, or use ``history`` (a running daemon's: ``window_s``,
    ``t0`` and ``t1`` counter texts) when given."""
    root = Path("/")
    if history is not None:
        window, before, after = float(history["window_s"]), parse_counters(history["t0"]), parse_counters(history["t1"])
    else:
        before = read_counters(root)
        t0 = time.monotonic()
        time.sleep(sample_s)
        after = read_counters(root)
        window = time.monotonic() - t0
    speed, mtu, rdma = _static(root)
    return Inputs(window, before, after, read_mounts(root), speed, mtu, rdma,
                  memory_limit(root), memlock_limit(root), tiers, **kw)


# -- the tree --------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Report:
    verdict: str
    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    @property
    def critical(self) -> bool:
        return any(f.severity == "critical" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return {"schema": SCHEMA, "verdict": self.verdict, "critical": self.critical,
                "findings": [f.to_dict() for f in sorted(self.findings, key=lambda f: order[f.severity])],
                "measurements": self.measurements}


def diagnose(i: Inputs) -> Report:
    r = Report("healthy")
    dt = max(i.window_s, 1e-3)
    # disks: every device in the window, flagged when it holds a tier
    tier_dev: dict[str, list[str]] = {}
    for t in i.tiers:
        m = mount_of(t.path, i.mounts)
        if m is not None:
            name = i.after.devnums.get(m.devnum)  # (partitions are listed too; overlay/tmpfs are not)
            if name:
                tier_dev.setdefault(name, []).append(t.name)
    disks = {}
    for name, (reads, rms, sectors, io) in i.after.disks.items():
        b = i.before.disks.get(name)
        if b is None:
            continue
        dr, drms, dsec, dio = reads - b[0], rms - b[1], sectors - b[2], io - b[3]
        await_ms = drms / dr if dr else 0.0
        util = min(1.0, dio / (dt * 1000))
        disks[name] = {"read_await_ms": round(await_ms, 2), "util": round(util, 3),
                       "read_bytes_per_s": round(dsec * 512 / dt), "reads_per_s": round(dr / dt, 1),
                       "tiers": tier_dev.get(name, [])}
    r.measurements["disks"] = {k: v for k, v in disks.items() if v["reads_per_s"] or v["tiers"]}
    disk_bound = [n for n, d in disks.items() if d["read_await_ms"] > AWAIT_MS and d["util"] > UTIL]
    for n in disk_bound:
        d = disks[n]
        on = ", ".join(d["tiers"]) or "no tier"
        r.findings.append(Finding(
            "disk-saturated", "critical", "disk",
            f"{n} is saturated: read await {d['read_await_ms']} ms (> {AWAIT_MS}), util {d['util']:.0%} (> {UTIL:.0%}); holds {on}",
            {"device": n, **d},
            "warm checkpoints into the page cache before servers start (`weightd preload --tier warm`, "
            "`weightd warm`); put hot checkpoints in the hot tier (/dev/shm); cap warming (`[warm] bandwidth`) "
            "and other readers with blkio/io.max limits; load with direct I/O where the loader supports it; "
            "check fragmentation (`filefrag`) of the weight files"))
    if i.probe:
        p = i.probe
        r.measurements["probe"] = p
        base = p.get("baseline_p50_us")
        if p.get("p50_us", 0) > 1000 or (base and p["p50_us"] > 4 * base):
            r.findings.append(Finding(
                "random-read-degraded", "critical" if p.get("p50_us", 0) > 1000 else "warning", "disk",
                f"4K random reads on the {p.get('tier', 'warm')} tier take {p['p50_us']:.0f} µs p50 "
                f"(baseline {base or 'none'} µs; the seed reports' healthy NVMe: ~50 µs)",
                p, "the device is contended or degraded: see the disk findings; re-run `weightd bench disk` "
                   "when idle to record a baseline"))
    # network
    nics = {}
    for name, (rx, tx) in i.after.nics.items():
        b = i.before.nics.get(name)
        if b is None:
            continue
        rate = max(rx - b[0], tx - b[1]) / dt
        speed = i.nic_speed.get(name)
        nics[name] = {"bytes_per_s": round(rate), "speed_bytes_per_s": speed,
                      "util": round(rate / speed, 3) if speed else None, "mtu": i.nic_mtu.get(name)}
    r.measurements["nics"] = nics
    busy = [n for n, d in nics.items() if d["util"] is not None and d["util"] > NIC_UTIL]
    dseg = i.after.tcp[0] - i.before.tcp[0]
    dret = i.after.tcp[1] - i.before.tcp[1]
    retrans = dret / dseg if dseg > 0 else 0.0
    r.measurements["tcp_retransmit_ratio"] = round(retrans, 4)
    r.measurements["net_softirqs_per_s"] = round((i.after.net_softirq - i.before.net_softirq) / dt)
    for n in busy:
        d = nics[n]
        r.findings.append(Finding(
            "nic-saturated", "critical", "network",
            f"{n} runs at {d['util']:.0%} of its {d['speed_bytes_per_s'] * 8 / 1e9:.0f} Gbit/s (> {NIC_UTIL:.0%})",
            {"interface": n, **d},
            "weight traffic competes with inference: set `[p2p] upload_limit`/`download_limit` below the link "
            "(e.g. 30-50% of it), let P2P spread the load (`[p2p] threshold`), preload before the restart"))
        if (d["mtu"] or 0) < 9000:
            r.findings.append(Finding("no-jumbo-frames", "warning", "network",
                                      f"{n} has MTU {d['mtu']}: jumbo frames (9000) cut per-packet overhead",
                                      {"interface": n, "mtu": d["mtu"]}, "set MTU 9000 end to end on the storage/P2P network"))
        if not i.rdma:
            r.findings.append(Finding("no-rdma", "info", "network", "no RDMA device (/sys/class/infiniband is empty)",
                                      {"infiniband": []}, "with RoCE/InfiniBand, GPUDirect Storage or an RDMA "
                                                          "transfer path takes weight traffic off the TCP stack"))
    if retrans > RETRANS:
        r.findings.append(Finding("tcp-retransmits", "warning", "network",
                                  f"TCP retransmits at {retrans:.1%} of segments (> {RETRANS:.0%})",
                                  {"retransmit_ratio": round(retrans, 4), "out_segs": dseg, "retrans_segs": dret},
                                  "check for congestion or a faulty link; lower the P2P rate limits"))
    # tiers
    for t in i.tiers:
        m = mount_of(t.path, i.mounts)
        if m is None:
            continue
        ev = {"tier": t.name, "path": t.path, "mount": m.mountpoint, "fstype": m.fstype, "options": sorted(m.options)}
        if m.fstype == "overlay":
            r.findings.append(Finding("tier-on-overlayfs", "warning", "tier",
                                      f"the {t.name} tier {t.path} is on overlayfs: every write is copied up (double writes)",
                                      ev, "mount a host path or volume (hostPath, emptyDir on a local disk) for the tier"))
        if t.name != "hot" and m.fstype not in ("tmpfs", "overlay", "nfs", "nfs4", "fuse") and "noatime" not in m.options:
            r.findings.append(Finding("no-noatime", "warning", "tier",
                                      f"the {t.name} tier {t.path} ({m.mountpoint}) is mounted without noatime",
                                      ev, f"remount with noatime (`mount -o remount,noatime {m.mountpoint}`, and in fstab): "
                                          "reads then never write access times"))
        if t.name == "hot" and m.fstype == "tmpfs" and t.capacity:
            size = tmpfs_size(m)
            if size is not None and size < t.capacity:
                r.findings.append(Finding("shm-smaller-than-hot", "critical", "tier",
                                          f"{m.mountpoint} is {size >> 20} MiB but the hot tier may hold {t.capacity >> 20} MiB",
                                          {**ev, "tmpfs_bytes": size, "capacity_bytes": t.capacity},
                                          "lower [tiers.hot] capacity below the tmpfs size, or enlarge it "
                                          "(`mount -o remount,size=... /dev/shm`; in Kubernetes an emptyDir medium: Memory with sizeLimit)"))
            if i.mem_limit is not None and t.capacity > i.mem_limit:
                r.findings.append(Finding("hot-beyond-memory-limit", "critical", "memory",
                                          f"the hot tier may hold {t.capacity >> 20} MiB but the cgroup memory limit is "
                                          f"{i.mem_limit >> 20} MiB, and tmpfs pages count against it (OOM kill)",
                                          {**ev, "capacity_bytes": t.capacity, "memory_limit_bytes": i.mem_limit},
                                          "lower [tiers.hot] capacity well below the memory limit, or raise the limit"))
        log_m = mount_of(i.log_dir, i.mounts)
        if log_m is not None and log_m.devnum == m.devnum and m.fstype not in ("tmpfs",) and t.name != "cold":
            r.findings.append(Finding("tier-shares-log-device", "warning", "disk",
                                      f"the {t.name} tier shares device {m.source} with the log directory {i.log_dir}",
                                      {**ev, "log_dir": i.log_dir, "device": m.devnum},
                                      "move logs (or the tier) to another device: log writes add latency to weight reads"))
    if i.lock_wanted:
        if i.memlock is not None and i.memlock < i.lock_wanted:
            r.findings.append(Finding("memlock-too-low", "warning", "memory",
                                      f"RLIMIT_MEMLOCK is {i.memlock >> 20} MiB, but locking needs {i.lock_wanted >> 20} MiB: "
                                      "`--lock` will lock only part of the checkpoint",
                                      {"memlock_bytes": i.memlock, "wanted_bytes": i.lock_wanted},
                                      "raise LimitMEMLOCK= in weightd.service (or ulimit -l), or do not lock"))
    # the tree
    if disk_bound:
        r.verdict = "disk"
    elif busy:
        r.verdict = "network"
    elif i.symptom:
        r.verdict = "gpu"
        r.findings.append(Finding(
            "neither-disk-nor-network", "warning", "gpu",
            f"loads are reported slow ({i.symptom}) but neither the disk nor the NIC is saturated",
            {"disks": r.measurements["disks"], "nics": nics},
            "look at the GPU side (outside weightd): host-to-device copies and CUDA stream contention with "
            "Nsight Systems, pinned memory, the loader's own parallelism"))
    return r
