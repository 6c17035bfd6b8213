"""``check_disjoint``: hot, warm, cold (a path) and ``state_dir`` are four separate directories as the
kernel resolves them (symlinks followed, bind mounts by device and inode), checked when a config is
loaded.
"""

from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .settings import Settings


class _Place(namedtuple("_Place", ["key", "path", "real", "ident", "chain"])):
    """A configured directory as the kernel sees it: ``real`` (symlinks resolved as far as they exist),
    ``ident`` ((device, inode) when it exists), ``chain`` (the identities of it and every existing
    directory above it: a bind mount of another place is caught by identity, not by spelling)."""
    __slots__ = ()


def _place(key: str, path: Path) -> _Place:
    real = os.path.realpath(path)
    chain: list[tuple[int, int]] = []
    ident = None
    p = Path(real)
    for i, q in enumerate((p, *p.parents)):
        try:
            st = os.stat(q)
        except OSError:
            continue
        if i == 0:
            ident = (st.st_dev, st.st_ino)
        chain.append((st.st_dev, st.st_ino))
    return _Place(key, path, real, ident, tuple(chain))


def _within(inner: _Place, outer: _Place) -> bool:
    return inner.real.startswith(outer.real.rstrip("/") + "/") or \
        (outer.ident is not None and outer.ident in inner.chain[1 if inner.ident is not None else 0:])


def check_disjoint(settings: "Settings", source: str) -> None:
    """Hot, warm, cold (a path) and the state directory must be four separate directories, none equal
    to, inside or containing another, as the kernel resolves them (symlinks followed, bind mounts by
    device and inode): else ConfigError (exit 2) naming both keys and paths. A tier over another's
    directory would count, serve and evict the other's files as its own (a warm tier on the cold path
    deleted published checkpoints)."""
    t = settings.tiers
    places = [_place("tiers.hot.path", t.hot.path), _place("tiers.warm.path", t.warm.path)]
    if t.cold.path is not None:
        places.append(_place("tiers.cold.path", t.cold.path))
    places.append(_place("state_dir", settings.state_dir))
    for i, a in enumerate(places):
        for b in places[i + 1:]:
            if a.real == b.real or (a.ident is not None and a.ident == b.ident):
                how = "is the same directory as"
            elif _within(a, b):
                how = "is inside"
            elif _within(b, a):
                how = "contains"
            else:
                continue
            raise ConfigError(source, f"{a.path} {how} {b.key} ({b.path}): hot, warm, cold and state_dir must be "
                                      "separate directories, none inside another", a.key)
