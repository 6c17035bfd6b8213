"""How soon can this node serve NAME@VERSION? For every version the node knows (its local copies in
each tier, the versions fleet intent wants here, the versions ``weightd ls`` lists as published), an
estimate of the seconds until a server could start reading it from the best tier, from rates this
node measured. Each estimate says which term it used (``source``) and what that term rests on
(``basis``), so an operator can see why a node says ``5m``.

The terms, and how each is measured:

- **resident** (0 s): a complete copy in the hot tier (tmpfs: in memory by construction), or in the
  warm tier with every byte in the page cache (``mincore``, as ``status`` shows).
- **read** (a warm copy not fully resident): its non-resident bytes at the warm tier's read rate:
  the median of the node's recent page-cache warming rates into that tier (the preload report's
  ``warm.bytes_per_s`` of warms that read at least 16 MiB from disk); else the sequential 16 MiB
  O_DIRECT rate ``weightd bench disk`` recorded for the tier's directory; else ``[warm] bandwidth``;
  else unknown.
- **cold** / **swarm** (a version not here): its bytes at the rate this node measured from that
  source, the median of its last 5 preloads of at least 16 MiB that took at least 90% of their bytes
  from that source (:class:`~weightd.node.ready_times.TransferRates`; peers and the origin count as
  ``swarm``; the same target tier first, else any). Such a rate is bytes over the preload's whole
  time, so it already holds the transfer, the verification against the manifest (hashed as the bytes
  arrive or read back), placement and warming: nothing is added. For the swarm, whose report times
  the download itself, the rate is the bytes over the download and the median of the rest of each
  preload's time (adding the torrent, connecting, a read-back, placing) is added as a fixed part. Without a measured rate, the raw
  rate falls back to, for cold storage on a path: ``weightd bench disk`` of the cold directory (its
  sequential rate), else the link capacity (an NFS mount reads over the NIC); for an object store or
  a registry: the link capacity; for the swarm: ``[p2p] download_limit`` and the link capacity; each
  capped by the configured rate (``[tiers.cold] bandwidth``, ``[p2p] download_limit``). The link
  capacity is ``[network] capacity``, else the fastest NIC's ``/sys/class/net/IF/speed``. To a
  fallback rate the verification is added: the bytes at this process's SHA-256 rate, measured once
  (64 MiB hashed in memory).
- Which source an absent version comes from follows the preload's own rule: the swarm when it is at
  or above ``[p2p] threshold`` and the node has peers or trackers, else cold storage. A delta update
  that reuses an older local version moves fewer bytes than the estimate assumes (an upper bound).

The estimate takes the best (least) over the version's copies, then the absent-version estimate when
it has no copy. Unknown (nothing measured and no fallback): ``seconds`` None, bucket ``long``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .ready_times import TransferRates

if TYPE_CHECKING:
    from ..config import Config

BUCKETS = ((1.0, "0s"), (10.0, "10s"), (60.0, "1m"), (300.0, "5m"))
LONG = "long"
HASH_SAMPLE_BYTES = 64 << 20
CACHE_S = 2.0        # an estimate of every copy is kept this long (a scrape storm reads residency once)
MAX_WANTED = 1024    # absent versions intent wants, estimated each round
MAX_SECONDS = 1e9    # (the origin's bound, weightd.fleet.report.MAX_READY_S: past that an estimate is "long")

log = logging.getLogger(__name__)


def bucket(seconds: float | None) -> str:
    """``0s`` (under a second: ready now), ``10s``, ``1m``, ``5m`` (at most that long), ``long``
    (longer, or unknown): the value of the ``weightd.io/<key>.ready-in`` label."""
    if seconds is None:
        return LONG
    for limit, name in BUCKETS:
        if seconds < limit if limit == 1.0 else seconds <= limit:
            return name
    return LONG


@functools.lru_cache(maxsize=1)
def hash_rate() -> float:
    """This process's SHA-256 rate in bytes/s (the best of two passes over 64 MiB in memory)."""
    buf = os.urandom(1 << 20) * (HASH_SAMPLE_BYTES >> 20)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        hashlib.sha256(buf).digest()
        best = min(best, time.perf_counter() - t0)
    return HASH_SAMPLE_BYTES / max(best, 1e-6)


def _rate_text(bytes_per_s: float) -> str:
    return f"{bytes_per_s / (1 << 20):.1f} MiB/s"


def link_capacity(config: "Config") -> int | None:
    """``[network] capacity``, else the fastest NIC's reported speed (bytes/s), else None."""
    from .pressure import read_nics
    cap = getattr(getattr(config.settings, "network", None), "capacity", 0)
    if cap:
        return int(cap)
    speeds = [n.speed_bytes_per_s for n in read_nics() if n.speed_bytes_per_s]
    return max(speeds) if speeds else None


