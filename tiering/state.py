"""What is where, pins, leases and access history, in SQLite (WAL) under the state directory.

The tier directories are the truth for presence: :meth:`State.reconcile` adopts complete versions it
did not know and forgets rows whose directory vanished. The clock is injected (``now``) for tests.

**A broken database never bricks the node.** :class:`State` checks what it opens (SQLite's own
"not a database" / "malformed" errors, ``PRAGMA quick_check``, the tables and columns of
:data:`SCHEMA`, the ``meta`` schema version, and a ``-wal`` whose header is not a WAL header, which
SQLite would silently discard together with the transactions it held). If the database is unusable it
is moved aside (with its ``-wal`` / ``-shm``) as ``state.db.corrupt-<UTC timestamp>`` in the state
directory (the newest :data:`KEEP_CORRUPT` are kept), a fresh database is created, one WARNING is
logged and :attr:`State.recovered` says why. What is lost and what is not:

* copies: nothing; the node's reconciliation re-adopts every complete version from the tier
  directories (access times restart);
* pins: nothing; every pin / unpin also rewrites ``pins.json`` (atomically, mode 0600) next to the
  database, and a fresh database imports it;
* leases: **lost**; a lease holder that still needs its copy must take a new lease.

A lock (``state.lock``) serialises checking and recovering between processes, so two commands started
together never both move the database aside. Errors that are not corruption (a locked database, an
I/O error, a full disk) are raised as they are: moving a healthy database aside would lose leases.
A process that already has the database open while another one moves it aside keeps writing to the
moved file (SQLite cannot tell us about other connections); the daemon re-opens its node on restart.

``state.db`` (and ``-wal`` / ``-shm`` / ``-journal``) must be regular files: a symlink is refused with
:class:`~tiering.errors.UnsafePath` (exit 2), so a planted link never makes SQLite write elsewhere.
The state directory is created with mode 0700.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Iterator, TypeVar

from .errors import InvalidName, TimedOut, UnsafePath
from .content.names import validate_name, validate_version

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)


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
DB_NAME = "state.db"
DB_COMPANIONS = ("-wal", "-shm", "-journal")  # files SQLite keeps next to the database
PINS_NAME = "pins.json"
LOCK_NAME = "state.lock"
KEEP_CORRUPT = 3           # moved-aside databases kept (newest first); older ones are deleted
PINS_MAX_BYTES = 16 << 20  # a pins.json larger than this is not ours
LOCK_WAIT_S = 60.0
_WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")  # big-endian 0x377f0682 / 0x377f0683
_CORRUPT_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
_CORRUPT_RE = re.compile(r"state\.db\.corrupt-(\d{8}T\d{6}(?:\.\d{6})?Z)(?:\.(\d+))?")


class _Corrupt(Exception):
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
        with self._open_lock():
            self._refuse_unsafe_files()
            reason = self._wal_is_garbage()
            fresh = False
            if reason is None:
                try:
                    fresh = self._connect_and_check()
                except _Corrupt as exc:
                    reason = str(exc)
            if reason is not None:
                self.moved_to = self._move_aside()
                try:
                    fresh = self._connect_and_check()
                except _Corrupt as exc:  # a database we just created: not a corruption we can handle
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

    # -- opening, checking, recovering -------------------------------------------------------------
    @contextmanager
    def _open_lock(self) -> Iterator[None]:
        """Serialise check-and-recover between processes (bounded wait)."""
        path = self.dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(str(path), "is a symbolic link; refusing to use it") from None
            raise
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimedOut(f"{path}: another process kept the state database locked for "
                                       f"{LOCK_WAIT_S:.0f} s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _refuse_unsafe_files(self) -> None:
        """The database and SQLite's companion files must be regular files, never symlinks."""
        for suffix in ("", *DB_COMPANIONS):
            p = self.dir / (DB_NAME + suffix)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePath(str(p), "is a symbolic link; refusing to open the state database through it")
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(str(p), "is not a regular file; refusing to open the state database")

    def _wal_is_garbage(self) -> str | None:
        """A non-empty ``-wal`` without a WAL header: SQLite would drop it (and what it committed)."""
        p = self.dir / (DB_NAME + "-wal")
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        try:
            head = os.pread(fd, 4, 0)
        finally:
            os.close(fd)
        if head and head not in _WAL_MAGIC:
            return f"{p.name} is not a SQLite write-ahead log"
        return None

    def _connect_and_check(self) -> bool:
        """Open ``state.db`` and check it; True if it was empty (created now). Raises _Corrupt."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            try:
                fresh = self._check(db)
            except sqlite3.DatabaseError as exc:
                # our read-only queries are fixed and valid: a plain SQLITE_ERROR here comes from what
                # the file holds (e.g. a table of an unknown module), not from us
                _raise_if_corrupt(exc, also=(sqlite3.SQLITE_ERROR,))
                raise
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA busy_timeout=30000")
                if fresh:
                    db.executescript(SCHEMA)
                    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            except sqlite3.DatabaseError as exc:
                _raise_if_corrupt(exc)
                raise
        except BaseException:
            _close_quietly(db)
            raise
        self.db = db
        return fresh

    @staticmethod
    def _check(db: sqlite3.Connection) -> bool:
        """Read-only checks before anything is written; True if the database has no objects at all."""
        if not db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            return True
        result = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
        if result != ["ok"]:
            raise _Corrupt("quick_check: " + "; ".join(map(str, result)))
        for table, columns in _EXPECTED.items():
            have = db.execute(f"PRAGMA table_info({table})").fetchall()
            if not have:
                raise _Corrupt(f"table {table} missing")
            if have != columns:
                raise _Corrupt(f"table {table} has columns {[c[1] for c in have]}, expected "
                               f"{[c[1] for c in columns]}")
        row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            raise _Corrupt("schema version missing")
        if row[0] != SCHEMA_VERSION:
            raise _Corrupt(f"schema version {row[0]!r}, expected {SCHEMA_VERSION!r}")
        return False

    def _move_aside(self) -> Path:
        """Rename the database and its companions to ``state.db.corrupt-<UTC>`` (atomic, same dir)."""
        ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        base = f"{DB_NAME}.corrupt-{ts}"
        taken = [_corrupt_key(stem) for stem in self._corrupt_groups()]
        if any(t == ts for t, _ in taken):  # same microsecond: a number after every one already there
            base += f".{1 + max(n for t, n in taken if t == ts)}"
        for suffix in ("", *DB_COMPANIONS):
            try:
                os.rename(self.dir / (DB_NAME + suffix), self.dir / (base + suffix))
            except FileNotFoundError:
                pass
        _fsync_dir(self.dir)
        self._prune_corrupt()
        return self.dir / base

    def _corrupt_groups(self) -> dict[str, list[str]]:
        """``state.db.corrupt-<ts>`` -> its files (the db and its companions)."""
        groups: dict[str, list[str]] = {}
        for name in os.listdir(self.dir):
            stem = name
            for s in DB_COMPANIONS:
                stem = stem.removesuffix(s)
            if _CORRUPT_RE.fullmatch(stem):
                groups.setdefault(stem, []).append(name)
        return groups

    def _prune_corrupt(self) -> None:
        groups = self._corrupt_groups()
        for stem in sorted(groups, key=_corrupt_key)[:-KEEP_CORRUPT]:
            for name in groups[stem]:
                try:
                    os.unlink(self.dir / name)
                except OSError as exc:
                    log.warning("cannot delete old %s: %s", self.dir / name, exc)

    # -- pins.json: where pins survive a rebuild ------------------------------------------------
    def _read_pins_file(self, *, quiet: bool = False) -> list[tuple[str, str, float]] | None:
        """Pins from ``pins.json``; None if it is missing or invalid (warned about unless quiet)."""
        try:
            dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = os.open(PINS_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            finally:
                os.close(dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if not quiet:
                log.warning("ignoring %s: %s", self.pins_path,
                            "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror)
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError("not a regular file")
                if st.st_size > PINS_MAX_BYTES:
                    raise ValueError(f"larger than {PINS_MAX_BYTES} bytes")
                return _parse_pins(f.read(PINS_MAX_BYTES + 1))
        except (ValueError, OSError, InvalidName) as exc:
            if not quiet:
                log.warning("ignoring invalid %s: %s", self.pins_path, exc)
            return None

    def _write_pins_file(self) -> None:
        """Rewrite ``pins.json`` from the pins table: temp file, fsync, rename, fsync the directory."""
        pins = [{"name": n, "version": v, "created_at": c}
                for n, v, c in self.db.execute("SELECT name, version, created_at FROM pins ORDER BY name, version")]
        data = (json.dumps({"format": 1, "pins": pins}, indent=1) + "\n").encode()
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            tmp = f".{PINS_NAME}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dfd)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, PINS_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise
            os.fsync(dfd)
        finally:
            os.close(dfd)

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
        pins = self._read_pins_file()
        if not pins:
            return
        with self._write_txn():
            self.db.executemany("INSERT OR IGNORE INTO pins VALUES (?,?,?)", pins)
        log.info("restored %d pin(s) from %s", len(pins), self.pins_path)

    def _sync_pins_file(self) -> None:
        """A healthy database is the truth: rewrite ``pins.json`` if it is missing or says otherwise."""
        def differs() -> bool:
            on_file = self._read_pins_file(quiet=True)
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


def _raise_if_corrupt(exc: sqlite3.DatabaseError, also: tuple[int, ...] = ()) -> None:
    """Corruption is SQLite's "malformed" / "not a database"; busy, locked, I/O errors are not."""
    if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in (*_CORRUPT_CODES, *also):
        raise _Corrupt(f"{getattr(exc, 'sqlite_errorname', 'SQLITE_CORRUPT')}: {exc}") from None


def _close_quietly(db: sqlite3.Connection) -> None:
    try:
        db.close()
    except sqlite3.Error:
        pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _corrupt_key(stem: str) -> tuple[str, int]:
    """``state.db.corrupt-<ts>[.<n>]`` -> (ts, n), in the order they were made."""
    m = _CORRUPT_RE.fullmatch(stem)
    assert m is not None
    return m[1], int(m[2] or 0)


def _parse_pins(raw: bytes) -> list[tuple[str, str, float]]:
    """Validate ``pins.json`` (ValueError / InvalidName if it is not what :meth:`State._write_pins_file` writes)."""
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(doc.get("pins"), list):
        raise ValueError('expected {"format": 1, "pins": [...]}')
    out = []
    for p in doc["pins"]:
        if not isinstance(p, dict):
            raise ValueError("a pin is not an object")
        created = p.get("created_at")
        if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
            raise ValueError(f"bad created_at {created!r}")
        out.append((validate_name(p.get("name")), validate_version(p.get("version")), float(created)))
    return out
