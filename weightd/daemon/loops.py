"""The daemon's background duties, each an asyncio task on the daemon's loop: gc (and the origin
picking up versions others published), the history of node counters ``weightd doctor`` reads, and
the systemd watchdog."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiering import WARM

from ..node.swarm import mirror_published, seed_held

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
GC_INTERVAL_S = 30.0
PRESSURE_INTERVAL_S = 5.0
STORAGE_INTERVAL_S = 10.0
STORAGE_TIMEOUT_S = 5.0


async def _sleep_or_stop(d: "DaemonContext", seconds: float) -> bool:
    """Wait ``seconds``; True if the daemon is stopping."""
    try:
        await asyncio.wait_for(d.stopping.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


async def pressure_loop(d: "DaemonContext") -> None:
    """A history of the raw node counters (``weightd doctor`` reads it instead of sampling)."""
    from ..doctor import read_counter_texts
    while not d.stopping.is_set():
        texts = await d.run_blocking("misc", read_counter_texts, Path("/"))
        d.pressure.append((time.monotonic(), texts))
        if await _sleep_or_stop(d, PRESSURE_INTERVAL_S):
            return


async def check_storage(d: "DaemonContext") -> None:
    """One look at the configured storage (cold absent or unmounted, a tier's device missing), in a
    thread of its own: a hung mount holds that one thread, never the loop or the other pools, and while
    it is held no second look starts; it counts as a problem once STORAGE_TIMEOUT_S has passed."""
    fut = d.storage_check
    if fut is None or fut.done():
        fut = d.storage_check = asyncio.ensure_future(d.run_blocking("storage", d.node.storage_problems))
    try:
        problems = await asyncio.wait_for(asyncio.shield(fut), STORAGE_TIMEOUT_S)
    except asyncio.TimeoutError:
        cold = d.node.roots.cold
        problems = [{"where": "cold", "path": str(cold), "reason": f"{cold}: storage did not answer within "
                     f"{STORAGE_TIMEOUT_S:g} s (a hung mount? see weightd doctor)"}]
    except Exception as exc:   # the check itself failed: say so as a problem, keep serving
        problems = [{"where": "storage", "path": "", "reason": f"the storage check failed: {exc}"}]
    if problems != d.storage_problems:
        for p in problems:
            log.error("storage problem: %s (readiness fails until it is fixed)", p["reason"])
        if d.storage_problems and not problems:
            log.info("storage problems resolved")
        d.storage_problems = problems
        d.status_changed()


async def storage_loop(d: "DaemonContext") -> None:
    while not d.stopping.is_set():
        await check_storage(d)
        if await _sleep_or_stop(d, STORAGE_INTERVAL_S):
            return


async def gc_loop(d: "DaemonContext") -> None:
    said: set[str] = set()   # the Hub downloads gc left alone, logged once while it lasts (the tiers log theirs)
    while not d.stopping.is_set():
        if await _sleep_or_stop(d, GC_INTERVAL_S):
            return
        try:
            if d.session is not None:  # the origin picks up versions others published
                await d.run_blocking("misc", seed_held, d.node, d.session, d.role)
            report = await d.run_blocking("misc", d.service.gc)  # (the service logs what it evicted)
            refused = set(report["imports"]["refused"])
            for line in sorted(refused - said):
                log.warning("gc left alone: %s", line)
            said = refused
            d.status_changed()
        except Exception as exc:  # keep serving; say it once per round
            log.warning("background gc failed: %s", exc)


async def origin_mirror_loop(d: "DaemonContext") -> None:
    """The origin of an object-store cold tier seeds from local copies: after every publish (and every
    GC_INTERVAL_S) it copies what is published and not held into warm, makes the torrent if the store
    has none, and seeds it (p2p.seeding.mirror_published)."""
    assert d.session is not None
    session = d.session

    def copy(v: Any) -> None:
        d.service.preload(v.ref, tier=WARM, strict=True, lease_s=0, waited_on=False)

    while not d.stopping.is_set():
        try:
            if await d.run_blocking(WARM, mirror_published, d.node, session.cfg, copy):
                await d.run_blocking("misc", seed_held, d.node, session, d.role)
                d.status_changed()
        except Exception as exc:  # keep serving; the next round tries again
            log.warning("origin: keeping local copies of published versions failed: %s", exc)
        try:
            await asyncio.wait_for(d.mirror_wanted.wait(), GC_INTERVAL_S)
        except asyncio.TimeoutError:
            pass
        d.mirror_wanted.clear()


async def watchdog_loop(d: "DaemonContext") -> None:
    assert d.notifier.watchdog_s is not None
    while not d.stopping.is_set():
        d.notifier.notify(WATCHDOG=1)
        await _sleep_or_stop(d, d.notifier.watchdog_s / 2)
