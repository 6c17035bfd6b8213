"""The daemon's side of fleet intent (design §15): one task on the daemon's loop owns the intent it
runs, the plan of the last round, failures and the fetches it started; its parts keep the rest
(:mod:`.intent_catalog`: published versions and partial copies' labels; :mod:`.intent_fleet`:
rollout slots and the holdings report; :mod:`.intent_prewarm`: the load history and prewarming;
:mod:`.intent_state`: what is kept across restarts).

Each round (every ``[intent] reconcile_s``, at once when an intent file changes, after a transfer
ends): read the files and this node's labels (a bad file keeps the previous intent, and says so),
gather what is published and what is here, plan (:mod:`weightd.intent.reconcile`), renew the entries'
leases and pins, start the next fetch (one at a time, highest priority first, through the daemon's
single-flight preload), then publish what the node holds: the NFD feature file, metrics, a report to
the origin. Prewarming runs in its window when no intent fetch is waiting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from ..errors import IntentError
from ..intent.files import fingerprint, load_intent, read_labels
from ..intent.reconcile import Failure, Fetch, Plan, plan
from ..intent.imports import ImportEntry
from ..intent.spec import KeepEntry
from .intent_catalog import IntentCatalog, held_of
from .intent_fleet import HoldingsReport, RolloutSlots, node_name, origin_client
from .intent_import import HubImports
from .intent_prewarm import Prewarmer
from .intent_state import HISTORY_FILE, PINS_FILE, load_pins, save_pins

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)


class IntentRunner:
    def __init__(self, d: "DaemonContext", *, clock: Callable[[], float] = time.time) -> None:
        self.d, self.clock = d, clock
        self.entries: list[KeepEntry] = []
        self.import_entries: list[ImportEntry] = []   # [[import]] entries that select this node
        self.import_refused: list[tuple[ImportEntry, str]] = []   # ... and those it refuses (conflicts)
        self.source: str | None = None          # the directory the running intent came from
        self.loaded_at: float | None = None
        self.error: dict[str, Any] | None = None
        self.labels: dict[str, str] = {}
        self.plan = Plan()
        self.fingerprint: tuple[Any, ...] | None = None
        self.first_seen: dict[tuple[str, str], float] = {}
        self.failures: dict[tuple[str, str, str], Failure] = {}
        self.fetching: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self.wake = asyncio.Event()
        self.imports = HubImports(d, clock, self.wake)
        self.rounds = 0
        state = d.config.settings.state_dir
        self.catalog = IntentCatalog(d)
        self.slots = RolloutSlots(d)
        self.report = HoldingsReport(d)
        self.prewarm = Prewarmer(d, clock, state / HISTORY_FILE)
        self.pins_path = state / PINS_FILE
        self.pins_made: set[tuple[str, str]] = load_pins(self.pins_path)

    # -- what the daemon tells us --------------------------------------------------------------------
    @property
    def cfg(self) -> Any:
        return self.d.config.settings.intent

    @property
    def node_name(self) -> str:
        return node_name(self.d)

    def loaded(self, name: str, version: str, tier: str) -> None:
        """A preload placed or found a version (from a pool thread): one load, for the forecaster."""
        if self.d.loop is not None:
            self.d.loop.call_soon_threadsafe(self.prewarm.record, name, self.clock(), "preload")

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self) -> None:
        next_round = 0.0
        while not self.d.stopping.is_set():
            d = self.cfg.dir
            fp = await self.d.run_blocking("misc", fingerprint, d) if d is not None else None
            if self.wake.is_set() or fp != self.fingerprint or time.monotonic() >= next_round:
                self.wake.clear()
                try:
                    await self.round(fp)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # keep serving; the next round tries again
                    log.exception("intent: a reconcile round failed: %s", exc)
                next_round = time.monotonic() + self.cfg.reconcile_s
            try:
                await asyncio.wait_for(self.wake.wait(), self.cfg.poll_s)
            except asyncio.TimeoutError:
                pass
            if self.d.stopping.is_set():
                break

    async def round(self, fp: tuple[Any, ...] | None = None) -> None:
        d, cfg = self.d, self.cfg
        now = self.clock()
        self.rounds += 1
        await self._read_intent(fp)
        self.imports.run(self.import_entries, self.import_refused)
        # an entry without patterns keeps what a preload of the model keeps: its default patterns, if any
        entries = [e if e.selection is not None else replace(e, selection=d.service.selection_for(e.name))
                   for e in self.entries]
        status = await d.run_blocking("misc", d.node.status)
        held, held_parts = held_of(status)
        self.prewarm.note_in_use(status, now)
        # what the last round wanted stays leased while cold storage is asked (it may hang)
        if self.rounds > 1:
            await d.run_blocking("misc", self._hold, self.plan)
        published, publish_errors = await self.catalog.published({e.name for e in entries})
        for name, versions in published.items():
            for v in versions:
                self.first_seen.setdefault((name, v), now)
        inflight = set(self.fetching) | {(k[0], k[1], k[2]) for k in d.api.inflight}
        if any(e.selection is not None for e in entries):
            await d.run_blocking("misc", self.catalog.find_labels, entries, published)
        self.catalog.learn_local(status)
        self.plan = plan(entries, published=published, held=held, now=now, first_seen=self.first_seen,
                         node=self.node_name, spread_s=cfg.jitter_s, failures=self.failures, inflight=inflight,
                         publish_errors=publish_errors, held_for=self.catalog.held_for(published, held, held_parts))
        for row in self.plan.rows:
            key = (row["model"].partition("@")[0], row.get("want"), row["tier"])
            if row["state"] == "pending" and key in self.slots.waiting:
                row.update(state="waiting", reason=self.slots.waiting[key])
        await d.run_blocking("misc", self._hold, self.plan)
        self._start_fetches(self.plan.fetches)
        await self.report.publish(status, self.plan, self.labels, now)
        if cfg.prewarm is not None:
            self.prewarm.maybe_prewarm(status, now, busy=bool(self.fetching or self.plan.fetches))
        await self.prewarm.save_history()

    async def _read_intent(self, fp: tuple[Any, ...] | None) -> None:
        """The intent files and this node's labels, into the running intent (a bad file keeps the
        previous one, and says so); ``[intent] dir`` taken out by a reload: no entry is wanted any more."""
        directory = self.cfg.dir
        if directory is None:
            if self.source is not None:
                log.info("intent: [intent] dir removed from the config; dropping the %d entries of %s",
                         len(self.entries), self.source)
                self.entries, self.source, self.error, self.loaded_at = [], None, None, None
                self.import_entries, self.import_refused = [], []
            return
        try:
            if fp == ("missing",) and self.source is not None:
                # (a typo in a reload, or a volume not mounted yet: not "keep nothing")
                raise IntentError(str(directory), "no such directory; fix [intent] dir (or create it empty to "
                                  "keep nothing)")
            intent = await self.d.run_blocking("misc", load_intent, directory, trusted_uids=self._trusted())
            labels = await self.d.run_blocking("misc", read_labels, self.cfg.labels_file, self.cfg.labels)
            entries = intent.for_node(labels)
            imports, refused = intent.imports_for(labels, origin=self.d.role == "origin")
        except IntentError as exc:
            msg = str(exc)
            if self.error is None or self.error["error"] != msg:
                self.d.metrics.intent_errors.inc()
                log.error("%s; %s", msg, "keeping the previous intent" if self.source else "no intent runs yet")
            self.error = {"at": self.clock(), "error": msg}
            self.fingerprint = fp
            return
        changed = [e.to_dict() for e in entries] != [e.to_dict() for e in self.entries] or labels != self.labels
        if changed or self.error is not None or self.source is None:
            log.info("intent: %d entr%s for this node (of %d in %s; labels %s)", len(entries),
                     "y" if len(entries) == 1 else "ies", len(intent.entries), directory,
                     ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none")
        if [e.to_dict() for e in imports] != [e.to_dict() for e in self.import_entries]:
            log.info("intent: %d [[import]] entr%s for this node", len(imports), "y" if len(imports) == 1 else "ies")
            changed = True
        self.entries, self.labels, self.source, self.error = entries, labels, str(directory), None
        self.import_entries, self.import_refused = imports, refused
        self.loaded_at = self.clock() if changed or self.loaded_at is None else self.loaded_at
        self.fingerprint = fp

    def _trusted(self) -> tuple[int, ...]:
        uids = {0, os.geteuid()}
        return tuple(sorted(uids))

    # -- acting on the plan --------------------------------------------------------------------------
    def _hold(self, p: Plan) -> None:
        """(pool thread) Renew every wanted copy's lease (one row per entry and copy); drop the leases
        of intent holders that no longer want a copy; pin and unpin what intent pinned."""
        node = self.d.node
        lease_s = 3 * self.cfg.reconcile_s + 30
        wanted = {(h.tier, h.entry.name, label, h.entry.holder) for h in p.holds
                  if (label := self.catalog.label(h.entry, h.version)) is not None}
        for tier, name, version, holder in wanted:
            node.hold(tier, name, version, lease_s, holder)
        for le in node.state.leases():
            if le.holder.startswith("intent ") and (le.tier, le.name, le.version, le.holder) not in wanted:
                node.state.hold(le.tier, le.name, le.version, 0, le.holder)   # (0: dropped)
        pins = {(h.entry.name, label) for h in p.holds if h.entry.pin
                and (label := self.catalog.label(h.entry, h.version)) is not None}
        changed = False
        for name, version in sorted(pins - self.pins_made):
            if not node.pin(name, version)[1]:
                continue   # (pinned already, by an admin: theirs to unpin, never intent's)
            self.pins_made.add((name, version))
            changed = True
            log.info("intent: pinned %s@%s", name, version)
        for name, version in sorted(self.pins_made - pins):
            node.unpin(name, version)
            self.pins_made.discard((name, version))
            changed = True
            log.info("intent: unpinned %s@%s (no entry pins it now)", name, version)
        if changed:
            save_pins(self.pins_path, self.pins_made)

    def _start_fetches(self, fetches: list[Fetch]) -> None:
        """One intent fetch at a time (priority order): the node's disk and NIC serve the first
        entry first; a fetch that ends wakes the loop for the next. A rollout waiting for a slot the
        origin refused is asked again only after its retry time (:meth:`.RolloutSlots.refused`), and
        does not hold up the entries after it."""
        for key in [k for k, t in self.fetching.items() if t.done()]:
            del self.fetching[key]   # (a task that ended without its bookkeeping: never blocks the rest)
        if self.fetching:
            return
        now = time.monotonic()
        for f in fetches:
            key = (f.entry.name, f.version, f.entry.tier)
            if f.rollout and self.slots.retry_at.get(key, 0.0) > now:
                continue
            self.fetching[key] = asyncio.get_running_loop().create_task(self._fetch(f))
            return

    async def _fetch(self, f: Fetch) -> None:
        """One intent fetch through the daemon's single flight (a rollout holds a slot from the origin
        while it moves); a failure is the entry's row, retried after a back-off."""
        e, key = f.entry, (f.entry.name, f.version, f.entry.tier)
        slot = False
        try:
            if f.rollout and origin_client(self.d) is not None:
                slot = await self.slots.ask(f)
                if not slot:
                    self.slots.refused(key, self.cfg.reconcile_s)
                    return
            self.slots.granted(key)
            log.info("intent: fetching %s@%s into %s for %s%s", e.name, f.version, e.tier, e.where,
                     " (rollout)" if f.rollout else "")
            body = {"ref": f"{e.name}@{f.version}", "tier": e.tier, "strict": True,
                    "lease_s": 3 * self.cfg.reconcile_s + 30}
            if e.selection is not None:   # (a partial copy of the version)
                body["selection"] = e.selection.to_dict()
            renew = asyncio.get_running_loop().create_task(self.slots.renew(f)) if slot else None
            try:
                await self.d.api.preload(body, holder=e.holder, rate_bytes_per_s=e.bandwidth, waited_on=False)
            finally:
                if renew is not None:
                    renew.cancel()
            self.failures.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 (the row says it; retried after a back-off)
            old = self.failures.get(key)
            self.failures[key] = Failure(self.clock(), str(exc).splitlines()[0][:300] if str(exc) else
                                         type(exc).__name__, (old.count + 1) if old else 1)
            self.d.metrics.intent_failures.labels(e.name).inc()
            log.warning("intent: fetching %s@%s into %s for %s failed: %s", e.name, f.version, e.tier, e.where, exc)
        finally:
            self.fetching.pop(key, None)
            if slot:
                await self.slots.release()
            # the next entry's turn (a refused slot is not asked again before its retry time, so this
            # wakes one round, not a loop)
            self.wake.set()

    # -- the ledger of pins intent made, and exit ---------------------------------------------------
    def admin_pinned(self, name: str, version: str) -> None:
        """An admin pinned or unpinned NAME@VERSION: intent never unpins it (nor re-pins it) by its
        ledger; an entry that still pins it pins it again at the next round if it is unpinned."""
        if (name, version) in self.pins_made:
            self.pins_made.discard((name, version))
            save_pins(self.pins_path, self.pins_made)

    def close(self) -> bool:
        """At exit: True if a cold listing is still running (the daemon then exits hard, as it does
        for a copy still running: a hung cold server must not hold the exit)."""
        importing = self.imports.close()
        return self.catalog.close() or importing

    # -- what `weightd intent status|explain` shows ----------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {"dir": str(self.cfg.dir) if self.cfg.dir else None, "node": self.node_name, "labels": self.labels,
                "loaded_at": self.loaded_at, "error": self.error, "rounds": self.rounds,
                "entries": self.plan.rows, "imports": self.imports.status(),
                "serving": {m: {"version": v, "tier": t} for m, (v, t) in sorted(self.plan.serving.items())},
                "report_error": self.report.error}

    def explain(self) -> dict[str, Any]:
        return self.prewarm.explain()
