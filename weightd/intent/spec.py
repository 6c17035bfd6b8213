"""Intent entries: what this node should hold, declared as ``[[keep]]`` entries (design §15).

A directory of ``*.toml`` files (a ConfigMap mounted in Kubernetes, ``/etc/weightd/intent.d`` on bare
metal), read in name order (:mod:`.files`). Each entry::

    [[keep]]
    model = "acme/llama-70b@latest"   # NAME@VERSION, or NAME@latest (rolled forward as versions appear)
    tier = "warm"                     # hot or warm (default warm)
    pin = false                       # pin the copy (never evicted while the entry wants it)
    nodes = "pool=chat,gpu in (h100,a100)"   # a label selector over this node's labels (default: all)
    priority = 100                    # higher first (default 0)
    versions = 2                      # @latest: keep this many (the newest plus rollbacks; default 1)
    window = "02:00-05:00"            # when the transfer may run (UTC); or cron: "0 2 * * 1-5" + window_minutes
    bandwidth = "200MB"               # bytes/s cap while this entry transfers (default: none)

Selectors (:mod:`.selector`) follow Kubernetes' label-selector syntax; windows are :mod:`.window`'s.

Every problem is an :class:`IntentError` naming the file, the entry (``keep #N``, counted from 1 in its
file) and the key, so one line tells the operator what to fix; the daemon keeps the intent it had.
Two entries for the same model that both select this node conflict unless their priorities differ
(the higher one wins) or they say the same thing.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ..errors import IntentError
from .imports import ImportEntry, imports_for, parse_imports
from .keys import refuse_unknown_keys
from .selector import Selector, parse_selector
from .window import Window, parse_window

MAX_VERSIONS = 16
KEYS = ("model", "models", "tier", "pin", "nodes", "priority", "versions", "window", "window_minutes", "bandwidth",
        "include", "exclude", "layers", "tp_rank", "experts")
MAX_SET_MODELS = 10_000
LATEST = "latest"


# -- entries ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeepEntry:
    file: str                     # the file's name in the intent directory
    index: int                    # 1-based, in its file
    name: str
    version: str | None           # None: @latest
    tier: str = "warm"
    pin: bool = False
    nodes: Selector = field(default_factory=lambda: Selector(""))
    priority: int = 0
    versions: int = 1
    window: Window | None = None
    bandwidth: int = 0            # bytes/s while transferring; 0 = no cap
    selection: Any = None         # a tiering.Selection: a partial copy of each version (None: every file)
    member: int | None = None     # its place in the entry's ``models`` list (a set: LoRA adapters)

    @property
    def where(self) -> str:
        return f"{self.file} keep #{self.index}" + (f" models[{self.member}]" if self.member is not None else "")

    @property
    def model(self) -> str:
        return f"{self.name}@{self.version or LATEST}"

    @property
    def holder(self) -> str:
        """The lease holder name this entry's copies carry (``weightd status`` shows it)."""
        return f"intent {self.where}"

    def settings(self) -> tuple[Any, ...]:
        """What two entries for one model must agree on (or differ in priority)."""
        return (self.tier, self.pin, self.versions, str(self.window) if self.window else None, self.bandwidth,
                self.selection.describe() if self.selection is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.where, "model": self.model, "tier": self.tier, "pin": self.pin,
                "nodes": str(self.nodes), "priority": self.priority, "versions": self.versions,
                "window": str(self.window) if self.window else None, "bandwidth": self.bandwidth,
                **({"selection": self.selection.to_dict()} if self.selection is not None else {})}


def _entries(file: str, index: int, raw: Any) -> list[KeepEntry]:
    """One entry, or one per model of its ``models`` list (a set, e.g. LoRA adapters: each kept alike)."""
    where = f"keep #{index}"
    if isinstance(raw, Mapping) and "models" in raw:
        models = raw["models"]
        if "model" in raw:
            raise IntentError(file, "give model or models, not both", f"{where}.models")
        if not isinstance(models, list) or not models or len(models) > MAX_SET_MODELS:
            raise IntentError(file, f"expected a list of 1 to {MAX_SET_MODELS} NAME@VERSION (or NAME@latest)",
                              f"{where}.models")
        if len(set(map(str, models))) != len(models):
            raise IntentError(file, "a model is listed twice", f"{where}.models")
        out = []
        for j, m in enumerate(models):
            e = _entry(file, index, {**{k: v for k, v in raw.items() if k != "models"}, "model": m},
                       f"{where}.models[{j}]")
            out.append(replace(e, member=j))
        return out
    return [_entry(file, index, raw)]


def _entry(file: str, index: int, raw: Any, model_key: str | None = None) -> KeepEntry:
    where = f"keep #{index}"
    if not isinstance(raw, Mapping):
        raise IntentError(file, "expected a table", where)
    refuse_unknown_keys(file, where, raw, KEYS)
    name, version = _model(file, raw.get("model"), model_key or f"{where}.model")
    kw: dict[str, Any] = {}
    key = "?"
    try:
        for key, check in _SETTINGS:   # (in this order: the first problem is the one named)
            if key in raw:
                kw.update(check(raw[key], raw, version))
        if any(k in raw for k in _SELECTION_KEYS):   # (each was checked alone above: an error there names it)
            from tiering import selection_from
            sel = selection_from(raw.get("include"), raw.get("exclude"), raw.get("layers"), raw.get("tp_rank"),
                                 experts=raw.get("experts"))
            kw["selection"] = None if sel.whole else sel
    except (ValueError, TypeError) as exc:
        raise IntentError(file, str(exc) or "bad value", f"{where}.{key}") from None
    return KeepEntry(file, index, name, version, **kw)


