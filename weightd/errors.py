"""Errors of the control plane, and the one table that maps every error type to an exit code and to
the next step for the operator (on the model of huggingface_hub's ``cli/_errors.py``).

Hierarchy::

    WeightdError                   exit 1 unless a subclass says otherwise
    ├── ConfigError                broken config file or value; exit 2
    │   └── IntentError            a bad intent file, entry or key (fleet intent); exit 2
    ├── OriginUnavailable          the origin's fleet endpoints do not answer (fleet status); exit 1
    ├── FeatureFileError           the NFD feature file cannot be written ([intent] nfd_dir); exit 1
    ├── UsageError                 bad command-line input; exit 2
    │   └── InvalidRequest         an operation's arguments out of bounds (CLI and daemon alike); exit 2
    ├── ApiError                   the daemon refuses a request (HTTP status, exit code; 403: exit 2)
    ├── BenchError                 ``weightd bench disk`` cannot measure that path; exit 2
    ├── PathsSkipped               warm/residency/cool skipped paths; exit 3 (missing) or 2 (unreadable)
    ├── DaemonError                an error the daemon reported, with the daemon's exit code and hint
    ├── BadAnswer (ValueError)     what came back on the daemon's socket is not HTTP/1.1 we can read; exit 1
    ├── DaemonUnavailable          ``--daemon-only`` and no daemon answers; exit 1
    ├── UntrustedDaemon            socket served by an untrusted uid, or a path outside the tiers; exit 2
    ├── DaemonAlreadyRunning       another daemon holds the state directory; exit 2
    └── SocketInUse                ``[api] socket`` is live, a symlink, or not a socket; exit 2

Errors are mapped by type in :func:`_rules` below (with the operator's next step); the errors of
``tiering`` (``TieringError``) and ``p2p`` (``P2PError``) that it does not name carry their code on
their type. Exit codes (design §5): 0 ok; 2 bad input; 3 not found; 4 timed out;
5 integrity failure; 6 no space in any allowed tier; 7 ``weightd doctor`` found a critical problem;
1 anything else. Nothing here looks at the text of a message.
"""

from __future__ import annotations

import errno
import grp
import os
from collections import namedtuple

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


class ReportRefused(ValueError):
    """The origin refuses a worker's report (or fleet request), with the HTTP status that says why: 400
    malformed, 413 larger than the room the fleet budget can give it, 429 too many (the address's rate,
    the view's node cap)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Stopped(BaseException):
    """Not an error: SIGTERM or SIGINT asked a long-running command (``weightd hold``) to release what
    it holds and leave (a BaseException, so no ``except Exception`` of a step in progress swallows it)."""


class ConfigError(WeightdError):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, source: str, reason: str, key: str | None = None) -> None:
        self.source, self.reason, self.key = source, reason, key
        where = f"{source}: {key}" if key else source
        super().__init__(f"config {where}: {reason}")


class SettingsError(Exception):
    """A settings model's refusal (:mod:`weightd.config.model`): where (``loc``, a key path), the
    words pydantic used (``msg``) and its kind (``type``). :func:`weightd.config.load_config` turns it
    into a ConfigError naming the key; it never reaches a user as itself."""

    def __init__(self, msg: str, type_: str = "value_error", loc: tuple[object, ...] = ()) -> None:
        super().__init__(msg)
        self.msg, self.type, self.loc = msg, type_, tuple(loc)

    def at(self, *outer: object) -> "SettingsError":
        self.loc = (*outer, *self.loc)
        return self

    def errors(self) -> list[dict[str, object]]:
        return [{"loc": self.loc, "msg": self.msg, "type": self.type}]


class IntentError(ConfigError):
    """A bad intent file, entry or key (exit 2); a daemon keeps the intent it runs."""

    def __init__(self, source: str, reason: str, where: str | None = None) -> None:
        self.source, self.reason, self.key = source, reason, where
        Exception.__init__(self, f"intent {source}" + (f": {where}" if where else "") + f": {reason}")


class OriginUnavailable(WeightdError):
    """The origin's fleet endpoints (``weightd fleet status``, a worker's report or rollout slot) did
    not answer, or answered something else than weightd's JSON; exit 1."""


