"""Fleet intent between this node and the rest of the fleet: rollout slots asked of the origins
(``[intent] max_movers`` nodes move at once fleet-wide; a slot counts when a strict majority of the
origins grant it; a refused node asks again at about the next round, jittered), and what the node
holds, published each round: the model-ready gauges, the NFD feature file a scheduler places servers
by, and (every ``[intent] report_s``) a report to every origin (docs/origins.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..fleet.rollout import SLOT_TTL_S
from ..intent.reconcile import Fetch, Plan

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
SLOT_RETRY_S = 30.0        # a refused rollout slot is asked for again after reconcile_s, at most about this long
SLOT_RENEW_S = 30.0        # a slot held is renewed this often while its move runs
RELEASE_RETRY_S = 2.0      # a release an origin did not take is sent again this often (until SLOT_TTL_S)

FetchKey = tuple[str, str, str]   # (name, version, tier)


def node_name(d: "DaemonContext") -> str:
    """This node's name in the fleet: ``[intent] node_name``, else the host name."""
    return d.config.settings.intent.node_name or socket.gethostname()


def origin_client(d: "DaemonContext") -> Any:
    """The origins this node reports to and asks slots of (:class:`~weightd.fleet.client.Origins`:
    ``[intent] origin``, else one per tracker host), or None: none configured, or this daemon is an origin."""
    from ..fleet.client import Origins, origin_urls
    urls = origin_urls(d.config)
    return None if not urls or d.role == "origin" else Origins(urls, d.config)


def majority(n: int) -> int:
    """How many of ``n`` origins must grant a slot: a strict majority (all of 1 or 2, 2 of 3, 3 of 4 or 5)."""
    return n // 2 + 1


def next_number(answers: list[Any], need: int, current: int) -> int:
    """The slot number to ask for next: the lowest one free at ``need`` of the origins that answered
    (their ``free`` lists; a number granted counts as free there), else ``current``."""
    counts: dict[int, int] = {}
    for a in answers:
        if not isinstance(a, dict):
            continue
        free = {n for n in a.get("free") or [] if isinstance(n, int)}
        if a.get("granted") is True and isinstance(a.get("slot"), int):
            free.add(a["slot"])
        for n in free:
            counts[n] = counts.get(n, 0) + 1
    ok = sorted(n for n, c in counts.items() if c >= need)
    return ok[0] if ok else current


def refusal(answers: list[tuple[str, Any]], granted: int, need: int) -> str:
    """Why a node waits for a slot, as its intent row says it (one origin: as before several were)."""
    if len(answers) == 1:
        a = answers[0][1]
        return (f"waiting for a rollout slot: {a}" if not isinstance(a, dict) else
                f"waiting for a rollout slot ({a.get('movers')} of {a.get('cap')} nodes are moving fleet-wide)")
    said = "; ".join(f"{u}: " + (f"unreachable ({str(a)[:120]})" if not isinstance(a, dict) else
                                 "granted" if a.get("granted") is True else
                                 f"{a.get('movers')} of {a.get('cap')} nodes moving")
                     for u, a in answers)
    return f"waiting for a rollout slot: granted by {granted} of {len(answers)} origins, {need} needed ({said})"


