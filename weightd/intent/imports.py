"""Intent's ``[[import]]`` entries: a Hugging Face Hub repository followed into cold storage (design §14).

::

    [[import]]
    source = "hf://acme/llama-70b@main"  # hf://ORG/REPO[@BRANCH|TAG|SHA]; each new commit is a new version
    name = "acme/llama-70b"              # default: ORG/REPO
    include = ["*.safetensors", "*.json"]   # which files (huggingface_hub allow/ignore patterns)
    exclude = ["original/*"]
    nodes = "weightd-import=yes"         # the nodes that import (default: the daemons run with --role origin)
    every = "10m"                        # how often the revision is resolved (default 10m; 10s to 7d)

A node the entry selects resolves the revision every ``every``; a commit not yet published as
``NAME@<commit SHA>`` is downloaded, checked against the Hub's hashes and published, so the fleet pulls
the Hub once and spreads it over P2P, and ``[[keep]] model = "NAME@latest"`` entries roll forward to
it. Problems are :class:`IntentError` naming file, ``import #N`` and key, like ``[[keep]]``'s.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import IntentError
from .keys import refuse_unknown_keys
from .selector import Selector, parse_selector

IMPORT_KEYS = ("source", "name", "include", "exclude", "nodes", "every")
DEFAULT_EVERY_S = 600.0
MIN_EVERY_S, MAX_EVERY_S = 10.0, 7 * 86400.0
MAX_PATTERNS = 64
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


@dataclass(frozen=True)
class ImportEntry:
    file: str
    index: int
    source: str                    # hf://ORG/REPO@REVISION (the revision spelled out)
    name: str
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    nodes: Selector | None = None  # None: the daemons run as origin
    every_s: float = DEFAULT_EVERY_S

    @property
    def where(self) -> str:
        return f"{self.file} import #{self.index}"

    def selects(self, labels: Mapping[str, str], origin: bool) -> bool:
        return self.nodes.matches(labels) if self.nodes is not None else origin

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.where, "source": self.source, "name": self.name, "include": list(self.include),
                "exclude": list(self.exclude), "nodes": str(self.nodes) if self.nodes is not None else "(origin)",
                "every_s": self.every_s}


def parse_every(v: Any) -> float:
    """Seconds from a number or ``"90s"``, ``"10m"``, ``"1h"``, ``"1d"``, within 10 s to 7 days."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError("expected a duration like '10m', '1h' or seconds")
    m = _DURATION.fullmatch(v.strip()) if isinstance(v, str) else None
    if isinstance(v, str) and m is None:
        raise ValueError(f"expected a duration like '10m', '1h' or seconds, got {v[:40]!r}")
    s = float(m.group(1)) * _UNIT_S[m.group(2)] if m is not None else float(v)
    if not MIN_EVERY_S <= s <= MAX_EVERY_S:
        raise ValueError(f"{s:g} s: expected 10 s to 7 days (the Hub is asked once per period)")
    return s


def _patterns(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or len(v) > MAX_PATTERNS or not all(isinstance(p, str) and p and len(p) <= 256
                                                                     for p in v):
        raise ValueError(f"expected a list of up to {MAX_PATTERNS} glob patterns")
    return tuple(v)


def parse_import(file: str, index: int, raw: Any) -> ImportEntry:
    """One ``[[import]]`` table; IntentError naming the key at fault."""
    from tiering import BadInput, InvalidName, parse_hub_ref, validate_name
    where = f"import #{index}"
    if not isinstance(raw, Mapping):
        raise IntentError(file, "expected a table", where)
    refuse_unknown_keys(file, where, raw, IMPORT_KEYS)
    if "source" not in raw:
        raise IntentError(file, "missing key (hf://ORG/REPO[@REVISION])", f"{where}.source")
    if not isinstance(raw["source"], str):
        raise IntentError(file, "expected hf://ORG/REPO[@REVISION]", f"{where}.source")
    try:
        ref = parse_hub_ref(raw["source"])
    except BadInput as exc:
        raise IntentError(file, str(exc), f"{where}.source") from None
    name = raw.get("name", ref.repo_id)
    try:
        if not isinstance(name, str):
            raise InvalidName("name", str(name)[:80], "expected a string like ORG/NAME")
        validate_name(name)
    except InvalidName as exc:
        raise IntentError(file, str(exc), f"{where}.name") from None
    kw: dict[str, Any] = {}
    key = "?"
    try:
        for key in ("include", "exclude"):
            if key in raw:
                kw[key] = _patterns(raw[key])
        key = "nodes"
        if "nodes" in raw:
            kw["nodes"] = parse_selector(raw["nodes"])
        key = "every"
        if "every" in raw:
            kw["every_s"] = parse_every(raw["every"])
    except (ValueError, TypeError) as exc:
        raise IntentError(file, str(exc) or "bad value", f"{where}.{key}") from None
    return ImportEntry(file, index, str(ref), name, **kw)


def parse_imports(file: str, raw: Any) -> list[ImportEntry]:
    if not isinstance(raw, list):
        raise IntentError(file, "expected [[import]] entries (an array of tables)", "import")
    return [parse_import(file, i, r) for i, r in enumerate(raw, 1)]


def imports_for(entries: tuple[ImportEntry, ...], labels: Mapping[str, str],
                origin: bool) -> tuple[list[ImportEntry], list[tuple[ImportEntry, str]]]:
    """The imports this node runs, and the ones it refuses with why: of two that publish one name from
    two sources (or two selections) the first in file order runs and the other is refused (a row in
    ``intent status``; the rest of the intent runs)."""
    chosen: dict[str, ImportEntry] = {}
    refused: list[tuple[ImportEntry, str]] = []
    for e in entries:
        if not e.selects(labels, origin):
            continue
        old = chosen.get(e.name)
        if old is not None and (old.source, old.include, old.exclude) != (e.source, e.include, e.exclude):
            refused.append((e, f"imports {e.name} as {old.where} does, from another source or selection: give "
                               f"one another name"))
            continue
        chosen.setdefault(e.name, e)
    return list(chosen.values()), refused


def not_allowed(e: ImportEntry, allow: Mapping[str, str]) -> str | None:
    """Why the daemon's ``[intent] import_allow`` (NAME glob = hf://ORG/REPO glob) does not cover ``e``, or
    None: an intent file alone never makes a daemon publish (with its rights, its Hub token and, if
    ``import_sign``, its signing key)."""
    repo = e.source.partition("@")[0]
    for name_glob, source_glob in allow.items():
        if fnmatch.fnmatchcase(e.name, name_glob) and fnmatch.fnmatchcase(repo, source_glob.partition("@")[0]):
            return None
    return (f"{e.name} from {repo} is not allowed by this daemon's [intent] import_allow "
            f"({', '.join(f'{k} = {v}' for k, v in allow.items()) or 'empty'}): add it there to run this import")
