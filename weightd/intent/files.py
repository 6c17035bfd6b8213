"""Reading intent from disk: the directory of ``*.toml`` files (:func:`load_intent`) and the node's
labels file (:func:`read_labels`). Both decide what a privileged daemon fetches and pins, so each file
must be a regular file that only root or the daemon's user can change, reached through directories and
links that only they can change (sshd's StrictModes, for the same reason), and bounded in size. Every
problem is an :class:`IntentError` naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Mapping

from ..errors import IntentError
from .selector import _check_key, _check_value
from .imports import ImportEntry
from .spec import Intent, KeepEntry, parse_document

MAX_FILES = 256
MAX_FILE_BYTES = 1 << 20
MAX_ENTRIES = 4096
MAX_LABELS_BYTES = 64 << 10


def fingerprint(directory: Path) -> tuple[Any, ...]:
    """What changes when a file is added, removed or rewritten (a ConfigMap update swaps ``..data``)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return ("missing",)
    except OSError as exc:
        return ("unreadable", exc.errno)
    out: list[Any] = []
    for n in names:
        if n.endswith(".toml") and not n.startswith("."):
            try:
                st = os.stat(directory / n)
                out.append((n, st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((n, None))
    return tuple(out)


def _check_owner(path: Path, st: os.stat_result, trusted_uids: tuple[int, ...]) -> None:
    """Intent decides what a privileged daemon fetches and pins: its files must not be writable by
    anyone but root or the daemon's user (sshd's StrictModes, for the same reason)."""
    if st.st_uid not in trusted_uids:
        raise IntentError(str(path), f"owned by uid {st.st_uid}, not by root or the daemon's user: refused "
                          "(chown it)")
    if st.st_mode & stat.S_IWOTH:
        raise IntentError(str(path), "writable by every user: refused (chmod o-w)")
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        raise IntentError(str(path), f"writable by group {st.st_gid}: refused (chmod g-w, or chgrp root)")


def _resolve(path: Path, trusted_uids: tuple[int, ...], what: str) -> str:
    """``path`` resolved, symlink by symlink, refusing it (IntentError) unless every directory on the
    way, and wherever a symlink leads, is one only root or the daemon's user can change: a file that
    passes :func:`_check_owner` in a directory another uid owns could be swapped for another the
    moment after it is read (a ConfigMap's ``..data`` links are root's, and pass)."""
    from tiering import UnsafePath, resolve_unchangeable
    try:
        return resolve_unchangeable(path, frozenset(trusted_uids) | {0}, what)
    except UnsafePath as exc:
        raise IntentError(str(path), exc.reason) from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise IntentError(str(path), f"cannot read: {exc.strerror}") from None


def _open_resolved(path: Path, trusted: tuple[int, ...], what: str) -> int:
    """``path`` resolved (:func:`_resolve`) and opened ``O_NOFOLLOW`` at the path checked. A component
    that vanishes on the way (a ConfigMap's ``..data`` swapped between a readlink and the next lstat,
    the old directory removed) is resolved once more from the start; FileNotFoundError if it is
    missing again."""
    def once() -> int:
        return os.open(_resolve(path, trusted, what), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return once()
    except FileNotFoundError:
        return once()


def load_intent(directory: Path, *, trusted_uids: tuple[int, ...] | None = None) -> Intent:
    """Read every ``*.toml`` in ``directory`` (name order; hidden files and ConfigMap internals
    skipped). A missing directory is an empty intent; anything wrong is an IntentError."""
    trusted = trusted_uids if trusted_uids is not None else tuple({0, os.geteuid()})
    fp = fingerprint(directory)
    if fp == ("missing",):
        return Intent(str(directory), (), fp)
    try:
        dst = os.stat(directory)
    except OSError as exc:
        raise IntentError(str(directory), f"cannot read: {exc.strerror}") from None
    if not stat.S_ISDIR(dst.st_mode):
        raise IntentError(str(directory), "not a directory")
    _check_owner(directory, dst, trusted)
    try:
        _resolve(directory, trusted, "the intent directory")
    except FileNotFoundError:
        raise IntentError(str(directory), "missing: a directory on its path went away while it was read") from None
    files = [n for n, *_ in fp if isinstance(n, str)]
    if len(files) > MAX_FILES:
        raise IntentError(str(directory), f"{len(files)} intent files; at most {MAX_FILES}")
    entries: list[KeepEntry] = []
    imports: list[ImportEntry] = []
    for n in files:
        path = directory / n
        try:   # (a ConfigMap's files are links: followed here)
            fd = _open_resolved(path, trusted, "this intent file")
        except FileNotFoundError:
            raise IntentError(n, f"missing: {path} or a directory its links lead through is gone (a ConfigMap "
                                 "update under way? it is read again at the next poll)") from None
        except OSError as exc:
            raise IntentError(n, f"cannot open: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IntentError(n, "not a regular file")
            _check_owner(path, st, trusted)
            if st.st_size > MAX_FILE_BYTES:
                raise IntentError(n, f"{st.st_size} bytes; an intent file is at most {MAX_FILE_BYTES}")
            raw = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise IntentError(n, "not UTF-8 text") from None
        keep, imp = parse_document(n, text)
        entries.extend(keep)
        imports.extend(imp)
        if len(entries) + len(imports) > MAX_ENTRIES:
            raise IntentError(n, f"more than {MAX_ENTRIES} entries in {directory}")
    return Intent(str(directory), tuple(entries), fp, tuple(imports))


def read_labels(path: Path | None, fixed: Mapping[str, str], *,
                trusted_uids: tuple[int, ...] | None = None) -> dict[str, str]:
    """This node's labels: ``[intent] labels`` from the config, overlaid by ``key=value`` lines of
    ``labels_file`` if set (a file an init container or the provisioner writes). Labels choose the
    entries a node runs, so the file gets the intent files' checks (a regular file, owned by root or
    the daemon's user, not writable by others, at most 64 KiB). IntentError names a bad line."""
    labels = dict(fixed)
    if path is None:
        return labels
    trusted = trusted_uids if trusted_uids is not None else tuple({0, os.geteuid()})
    try:
        fd = _open_resolved(path, trusted, "the node labels file")
    except FileNotFoundError:
        if not os.path.lexists(path):
            return labels   # (no labels file: only when the configured path itself is absent)
        raise IntentError(str(path), "node labels: missing: a file or directory its links lead to is gone (a "
                                     "ConfigMap update under way? it is read again at the next poll)") from None
    except OSError as exc:
        raise IntentError(str(path), f"cannot read node labels: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IntentError(str(path), "node labels: not a regular file")
        _check_owner(path, st, trusted)
        raw = os.read(fd, MAX_LABELS_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_LABELS_BYTES:
        raise IntentError(str(path), f"node labels: larger than {MAX_LABELS_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise IntentError(str(path), "node labels: not UTF-8 text") from None
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, sep, v = line.partition("=")
        try:
            if not sep:
                raise ValueError("expected key=value")
            labels[_check_key(k.strip())] = _check_value(v.strip())
        except ValueError as exc:
            raise IntentError(str(path), str(exc), f"line {i}") from None
    return labels