class RolloutSlots:
    """The rollout slots this node asks the origins for, and why each refused fetch waits. A node
    moves only while a strict majority of the origins grant it the same slot number
    (:mod:`weightd.fleet.rollout`): with one origin, that one."""

    def __init__(self, d: "DaemonContext") -> None:
        self.d = d
        self.waiting: dict[FetchKey, str] = {}       # a fetch waiting for a slot -> the reason its row shows
        self.retry_at: dict[FetchKey, float] = {}    # (monotonic) a refused slot is asked again then
        self.number = 0                              # the slot number asked for (held while moving)
        self._retry: asyncio.Task[None] | None = None   # a release some origin has not taken yet

    async def ask(self, f: Fetch, *, renewing: bool = False) -> bool:
        """True if a majority of the origins grant slot ``self.number`` for ``f`` (or renew it); else
        the fetch's row says why not, and (unless ``renewing``) the grants short of a majority are
        given back, and the next ask is for a number free at a majority."""
        key = (f.entry.name, f.version, f.entry.tier)
        if self._retry is not None and not renewing:   # (asking anew: a late release would drop the new slot)
            self._retry.cancel()
            self._retry = None
        origins = origin_client(self.d)
        body = {"node": node_name(self.d), "moving": f"{f.entry.name}@{f.version}", "slot": self.number,
                "origins": origins.hash}   # (an origin refuses a worker counting over another list)
        answers = await self.d.run_blocking("misc", origins.each, "POST", "/v1/rollout/slot", body)
        granted = [u for u, a in answers if isinstance(a, dict) and a.get("granted") is True]
        need = majority(len(answers))
        if len(granted) >= need:
            return True
        if renewing:
            log.warning("intent: the rollout slot is renewed by %d of %d origins (%d needed): it expires at "
                        "the others unless they answer", len(granted), len(answers), need)
            return False
        self.waiting[key] = refusal(answers, len(granted), need)
        if granted:   # (short of a majority: not a mover; the slots granted go back at once)
            await self.release(granted)
        self.number = next_number([a for _u, a in answers], need, self.number)
        return False

    def refused(self, key: FetchKey, reconcile_s: float) -> None:
        """Ask again at about the next full round (jittered: refused nodes do not come back together),
        never sooner than a second."""
        retry = max(1.0, min(SLOT_RETRY_S, reconcile_s))
        self.retry_at[key] = time.monotonic() + retry * (0.75 + 0.5 * random.random())

    def granted(self, key: FetchKey) -> None:
        self.waiting.pop(key, None)
        self.retry_at.pop(key, None)

    async def renew(self, f: Fetch) -> None:
        """While ``f`` moves: its slot renewed at every origin every SLOT_RENEW_S (cancelled when the move ends)."""
        while True:
            await asyncio.sleep(SLOT_RENEW_S)
            try:
                await self.ask(f, renewing=True)
            except Exception:  # noqa: BLE001 (the slot expires at the origins; the move goes on)
                pass

    async def release(self, urls: list[str] | None = None) -> None:
        """The slot given back at every origin (or at ``urls``); one that does not answer is asked
        again every RELEASE_RETRY_S until it does, the slot expires there, or this node asks for a
        slot again (an origin that restarts keeps the slots it held: unreleased, it would block
        the rollout until the slot expires)."""
        left = await self._release_at(urls)
        if left:
            self._retry = asyncio.get_running_loop().create_task(self._release_later(left))

    async def _release_later(self, urls: list[str]) -> None:
        deadline = time.monotonic() + SLOT_TTL_S
        while urls and time.monotonic() < deadline:
            await asyncio.sleep(RELEASE_RETRY_S)
            urls = await self._release_at(urls)

    async def _release_at(self, urls: list[str] | None) -> list[str]:
        """Released at those origins; the ones that did not answer."""
        try:
            origins = origin_client(self.d)   # (a certificate being rotated can fail here: the slot expires)
            if origins is None:
                return []
            if urls is not None:
                origins = origins.only(urls)
            answers = await self.d.run_blocking("misc", origins.each, "POST", "/v1/rollout/release",
                                                {"node": node_name(self.d)})
        except Exception as exc:  # noqa: BLE001 (it expires at the origin)
            log.info("intent: releasing the rollout slot: %s", exc)
            return []
        for u, a in answers:
            if not isinstance(a, dict):
                log.info("intent: releasing the rollout slot at %s: %s (asked again)", u, a)
        return [u for u, a in answers if not isinstance(a, dict)]


SIZES_KEPT = 100_000       # sizes of wanted copies remembered (a bound, never reached by a sane intent)

SizeKey = tuple[str, str, str]   # (name, version, the selection's key, "" for the whole version)


