"""Who may do what (design §13), and whose socket this is.

Anyone who can connect (the socket's ``[api] group``) reads; the mutating routes are for root, the
daemon's own user and ``[api] admin_group``, told apart by the kernel's ``SO_PEERCRED``; ``publish``
reads only what its caller could read. A live, symlinked or non-socket ``[api] socket`` is never
taken over.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..client import peer_credentials, peer_groups
from ..errors import ApiError, SocketInUse

MUTATING_ROUTES = ("publish", "evict", "pin", "unpin", "gc")


@dataclass(frozen=True)
class Caller:
    """The other end of an admin connection, as the kernel saw it at connect time."""
    pid: int
    uid: int
    gids: frozenset[int]   # primary and supplementary


def _mode_allows(st: os.stat_result, caller: Caller, want: int) -> bool:
    """POSIX owner/group/other permission bits (``want``: 4 read, 1 search); root may do anything."""
    if caller.uid == 0:
        return True
    if st.st_uid == caller.uid:
        bits = st.st_mode >> 6
    elif st.st_gid in caller.gids:
        bits = st.st_mode >> 3
    else:
        bits = st.st_mode
    return bits & want == want


def caller_may_read(caller: Caller) -> Callable[[str, os.stat_result], None]:
    """The scan's check for a publish through the daemon: every directory it enters must be readable
    and searchable by ``caller``, every file (and symlink target) it pins readable, judged on the
    inode the scan holds, so a tree swapped after :func:`check_caller_can_read` gains nothing."""
    def check(path: str, st: os.stat_result) -> None:
        want, what = (5, "read and search (r-x)") if stat.S_ISDIR(st.st_mode) else (4, "read (r)")
        if not _mode_allows(st, caller, want):
            raise ApiError(403, f"uid {caller.uid} may not read {path} (needs {what} permission): publish reads "
                                "only what its caller could read")
    return check


def check_caller_can_read(top: str, caller: Caller) -> None:
    """Refuse (403) unless ``caller`` could read the whole tree at ``top`` itself: search (x) on every
    directory on the way, read and search on every directory in the tree, read on every file, with
    symlinks (an HF cache snapshot is made of them) checked where they lead."""
    if caller.uid == 0:
        return

    def refuse(path: str, what: str) -> ApiError:
        return ApiError(403, f"uid {caller.uid} may not read {path} (needs {what} permission): publish reads only "
                        "what its caller could read")

    searchable: set[str] = set()

    def traverse(path: str) -> None:  # x on every directory from / down to path
        cur = "/"
        for part in Path(path).parts[1:] if path != "/" else ():
            cur = os.path.join(cur, part)
            if cur in searchable:
                continue
            if not _mode_allows(os.stat(cur), caller, 1):
                raise refuse(cur, "search (x)")
            searchable.add(cur)
        if not _mode_allows(os.stat("/"), caller, 1):
            raise refuse("/", "search (x)")

    traverse(os.path.dirname(os.path.abspath(top)))   # the path as the caller wrote it
    seen: set[str] = set()
    stack = [top]
    while stack:
        real = os.path.realpath(stack.pop())
        if real in seen:
            continue
        seen.add(real)
        traverse(os.path.dirname(real))                  # ... and where it really leads
        st = os.stat(real)
        if not stat.S_ISDIR(st.st_mode):
            if not _mode_allows(st, caller, 4):
                raise refuse(real, "read (r)")
            continue
        if not _mode_allows(st, caller, 5):
            raise refuse(real, "read and search (r-x)")
        searchable.add(real)
        with os.scandir(real) as it:
            for entry in it:
                if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif not _mode_allows(entry.stat(follow_symlinks=False), caller, 4):
                    raise refuse(entry.path, "read (r)")


def check_caller_may_sign(key: Path, caller: Caller) -> None:
    """``[publish] signing_key`` signs a publish through the daemon only for a caller who could read
    that key itself: root, the daemon's user, or a uid/gid the key file's owner and mode let read it
    (and search every directory above it). Being in ``[api] admin_group`` is not enough: the daemon
    would otherwise lend its key to every admin. The grant is the key file's own permissions (say
    ``chgrp signers KEY; chmod 0640 KEY``). 403 with one line otherwise; nothing is published."""
    if caller.uid in (0, os.geteuid()):
        return
    try:
        check_caller_can_read(str(key), caller)
    except (ApiError, OSError) as exc:
        why = str(exc) if isinstance(exc, ApiError) else (exc.strerror or str(exc))
        raise ApiError(403, f"uid {caller.uid} may not publish signed with [publish] signing_key {key}: it could "
                            f"not read that key itself ({why.split(' (needs')[0]}); sign with a key of its own "
                            "(--sign KEY), or let its group read the key (chgrp GROUP KEY; chmod 0640 KEY)") from None


def claim_socket(path: Path) -> None:
    """Make way for our socket: a stale one is removed; a live one (another daemon, even with another
    state dir), a symlink or anything that is not a socket is refused, never unlinked."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise SocketInUse(f"api.socket {path} is a symlink; refusing to use or remove it")
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"api.socket {path} exists and is not a socket; refusing to remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        try:
            path.unlink()  # nobody listens: a stale socket from a daemon that died
        except FileNotFoundError:
            pass
        return
    except OSError as exc:  # a full backlog or a timeout: someone is there
        raise SocketInUse(f"api.socket {path}: something listens on it ({exc.strerror or exc}); refusing to take "
                          "it over") from None
    else:
        pid, uid, _ = peer_credentials(probe)
        raise SocketInUse(f"api.socket {path}: another weightd daemon (pid {pid}, uid {uid}) answers on it; "
                          "refusing to take it over")
    finally:
        probe.close()


def is_admin(uid: int, gids: Any, admin_group: int | None) -> bool:
    """The admin rule (design §13): root, the daemon's own user, or a member of ``[api] admin_group``."""
    return uid in (0, os.geteuid()) or (admin_group is not None and admin_group in gids)


def authorize(sock: Any, route: str, admin_group: int | None) -> Caller:
    """Mutating routes: root, the daemon's own user, or a member of ``[api] admin_group``."""
    if sock is None or sock.family != socket.AF_UNIX:
        raise ApiError(403, f"{route}: cannot tell who is calling (no peer credentials)")
    pid, uid, gid = peer_credentials(sock)
    caller = Caller(pid, uid, peer_groups(sock, pid, uid, gid))
    if is_admin(uid, caller.gids, admin_group):
        return caller
    group = f"[api] admin_group (gid {admin_group})" if admin_group is not None else "[api] admin_group (not set)"
    raise ApiError(403, f"uid {uid} may not {route}: it needs root, the daemon's user (uid {os.geteuid()}) "
                   f"or membership of {group}")
