"""The check every intent table gets: a key it does not know is one line naming the file, the entry and
the key, with the nearest known key when there is one (``keep #2.tier``, ``import #1.source``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import IntentError


def refuse_unknown_keys(file: str, where: str, raw: Mapping[str, Any], keys: Sequence[str]) -> None:
    unknown = [k for k in raw if k not in keys]
    if unknown:
        import difflib
        near = difflib.get_close_matches(unknown[0], keys, n=1)
        raise IntentError(file, "unknown key" + (f" (did you mean {near[0]}?)" if near else ""),
                          f"{where}.{unknown[0]}")
