"""The admin API's reads of cold storage, bounded: a hung mount holds a thread, never a request or a
pool for ever, and work that reads cold storage is refused at once while ``tiering.copy.STUCK_CAP``
threads are stuck in it (ColdStorageStuck). The bounds of each kind of read are here too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from tiering import TimedOut, refuse_if_stuck, run_bounded_async

COLD_CHECK_S = 20.0            # check-cold (doctor): every manifest read, every file opened
COLD_LIST_S = 60.0             # ls, pin and unpin (which resolve NAME), a preload's resolve without timeout_s
PATH_COLD_S = 5.0              # path NAME (the latest published) or a part of it: which version is in cold
COLD_AT_ONCE = 8               # reads of cold storage the API runs at once (each on a thread of its own, never
                               # a pool's): more wait for a slot, within their own bound


class ColdReads:
    """At most COLD_AT_ONCE reads of cold storage at once, each within its own bound."""

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(COLD_AT_ONCE)

    async def run(self, fn: Callable[[], Any], seconds: float, what: str) -> Any:
        """``fn()`` (which reads cold storage), refused at once while reads of cold storage are stuck, and
        answered within ``seconds`` (TimedOut, exit 4), waiting for one of COLD_AT_ONCE slots included.
        It runs on a thread of its own: no pool thread waits for it, so cold storage that never answers
        keeps that thread (counted against tiering.copy.STUCK_CAP), never a pool or the caller."""
        refuse_if_stuck()
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self.slots.acquire(), seconds)
        except asyncio.TimeoutError:
            raise TimedOut(f"{what}: not started within {seconds:g} s ({COLD_AT_ONCE} reads of cold storage "
                           "already running; is it hung?)") from None
        try:
            return await run_bounded_async(fn, seconds=max(0.001, seconds - (time.monotonic() - t0)), what=what)
        finally:
            self.slots.release()
