"""Leases taken by callers who are not admins (design §13): anyone the socket's ``[api] group`` lets in
may preload and hold a copy, and a lease keeps that copy from eviction. So a lease a read-only caller
asks for is at most ``[api] max_lease_s_readonly`` long (a longer one is refused, 403; the default
lease is cut to it), and the copies one such uid leases in a tier take at most ``[api]
lease_share_readonly`` of that tier's capacity (a lease past it is refused, 403 with exit 6, before
anything moves; ``lease_s: 0`` still preloads). Root, the daemon's user and ``[api] admin_group`` are
not limited, nor is the daemon's own work (fleet intent). The rest of the tier stays for them: an
admin's ``preload --tier hot --strict`` cannot be starved by one read-only uid.

A uid's leases are found by the holder each lease was recorded with (``pid N (comm) uid U``: the
kernel's uid is its last word, whatever name the process gave itself). Concurrent requests of one uid
are counted together: a request's bytes stay reserved until its lease is in the state database.
"""

from __future__ import annotations

import asyncio
import socket
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

from tiering import DEFAULT_LEASE_S, check_seconds, format_bytes

from ..errors import EXIT_NO_SPACE, ApiError
from ..node.requests import DEFAULT
from .authz import is_admin

if TYPE_CHECKING:
    from .context import DaemonContext


@dataclass(frozen=True)
class Who:
    """A caller of the admin socket, as the kernel said at connect time."""
    uid: int
    admin: bool
    pid: int = 0   # (its page cache room bounds what a preload it asks for warms)


def who(sock: Any, admin_group: int | None) -> Who | None:
    """The caller on ``sock`` (None: no peer credentials, as on no unix socket: treated as not an
    admin by :class:`LeaseGuard`)."""
    from ..client import peer_credentials, peer_groups
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, gid = peer_credentials(sock)
        admin = is_admin(uid, peer_groups(sock, pid, uid, gid), admin_group)
    except OSError:
        return None
    return Who(uid, admin, pid)


def holder_uid(holder: str) -> int | None:
    """The uid a lease's holder was recorded with (its last word), or None (an in-process lease)."""
    head, sep, tail = holder.rpartition(" uid ")
    return int(tail) if sep and tail.isdigit() else None


class LeaseGuard:
    def __init__(self, daemon: "DaemonContext") -> None:
        self.d = daemon
        self.reserved: dict[tuple[int, str], dict[tuple[str, str], int]] = {}   # (uid, tier) -> {(name, version): bytes}
        self.locks: dict[int, asyncio.Lock] = {}

    def lease_s(self, caller: Who | None, lease_s: Any) -> Any:
        """The lease ``caller`` may ask for: as asked for an admin; else at most ``[api]
        max_lease_s_readonly`` (the default lease cut to it; a longer one refused, 403)."""
        if caller is not None and caller.admin:
            return lease_s
        cap = self.d.config.settings.api.max_lease_s_readonly
        if lease_s is DEFAULT:
            return min(DEFAULT_LEASE_S, cap)
        if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)):
            return lease_s   # (malformed: the service says what is wrong with it)
        check_seconds("lease_s", lease_s, allow_zero=True)   # (NaN, a 400-digit integer: 400, never compared)
        if not lease_s > cap:
            return lease_s
        uid = caller.uid if caller is not None else "unknown"
        raise ApiError(403, f"uid {uid} may lease a copy for at most {cap:g} s ([api] max_lease_s_readonly; asked "
                       f"for {lease_s:g} s): renew a shorter lease (weightd hold) to keep it longer")

    @asynccontextmanager
    async def room(self, caller: Who | None, tier: str, name: str, version: str, need: int) -> AsyncIterator[None]:
        """Within this block, ``caller``'s lease of NAME@VERSION (``need`` bytes) in ``tier`` fits its
        share; 403 (exit 6) if it does not."""
        if caller is not None and caller.admin:
            yield
            return
        uid = caller.uid if caller is not None else -1
        key, obj = (uid, tier), (name, version)
        lock = self.locks.setdefault(uid, asyncio.Lock())
        async with lock:   # (the database read and the reservation together: two requests never both fit)
            leased, size, capacity = await self.d.run_blocking("misc", self._usage, uid, tier, obj, need)
            pending = sum(b for o, b in self.reserved.get(key, {}).items() if o != obj)
            share = self.d.config.settings.api.lease_share_readonly
            if leased + pending + size > share * capacity:
                raise ApiError(403, f"uid {uid} leases {format_bytes(leased + pending)} in the {tier} tier; "
                               f"{name}@{version} ({format_bytes(size)}) would take it past its share, "
                               f"{share:.0%} of {format_bytes(capacity)} ([api] lease_share_readonly): release "
                               "a lease, or preload without one (lease_s 0)", exit_code=EXIT_NO_SPACE)
            mine = self.reserved.setdefault(key, {})
            mine[obj] = mine.get(obj, 0) + size
        try:
            yield
        finally:
            async with lock:
                mine[obj] -= size
                if mine[obj] <= 0:
                    del mine[obj]
                if not mine:
                    self.reserved.pop(key, None)

    def _usage(self, uid: int, tier: str, obj: tuple[str, str], need: int) -> tuple[int, int, int]:
        """(bytes of the other copies ``uid`` leases in ``tier``, bytes of ``obj``, the tier's capacity)."""
        node = self.d.node
        state = node.state
        held = {(lease.name, lease.version) for lease in state.leases()
                if lease.tier == tier and holder_uid(lease.holder) == uid} - {obj}
        leased = 0
        for n, v in held:
            row = state.copy(tier, n, v)
            leased += row.bytes if row is not None else 0
        return leased, need, node.roots.tiers[tier].capacity()

    def copy_bytes(self, tier: str, name: str, version: str) -> int:
        """The bytes of NAME@VERSION's copy in ``tier`` as the state database recorded them (0: none)."""
        row = self.d.node.state.copy(tier, name, version)
        return row.bytes if row is not None else 0