class ObjectSizes:
    """The bytes of the copies intent wants here and does not hold, for their ready estimates: read
    from cold storage's manifests on a thread of its own, never in the intent round (a hung cold
    server holds that thread, not the round: the round estimates what it has sizes for, and a copy
    whose size is not known yet is left out). A published version never changes: a size is read once."""

    def __init__(self, read: Callable[[SizeKey], int]) -> None:
        self.read = read
        self.sizes: dict[SizeKey, int] = {}
        self._lock = threading.Lock()
        self._busy: threading.Thread | None = None

    def get(self, keys: list[SizeKey]) -> dict[SizeKey, int]:
        """The sizes known of ``keys`` now; the others are read in the background (one batch at a
        time: while one hangs, no other starts)."""
        with self._lock:
            known = {k: self.sizes[k] for k in keys if k in self.sizes}
        missing = [k for k in dict.fromkeys(keys) if k not in known]
        if missing and (self._busy is None or not self._busy.is_alive()):
            # (a daemon thread: one hung on a dead NFS mount never holds the process at exit)
            self._busy = threading.Thread(target=self._fill, args=(missing,), name="weightd-ready-sizes", daemon=True)
            self._busy.start()
        return known

    def _fill(self, keys: list[SizeKey]) -> None:
        for k in keys:
            try:
                size = int(self.read(k))
            except Exception as exc:  # noqa: BLE001 (unreadable now: asked again next round)
                log.debug("intent: size of %s@%s not known yet: %s", k[0], k[1], exc)
                continue
            with self._lock:
                if len(self.sizes) >= SIZES_KEPT:
                    self.sizes.clear()
                self.sizes[k] = size


class HoldingsReport:
    """What the node holds, told to the scheduler and the origin each round."""

    def __init__(self, d: "DaemonContext") -> None:
        self.d = d
        self.last_report = 0.0
        self.error: str | None = None   # why the last report to the origin failed (intent status shows it)
        self.sizes = ObjectSizes(lambda k: object_size(d, k))
        self.nfd_cut_said = False
        self._sending: asyncio.Task[None] | None = None   # the report being sent (the round does not wait)

    async def publish(self, status: dict[str, Any], plan: Plan, labels: dict[str, str], now: float) -> None:
        """The NFD feature file, the model-ready gauges, and (every report_s) the origin's report."""
        cfg = self.d.config.settings.intent
        holdings = holdings_of(status, plan)
        self.d.metrics.set_model_ready(holdings)
        from ..node.ready_estimate import guarded
        estimates = await self.d.run_blocking(
            "misc", lambda: guarded("intent round", lambda: ready_estimates(self.d, status, plan, self.sizes), []))
        if cfg.nfd_dir is not None:
            try:
                await self.d.run_blocking("misc", self._write_nfd, holdings, estimates)
            except Exception as exc:  # noqa: BLE001 (said once per round at most; the next round retries)
                log.warning("intent: node feature file not written: %s", exc)
        client = origin_client(self.d)
        if client is not None and now - self.last_report >= cfg.report_s and \
                (self._sending is None or self._sending.done()):   # (one report in flight at most)
            self.last_report = now
            # intent: what each entry serves, else (nothing of it here yet) the version it wants: the
            # origin keeps ready estimates only of models a report holds or intends
            intent = {m: v for m, (v, _t) in plan.serving.items()}
            for row in plan.rows:
                if row.get("want") is not None and row["model"] not in intent:
                    intent[row["model"]] = row["want"]
            body = {"node": node_name(self.d), "rack": self.d.config.settings.p2p.rack or None,
                    "labels": dict(list(labels.items())[:64]), "holdings": holdings[:1024],
                    "intent": dict(list(intent.items())[:1024]),
                    "ready": [{k: e[k] for k in ("model", "version", "tier", "seconds")}
                              for e in estimates if e["seconds"] is not None][:1024],
                    "origins": client.hash}
            # sent beside the round: an origin slow to answer (each call is bounded by its deadline)
            # holds neither this round nor the fetches, rollouts and NFD writes after it
            self._sending = asyncio.get_running_loop().create_task(self._send(client, body))

    async def _send(self, origins: Any, body: dict[str, Any]) -> None:
        """The report to every origin at once; ``error`` says which did not take it (one origin down
        is not a failure: the others' views have the node)."""
        try:
            answers = await self.d.run_blocking("misc", origins.each, "POST", "/v1/fleet/report", body)
        except Exception as exc:  # noqa: BLE001 (a task of its own: said here, the next report retries)
            answers = [("(every origin)", exc)]
        failed = "; ".join(str(a) for _u, a in answers if not isinstance(a, dict))
        if failed and self.error != failed:
            log.warning("intent: holdings not reported to %d of %d origin(s): %s",
                        sum(not isinstance(a, dict) for _u, a in answers), len(answers), failed)
        self.error = failed or None

    def _write_nfd(self, holdings: list[dict[str, Any]], estimates: list[dict[str, Any]]) -> None:
        from ..intent import nfd
        from ..node.ready_estimate import best_per_model
        cfg = self.d.config.settings.intent
        best = nfd.best_values([(h["model"], nfd.label_value(h["tier"], h["resident"])) for h in holdings])
        expiry = max(600.0, 4 * cfg.reconcile_s)
        text = nfd.render(best, expiry_s=expiry, ready_in=best_per_model(estimates))
        if "ready-in labels left out" in text and not self.nfd_cut_said:
            self.nfd_cut_said = True
            log.info("intent: node feature file: %s", text.rstrip().rpartition("\n")[2].lstrip("# "))
        nfd.write_features(cfg.nfd_dir, "weightd", text, refresh_s=expiry / 2)


