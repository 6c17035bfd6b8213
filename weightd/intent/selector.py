"""Node selectors of intent entries (``nodes = "pool=chat,gpu in (h100,a100)"``), in Kubernetes'
label-selector syntax: ``key=value``, ``key!=value``, ``key in (a,b)``, ``key notin (a,b)``, ``key``,
``!key``, joined by commas (all must hold); an inline table ``nodes = {pool = "chat"}`` means equality
on each key. Also the checks of one label key and value, which the node's labels get wherever they
come from (the config, the labels file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str                       # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.key)
        if self.op == "exists":
            return v is not None
        if self.op == "!exists":
            return v is None
        if self.op in ("=", "in"):
            return v is not None and v in self.values
        return v not in self.values  # != and notin: a node without the label does not have that value


@dataclass(frozen=True)
class Selector:
    text: str
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels) for r in self.requirements)

    def __str__(self) -> str:
        return self.text or "(every node)"


def _check_key(k: str) -> str:
    if not _LABEL_KEY.fullmatch(k):
        raise ValueError(f"{k!r} is not a label key (like 'pool' or 'example.com/pool')")
    return k


def _check_value(v: str) -> str:
    if not _LABEL_VALUE.fullmatch(v):
        raise ValueError(f"{v!r} is not a label value (at most 63 letters, digits, '-', '_', '.')")
    return v


_REQ = re.compile(r"\s*(!?)\s*([^\s!=,()]+)(?:\s*(==|=|!=)\s*([^\s,()]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*")


def parse_selector(v: Any) -> Selector:
    """A label selector string or an inline table of equalities (ValueError naming what is wrong)."""
    if isinstance(v, Mapping):
        reqs = []
        for k, val in v.items():
            if not isinstance(val, str):
                raise ValueError(f"label {k!r}: expected a string value")
            reqs.append(Requirement(_check_key(str(k)), "=", (_check_value(val),)))
        return Selector(",".join(f"{r.key}={r.values[0]}" for r in reqs), tuple(reqs))
    if not isinstance(v, str):
        raise ValueError("expected a label selector like 'pool=chat,gpu in (h100,a100)' or a table of labels")
    text, reqs, pos = v.strip(), [], 0
    while pos < len(text):
        m = _REQ.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read the selector at {text[pos:pos + 20]!r}")
        neg, key, eq, val, setop, values = m.groups()
        _check_key(key)
        if neg and (eq or setop):
            raise ValueError(f"'!{key}' takes no value")
        if eq:
            req = Requirement(key, "!=" if eq == "!=" else "=", (_check_value(val),))
        elif setop:
            vals = tuple(_check_value(x.strip()) for x in values.split(",") if x.strip())
            if not vals:
                raise ValueError(f"'{key} {setop} ()' lists no values")
            req = Requirement(key, setop, vals)
        else:
            req = Requirement(key, "!exists" if neg else "exists")
        reqs.append(req)
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"expected ',' between requirements at {text[pos:pos + 20]!r}")
            pos += 1
            if pos == len(text):
                raise ValueError("ends with ','")
    return Selector(text, tuple(reqs))
