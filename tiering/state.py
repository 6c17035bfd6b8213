"""What is where, pins, leases and access history, in SQLite (WAL) under the state directory.

The tier directories are the truth for presence: :meth:`State.reconcile` adopts complete versions it
did not know and forgets rows whose directory vanished. The clock is injected (``now``) for tests.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _locked(fn: F) -> F:
    """One connection, many worker threads (the daemon): serialise every use of it."""
    @functools.wraps(fn)
    def wrapper(self: "State", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]

SCHEMA = """
CREATE TABLE IF NOT EXISTS copies (
    tier TEXT NOT NULL, name TEXT NOT NULL, version TEXT NOT NULL,
    digest TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at REAL NOT NULL, last_access REAL NOT NULL,
    PRIMARY KEY (tier, name, version));
CREATE TABLE IF NOT EXISTS pins (
    name TEXT NOT NULL, version TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (name, version));
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, tier TEXT NOT NULL, name TEXT NOT NULL, version TEXT NOT NULL,
    holder TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
SCHEMA_VERSION = "1"


@dataclass(frozen=True, slots=True)
class CopyRow:
    tier: str
    name: str
    version: str
    digest: str
    bytes: int
    created_at: float
    last_access: float


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    tier: str
    name: str
    version: str
    holder: str
    expires_at: float


class State:
    def __init__(self, state_dir: Path, *, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self._lock = threading.RLock()
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "state.db"
        self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=30000")
        self.db.executescript(SCHEMA)
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))

    @_locked
    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "State":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- copies -------------------------------------------------------------------------------
    @_locked
    def record_copy(self, tier: str, name: str, version: str, digest: str, nbytes: int) -> None:
        t = self.now()
        self.db.execute("INSERT INTO copies VALUES (?,?,?,?,?,?,?) ON CONFLICT(tier, name, version) DO UPDATE "
                        "SET digest=excluded.digest, bytes=excluded.bytes, last_access=excluded.last_access",
                        (tier, name, version, digest, nbytes, t, t))

    @_locked
    def touch(self, tier: str, name: str, version: str) -> None:
        self.db.execute("UPDATE copies SET last_access=? WHERE tier=? AND name=? AND version=?",
                        (self.now(), tier, name, version))

    @_locked
    def forget_copy(self, tier: str, name: str, version: str) -> None:
        self.db.execute("DELETE FROM copies WHERE tier=? AND name=? AND version=?", (tier, name, version))

    @_locked
    def copies(self, tier: str | None = None) -> list[CopyRow]:
        q = "SELECT * FROM copies" + (" WHERE tier=?" if tier else "") + " ORDER BY name, version, tier"
        return [CopyRow(*r) for r in self.db.execute(q, (tier,) if tier else ())]

    @_locked
    def copy(self, tier: str, name: str, version: str) -> CopyRow | None:
        r = self.db.execute("SELECT * FROM copies WHERE tier=? AND name=? AND version=?",
                            (tier, name, version)).fetchone()
        return CopyRow(*r) if r else None

    @_locked
    def reconcile(self, tier: str, present: Iterable[tuple[str, str, str, int]]) -> tuple[int, int]:
        """Make the rows of ``tier`` match what is on disk; returns (adopted, forgotten)."""
        on_disk = {(n, v): (d, b) for n, v, d, b in present}
        known = {(r.name, r.version): r for r in self.copies(tier)}
        adopted = forgotten = 0
        with self.db:
            for (n, v), (d, b) in on_disk.items():
                row = known.get((n, v))
                if row is None or row.digest != d or row.bytes != b:
                    self.record_copy(tier, n, v, d, b)
                    adopted += row is None
            for (n, v) in set(known) - set(on_disk):
                self.forget_copy(tier, n, v)
                forgotten += 1
        return adopted, forgotten

    # -- pins -----------------------------------------------------------------------------------
    @_locked
    def pin(self, name: str, version: str) -> bool:
        cur = self.db.execute("INSERT OR IGNORE INTO pins VALUES (?,?,?)", (name, version, self.now()))
        return cur.rowcount > 0

    @_locked
    def unpin(self, name: str, version: str) -> bool:
        return self.db.execute("DELETE FROM pins WHERE name=? AND version=?", (name, version)).rowcount > 0

    @_locked
    def pinned(self) -> set[tuple[str, str]]:
        return {(n, v) for n, v in self.db.execute("SELECT name, version FROM pins")}

    # -- leases ---------------------------------------------------------------------------------
    @_locked
    def add_lease(self, tier: str, name: str, version: str, seconds: float, holder: str | None = None) -> int:
        holder = holder or f"pid {os.getpid()}"
        cur = self.db.execute("INSERT INTO leases (tier, name, version, holder, expires_at) VALUES (?,?,?,?,?)",
                              (tier, name, version, holder, self.now() + seconds))
        return int(cur.lastrowid or 0)

    @_locked
    def leases(self, *, active_only: bool = True) -> list[Lease]:
        q = "SELECT * FROM leases" + (" WHERE expires_at > ?" if active_only else "") + " ORDER BY expires_at"
        return [Lease(*r) for r in self.db.execute(q, (self.now(),) if active_only else ())]

    @_locked
    def expire_leases(self) -> int:
        return self.db.execute("DELETE FROM leases WHERE expires_at <= ?", (self.now(),)).rowcount

    @_locked
    def release_leases(self, name: str, version: str, tier: str | None = None) -> int:
        q = "DELETE FROM leases WHERE name=? AND version=?" + (" AND tier=?" if tier else "")
        return self.db.execute(q, (name, version, tier) if tier else (name, version)).rowcount