def bench_rate(state_dir: Path, directory: Path | None) -> float | None:
    """The sequential read rate ``weightd bench disk`` recorded for ``directory`` (a run on it or on
    a directory inside it), else None. Reads the state dir's record only: never the directory."""
    from .diskbench import load_baselines
    if directory is None:
        return None
    for result in load_baselines(state_dir).values():
        try:
            where = Path(result["path"])
            raw = result["seqread_16m"]["bytes_per_s"]
            if isinstance(raw, bool):
                continue
            rate = float(raw)
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        # (a hand-edited or damaged record: only a finite rate of at least a byte a second counts)
        if math.isfinite(rate) and rate >= 1.0 and (where == directory or directory in where.parents):
            return rate
    return None


def finite_seconds(seconds: float | None) -> float | None:
    """``seconds`` as an estimate may say it: None (unknown) when not a finite number, else clamped
    to [0, MAX_SECONDS] (a forged manifest of 2**62 bytes is "long", not 6e9 s the origin refuses)."""
    if seconds is None:
        return None
    try:
        s = float(seconds)
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(s, 0.0), MAX_SECONDS) if math.isfinite(s) else None


def _row(model: str, version: str, tier: str, seconds: float | None, source: str, basis: str) -> dict[str, Any]:
    seconds = finite_seconds(seconds)
    return {"model": model, "version": version, "tier": tier,
            "seconds": None if seconds is None else round(seconds, 3), "bucket": bucket(seconds),
            "source": source, "basis": basis}


def _measured_text(m: dict[str, Any]) -> str:
    fixed = f" + {m['fixed_s']:.1f} s besides the download" if m.get("fixed_s") else ""
    return (f"measured: median of {m['transfers']} recent transfer{'s' if m['transfers'] != 1 else ''}, "
            f"{_rate_text(m['bytes_per_s'])}{fixed}, the last {m['age_s']:.0f} s ago")