def _model(file: str, model: Any, model_key: str) -> tuple[str, str | None]:
    """NAME and VERSION of an entry's ``model`` (None: @latest)."""
    from tiering import InvalidName, parse_ref
    if model is None:
        raise IntentError(file, "missing key (NAME@VERSION or NAME@latest; or models = [...])", model_key)
    if not isinstance(model, str) or "@" not in model:
        raise IntentError(file, f"expected NAME@VERSION or NAME@latest, got {str(model)[:80]!r}", model_key)
    try:
        name, version = parse_ref(model)
    except InvalidName as exc:
        raise IntentError(file, str(exc), model_key) from None
    return name, None if version == LATEST else version


# -- each setting's check: (value, the whole entry, its VERSION or None) -> KeepEntry fields; ValueError
def _tier(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    from tiering import LOCAL_TIERS
    if v not in LOCAL_TIERS:
        raise ValueError(f"expected one of {', '.join(LOCAL_TIERS)}, got {str(v)[:40]!r}")
    return {"tier": v}


def _pin(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    if not isinstance(v, bool):
        raise ValueError("expected true or false")
    return {"pin": v}


def _nodes(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    return {"nodes": parse_selector(v)}


def _priority(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    if isinstance(v, bool) or not isinstance(v, int) or not -1_000_000 <= v <= 1_000_000:
        raise ValueError("expected a whole number from -1000000 to 1000000 (higher first)")
    return {"priority": v}


def _versions(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_VERSIONS:
        raise ValueError(f"expected a whole number from 1 to {MAX_VERSIONS} (the newest plus rollbacks)")
    if version is not None and v != 1:
        raise ValueError(f"goes with NAME@latest only ({raw['model']} names one version)")
    return {"versions": v}


def _window(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    return {"window": parse_window(v, raw.get("window_minutes"))}


def _window_minutes(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    if "window" not in raw:   # (with a window, parse_window checked it)
        raise ValueError("goes with a cron window")
    return {}


def _bandwidth(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    from tiering import parse_size
    if isinstance(v, bool) or isinstance(v, float) and not math.isfinite(v):
        raise ValueError("expected bytes per second like '200MB'")
    n = parse_size(v)
    if n < 0:
        raise ValueError("expected bytes per second like '200MB'")
    return {"bandwidth": n}


def _pattern(key: str) -> Callable[[Any, Mapping[str, Any], str | None], dict[str, Any]]:
    """The check of one of the selection keys alone (the entry's selection is made of them all after)."""
    def check(v: Any, raw: Mapping[str, Any], version: str | None) -> dict[str, Any]:
        from tiering import BadInput, selection_from
        try:
            selection_from(**{key: v})
        except BadInput as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        return {}
    return check


_SELECTION_KEYS = ("include", "exclude", "layers", "tp_rank", "experts")
_SETTINGS = (("tier", _tier), ("pin", _pin), ("nodes", _nodes), ("priority", _priority), ("versions", _versions),
             ("window", _window), ("window_minutes", _window_minutes), ("bandwidth", _bandwidth),
             *((k, _pattern(k)) for k in _SELECTION_KEYS))


def parse_document(file: str, text: str) -> tuple[list[KeepEntry], list[ImportEntry]]:
    """An intent file's ``[[keep]]`` and ``[[import]]`` entries (:mod:`.imports`)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise IntentError(file, f"invalid TOML: {exc}") from None
    unknown = [k for k in data if k not in ("keep", "import")]
    if unknown:
        raise IntentError(file, "unknown table (an intent file holds [[keep]] and [[import]] entries)", unknown[0])
    keep = data.get("keep", [])
    if not isinstance(keep, list):
        raise IntentError(file, "expected [[keep]] entries (an array of tables)", "keep")
    imports = parse_imports(file, data["import"]) if "import" in data else []
    return [e for i, raw in enumerate(keep, 1) for e in _entries(file, i, raw)], imports


def parse_text(file: str, text: str) -> list[KeepEntry]:
    """The ``[[keep]]`` entries of an intent file (its ``[[import]]`` entries checked too)."""
    return parse_document(file, text)[0]

# -- the directory ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Intent:
    """Every entry of the directory's files, and what they were read from (to notice a change)."""
    directory: str
    entries: tuple[KeepEntry, ...]
    fingerprint: tuple[Any, ...]
    imports: tuple[ImportEntry, ...] = ()

    def imports_for(self, labels: Mapping[str, str],
                    origin: bool) -> tuple[list[ImportEntry], list[tuple[ImportEntry, str]]]:
        """The ``[[import]]`` entries this node runs, and those it refuses (:func:`.imports.imports_for`)."""
        return imports_for(self.imports, labels, origin)

    def for_node(self, labels: Mapping[str, str]) -> list[KeepEntry]:
        """The entries that select this node, one per model reference (the highest priority wins), in
        the order to reconcile them: priority first, then file and entry order. IntentError on two
        entries for one model at one priority that disagree."""
        chosen: dict[tuple[str, str | None], KeepEntry] = {}
        for e in self.entries:
            if not e.nodes.matches(labels):
                continue
            key = (e.name, e.version)
            old = chosen.get(key)
            if old is None or e.priority > old.priority:
                chosen[key] = e
            elif e.priority == old.priority and e.settings() != old.settings():
                diff = next(f"{n} ({a} vs {b})" for n, a, b in
                            zip(("tier", "pin", "versions", "window", "bandwidth"), old.settings(), e.settings())
                            if a != b)
                raise IntentError(e.file, f"conflicts with {old.where} for this node: same model ({e.model}) and "
                                  f"priority, different {diff}; give one a higher priority or a node selector "
                                  "that leaves the other out", f"keep #{e.index}")
        return sorted(chosen.values(), key=lambda e: (-e.priority, e.file, e.index))
