"""The state database's schema and its checks: what counts as corruption, and opening one checked."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


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
_CORRUPT_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


class Corrupt(Exception):
    """The database cannot be used as it is; ``str()`` is the reason."""


def _expected_columns() -> dict[str, list[tuple[Any, ...]]]:
    """``PRAGMA table_info`` of every table of SCHEMA, from an in-memory database built from it."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(SCHEMA)
        tables = [r[0] for r in mem.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                            "AND name NOT LIKE 'sqlite_%'")]
        return {t: mem.execute(f"PRAGMA table_info({t})").fetchall() for t in tables}
    finally:
        mem.close()


_EXPECTED = _expected_columns()


def check_db(db: sqlite3.Connection) -> bool:
    """Read-only checks before anything is written; True if the database has no objects at all."""
    if not db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        return True
    result = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
    if result != ["ok"]:
        raise Corrupt("quick_check: " + "; ".join(map(str, result)))
    for table, columns in _EXPECTED.items():
        have = db.execute(f"PRAGMA table_info({table})").fetchall()
        if not have:
            raise Corrupt(f"table {table} missing")
        if have != columns:
            raise Corrupt(f"table {table} has columns {[c[1] for c in have]}, expected "
                          f"{[c[1] for c in columns]}")
    row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    if row is None:
        raise Corrupt("schema version missing")
    if row[0] != SCHEMA_VERSION:
        raise Corrupt(f"schema version {row[0]!r}, expected {SCHEMA_VERSION!r}")
    return False


def connect_and_check(path: Path) -> tuple[sqlite3.Connection, bool]:
    """Open ``state.db`` and check it; (the connection, True if it was empty: created now). Raises
    Corrupt."""
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    try:
        try:
            fresh = check_db(db)
        except sqlite3.DatabaseError as exc:
            # our read-only queries are fixed and valid: a plain SQLITE_ERROR here comes from what
            # the file holds (e.g. a table of an unknown module), not from us
            raise_if_corrupt(exc, also=(sqlite3.SQLITE_ERROR,))
            raise
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=30000")
            if fresh:
                db.executescript(SCHEMA)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        except sqlite3.DatabaseError as exc:
            raise_if_corrupt(exc)
            raise
    except BaseException:
        close_quietly(db)
        raise
    return db, fresh


def raise_if_corrupt(exc: sqlite3.DatabaseError, also: tuple[int, ...] = ()) -> None:
    """Corruption is SQLite's "malformed" / "not a database"; busy, locked, I/O errors are not."""
    if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (*_CORRUPT_CODES, *also):
        raise Corrupt(f"{getattr(exc, 'sqlite_errorname', 'SQLITE_CORRUPT')}: {exc}") from None


def close_quietly(db: sqlite3.Connection) -> None:
    try:
        db.close()
    except sqlite3.Error:
        pass