class ReadyEstimator:
    """The estimates of one node (see the module docstring), from its :class:`TransferRates` and its
    config. ``wanted``: the absent versions fleet intent wants here (set each intent round)."""

    def __init__(self, config: "Config", rates: TransferRates, *, clock: Callable[[], float] = time.monotonic,
                 capacity: Callable[["Config"], int | None] = link_capacity) -> None:
        self.config, self.rates, self.clock, self._capacity = config, rates, clock, capacity
        self.wanted: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._cache: tuple[float, list[dict[str, Any]]] | None = None

    def source_of(self, size: int) -> str:
        """Where a preload of ``size`` bytes takes them: ``swarm`` or ``cold`` (the preload's rule)."""
        p = self.config.settings.p2p
        return "swarm" if size >= p.threshold and (p.trackers or p.peers) else "cold"

    def _fallback(self, source: str) -> tuple[float | None, str]:
        """(raw rate, what it rests on) of ``source`` when nothing was measured."""
        s = self.config.settings
        cold = s.tiers.cold
        cap = (s.p2p.download_limit if source == "swarm" else cold.bandwidth) or None
        rate, basis = None, ""
        if source == "cold" and cold.path is not None:
            rate = bench_rate(s.state_dir, Path(cold.path))
            basis = f"weightd bench disk of {cold.path}" if rate else ""
        if rate is None:
            rate = self._capacity(self.config)
            basis = "the link capacity" if rate else ""
        if cap and (rate is None or cap < rate):
            rate, basis = float(cap), ("[p2p] download_limit" if source == "swarm" else "[tiers.cold] bandwidth")
        return rate, basis

    def of_absent(self, model: str, version: str, size: int, tier: str) -> dict[str, Any]:
        """NAME@VERSION, not here: its ``size`` bytes from the source a preload into ``tier`` uses."""
        source = self.source_of(size)
        m = self.rates.rate(source, tier)
        if m is not None:
            return _row(model, version, tier, m["fixed_s"] + size / m["bytes_per_s"], source, _measured_text(m))
        rate, basis = self._fallback(source)
        if not rate:
            return _row(model, version, tier, None, source, "nothing measured and no fallback: run weightd bench disk "
                        "on the cold directory, or set [network] capacity")
        h = hash_rate()
        return _row(model, version, tier, size / rate + size / h, source,
                    f"not measured yet: {basis} {_rate_text(rate)}, plus hashing at {_rate_text(h)}")

    def of_copy(self, model: str, version: str, tier: str, size: int, resident_bytes: int) -> dict[str, Any]:
        """A complete local copy in ``tier`` with ``resident_bytes`` of its ``size`` in the page cache."""
        missing = max(0, size - resident_bytes)
        if tier == "hot" or missing == 0:
            return _row(model, version, tier, 0.0, "resident", "in memory" if tier == "hot" else "fully resident")
        m = self.rates.read_rate(tier)
        if m is not None:
            return _row(model, version, tier, missing / m["bytes_per_s"], "read", _measured_text(m))
        s = self.config.settings
        rate = bench_rate(s.state_dir, Path(s.tiers.warm.path))
        basis = f"weightd bench disk of {s.tiers.warm.path}"
        if rate is None and s.warm.bandwidth:
            rate, basis = float(s.warm.bandwidth), "[warm] bandwidth"
        if rate is None:
            return _row(model, version, tier, None, "read", "no read rate of this tier measured yet: run "
                        f"weightd bench disk {s.tiers.warm.path}")
        return _row(model, version, tier, missing / rate, "read", f"{basis}: {_rate_text(rate)}")

    def of_version(self, model: str, version: str, size: int, copies: dict[str, int], tier: str) -> dict[str, Any]:
        """The best estimate of NAME@VERSION: over its local ``copies`` (tier -> resident bytes), else
        (no copy, or none with a known read rate) absent, preloaded into ``tier``."""
        rows = [self.of_copy(model, version, t, size, r) for t, r in sorted(copies.items())]
        known = [r for r in rows if r["seconds"] is not None]
        if known:
            return min(known, key=lambda r: r["seconds"])
        absent = self.of_absent(model, version, size, tier)
        return absent if absent["seconds"] is not None or not rows else rows[0]

    def from_status(self, status: dict[str, Any]) -> list[dict[str, Any]]:
        """One estimate per whole version of the ``status`` document (its copies), then the copies
        intent wants (:attr:`wanted`: absent, or partial copies here); sorted by model and version."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for c in status.get("checkpoints", ()):
            if c.get("part_of") is not None:   # (a part or a companion is not what a server loads)
                continue
            copies = {t: int(info.get("resident_bytes") or 0) for t, info in c["tiers"].items()}
            out[(c["name"], c["version"])] = self.of_version(c["name"], c["version"], int(c["bytes"]), copies, "hot")
        for w in self.wanted:
            key = (w["model"], w["version"])
            if key not in out:   # (a partial copy intent keeps: its own bytes and residency, if here)
                out[key] = self.of_version(w["model"], w["version"], w["bytes"], w["copies"], w["tier"])
        return [out[k] for k in sorted(out)]

    def current(self, status: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
        """:meth:`from_status` of ``status()``, kept CACHE_S (for scrapes)."""
        with self._lock:
            now = self.clock()
            if self._cache is not None and now - self._cache[0] < CACHE_S:
                return self._cache[1]
        rows = self.from_status(status())
        with self._lock:
            self._cache = (self.clock(), rows)
        return rows

    def for_listing(self, rows: list[dict[str, Any]], status: dict[str, Any]) -> list[dict[str, Any]]:
        """``weightd ls`` rows, each with its ``ready_in_s``, ``ready_in`` (its bucket), and the
        estimate's ``ready_source`` and ``ready_basis``: local copies' residency from ``status``."""
        resident = {(c["name"], c["version"]): {t: int(i.get("resident_bytes") or 0) for t, i in c["tiers"].items()}
                    for c in status.get("checkpoints", ()) if c.get("part_of") is None}
        out = []
        for r in rows:
            copies = {t: b for t, b in resident.get((r["name"], r["version"]), {}).items() if t in r["local"]}
            e = self.of_version(r["name"], r["version"], int(r["bytes"]), copies, "hot")
            out.append({**r, "ready_in_s": e["seconds"], "ready_in": e["bucket"], "ready_source": e["source"],
                        "ready_basis": e["basis"]})
        return out

    def set_wanted(self, entries: list[tuple[str, str, str, int, dict[str, int] | None]]) -> None:
        """The copies fleet intent wants here and no whole version of which is here, ``(model,
        version, tier, bytes, copies)`` (at most MAX_WANTED): ``bytes`` and ``copies`` (tier ->
        resident bytes, None when absent) are of the copy the entry keeps (a partial copy's own,
        ``V~p<hex>``, for an entry with patterns: estimated as the version it is part of)."""
        self.wanted = [{"model": m, "version": v, "tier": t, "bytes": int(b), "copies": dict(c or {})}
                       for m, v, t, b, c in entries[:MAX_WANTED]]
        with self._lock:
            self._cache = None


_said: set[str] = set()


def guarded(what: str, fn: Callable[[], Any], fallback: Any) -> Any:
    """``fn()``, else ``fallback`` and one log line per distinct error: an estimate that fails (a
    damaged record in the state dir, a bug) is "unknown", never a failed ``status``, ``ls`` or
    intent round."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 (an estimate is advice: unknown beats an internal error)
        key = f"{what}: {type(exc).__name__}: {exc}"
        if key not in _said and len(_said) < 64:
            _said.add(key)
            log.warning("ready estimate unknown (%s)", key)
        return fallback


def unknown_listing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``weightd ls`` rows when no estimate could be made: ready in ``?``."""
    return [{**r, "ready_in_s": None, "ready_in": "?", "ready_source": None, "ready_basis": "the estimate failed"}
            for r in rows]


def best_per_model(estimates: list[dict[str, Any]]) -> dict[str, str]:
    """model -> the bucket of its soonest version (the ``weightd.io/<key>.ready-in`` label values)."""
    best: dict[str, float | None] = {}
    for e in estimates:
        m, s = e["model"], e["seconds"]
        if m not in best or (s is not None and ((b := best[m]) is None or s < b)):
            best[m] = s
    return {m: bucket(s) for m, s in best.items()}
