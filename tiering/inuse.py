"""Is any file of a checkpoint open or mapped by any process? (``/proc/*/fd`` and ``/proc/*/maps``)

An unprivileged caller only sees its own user's processes; the daemon runs with the rights to see
the serving processes (root or CAP_SYS_PTRACE in the hardened unit).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def _scan() -> dict[str, set[int]]:
    """Every file path open or mapped, with the pids holding it."""
    holders: dict[str, set[int]] = {}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return holders
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                if target.startswith("/"):
                    holders.setdefault(target.removesuffix(" (deleted)"), set()).add(int(pid))
        except OSError:
            pass
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    i = line.find("/")
                    if i >= 0:
                        holders.setdefault(line[i:].rstrip("\n").removesuffix(" (deleted)"), set()).add(int(pid))
        except OSError:
            pass
    return holders


_last: tuple[float, dict[str, set[int]]] | None = None
_last_lock = threading.Lock()


def processes_using(dirs: list[Path], *, max_age_s: float = 0.0) -> dict[Path, set[int]]:
    """For each directory, the pids that have a file under it open or mapped (empty sets omitted).
    ``max_age_s``: a scan of /proc at most this old may be reused (for ``status``, which any socket
    user may ask for in a loop); 0, the default, always scans (eviction decides on a fresh one)."""
    global _last
    now = time.monotonic()
    with _last_lock:
        cached = _last if _last is not None and max_age_s > 0 and now - _last[0] <= max_age_s else None
    if cached is not None:
        holders = cached[1]
    else:
        holders = _scan()
        with _last_lock:
            _last = (now, holders)
    out: dict[Path, set[int]] = {}
    real = [(d, os.path.realpath(d).rstrip("/") + "/") for d in dirs]
    for path, pids in holders.items():
        for d, prefix in real:
            if path.startswith(prefix):
                out.setdefault(d, set()).update(pids)
    return out


def process_name(pid: int) -> str:
    """The process's name (``/proc/PID/comm``), or "" once it is gone. Any process sets its own name
    (``prctl(PR_SET_NAME)``, any bytes): what is not printable becomes ``?``, so a name shown in
    ``status`` or an error can carry no terminal escape sequence."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            raw = fh.read(64).rstrip(b"\n").decode("utf-8", "replace")
    except OSError:
        return ""
    return "".join(c if c.isprintable() and c != "\ufffd" else "?" for c in raw)[:32]
