"""Errors of the control plane, and the one place that maps every error to an exit code.

Hierarchy::

    WeightdError                 exit 1 unless a subclass says otherwise
    ├── ConfigError              broken config file or value; exit 2
    └── UsageError               bad command-line input; exit 2

Errors from ``tiering`` (``TieringError``) and ``p2p`` (``P2PError``) carry their own ``exit_code``.
Exit codes (design §5): 0 ok; 2 bad input; 3 not found; 4 timed out; 5 integrity failure;
6 no space in any allowed tier; 7 ``weightd doctor`` found a critical problem; 1 anything else.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4
EXIT_INTEGRITY = 5
EXIT_NO_SPACE = 6
EXIT_CRITICAL = 7   # weightd doctor: a critical finding


class WeightdError(Exception):
    exit_code = EXIT_ERROR


class ConfigError(WeightdError):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, source: str, reason: str, key: str | None = None) -> None:
        self.source, self.reason, self.key = source, reason, key
        where = f"{source}: {key}" if key else source
        super().__init__(f"config {where}: {reason}")


class UsageError(WeightdError):
    exit_code = EXIT_BAD_INPUT


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code of any exception (1 for the unexpected)."""
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int):
        return code
    if isinstance(exc, TimeoutError):
        return EXIT_TIMEOUT
    if isinstance(exc, FileNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
        return EXIT_NO_SPACE
    return EXIT_ERROR
