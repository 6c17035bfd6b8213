"""The ``State`` API over one SQLite connection (see the package docstring for recovery)."""

from __future__ import annotations

import functools
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, TypeVar

from .pins import PINS_NAME, read_pins_file, write_pins_file
from .recovery import DB_NAME, move_aside, open_lock, refuse_unsafe_files, wal_is_garbage
from .schema import Corrupt, connect_and_check

log = logging.getLogger("tiering.state")


F = TypeVar("F", bound=Callable[..., Any])


def _locked(fn: F) -> F:
    """One connection, many worker threads (the daemon): serialise every use of it."""
    @functools.wraps(fn)
    def wrapper(self: "State", *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return fn(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


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
    """The node's database; see the module docstring for corruption recovery and what it loses.

    ``recovered`` is None, or why the database found at open was moved aside and replaced by a fresh
    one (the daemon counts it in ``weightd_state_recoveries_total``); ``recoveries`` counts that for
    the whole process.
    """

    recoveries: ClassVar[int] = 0

    def __init__(self, state_dir: Path, *, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self._lock = threading.RLock()
        self.dir = Path(state_dir)
        self.path = self.dir / DB_NAME
        self.pins_path = self.dir / PINS_NAME
        self.recovered: str | None = None
        self.moved_to: Path | None = None
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open_lock(self.dir):
            refuse_unsafe_files(self.dir)
            reason = wal_is_garbage(self.dir)
            fresh = False
            if reason is None:
                try:
                    self.db, fresh = connect_and_check(self.path)
                except Corrupt as exc:
                    reason = str(exc)
            if reason is not None:
                self.moved_to = move_aside(self.dir)
                try:
                    self.db, fresh = connect_and_check(self.path)
                except Corrupt as exc:  # a database we just created: not a corruption we can handle
                    raise sqlite3.DatabaseError(f"{self.path}: fresh state database unusable: {exc}") from None
                self.recovered = reason
                State.recoveries += 1
                log.warning("state database %s was unusable (%s): moved it aside as %s and started a fresh "
                            "one; copies are re-adopted from the tier directories, pins restored from %s, "
                            "leases are lost", self.path, reason, self.moved_to, self.pins_path)
            try:
                if fresh:
                    self._import_pins()
                else:
                    self._sync_pins_file()
            except BaseException:
                self.db.close()
                raise

    def _write_pins_file(self) -> None:
        """Rewrite ``pins.json`` from the pins table (inside the write transaction)."""
        write_pins_file(self.dir, self.db.execute(
            "SELECT name, version, created_at FROM pins ORDER BY name, version").fetchall())

    @contextmanager
    def _write_txn(self) -> Iterator[None]:
        """A write transaction taken up front: other processes' writers wait (pins.json stays in step)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _import_pins(self) -> None:
        """A fresh database (first start or after recovery) takes the pins kept in ``pins.json``."""
        pins = read_pins_file(self.dir)
        if not pins:
            return
        with self._write_txn():
            self.db.executemany("INSERT OR IGNORE INTO pins VALUES (?,?,?)", pins)
        log.info("restored %d pin(s) from %s", len(pins), self.pins_path)

    def _sync_pins_file(self) -> None:
        """A healthy database is the truth: rewrite ``pins.json`` if it is missing or says otherwise."""
        def differs() -> bool:
            on_file = read_pins_file(self.dir, quiet=True)
            db = {(n, v) for n, v in self.db.execute("SELECT name, version FROM pins")}
            return on_file is None and bool(db) or on_file is not None and {(n, v) for n, v, _ in on_file} != db
        if differs():
            with self._write_txn():
                if differs():
                    self._write_pins_file()

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
        with self._write_txn():
            cur = self.db.execute("INSERT OR IGNORE INTO pins VALUES (?,?,?)", (name, version, self.now()))
            if cur.rowcount > 0:
                self._write_pins_file()
        return cur.rowcount > 0

    @_locked
    def unpin(self, name: str, version: str) -> bool:
        with self._write_txn():
            cur = self.db.execute("DELETE FROM pins WHERE name=? AND version=?", (name, version))
            if cur.rowcount > 0:
                self._write_pins_file()
        return cur.rowcount > 0

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
    def hold(self, tier: str, name: str, version: str, seconds: float, holder: str) -> None:
        """One lease per (copy, holder), renewed: a holder that renews every round (fleet intent)
        keeps one row, not one per round. ``seconds`` <= 0 drops the holder's lease."""
        with self._write_txn():
            self.db.execute("DELETE FROM leases WHERE tier=? AND name=? AND version=? AND holder=?",
                            (tier, name, version, holder))
            if seconds > 0:
                    self.db.execute("INSERT INTO leases (tier, name, version, holder, expires_at) VALUES (?,?,?,?,?)",
                                (tier, name, version, holder, self.now() + seconds))

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


def recorded_copies(state_dir: Path, tier: str) -> dict[tuple[str, str], str]:
    """{(name, version): digest} of the copies the state database records in ``tier``, read without
    making, locking or recovering anything (``serve --check``); empty when there is no database or
    it cannot be read as it is."""
    path = Path(state_dir) / DB_NAME
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return {(n, v): d for n, v, d in db.execute("SELECT name, version, digest FROM copies WHERE tier=?",
                                                         (tier,))}
        finally:
            db.close()
    except sqlite3.Error:
        return {}
