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

from .inputs import (Counters, Finding, Inputs, Mount, Tier, gather_live, gather_snapshot, parse_counters,
                     read_counter_texts, read_counters, read_mounts)
from .tree import AWAIT_MS, NIC_UTIL, RETRANS, UTIL, Report, diagnose

__all__ = ["AWAIT_MS", "Counters", "Finding", "Inputs", "Mount", "NIC_UTIL", "RETRANS", "Report", "Tier", "UTIL",
           "diagnose", "gather_live", "gather_snapshot", "parse_counters", "read_counter_texts", "read_counters",
           "read_mounts"]
