"""Errors of the local data plane.

Hierarchy (every error weightd's tiering raises derives from ``TieringError``)::

    TieringError
    ├── BadInput (ValueError)                 the caller's input is wrong; exit 2
    │   ├── InvalidName                       NAME or VERSION outside the design's patterns
    │   ├── UnsafePath                        absolute, "..", escaping symlink, special file, non-UTF-8 name
    │   ├── SafetensorsHeaderError            malformed / hostile safetensors header
    │   ├── ManifestError                     manifest.json that cannot be trusted
    │   ├── NotOurs                           a tier root or version weightd cannot prove it made: not removed
    │   └── StorageUnavailable                a configured storage root is absent, empty or unreadable
    ├── CheckpointNotFound (FileNotFoundError) a path or checkpoint that does not exist; exit 3
    ├── IntegrityError                        content differs from its manifest; exit 5
    │   ├── ChecksumMismatch                  a part (header, tensor, chunk) hashed differently
    │   └── FileChanged                       a file changed while it was being read
    ├── NoSpace                               no allowed tier can hold it; exit 6
    ├── TimedOut (TimeoutError)               a deadline passed (lock wait, copy); exit 4
    └── Busy                                  pinned / leased / in use, for an explicit action; exit 1

    (VersionConflict is a BadInput: NAME@VERSION already published with other content.)

    PageCacheError (OSError)                  one file could not be warmed, measured or locked
    └── MemlockTooLow                         RLIMIT_MEMLOCK below what locking needs; exit 2

``PageCacheError`` is an ``OSError`` and not a ``TieringError`` on purpose: the page-cache engine
reports it per file (the caller warns and goes on, as for any ``OSError`` of that file), and only
``MemlockTooLow`` carries an exit code of its own.

Every class carries an ``exit_code`` matching design §5 so the CLI maps errors in one place.
"""

from __future__ import annotations

import errno


class TieringError(Exception):
    exit_code = 1


class BadInput(TieringError, ValueError):
    exit_code = 2


class InvalidName(BadInput):
    def __init__(self, kind: str, value: str, reason: str) -> None:
        self.kind, self.value, self.reason = kind, value, reason
        super().__init__(f"invalid {kind} {value!r}: {reason}")


class UnsafePath(BadInput):
    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


class SafetensorsHeaderError(BadInput):
    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: bad safetensors header: {reason}")


class ManifestError(BadInput):
    def __init__(self, source: str, reason: str) -> None:
        self.source, self.reason = source, reason
        super().__init__(f"{source}: bad manifest: {reason}")


class LabelMismatch(ManifestError):
    """A manifest that describes another NAME@VERSION than the directory it is in (a renamed copy)."""


class ColdUnreadable(BadInput):
    """A published version this process may not read (permissions, an NFS export's squashing): named
    for what it is, never taken for "not published", and never skipped when resolving the latest."""

    def __init__(self, ref: str, where: str, reason: str) -> None:
        import os
        self.ref, self.where = ref, where
        super().__init__(f"{ref} is published but this process (uid {os.geteuid()}) cannot read it: {reason} "
                         f"on {where}; make cold storage readable by the daemon's user (e.g. chmod -R a+rX "
                         f"on the version's directory, or fix the export's uid mapping)")


class NotOurs(UnsafePath):
    """Something weightd was about to remove (a version directory, or anything in a tier root) that it
    cannot prove it made: a tier root without weightd's marker that holds other files, a version
    directory holding entries its manifest does not list, or one without a manifest. Left alone,
    logged and counted; ``kind`` is the metric's reason (``foreign_root``, ``unlisted_entries``,
    ``no_manifest``). exit 2."""

    def __init__(self, path: str, reason: str, kind: str) -> None:
        self.kind = kind
        super().__init__(path, reason)


class StorageUnavailable(BadInput):
    """A configured storage root that is not there as configured: cold storage absent, an empty
    directory where a store should be (a mount point with nothing mounted), unreadable, or a tier whose
    parent directory is missing. Never taken for "nothing published": an unmounted NFS must not look
    like an empty catalog. exit 2."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


class CheckpointNotFound(TieringError, FileNotFoundError):
    exit_code = 3

    def __init__(self, what: str, reason: str = "not found") -> None:
        self.what = what
        super().__init__(f"{what}: {reason}")


class IntegrityError(TieringError):
    exit_code = 5


class ChecksumMismatch(IntegrityError):
    def __init__(self, path: str, part: str, expected: str, actual: str) -> None:
        self.path, self.part, self.expected, self.actual = path, part, expected, actual
        super().__init__(f"{path}: {part}: xxh3-128 mismatch (expected {expected}, got {actual})")


class FileChanged(IntegrityError):
    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


class NoSpace(TieringError):
    """No allowed tier can hold the checkpoint, even after evicting what policy allows; exit 6."""
    exit_code = 6

    def __init__(self, tier: str, need: int, available: int, reason: str = "") -> None:
        from .content.units import format_bytes
        self.tier, self.need, self.available = tier, need, available
        extra = f": {reason}" if reason else ""
        super().__init__(f"tier {tier} cannot hold {format_bytes(need)} ({format_bytes(available)} available "
                         f"after eviction){extra}")


class TimedOut(TieringError, TimeoutError):
    exit_code = 4


class VersionConflict(BadInput):
    """NAME@VERSION is already published with different content (versions are immutable)."""

    def __init__(self, ref: str, existing: str, new: str) -> None:
        self.ref, self.existing, self.new = ref, existing, new
        super().__init__(f"{ref} is already published with different content (digest {existing}, "
                         f"this is {new}); versions are immutable: publish it under a new version")


class Busy(TieringError):
    """An explicit action refused because the checkpoint is pinned, leased or in use; exit 1."""

    def __init__(self, ref: str, reason: str) -> None:
        self.ref, self.reason = ref, reason
        super().__init__(f"{ref}: {reason}")


class PageCacheError(OSError):
    """A per-file problem (the caller warns and goes on)."""


class MemlockTooLow(PageCacheError):
    exit_code = 2  # a set-up problem the operator fixes (the message says how)

    def __init__(self, need: int, limit: int) -> None:
        self.need, self.limit = need, limit
        super().__init__(errno.ENOMEM,
                         f"locking needs {need} bytes but RLIMIT_MEMLOCK is {limit}: raise it "
                         f"(systemd: LimitMEMLOCK=infinity in the unit; containers: --ulimit memlock=-1:-1 "
                         f"or a Kubernetes runtime setting; a shell: ulimit -l unlimited)")
