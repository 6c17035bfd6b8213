"""The daemon's thread pools, one per kind of blocking work, so a slow NVMe copy never starves a
/dev/shm promotion or the API: each local tier's copies and warming, ``misc`` (the rest: gc,
publish, evict, leases, intent, seeding), ``storage`` (the storage check of :mod:`.loops` only) and
``query`` (status, path NAME@VERSION and /metrics: local facts only, never queued behind work that
reads cold storage). Calls go through :meth:`.context.DaemonContext.run_blocking`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tiering import HOT, WARM


def open_pools() -> dict[str, ThreadPoolExecutor]:
    return {HOT: ThreadPoolExecutor(2, "weightd-hot"), WARM: ThreadPoolExecutor(2, "weightd-warm"),
            "misc": ThreadPoolExecutor(4, "weightd-misc"), "storage": ThreadPoolExecutor(1, "weightd-storage"),
            "query": ThreadPoolExecutor(2, "weightd-query")}


def close_pools(pools: dict[str, ThreadPoolExecutor]) -> None:
    """At exit: queued work is cancelled and nothing waits for a call still running (the daemon then
    exits hard: :meth:`.app.Daemon.close`)."""
    for pool in pools.values():
        pool.shutdown(wait=False, cancel_futures=True)