def object_size(d: "DaemonContext", k: SizeKey) -> int:
    """(the sizes' thread) The bytes of the copy ``k`` names: the published version, or the partial
    copy its selection keeps of it (from the version's manifest in cold storage)."""
    name, version, skey = k
    v = d.node.published_version(name, version)
    if v is None:
        raise LookupError(f"{name}@{version} is not published")
    if not skey:
        return v.size
    from tiering import selection_from_dict
    return d.node.object_of(v, selection_from_dict(json.loads(skey)))[0].size


def _part_key(of: dict[str, Any]) -> str | None:
    from tiering import selection_from_dict

    from .intent_catalog import sel_key
    try:
        return sel_key(selection_from_dict(of["selection"]))
    except (ValueError, KeyError, TypeError):
        return None


def ready_estimates(d: "DaemonContext", status: dict[str, Any], p: Plan, sizes: ObjectSizes) -> list[dict[str, Any]]:
    """The ready estimates of what the node holds and of the copies intent wants here: for an entry
    that keeps a partial copy (patterns, or the model's default patterns), that copy, from its local
    copies' residency when it is here, else its size (:class:`ObjectSizes`; a copy whose size is not
    known yet is left out this round). Never reads cold storage itself. Blocking: run in a pool."""
    from tiering import selection_from_dict

    from .intent_catalog import sel_key
    held = {(c["name"], c["version"]) for c in status["checkpoints"] if c.get("part_of") is None}
    parts: dict[tuple[str, str, str], dict[str, Any]] = {}   # (name, version, selection) -> the partial copy here
    for c in status["checkpoints"]:
        of = c.get("part_of") or {}
        if of.get("kind") == "partial" and isinstance(of.get("selection"), dict) and (k := _part_key(of)):
            parts[(c["name"], str(of.get("version")), k)] = c
    wanted: list[tuple[str, str, str, SizeKey, dict[str, int] | None]] = []
    for row in p.rows:   # (each entry's target version, once something is published to aim at)
        name, version, tier = row["model"].partition("@")[0], row.get("want"), row["tier"]
        if version is None or (name, version) in held:
            continue
        skey = ""
        if row.get("selection") is not None:
            try:
                sel = selection_from_dict(row["selection"])
            except (ValueError, KeyError, TypeError):
                continue
            skey = "" if sel.whole else sel_key(sel)
        c = parts.get((name, version, skey)) if skey else None
        copies = None if c is None else {t: int(i.get("resident_bytes") or 0) for t, i in c["tiers"].items()}
        wanted.append((name, version, tier, (name, version, skey), copies))
    known = sizes.get([w[3] for w in wanted if w[4] is None])
    entries = []
    for name, version, tier, key, copies in wanted:
        if copies is not None:
            c = parts[(name, version, key[2])]
            entries.append((name, version, tier, int(c["bytes"]), copies))
        elif key in known:
            entries.append((name, version, tier, known[key], None))
    d.service.estimates.set_wanted(entries)
    return d.service.estimates.from_status(status)


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