class FeatureFileError(WeightdError):
    """The Node Feature Discovery file cannot be written where ``[intent] nfd_dir`` says; exit 1."""


class UsageError(WeightdError):
    exit_code = EXIT_BAD_INPUT


class InvalidRequest(UsageError):
    """An argument of an operation is out of bounds; raised by :class:`weightd.node.service.NodeService`,
    so the CLI and the daemon refuse alike (the daemon answers 400)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


class ApiError(WeightdError):
    """The daemon refuses a request before it reaches the service (authz, malformed body)."""

    def __init__(self, status: int, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.status, self.exit_code = status, exit_code


class BenchError(WeightdError):
    exit_code = EXIT_BAD_INPUT


class PathsSkipped(WeightdError):
    """Some paths given to warm/residency/cool were skipped (each already warned about)."""

    def __init__(self, count: int, *, missing: bool, unreadable: bool) -> None:
        super().__init__(f"{count} path(s) skipped")
        self.count, self.missing, self.unreadable = count, missing, unreadable
        self.exit_code = EXIT_NOT_FOUND if missing else EXIT_BAD_INPUT if unreadable else EXIT_ERROR


class DaemonError(WeightdError):
    """An error the daemon reported; carries its exit code and hint so the CLI behaves the same either way.
    ``retry``: the daemon is stopping (a restart, a rollout): ask the next one."""

    def __init__(self, message: str, exit_code: int, hint: str | None = None, *, retry: bool = False) -> None:
        super().__init__(message)
        self.exit_code, self.hint, self.retry = exit_code, hint, retry


class DaemonStopping(ApiError):
    """The daemon is stopping: a request still waiting is answered at once (503, ``retry``) instead of
    holding the stop, and the client asks the next daemon."""

    def __init__(self) -> None:
        super().__init__(503, "the daemon is stopping (a restart?): ask again", exit_code=EXIT_ERROR)


class BadAnswer(WeightdError, ValueError):
    """What came back on the daemon's socket is not an HTTP/1.1 answer the client can read."""


class DaemonUnavailable(WeightdError):
    exit_code = EXIT_ERROR


class UntrustedDaemon(WeightdError):
    """The socket is served by someone the CLI does not trust, or the daemon answered a path outside
    the tiers: refuse, never fall back silently."""
    exit_code = EXIT_BAD_INPUT


class SocketDenied(WeightdError):
    """This user may not connect to the daemon's socket: say which group may."""
    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: "os.PathLike[str] | str") -> None:
        try:
            try:
                st = os.stat(path)
            except PermissionError:  # the directory is closed to us: its group decides
                st = os.stat(os.path.dirname(os.fspath(path)))
            try:
                group = grp.getgrgid(st.st_gid).gr_name
            except KeyError:
                group = str(st.st_gid)
            how = (f"it is mode {st.st_mode & 0o777:04o}, group {group}: add this user to {group!r} "
                   f"(usermod -aG {group} $USER, then log in again), or run as root")
        except OSError:
            how = "check the socket's group ([api] group)"
        super().__init__(f"cannot connect to the daemon's socket {path}: permission denied ({how})")


class DaemonAlreadyRunning(WeightdError):
    exit_code = EXIT_BAD_INPUT


class SocketInUse(WeightdError):
    """``[api] socket`` is answered by another daemon, or is not a socket we may replace."""
    exit_code = EXIT_BAD_INPUT


#: an exit code and the next step to print with it (a named tuple: dataclasses import ``inspect``, ~6 ms
#: of the start of every command that can fail)
ExitRule = namedtuple("ExitRule", ["code", "hint"], defaults=[None])


