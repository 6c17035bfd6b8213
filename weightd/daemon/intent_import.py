"""Intent's ``[[import]]`` entries on the daemon (design §14, §15): the nodes an entry selects (by default
the origin) follow a Hugging Face Hub branch into cold storage.

An entry runs only if the daemon's own config allows it (``[intent] import_allow``: NAME glob = hf://
ORG/REPO glob): an intent file alone never makes the daemon publish with its rights and Hub token, and
imports are signed with ``[publish] signing_key`` only when ``[intent] import_sign`` says so. Each
allowed entry is checked every ``every_s`` (at once when it first appears): the revision is resolved
to a commit SHA (one request); a version not yet published under the import's label is downloaded,
checked against the Hub's hashes and published through the node's service (as ``weightd publish``
does, so the origin seeds it over P2P at once), then the intent loop is woken so ``NAME@latest``
entries roll forward. Imports run one at a time, every due one in turn, in a thread of their own (a
download of hundreds of GB never holds a pool the API needs); every request to the Hub is bounded
(``tiering.sources.hf.bound_requests``); an entry removed, or the daemon stopping, calls the import off
between its steps, and a daemon stopping during a download exits without waiting for it. A failure
is the entry's row in ``weightd intent status`` and is retried after the intent back-off (30 s to 15 min). The token and endpoint are the daemon's own (``HF_TOKEN`` or the
huggingface_hub token file of the daemon's user, ``HF_ENDPOINT``): the unit's ``EnvironmentFile=`` or a
Kubernetes Secret; never logged.

The download cache is ``STATE_DIR/imports/hf`` (a real 0700 directory of the daemon's user), shared
with ``weightd publish hf://`` run as that user: both take the repository's lock.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tiering import TieringError, private_dir

from ..errors import WeightdError
from ..intent.imports import ImportEntry, not_allowed
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
        self.refused: list[tuple[ImportEntry, str]] = []   # conflicts, and entries [intent] import_allow leaves out
        self.state: dict[str, ImportState] = {}
        self.task: asyncio.Task[None] | None = None
        self.running: str | None = None
        self.started_at: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._busy: Any = None      # the running import's future (close() says so: the daemon exits hard)

    def due_at(self, e: ImportEntry) -> float:
        st = self.state.get(e.name)
        if st is None or st.checked_at is None:
            return 0.0
        if st.failure is not None:
            return st.failure.retry_at()
        return st.checked_at + e.every_s

    def run(self, entries: list[ImportEntry], refused: list[tuple[ImportEntry, str]]) -> None:
        """(loop) Keep the entries this node selects (those ``[intent] import_allow`` leaves out join the
        refused); start the imports that are due, one after the other, if none is running."""
        allow = self.d.config.settings.intent.import_allow if entries else {}
        self.refused = refused + [(e, why) for e in entries if (why := not_allowed(e, allow)) is not None]
        self.entries = [e for e in entries if not_allowed(e, allow) is None]
        names = {e.name for e in self.entries}
        for gone in set(self.state) - names:
            del self.state[gone]
        if self.task is not None and not self.task.done():
            return
        if any(self.due_at(e) <= self.clock() for e in self.entries):
            self.task = asyncio.get_running_loop().create_task(self._due())

    async def _due(self) -> None:
        """Every entry that is due, in turn (an entry checked is due again only ``every_s`` later)."""
        while not self.d.stopping.is_set():
            now = self.clock()
            due = [e for e in self.entries if self.due_at(e) <= now]
            if not due:
                return
            await self._one(min(due, key=self.due_at))

    def _wanted(self, e: ImportEntry) -> bool:
        return not self.d.stopping.is_set() and any(x == e for x in self.entries)

    async def _one(self, e: ImportEntry) -> None:
        st = self.state.setdefault(e.name, ImportState())
        self.running, self.started_at = e.name, self.clock()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "weightd-import")
        try:
            self._busy = asyncio.get_running_loop().run_in_executor(self._pool, self._import, e)
            r, _, version = await self._busy
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
            if not isinstance(exc, (WeightdError, TieringError, OSError)):   # (a bug: its traceback, for a report)
                log.debug("intent: %s: the import's traceback", e.where, exc_info=True)
        finally:
            st.checked_at = self.clock()
            self.running = self.started_at = self._busy = None

    def _import(self, e: ImportEntry) -> tuple[dict[str, Any], str, str]:
        """(import thread) One check of ``e``, and its import if the commit is new."""
        d = self.d

        def published(name: str, version: str) -> dict[str, Any] | None:
            return published_report(d.node.listing(name), name, version, cold_location(d.config.settings))

        def publish(snap: Any, name: str, version: str) -> dict[str, Any]:
            snap.publishable()
            # never the fleet's signing key unless the daemon's config says so ([intent] import_sign)
            r = d.service.publish(snap.path, name, version, check=snap.check,
                                  default_key=d.config.settings.intent.import_sign)
            snap.unchanged()
            return r

        def note(line: str) -> None:
            log.info("intent: %s: %s", e.where, line)

        return import_from_hub(e.source, lambda: private_dir(Path(d.config.settings.state_dir) / "imports" / "hf"),
                               name=e.name, version_label=None, include=e.include, exclude=e.exclude,
                               published=published, publish=publish, note=note,
                               cancelled=lambda: not self._wanted(e))

    def status(self) -> list[dict[str, Any]]:
        out = []
        for e in self.entries:
            st = self.state.get(e.name, ImportState())
            row: dict[str, Any] = {**e.to_dict(), "commit": st.commit, "version": st.version,
                                   "checked_at": st.checked_at, "next_check_at": self.due_at(e) or None}
            if self.running == e.name:
                row.update(state="importing", started_at=self.started_at,
                           reason=f"checking {e.source} (importing it if its commit is new)")
            elif st.failure is not None:
                row.update(state="failed", reason=st.failure.error, error=st.failure.error,
                           failed_at=st.failure.at)
            elif st.checked_at is None:
                row.update(state="pending", reason=f"{e.source} not checked yet")
            else:
                row.update(state="ready", reason=f"{e.name}@{st.version} is commit {st.commit} of {e.source} "
                                                 f"({st.result})")
            out.append(row)
        for e, why in self.refused:
            out.append({**e.to_dict(), "commit": None, "version": None, "checked_at": None, "next_check_at": None,
                        "state": "refused", "reason": why, "error": why})
        return out

    def close(self) -> bool:
        """At exit: True while an import is still running (the daemon then exits hard, as for a copy)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        return self._busy is not None and not self._busy.done()

