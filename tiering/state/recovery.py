"""The files of the state directory around the database: the lock that serialises check-and-recover
between processes, refusing symlinked or special files, a ``-wal`` that is not one, and moving an
unusable database aside (keeping the newest :data:`KEEP_CORRUPT`)."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from ..errors import TimedOut, UnsafePath

log = logging.getLogger("tiering.state")
DB_NAME = "state.db"
DB_COMPANIONS = ("-wal", "-shm", "-journal")  # files SQLite keeps next to the database
LOCK_NAME = "state.lock"
KEEP_CORRUPT = 3           # moved-aside databases kept (newest first); older ones are deleted
LOCK_WAIT_S = 60.0
_WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")  # big-endian 0x377f0682 / 0x377f0683
_CORRUPT_RE = re.compile(r"state\.db\.corrupt-(\d{8}T\d{6}(?:\.\d{6})?Z)(?:\.(\d+))?")


@contextmanager
def open_lock(state_dir: Path) -> Iterator[None]:
    """Serialise check-and-recover between processes (bounded wait)."""
    path = state_dir / LOCK_NAME
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


def refuse_unsafe_files(state_dir: Path) -> None:
    """The database and SQLite's companion files must be regular files, never symlinks."""
    for suffix in ("", *DB_COMPANIONS):
        p = state_dir / (DB_NAME + suffix)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(str(p), "is a symbolic link; refusing to open the state database through it")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(str(p), "is not a regular file; refusing to open the state database")


def wal_is_garbage(state_dir: Path) -> str | None:
    """A non-empty ``-wal`` without a WAL header: SQLite would drop it (and what it committed)."""
    p = state_dir / (DB_NAME + "-wal")
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


def move_aside(state_dir: Path) -> Path:
    """Rename the database and its companions to ``state.db.corrupt-<UTC>`` (atomic, same dir)."""
    ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    base = f"{DB_NAME}.corrupt-{ts}"
    taken = [corrupt_key(stem) for stem in corrupt_groups(state_dir)]
    if any(t == ts for t, _ in taken):  # same microsecond: a number after every one already there
        base += f".{1 + max(n for t, n in taken if t == ts)}"
    for suffix in ("", *DB_COMPANIONS):
        try:
            os.rename(state_dir / (DB_NAME + suffix), state_dir / (base + suffix))
        except FileNotFoundError:
            pass
    fsync_dir(state_dir)
    prune_corrupt(state_dir)
    return state_dir / base


def corrupt_groups(state_dir: Path) -> dict[str, list[str]]:
    """``state.db.corrupt-<ts>`` -> its files (the db and its companions)."""
    groups: dict[str, list[str]] = {}
    for name in os.listdir(state_dir):
        stem = name
        for s in DB_COMPANIONS:
            stem = stem.removesuffix(s)
        if _CORRUPT_RE.fullmatch(stem):
            groups.setdefault(stem, []).append(name)
    return groups


def prune_corrupt(state_dir: Path) -> None:
    groups = corrupt_groups(state_dir)
    for stem in sorted(groups, key=corrupt_key)[:-KEEP_CORRUPT]:
        for name in groups[stem]:
            try:
                os.unlink(state_dir / name)
            except OSError as exc:
                log.warning("cannot delete old %s: %s", state_dir / name, exc)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def corrupt_key(stem: str) -> tuple[str, int]:
    """``state.db.corrupt-<ts>[.<n>]`` -> (ts, n), in the order they were made."""
    m = _CORRUPT_RE.fullmatch(stem)
    assert m is not None
    return m[1], int(m[2] or 0)
