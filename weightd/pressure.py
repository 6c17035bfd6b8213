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


def read_disks(path: str = "/proc/diskstats") -> list[DiskCounters]:
    out = []
    try:
        with open(path) as fh:
            for line in fh:
                f = line.split()
                if len(f) < 14:
                    continue
                name = f[2]
                if name.startswith(("loop", "ram", "zram", "dm-")) and int(f[3]) == 0:
                    continue
                out.append(DiskCounters(name, int(f[3]), int(f[6]), int(f[5]), int(f[7]), int(f[10]), int(f[12]),
                                        int(f[11])))
    except OSError:
        pass
    return out


@dataclass(frozen=True, slots=True)
class NicCounters:
    interface: str
    rx_bytes: int
    tx_bytes: int
    speed_bytes_per_s: int | None  # from /sys/class/net/*/speed (Mbit/s); None when unknown
    mtu: int | None


def read_nics(path: str = "/proc/net/dev", sys_net: str = "/sys/class/net") -> list[NicCounters]:
    out = []
    try:
        with open(path) as fh:
            lines = fh.readlines()[2:]
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        name = name.strip()
        f = rest.split()
        if len(f) < 9 or name == "lo":
            continue
        speed = mtu = None
        try:
            mbit = int(Path(sys_net, name, "speed").read_text().strip())
            speed = mbit * 1_000_000 // 8 if mbit > 0 else None
        except (OSError, ValueError):
            pass
        try:
            mtu = int(Path(sys_net, name, "mtu").read_text().strip())
        except (OSError, ValueError):
            pass
        out.append(NicCounters(name, int(f[0]), int(f[8]), speed, mtu))
    return out


def read_tcp(path: str = "/proc/net/snmp") -> dict[str, int]:
    """OutSegs and RetransSegs of the Tcp line."""
    try:
        with open(path) as fh:
            rows = [line.split() for line in fh if line.startswith("Tcp:")]
    except OSError:
        return {}
    if len(rows) < 2:
        return {}
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:]) if v.lstrip("-").isdigit()}


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
