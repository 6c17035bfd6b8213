"""What the intent runner plans from, besides the intent files: the versions cold storage publishes
(each name listed on a thread of its own, bounded, the last answer kept while a listing hangs or
fails), what this node holds (whole versions, partial copies and companions, from its status), and
the label of the partial copy an entry with patterns keeps of each version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from .context import DaemonContext

log = logging.getLogger(__name__)
LISTING_TIMEOUT_S = 30.0
LABEL_RETRY_S = 30.0           # a version whose partial-copy label could not be made is asked again after this
LABELS_KEPT = 100_000          # partial copies' labels remembered (a bound, never reached by a sane intent)

Held = dict[tuple[str, str], set[str]]   # (name, version or label) -> the tiers holding it


def sel_key(sel: Any) -> str:
    """A selection as a key (its canonical JSON: patterns with commas in them stay apart)."""
    return json.dumps(sel.to_dict(), sort_keys=True)


def held_of(status: dict[str, Any]) -> tuple[Held, Held]:
    """(whole versions, what a plain entry keeps; partial copies and companions, by label) on this node."""
    held: Held = {}
    held_parts: Held = {}
    for c in status["checkpoints"]:
        (held_parts if c.get("part_of") is not None else held).setdefault(
            (c["name"], c["version"]), set()).update(c["tiers"])
    return held, held_parts


class IntentCatalog:
    def __init__(self, d: "DaemonContext") -> None:
        self.d = d
        self._listing: dict[str, Any] = {}        # name -> a cold listing still running (one per name)
        self._published_seen: dict[str, list[str]] = {}
        # listings have a thread of their own: a hung cold server holds it, never the daemon's pools
        self._lister = ThreadPoolExecutor(1, "weightd-intent-list")
        self.labels: dict[tuple[str, str, str], str] = {}   # (name, version, selection) -> partial copy's label
        # ... and those that could not be made (the version unreadable now): not asked again before then
        self.label_retry: dict[tuple[str, str, str], float] = {}
        self.monotonic = time.monotonic

    async def published(self, names: set[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
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

    def label(self, e: Any, version: str) -> str | None:
        """The local object an entry keeps of a version: the version, or its partial copy's label
        (None while that is not known: the version's manifest could not be read yet)."""
        if e.selection is None:
            return version
        return self.labels.get((e.name, version, sel_key(e.selection)))

    def learn_local(self, status: dict[str, Any]) -> None:
        """The labels of the partial copies on this node, from their own manifests' ``of``: a copy of a
        version that cold storage no longer lists (or lists beyond ``versions``) is still found, held
        and kept pinned while an entry wants it."""
        for c in status["checkpoints"]:
            of = c.get("part_of") or {}
            if of.get("kind") in ("partial", "experts") and isinstance(of.get("selection"), dict):
                try:
                    from tiering import selection_from_dict
                    k = (c["name"], of["version"], sel_key(selection_from_dict(of["selection"])))
                except (ValueError, KeyError):
                    continue
                self.labels.setdefault(k, c["version"])

    def find_labels(self, entries: list[Any], published: dict[str, list[str]]) -> None:
        """(pool thread) The partial copy's label of each version a partial-copy entry may want (a
        manifest read once: a published version never changes)."""
        for e in entries:
            if e.selection is None:
                continue
            versions = [e.version] if e.version else published.get(e.name, [])[:e.versions + 1]
            for v in versions:
                k = (e.name, v, sel_key(e.selection))
                if k in self.labels or self.label_retry.get(k, 0.0) > self.monotonic():
                    continue
                try:
                    obj = self.d.node.object_of(self.d.node.resolve(e.name, v), e.selection)[0]
                except Exception as exc:  # noqa: BLE001 (the fetch says it)
                    # (a manifest that cannot be read or parsed now is read again after LABEL_RETRY_S,
                    # not every round: a 90,000-tensor one costs a second of cold reads and parsing)
                    log.debug("intent: no partial-copy label for %s@%s yet: %s", e.name, v, exc)
                    if len(self.label_retry) > LABELS_KEPT:
                        self.label_retry.clear()
                    self.label_retry[k] = self.monotonic() + LABEL_RETRY_S
                    continue
                self.label_retry.pop(k, None)
                if len(self.labels) > LABELS_KEPT:
                    self.labels.clear()
                self.labels[k] = obj.version

    def held_for(self, published: dict[str, list[str]], held: Held, held_parts: Held) -> Callable[[Any], Held]:
        """The plan's ``held_for``: a partial-copy entry holds a version when its object of that version
        is here (published versions, and the versions of the partial copies on the node)."""
        def held_for(e: Any) -> Held:
            skey = sel_key(e.selection)
            versions = set(published.get(e.name, [])) | {v for (n, v, k) in self.labels if n == e.name and k == skey}
            return {(e.name, v): tiers for v in versions
                    if (label := self.label(e, v)) is not None
                    and (tiers := (held_parts if "~" in label else held).get((e.name, label), set()))}
        return held_for

    def close(self) -> bool:
        """At exit: True if a cold listing is still running."""
        busy = any(not f.done() for f in self._listing.values())
        self._lister.shutdown(wait=False, cancel_futures=True)
        return busy