def _rules() -> list[tuple[type[BaseException], ExitRule]]:
    """Most specific first: the first type an error is an instance of decides. Other errors of
    ``tiering`` and ``p2p`` (BadInput, Busy, TorrentRejected, their roots, ...) declare their code on
    their type (``exit_code``), which :func:`rule_for` reads next."""
    from p2p import TransferStalled
    from tiering import CheckpointNotFound, IntegrityError, NoSpace, SignatureRefused, TimedOut
    return [
        (DaemonUnavailable, ExitRule(EXIT_ERROR, "start it: systemctl start weightd, or weightd serve")),
        (UntrustedDaemon, ExitRule(EXIT_BAD_INPUT, "check who serves [api] socket and [api] daemon_user")),
        (IntentError, ExitRule(EXIT_BAD_INPUT, None)),
        (ConfigError, ExitRule(EXIT_BAD_INPUT, "check it with: weightd config show")),
        (InvalidRequest, ExitRule(EXIT_BAD_INPUT, None)),
        (UsageError, ExitRule(EXIT_BAD_INPUT, None)),
        (DaemonAlreadyRunning, ExitRule(EXIT_BAD_INPUT, "stop the other daemon or give this one its own state_dir")),
        (SocketInUse, ExitRule(EXIT_BAD_INPUT, "stop the daemon that answers, or set another [api] socket")),
        (BenchError, ExitRule(EXIT_BAD_INPUT, None)),
        (CheckpointNotFound, ExitRule(EXIT_NOT_FOUND, None)),
        (TransferStalled, ExitRule(EXIT_TIMEOUT, None)),
        (TimedOut, ExitRule(EXIT_TIMEOUT, "retry later, or with a longer --timeout")),
        (SignatureRefused, ExitRule(EXIT_INTEGRITY, None)),   # (its message carries the next step, by reason)
        (IntegrityError, ExitRule(EXIT_INTEGRITY, None)),
        (NoSpace, ExitRule(EXIT_NO_SPACE, "or preload into another --tier")),
    ]


_BUILTINS: list[tuple[type[BaseException], ExitRule]] = [   # after the types' own codes, as OS errors
    (TimeoutError, ExitRule(EXIT_TIMEOUT)),
    (FileNotFoundError, ExitRule(EXIT_NOT_FOUND)),
]


_RULES: list[tuple[type[BaseException], ExitRule]] | None = None


def rule_for(exc: BaseException) -> ExitRule:
    """The exit code and hint of any exception (exit 1 and no hint for the unexpected)."""
    global _RULES
    if _RULES is None:
        _RULES = _rules()
    if isinstance(exc, (DaemonError, ApiError, PathsSkipped)):  # the code travels with the error
        return ExitRule(exc.exit_code, getattr(exc, "hint", None))
    for kind, rule in _RULES:
        if isinstance(exc, kind):
            return rule
    own = getattr(type(exc), "exit_code", None)  # a typed error of another package (tiering's MemlockTooLow)
    if isinstance(own, int):
        return ExitRule(own)
    for kind, rule in _BUILTINS:
        if isinstance(exc, kind):
            return rule
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return ExitRule(EXIT_NO_SPACE, "free space on that file system")
    return ExitRule(EXIT_ERROR)


def exit_code_for(exc: BaseException) -> int:
    """The documented exit code of any exception (1 for the unexpected)."""
    return rule_for(exc).code


def hint_for(exc: BaseException) -> str | None:
    return rule_for(exc).hint


_HTTP_STATUS = {EXIT_BAD_INPUT: 400, EXIT_NOT_FOUND: 404, EXIT_TIMEOUT: 504, EXIT_INTEGRITY: 422, EXIT_NO_SPACE: 507}


def http_status_for(exc: BaseException) -> int:
    """The daemon's HTTP status for an error, from its exit code (an ApiError names its own)."""
    if isinstance(exc, ApiError):
        return exc.status
    from tiering import TieringError
    code = exit_code_for(exc)
    return _HTTP_STATUS.get(code, 409 if code == EXIT_ERROR and isinstance(exc, TieringError) else 500)
