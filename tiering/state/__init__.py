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

By concern: :mod:`.db` (the ``State`` API), :mod:`.schema` (tables, checks, what corruption is),
:mod:`.recovery` (the lock, the files around the database, moving it aside), :mod:`.pins`
(``pins.json``).
"""

from __future__ import annotations

from .db import CopyRow, Lease, State, recorded_copies
from .recovery import KEEP_CORRUPT

__all__ = ["KEEP_CORRUPT", "CopyRow", "Lease", "State", "recorded_copies"]
