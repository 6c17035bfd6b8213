"""Errors of the OCI cold tier (every one a :class:`~tiering.errors.TieringError`)::

    RegistryError                 the registry refused or failed; exit 1
    ├── RegistrySetupError        credentials, access, TLS, not a registry, unreachable; exit 2
    └── ShortRead                 a range that came back short or broke midway (asked again); exit 1
    BlobMismatch (IntegrityError) a blob whose bytes are not its sha256 digest; exit 5

A 404 is :class:`~tiering.errors.CheckpointNotFound` (exit 3), a deadline :class:`~tiering.errors.TimedOut`
(exit 4), another tag under a published version :class:`~tiering.errors.VersionConflict` (exit 2).
"""

from __future__ import annotations

from ...errors import IntegrityError, TieringError


class RegistryError(TieringError):
    """The registry refused or failed (exit 2 for set-up problems, 1 otherwise); ``kind`` says how
    (not_found, unauthorized, denied, unreachable, tls, throttled, error, short_read)."""
    kind = "error"


class RegistrySetupError(RegistryError):
    """Credentials refused or missing, access denied, not a registry, no TLS trust, unreachable: the
    configuration or the registry's state needs a fix (exit 2)."""
    exit_code = 2


class ShortRead(RegistryError):
    """The registry sent fewer (or more) bytes than the range asked for, or the response broke midway:
    asked again (a range at a time), then this error (exit 1; resumable)."""
    kind = "short_read"


class BlobMismatch(IntegrityError):
    """A blob whose bytes are not its digest (sha256): refused (exit 5)."""
