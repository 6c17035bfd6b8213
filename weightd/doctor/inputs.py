"""What ``weightd doctor`` diagnoses: two samples of the node's counters, the static facts (NIC speed
and MTU, InfiniBand, mounts, cgroup memory limit, RLIMIT_MEMLOCK) and the tiers, read below a root
directory (``/`` live, a snapshot's ``t0/``, ``t1/`` and ``static/`` when replayed)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..node.pressure import link_info, parse_diskstats, parse_netdev, parse_tcp, read_text

SEVERITIES = ("critical", "warning", "info")


@dataclass(slots=True)
class Finding:
    id: str
    severity: str
    subsystem: str          # disk | network | memory | tier | gpu | weightd
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
    node: dict[str, Any] | None = None        # weightd itself (weightd.doctor.node), live runs only


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
