"""Who read and wrote how much around one benchmark run: a process's own storage I/O (``/proc/PID/io``
read_bytes and write_bytes: the kernel's per-task accounting, so the shared machine's other work does not
add to it), and bytes as multiples of a checkpoint's in the common shape of ``_rounds.speedup()``.

The device's sectors (``/proc/diskstats``) and a command's rusage are :mod:`_memcg`'s (``run_counted``).
(Not ``_io.py``: that name is the standard library's C module, found first.)"""

from __future__ import annotations

import statistics
from typing import Any


def proc_io(pid: "int | str") -> tuple[int, int]:
    """(read_bytes, write_bytes) a process has done against storage so far (``/proc/PID/io``;
    ``"self"`` for this one); (0, 0) once it is gone. Pages it dirtied count as written when dirtied."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            got = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
    except OSError:
        return 0, 0
    return int(got.get("read_bytes", 0)), int(got.get("write_bytes", 0))


def io_since(pid: "int | str", start: tuple[int, int]) -> tuple[int, int]:
    """What ``pid`` read and wrote since ``start`` (an earlier :func:`proc_io`)."""
    r, w = proc_io(pid)
    return max(0, r - start[0]), max(0, w - start[1])


def times_checkpoint(got: list[int], total: int, name: str, *, target_at_most: float | None = None) -> dict[str, Any]:
    """``got`` (bytes, one per round) over the checkpoint's ``total`` bytes, as a row of the common shape:
    the ratio of the median to ``total``, with the per-round min-max (``vs`` is "checkpoint")."""
    per = [g / total for g in got] if total > 0 else []
    out: dict[str, Any] = {"of": name, "vs": "checkpoint", "rounds": len(per),
                           "per_round_min": round(min(per), 3) if per else None,
                           "per_round_max": round(max(per), 3) if per else None,
                           "ratio": round(statistics.median(got) / total, 3) if got and total > 0 else None}
    if target_at_most is not None:
        out["target_at_most"] = target_at_most
        out["met"] = None if out["ratio"] is None else out["ratio"] <= target_at_most
    return out
