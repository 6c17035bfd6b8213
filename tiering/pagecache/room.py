"""How much page cache a process can hold: what warming may read so that it stays resident (design
§9, §11). A checkpoint larger than that only evicts its own pages while it is read: warming it whole
reads the device again for nothing.

The room is the smallest of: for each memory cgroup of the processes named (and of this one) and each
of its ancestors, its limit minus what it holds that reclaim cannot drop (everything but file pages:
anonymous memory, shared memory, the kernel's); and ``MemAvailable`` (the whole machine). cgroup v1
(``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.stat``'s ``total_*_file``) and v2
(``memory.max``, ``memory.current``, ``memory.stat``'s ``file`` less ``shmem``) are read where they
are mounted (``/proc/self/mountinfo``); a limit at or above the machine's memory is no limit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterable

from ..content.units import format_bytes


@dataclass(frozen=True, slots=True)
class Room:
    """``bytes`` of page cache the processes can hold; ``what``: who sets that bound, for people
    (``the memory cgroup /kubepods/pod1 (limit 384.0 MiB)``, ``MemAvailable``)."""
    bytes: int
    what: str


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _meminfo() -> dict[str, int]:
    out = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        parts = v.split()
        if parts and parts[0].isdigit():
            out[k] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def _stat(path: str) -> dict[str, int]:
    out = {}
    for line in (_read(path) or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def _mounts() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(v1 memory mounts, v2 mounts) as (root within the hierarchy, mount point)."""
    v1, v2 = [], []
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        f = line.split()
        if " - " not in line or len(f) < 5:
            continue
        post = line.split(" - ", 1)[1].split()
        fstype, opts = post[0], post[2] if len(post) > 2 else ""
        root, mnt = f[3], f[4].replace("\\040", " ")
        if fstype == "cgroup" and "memory" in opts.split(","):
            v1.append((root, mnt))
        elif fstype == "cgroup2":
            v2.append((root, mnt))
    return v1, v2


def _cgroups_of(pid: int | str) -> tuple[str | None, str | None]:
    """(v1 memory cgroup path, v2 cgroup path) of a process, as /proc/PID/cgroup names them."""
    v1 = v2 = None
    for line in (_read(f"/proc/{pid}/cgroup") or "").splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hid == "0" and ctrls == "":
            v2 = path
        elif "memory" in ctrls.split(","):
            v1 = path
    return v1, v2


def _dirs(mounts: list[tuple[str, str]], path: str) -> list[tuple[str, str]]:
    """The directories of ``path`` and each of its ancestors under the mount that holds it, each with
    the cgroup name it stands for (innermost first)."""
    for root, mnt in mounts:
        rel = path if root == "/" else path[len(root):] if path == root or path.startswith(root + "/") else None
        if rel is None:
            continue
        out = []
        parts = [p for p in rel.split("/") if p]
        while True:
            out.append((os.path.join(mnt, *parts), "/" + "/".join(parts) if root == "/" else
                        root.rstrip("/") + ("/" + "/".join(parts) if parts else "")))
            if not parts:
                return out
            parts.pop()
    return []


def _v1_room(d: str, total: int) -> tuple[int, int] | None:
    """(room, limit) of a v1 memory cgroup directory, or None when it has no limit below ``total``."""
    return _room(d, "memory.limit_in_bytes", "memory.usage_in_bytes", total,
                 lambda st: st.get("total_active_file", st.get("active_file", 0))
                 + st.get("total_inactive_file", st.get("inactive_file", 0)))


def _v2_room(d: str, total: int) -> tuple[int, int] | None:
    return _room(d, "memory.max", "memory.current", total, lambda st: st.get("file", 0) - st.get("shmem", 0))


def _room(d: str, limit_file: str, usage_file: str, total: int,
          reclaimable: Callable[[dict[str, int]], int]) -> tuple[int, int] | None:
    """The limit less the usage reclaim cannot drop (``reclaimable`` file pages, from memory.stat)."""
    limit = (_read(f"{d}/{limit_file}") or "").strip()
    usage = (_read(f"{d}/{usage_file}") or "").strip()
    if not limit.isdigit() or not usage.isdigit() or int(limit) >= total:
        return None
    files = reclaimable(_stat(f"{d}/memory.stat"))
    return max(0, int(limit) - (int(usage) - files)), int(limit)


def page_cache_room(pids: Iterable[int] = ()) -> Room:
    """The page cache this process and ``pids`` (the caller a daemon works for) can hold: the
    smallest room of their memory cgroups (and their ancestors') and MemAvailable."""
    info = _meminfo()
    total = info.get("MemTotal", 1 << 62)
    best = Room(info.get("MemAvailable", info.get("MemFree", total)), "MemAvailable")
    v1, v2 = _mounts()
    seen: set[str] = set()
    for pid in ("self", *pids):
        c1, c2 = _cgroups_of(pid)
        for mounts, path, room_of in ((v1, c1, _v1_room), (v2, c2, _v2_room)):
            if path is None:
                continue
            for d, name in _dirs(mounts, path):
                if d in seen:
                    continue
                seen.add(d)
                r = room_of(d, total)
                if r is not None and r[0] < best.bytes:
                    best = Room(r[0], f"the memory cgroup {name} (limit {format_bytes(r[1])})")
    return best
