"""Node I/O pressure from /proc and /sys, as raw counters (rates are Prometheus's job)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class DiskCounters:
    device: str
    reads: int
    read_ms: int
    sectors_read: int
    writes: int
    write_ms: int
    io_ms: int           # time the device had I/O in flight (-> utilisation)
    in_flight: int
    devnum: str = ""     # "major:minor", what mountinfo names


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def parse_diskstats(text: str) -> list[DiskCounters]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14:
            continue
        name = f[2]
        if name.startswith(("loop", "ram", "zram", "dm-")) and int(f[3]) == 0:
            continue
        out.append(DiskCounters(name, int(f[3]), int(f[6]), int(f[5]), int(f[7]), int(f[10]), int(f[12]),
                                int(f[11]), f"{f[0]}:{f[1]}"))
    return out


def read_disks(path: str = "/proc/diskstats") -> list[DiskCounters]:
    return parse_diskstats(read_text(path))


@dataclass(frozen=True, slots=True)
class NicCounters:
    interface: str
    rx_bytes: int
    tx_bytes: int
    speed_bytes_per_s: int | None  # from /sys/class/net/*/speed (Mbit/s); None when unknown
    mtu: int | None


def parse_netdev(text: str) -> list[tuple[str, int, int]]:
    """(interface, rx bytes, tx bytes) of every interface but lo."""
    out = []
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        name = name.strip()
        f = rest.split()
        if len(f) >= 9 and name != "lo":
            out.append((name, int(f[0]), int(f[8])))
    return out


def link_info(sys_net: str | Path, name: str) -> tuple[int | None, int | None]:
    """(speed in bytes/s, MTU) from /sys/class/net/NAME; None when unknown."""
    speed = mtu = None
    s = read_text(Path(sys_net, name, "speed")).strip()
    if s.isdigit() and int(s) > 0:  # (virtual links say -1 or nothing)
        speed = int(s) * 1_000_000 // 8
    m = read_text(Path(sys_net, name, "mtu")).strip()
    if m.isdigit():
        mtu = int(m)
    return speed, mtu


def read_nics(path: str = "/proc/net/dev", sys_net: str = "/sys/class/net") -> list[NicCounters]:
    return [NicCounters(name, rx, tx, *link_info(sys_net, name)) for name, rx, tx in parse_netdev(read_text(path))]


def parse_tcp(text: str) -> dict[str, int]:
    """The Tcp line of /proc/net/snmp (OutSegs, RetransSegs, ...)."""
    rows = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        return {}
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:]) if v.lstrip("-").isdigit()}


def read_tcp(path: str = "/proc/net/snmp") -> dict[str, int]:
    return parse_tcp(read_text(path))


def read_softirq_seconds(path: str = "/proc/stat") -> float | None:
    """CPU time spent in softirq, all CPUs (seconds)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("cpu "):
                    return int(line.split()[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return None
