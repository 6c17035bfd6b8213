"""Intent's ``[[import]]`` entries on the daemon (design §14, §15): the nodes an entry selects (by default
the origin) follow a Hugging Face Hub branch into cold storage.

Each entry is checked every ``every_s`` (at once when it first appears): the revision is resolved to a
commit SHA (one request); a commit not yet published as ``NAME@<SHA>`` is downloaded, checked against
the Hub's hashes and published through the node's service (as ``weightd publish`` does, so the origin
seeds it over P2P at once), then the intent loop is woken so ``NAME@latest`` entries roll forward. One
import runs at a time, in a thread of its own (a download of hundreds of GB never holds a pool the API
needs); a failure is the entry's row in ``weightd intent status`` and is retried after the intent
back-off (30 s to 15 min). The token and endpoint are the daemon's own (``HF_TOKEN`` or the
huggingface_hub token file of the daemon's user, ``HF_ENDPOINT``): the unit's ``EnvironmentFile=`` or a
Kubernetes Secret; never logged.

The download cache is ``STATE_DIR/imports/hf`` (a real 0700 directory of the daemon's user), shared
with ``weightd publish hf://`` run as that user: both take the repository's lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..intent.imports import ImportEntry
from ..intent.reconcile import Failure
from ..node.hub_import import cold_location, import_from_hub, published_report

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)


@dataclass
class ImportState:
    checked_at: float | None = None       # when the last check ended (clock)
    commit: str | None = None             # the commit the revision named then
    version: str | None = None            # NAME@VERSION it is published as
    result: str | None = None             # "published", "up to date"
    failure: Failure | None = None


class HubImports:
    def __init__(self, d: "DaemonContext", clock: Callable[[], float], wake: asyncio.Event) -> None:
        self.d, self.clock, self.wake = d, clock, wake
        self.entries: list[ImportEntry] = []
        self.state: dict[str, ImportState] = {}
        self.task: asyncio.Task[None] | None = None
        self.running: str | None = None
        self._pool: ThreadPoolExecutor | None = None

    def due_at(self, e: ImportEntry) -> float:
        st = self.state.get(e.name)
        if st is None or st.checked_at is None:
            return 0.0
        if st.failure is not None:
            return st.failure.retry_at()
        return st.checked_at + e.every_s

    def run(self, entries: list[ImportEntry]) -> None:
        """(loop) Keep the entries this node runs; start the first one that is due, if none is running."""
        self.entries = entries
        names = {e.name for e in entries}
        for gone in set(self.state) - names:
            del self.state[gone]
        if self.task is not None and not self.task.done():
            return
        now = self.clock()
        for e in sorted(entries, key=self.due_at):
            if self.due_at(e) <= now:
                self.task = asyncio.get_running_loop().create_task(self._one(e))
                return

    async def _one(self, e: ImportEntry) -> None:
        st = self.state.setdefault(e.name, ImportState())
        self.running = e.name
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "weightd-import")
        try:
            r, _, version = await asyncio.get_running_loop().run_in_executor(self._pool, self._import, e)
            st.commit, st.version, st.failure = r["source"]["commit"], version, None
            st.result = "up to date" if r["source"].get("downloaded") == 0 else "published"
            self.d.metrics.intent_imports.labels(st.result.replace(" ", "_")).inc()
            if st.result == "published":
                log.info("intent: %s published %s@%s from %s (commit %s)", e.where, e.name, version, e.source,
                         st.commit)
                self.wake.set()   # (NAME@latest entries see it at once)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the row says it; retried after a back-off)
            msg = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            old = st.failure
            st.failure = Failure(self.clock(), msg, (old.count + 1) if old else 1)
            self.d.metrics.intent_imports.labels("failed").inc()
            log.warning("intent: %s importing %s failed: %s", e.where, e.source, msg)
        finally:
            st.checked_at = self.clock()
            self.running = None

    def _import(self, e: ImportEntry) -> tuple[dict[str, Any], str, str]:
        """(import thread) One check of ``e``, and its import if the commit is new."""
        d = self.d
        cache = _cache_dir(d.config.settings.state_dir)

        def published(name: str, version: str) -> dict[str, Any] | None:
            return published_report(d.node.listing(name), name, version, cold_location(d.config.settings))

        def publish(snap: Any, name: str, version: str) -> dict[str, Any]:
            snap.publishable()
            r = d.service.publish(snap.path, name, version, check=snap.check)
            snap.unchanged()
            return r

        def note(line: str) -> None:
            log.info("intent: %s: %s", e.where, line)

        return import_from_hub(e.source, cache, name=e.name, version_label=None, include=e.include,
                               exclude=e.exclude, published=published, publish=publish, note=note)

    def status(self) -> list[dict[str, Any]]:
        out = []
        for e in self.entries:
            st = self.state.get(e.name, ImportState())
            row: dict[str, Any] = {**e.to_dict(), "commit": st.commit, "version": st.version,
                                   "checked_at": st.checked_at, "next_check_at": self.due_at(e) or None}
            if self.running == e.name:
                row.update(state="importing", reason=f"checking {e.source} (importing it if its commit is new)")
            elif st.failure is not None:
                row.update(state="failed", reason=st.failure.error, error=st.failure.error,
                           failed_at=st.failure.at)
            elif st.checked_at is None:
                row.update(state="pending", reason=f"{e.source} not checked yet")
            else:
                row.update(state="ready", reason=f"{e.name}@{st.version} is commit {st.commit} of {e.source} "
                                                 f"({st.result})")
            out.append(row)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _cache_dir(state_dir: Path) -> Path:
    """STATE_DIR/imports/hf: a real 0700 directory of the daemon's user (created if missing)."""
    d = Path(state_dir) / "imports" / "hf"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        from tiering import UnsafePath
        raise UnsafePath(str(d), "the download cache must be a real directory of the daemon's user with mode 0700 "
                                 "(a symlink, another user's, or open to others): remove it")
    return d
