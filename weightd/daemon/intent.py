"""The daemon's side of fleet intent (design §15): one task on the daemon's loop owns the intent it
runs, the plan of the last round, failures, rollout clocks, the load history and the prewarm log.

Each round (every ``[intent] reconcile_s``, at once when an intent file changes, after a transfer
ends): read the files and this node's labels (a bad file keeps the previous intent, and says so),
gather what is published and what is here, plan (:mod:`weightd.intent.reconcile`), renew the entries'
leases and pins, start the next fetch (one at a time, highest priority first, through the daemon's
single-flight preload), then publish what the node holds: the NFD feature file, metrics, a report to
the origin. Prewarming runs in its window when no intent fetch is waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import socket
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..intent.forecast import Forecaster, choose_prewarm
from ..intent.reconcile import Failure, Fetch, Plan, plan
from ..intent.spec import IntentError, KeepEntry, load_intent, parse_window, read_labels, fingerprint

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
HISTORY_FILE = "intent-loads.json"
PINS_FILE = "intent-pins.json"
LISTING_TIMEOUT_S = 30.0
PREWARM_KEPT = 100
USE_SAMPLE_S = 3600.0      # a model found in use is recorded at most once an hour
SLOT_RETRY_S = 30.0        # a refused rollout slot is asked for again after reconcile_s, at most about this long


class IntentRunner:
    def __init__(self, d: "DaemonContext", *, clock: Callable[[], float] = time.time) -> None:
        self.d, self.clock = d, clock
        self.entries: list[KeepEntry] = []
        self.source: str | None = None          # the directory the running intent came from
        self.loaded_at: float | None = None
        self.error: dict[str, Any] | None = None
        self.labels: dict[str, str] = {}
        self.plan = Plan()
        self.fingerprint: tuple[Any, ...] | None = None
        self.first_seen: dict[tuple[str, str], float] = {}
        self.failures: dict[tuple[str, str, str], Failure] = {}
        self.fetching: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self.slot_waiting: dict[tuple[str, str, str], str] = {}
        self.slot_retry_at: dict[tuple[str, str, str], float] = {}   # (monotonic) a refused slot is asked again then
        self._listing: dict[str, Any] = {}        # name -> a cold listing still running (one per name)
        self._published_seen: dict[str, list[str]] = {}
        from concurrent.futures import ThreadPoolExecutor
        # listings have a thread of their own: a hung cold server holds it, never the daemon's pools
        self._lister = ThreadPoolExecutor(1, "weightd-intent-list")
        self.prewarms: deque[dict[str, Any]] = deque(maxlen=PREWARM_KEPT)
        self.prewarm_task: asyncio.Task[None] | None = None
        self._prewarmed: dict[str, int] = {}    # model -> the period it was last prewarmed (or refreshed) in
        self._labels: dict[tuple[str, str, str], str] = {}   # (name, version, selection) -> partial copy's label
        self.wake = asyncio.Event()
        self.last_report = 0.0
        self.report_error: str | None = None
        self.last_use: dict[str, float] = {}
        self.rounds = 0
        state = d.config.settings.state_dir
        self.history_path = state / HISTORY_FILE
        self.pins_path = state / PINS_FILE
        self.forecaster = self._load_history()
        self.pins_made: set[tuple[str, str]] = self._load_pins()
        self._history_dirty = False

    # -- what the daemon tells us --------------------------------------------------------------------
    @property
    def cfg(self) -> Any:
        return self.d.config.settings.intent

    @property
    def node_name(self) -> str:
        return self.cfg.node_name or socket.gethostname()

    def loaded(self, name: str, version: str, tier: str) -> None:
        """A preload placed or found a version (from a pool thread): one load, for the forecaster."""
        if self.d.loop is not None:
            self.d.loop.call_soon_threadsafe(self._record, name, self.clock(), "preload")

    def _record(self, name: str, at: float, kind: str) -> None:
        self.forecaster.record(name, at, kind)
        self._history_dirty = True

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
        if cfg.dir is not None:
            await self._read_intent(cfg.dir, fp)
        elif self.source is not None:   # [intent] dir taken out by a reload: no entry is wanted any more
            log.info("intent: [intent] dir removed from the config; dropping the %d entries of %s",
                     len(self.entries), self.source)
            self.entries, self.source, self.error, self.loaded_at = [], None, None, None
        # an entry without patterns keeps what a preload of the model keeps: its default patterns, if any
        entries = [e if e.selection is not None else replace(e, selection=d.service.selection_for(e.name))
                   for e in self.entries]
        status = await d.run_blocking("misc", d.node.status)
        held: dict[tuple[str, str], set[str]] = {}       # whole versions (what a plain entry keeps)
        held_parts: dict[tuple[str, str], set[str]] = {}  # partial copies and companions, by label
        for c in status["checkpoints"]:
            (held_parts if c.get("part_of") is not None else held).setdefault(
                (c["name"], c["version"]), set()).update(c["tiers"])
            if any(t.get("in_use") for t in c["tiers"].values()):
                if now - self.last_use.get(c["name"], 0.0) >= USE_SAMPLE_S:
                    self.last_use[c["name"]] = now
                    self._record(c["name"], now, "in_use")
        # what the last round wanted stays leased while cold storage is asked (it may hang)
        if self.rounds > 1:
            await d.run_blocking("misc", self._hold, self.plan)
        published, publish_errors = await self._published({e.name for e in entries})
        for name, versions in published.items():
            for v in versions:
                self.first_seen.setdefault((name, v), now)
        inflight = set(self.fetching) | {(k[0], k[1], k[2]) for k in d.api.inflight}
        if any(e.selection is not None for e in entries):
            await d.run_blocking("misc", self._find_labels, entries, published)

        self._labels_of_local(status)

        def held_for(e: Any) -> dict[tuple[str, str], set[str]]:
            """A partial-copy entry holds a version when its object of that version is here (published
            versions, and the versions of the partial copies on the node)."""
            skey = _sel_key(e.selection)
            versions = set(published.get(e.name, [])) | {v for (n, v, k) in self._labels if n == e.name and k == skey}
            return {(e.name, v): tiers for v in versions
                    if (label := self._label(e, v)) is not None and (tiers := (held_parts if "~" in label else held).get((e.name, label), set()))}
        self.plan = plan(entries, published=published, held=held, now=now, first_seen=self.first_seen,
                         node=self.node_name, spread_s=cfg.jitter_s, failures=self.failures, inflight=inflight,
                         publish_errors=publish_errors, held_for=held_for)
        for row in self.plan.rows:
            key = (row["model"].partition("@")[0], row.get("want"), row["tier"])
            if row["state"] == "pending" and key in self.slot_waiting:
                row.update(state="waiting", reason=self.slot_waiting[key])
        await d.run_blocking("misc", self._hold, self.plan)
        self._start_fetches(self.plan.fetches)
        await self._publish_holdings(status, now)
        if cfg.prewarm is not None:
            self._maybe_prewarm(status, published, now)
        if self._history_dirty:
            self._history_dirty = False
            await d.run_blocking("misc", self._save_history)

    async def _read_intent(self, directory: Path, fp: tuple[Any, ...] | None) -> None:
        try:
            if fp == ("missing",) and self.source is not None:
                # (a typo in a reload, or a volume not mounted yet: not "keep nothing")
                raise IntentError(str(directory), "no such directory; fix [intent] dir (or create it empty to "
                                  "keep nothing)")
            intent = await self.d.run_blocking("misc", load_intent, directory, trusted_uids=self._trusted())
            labels = await self.d.run_blocking("misc", read_labels, self.cfg.labels_file, self.cfg.labels)
            entries = intent.for_node(labels)
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
        self.entries, self.labels, self.source, self.error = entries, labels, str(directory), None
        self.loaded_at = self.clock() if changed or self.loaded_at is None else self.loaded_at
        self.fingerprint = fp

    def _label(self, e: Any, version: str) -> str | None:
        """The local object an entry keeps of a version: the version, or its partial copy's label
        (None while that is not known: the version's manifest could not be read yet)."""
        if e.selection is None:
            return version
        return self._labels.get((e.name, version, _sel_key(e.selection)))

    def _labels_of_local(self, status: dict[str, Any]) -> None:
        """The labels of the partial copies on this node, from their own manifests' ``of``: a copy of a
        version that cold storage no longer lists (or lists beyond ``versions``) is still found, held
        and kept pinned while an entry wants it."""
        for c in status["checkpoints"]:
            of = c.get("part_of") or {}
            if of.get("kind") == "partial" and isinstance(of.get("selection"), dict):
                try:
                    from tiering import selection_from_dict
                    k = (c["name"], of["version"], _sel_key(selection_from_dict(of["selection"])))
                except (ValueError, KeyError):
                    continue
                self._labels.setdefault(k, c["version"])

    def _find_labels(self, entries: list[Any], published: dict[str, list[str]]) -> None:
        """(pool thread) The partial copy's label of each version a partial-copy entry may want (a
        manifest read once: a published version never changes)."""
        for e in entries:
            if e.selection is None:
                continue
            versions = [e.version] if e.version else published.get(e.name, [])[:e.versions + 1]
            for v in versions:
                k = (e.name, v, _sel_key(e.selection))
                if k in self._labels:
                    continue
                try:
                    obj = self.d.node.object_of(self.d.node.resolve(e.name, v), e.selection)[0]
                except Exception as exc:  # noqa: BLE001 (the fetch says it; asked again next round)
                    log.debug("intent: no partial-copy label for %s@%s yet: %s", e.name, v, exc)
                    continue
                if len(self._labels) > 100_000:   # (a bound, never reached by a sane intent)
                    self._labels.clear()
                self._labels[k] = obj.version

    def _trusted(self) -> tuple[int, ...]:
        uids = {0, os.geteuid()}
        return tuple(sorted(uids))

    async def _published(self, names: set[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
        """Published versions of each name, newest first; a name cold storage cannot list now keeps
        what the last round saw (and its row says why)."""
        out: dict[str, list[str]] = {}
        errors: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        for name in sorted(names):
            fut = self._listing.get(name)
            if fut is None:   # (one listing per name at a time: a hung one is waited for, not repeated)
                fut = self._listing[name] = loop.run_in_executor(self._lister, self.d.node.listing, name)
            try:
                rows = await asyncio.wait_for(asyncio.shield(fut), LISTING_TIMEOUT_S)
            except asyncio.TimeoutError:
                errors[name] = f"cold storage did not list {name} within {LISTING_TIMEOUT_S:g} s (still waiting)"
                if name in self._published_seen:
                    out[name] = self._published_seen[name]
                continue
            except Exception as exc:  # noqa: BLE001 (the row says it; the next round asks again)
                self._listing.pop(name, None)
                errors[name] = f"cannot list {name} in cold storage: {exc}"
                if name in self._published_seen:
                    out[name] = self._published_seen[name]
                continue
            self._listing.pop(name, None)
            pub = [r for r in rows if r.get("published")]
            # (a manifest may lack published_at: "" sorts first, as the catalog itself does)
            out[name] = self._published_seen[name] = [
                r["version"] for r in sorted(pub, key=lambda r: (str(r.get("published_at") or ""), r["version"]),
                                             reverse=True)]
        return out, errors

    # -- acting on the plan --------------------------------------------------------------------------
    def _hold(self, p: Plan) -> None:
        """(pool thread) Renew every wanted copy's lease (one row per entry and copy); drop the leases
        of intent holders that no longer want a copy; pin and unpin what intent pinned."""
        node = self.d.node
        lease_s = 3 * self.cfg.reconcile_s + 30
        wanted = {(h.tier, h.entry.name, label, h.entry.holder) for h in p.holds
                  if (label := self._label(h.entry, h.version)) is not None}
        for tier, name, version, holder in wanted:
            node.hold(tier, name, version, lease_s, holder)
        for le in node.state.leases():
            if le.holder.startswith("intent ") and (le.tier, le.name, le.version, le.holder) not in wanted:
                node.state.hold(le.tier, le.name, le.version, 0, le.holder)   # (0: dropped)
        pins = {(h.entry.name, label) for h in p.holds if h.entry.pin
                and (label := self._label(h.entry, h.version)) is not None}
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
            self._save_pins()

    def _start_fetches(self, fetches: list[Fetch]) -> None:
        """One intent fetch at a time (priority order): the node's disk and NIC serve the first
        entry first; a fetch that ends wakes the loop for the next. A rollout waiting for a slot the
        origin refused is asked again only after SLOT_RETRY_S, and does not hold up the entries after it."""
        for key in [k for k, t in self.fetching.items() if t.done()]:
            del self.fetching[key]   # (a task that ended without its bookkeeping: never blocks the rest)
        if self.fetching:
            return
        now = time.monotonic()
        for f in fetches:
            key = (f.entry.name, f.version, f.entry.tier)
            if f.rollout and self.slot_retry_at.get(key, 0.0) > now:
                continue
            self.fetching[key] = asyncio.get_running_loop().create_task(self._fetch(f))
            return

    async def _fetch(self, f: Fetch) -> None:
        e, key = f.entry, (f.entry.name, f.version, f.entry.tier)
        slot = False
        try:
            if f.rollout and self._origin() is not None:
                slot = await self._ask_slot(f)
                if not slot:
                    # asked again at about the next full round (jittered: refused nodes do not come back
                    # together), never sooner than a second
                    retry = max(1.0, min(SLOT_RETRY_S, self.cfg.reconcile_s))
                    self.slot_retry_at[key] = time.monotonic() + retry * (0.75 + 0.5 * random.random())
                    return
            self.slot_waiting.pop(key, None)
            self.slot_retry_at.pop(key, None)
            log.info("intent: fetching %s@%s into %s for %s%s", e.name, f.version, e.tier, e.where,
                     " (rollout)" if f.rollout else "")
            body = {"ref": f"{e.name}@{f.version}", "tier": e.tier, "strict": True,
                    "lease_s": 3 * self.cfg.reconcile_s + 30}
            if e.selection is not None:   # (a partial copy of the version)
                body["selection"] = e.selection.to_dict()
            renew = asyncio.get_running_loop().create_task(self._renew_slot(f)) if slot else None
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
                await self._release_slot()
            # the next entry's turn (a refused slot is not asked again before its retry time, so this
            # wakes one round, not a loop)
            self.wake.set()

    # -- the origin: mover slots and holdings reports -------------------------------------------------
    def _origin(self) -> Any:
        from ..fleet.client import OriginClient, origin_url
        base = origin_url(self.d.config)
        return None if base is None or self.d.role == "origin" else OriginClient(base, self.d.config)

    async def _ask_slot(self, f: Fetch) -> bool:
        from ..fleet.client import OriginUnavailable
        key = (f.entry.name, f.version, f.entry.tier)
        client = self._origin()
        try:
            got = await self.d.run_blocking("misc", client.call, "POST", "/v1/rollout/slot",
                                            {"node": self.node_name, "moving": f"{f.entry.name}@{f.version}"})
        except OriginUnavailable as exc:
            self.slot_waiting[key] = f"waiting for a rollout slot: {exc}"
            return False
        if got.get("granted") is True:
            return True
        self.slot_waiting[key] = (f"waiting for a rollout slot ({got.get('movers')} of {got.get('cap')} nodes are "
                                  "moving fleet-wide)")
        return False

    async def _renew_slot(self, f: Fetch) -> None:
        while True:
            await asyncio.sleep(30)
            try:
                await self._ask_slot(f)
            except Exception:  # noqa: BLE001 (the slot expires at the origin; the move goes on)
                pass

    async def _release_slot(self) -> None:
        try:
            client = self._origin()   # (a certificate being rotated can fail here: the slot expires)
            if client is None:
                return
            await self.d.run_blocking("misc", client.call, "POST", "/v1/rollout/release", {"node": self.node_name})
        except Exception as exc:  # noqa: BLE001 (it expires at the origin)
            log.info("intent: releasing the rollout slot: %s", exc)

    async def _publish_holdings(self, status: dict[str, Any], now: float) -> None:
        """The NFD feature file, the model-ready gauges, and (every report_s) the origin's report."""
        holdings = holdings_of(status, self.plan)
        self.d.metrics.set_model_ready(holdings)
        if self.cfg.nfd_dir is not None:
            try:
                await self.d.run_blocking("misc", self._write_nfd, holdings)
            except Exception as exc:  # noqa: BLE001 (said once per round at most; the next round retries)
                log.warning("intent: node feature file not written: %s", exc)
        client = self._origin()
        if client is not None and now - self.last_report >= self.cfg.report_s:
            self.last_report = now
            body = {"node": self.node_name, "rack": self.d.config.settings.p2p.rack or None,
                    "labels": dict(list(self.labels.items())[:64]), "holdings": holdings[:1024],
                    "intent": {m: v for m, (v, _t) in list(self.plan.serving.items())[:1024]}}
            try:
                await self.d.run_blocking("misc", client.call, "POST", "/v1/fleet/report", body)
                self.report_error = None
            except Exception as exc:  # noqa: BLE001
                if self.report_error != str(exc):
                    log.warning("intent: holdings not reported to the origin: %s", exc)
                self.report_error = str(exc)

    def _write_nfd(self, holdings: list[dict[str, Any]]) -> None:
        from ..intent import nfd
        best = nfd.best_values([(h["model"], nfd.label_value(h["tier"], h["resident"])) for h in holdings])
        expiry = max(600.0, 4 * self.cfg.reconcile_s)
        nfd.write_features(self.cfg.nfd_dir, "weightd", nfd.render(best, expiry_s=expiry), refresh_s=expiry / 2)

    # -- prediction -----------------------------------------------------------------------------------
    def _maybe_prewarm(self, status: dict[str, Any], published: dict[str, list[str]], now: float) -> None:
        pw = self.cfg.prewarm
        window = parse_window(pw.window, pw.window_minutes)
        if not window.is_open(now) or self.fetching or self.plan.fetches or \
                (self.prewarm_task is not None and not self.prewarm_task.done()):
            return
        ranked = self.forecaster.rank(now, pw.horizon_s)
        held = {c["name"] for c in status["checkpoints"] if pw.tier in c["tiers"]}
        chosen = choose_prewarm(ranked, held, pw.top, min_score=pw.min_score)
        hour = int(now // pw.horizon_s)
        chosen = [f for f in chosen if self._prewarmed.get(f.model) != hour]   # (once per model and period)
        if chosen:
            for f in chosen:
                self._prewarmed[f.model] = hour
            self.prewarm_task = asyncio.get_running_loop().create_task(self._prewarm(chosen, now))

    async def _prewarm(self, chosen: list[Any], now: float) -> None:
        pw = self.cfg.prewarm
        for fc in chosen:
            rec = {"at": now, "model": fc.model, "tier": pw.tier, "score": round(fc.score, 3), "reason": fc.reason,
                   "outcome": ""}
            try:
                # lease 0: a prewarmed copy is evictable like any cached one (LRU), never ahead of what
                # intent wants or what is pinned, leased or in use (those are protected from eviction)
                r = await self.d.api.preload({"ref": fc.model, "tier": pw.tier, "strict": True, "lease_s": 0},
                                             holder="intent prewarm", waited_on=False)
                if r.get("already_present"):   # (recency refreshed and the page cache warmed)
                    rec["outcome"] = f"refreshed {fc.model}@{r.get('version')} in {r.get('tier')} (already there)"
                else:
                    rec["outcome"] = f"placed {fc.model}@{r.get('version')} in {r.get('tier')}"
                    self.d.metrics.intent_prewarms.labels(pw.tier).inc()
            except Exception as exc:  # noqa: BLE001
                rec["outcome"] = f"not placed: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
            log.info("intent: prewarm %s: %s (%s)", fc.model, rec["outcome"], fc.reason)
            self.prewarms.append(rec)

    # -- persistence ----------------------------------------------------------------------------------
    def _load_history(self) -> Forecaster:
        try:
            raw = self.history_path.read_bytes()
        except FileNotFoundError:
            return Forecaster()
        except OSError as exc:
            log.warning("intent: load history %s not read (%s); starting a new one", self.history_path, exc.strerror)
            return Forecaster()
        try:
            return Forecaster.from_json(json.loads(raw))
        except (ValueError, RecursionError) as exc:
            log.warning("intent: load history %s is damaged (%s); starting a new one", self.history_path, exc)
            return Forecaster()

    def _save_history(self) -> None:
        _write_json(self.history_path, self.forecaster.to_json())

    def _load_pins(self) -> set[tuple[str, str]]:
        try:
            data = json.loads(self.pins_path.read_bytes())
            return {(str(n), str(v)) for n, v in data["pins"]}
        except FileNotFoundError:
            return set()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("intent: %s is damaged (%s): pins intent made are left as they are", self.pins_path, exc)
            return set()

    def _save_pins(self) -> None:
        _write_json(self.pins_path, {"pins": sorted(self.pins_made)})

    def admin_pinned(self, name: str, version: str) -> None:
        """An admin pinned or unpinned NAME@VERSION: intent never unpins it (nor re-pins it) by its
        ledger; an entry that still pins it pins it again at the next round if it is unpinned."""
        if (name, version) in self.pins_made:
            self.pins_made.discard((name, version))
            self._save_pins()

    def close(self) -> bool:
        """At exit: True if a cold listing is still running (the daemon then exits hard, as it does
        for a copy still running: a hung cold server must not hold the exit)."""
        busy = any(not f.done() for f in self._listing.values())
        self._lister.shutdown(wait=False, cancel_futures=True)
        return busy

    # -- what `weightd intent status|explain` shows ----------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {"dir": str(self.cfg.dir) if self.cfg.dir else None, "node": self.node_name, "labels": self.labels,
                "loaded_at": self.loaded_at, "error": self.error, "rounds": self.rounds,
                "entries": self.plan.rows,
                "serving": {m: {"version": v, "tier": t} for m, (v, t) in sorted(self.plan.serving.items())},
                "report_error": self.report_error}

    def explain(self) -> dict[str, Any]:
        now = self.clock()
        pw = self.cfg.prewarm
        horizon = pw.horizon_s if pw is not None else 3600.0
        return {"prewarm": None if pw is None else {"window": pw.window, "tier": pw.tier, "top": pw.top,
                                                    "min_score": pw.min_score, "horizon_s": pw.horizon_s},
                "forecast": [{"model": f.model, "score": round(f.score, 3), "reason": f.reason}
                             for f in self.forecaster.rank(now, horizon, top=20)],
                "prewarms": list(self.prewarms)}


def _sel_key(sel: Any) -> str:
    """A selection as a key (its canonical JSON: patterns with commas in them stay apart)."""
    return json.dumps(sel.to_dict(), sort_keys=True)


def holdings_of(status: dict[str, Any], p: Plan) -> list[dict[str, Any]]:
    """What this node holds, one row per copy: tier, residency, since, and whether intent serves it.
    Whole versions only: a partial copy or a companion is not the model a scheduler places a server
    for (the NFD labels, the ready gauges and the fleet view say what a whole server can load here)."""
    serving = {(m.partition("@")[0], v, t) for m, (v, t) in p.serving.items()}
    out = []
    for c in status["checkpoints"]:
        if c.get("part_of") is not None:
            continue
        for tier, t in sorted(c["tiers"].items()):
            out.append({"model": c["name"], "version": c["version"], "tier": tier,
                        "resident": min(1.0, max(0.0, (t.get("resident_percent") or 0.0) / 100.0)),
                        "bytes": int(c["bytes"]), "since": float(t.get("last_access") or 0.0),
                        "serving": (c["name"], c["version"], tier) in serving})
    return out


def _write_json(path: Path, doc: Any) -> None:
    """Atomically (``tiering.Dir.write_atomic``: a unique O_EXCL temporary, fsync, rename), mode 0600,
    in the state directory opened without following a symlink."""
    from tiering import Dir
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    d = Dir(fd, path.parent)
    try:
        d.write_atomic(path.name, json.dumps(doc, separators=(",", ":")).encode(), 0o600)
    finally:
        d.close()
