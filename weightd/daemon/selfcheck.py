"""``weightd serve --check``: can this installation run the daemon with this config, on this node?

Two depths. ``install`` (an image's build stage, the unit's ``ExecStartPre=``): the config is valid and
every module of weightd, tiering and p2p imports, with every dependency the package declares present;
nothing on disk is looked at, so it passes in a build container and never fails a start for storage
that may still be mounting. ``all`` (an operator, a node's first boot): also the tier roots usable by
this uid (existing and weightd's: owned, not writable by others, and holding nothing weightd did not
make; or makeable) and cold storage there and readable (a path: present,
not an unmounted mount point; an object store: it answers a listing).

Each check is a line ``ok|FAIL  WHAT  DETAIL``; the command exits 0 when all pass, else 2.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..config import Config

PACKAGES = ("weightd", "tiering", "p2p")
COLD_TIMEOUT_S = 15.0


class Check(NamedTuple):
    ok: bool
    what: str
    detail: str


def check_install() -> list[Check]:
    """Every declared dependency installed, and every module of the three packages importable."""
    from importlib import metadata
    out: list[Check] = []
    try:
        requires = metadata.requires("weightd") or []
    except metadata.PackageNotFoundError:
        requires = []   # (run from a checkout without an install: the imports below still tell)
    missing = []
    for req in requires:
        if "extra ==" in req:
            continue
        dist = re.split(r"[ <>=!~;\[(]", req, maxsplit=1)[0]
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            missing.append(dist)
    out.append(Check(not missing, "dependencies",
                     f"{len(requires) - len(missing)} declared and installed" if not missing
                     else f"not installed: {', '.join(missing)} (pip install --force-reinstall weightd)"))
    failed: list[str] = []
    count = 0
    for pkg in PACKAGES:
        try:
            mod = importlib.import_module(pkg)
        except Exception as exc:   # (an import error of any kind is what this check reports)
            failed.append(f"{pkg} ({type(exc).__name__}: {exc})")
            continue
        for info in pkgutil.walk_packages(mod.__path__, f"{pkg}."):
            count += 1
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                failed.append(f"{info.name} ({type(exc).__name__}: {exc})")
    out.append(Check(not failed, "modules", f"{count + len(PACKAGES)} imported" if not failed
                     else f"{len(failed)} fail to import: {'; '.join(failed[:3])}"))
    return out


def check_storage(cfg: "Config") -> list[Check]:
    """The tier roots and cold storage as this uid sees them; makes nothing."""
    from tiering import (COLD, HOT, WARM, RootPolicy, StorageUnavailable, TieringError, foreign_root,
                         open_cold_store, open_tier_root, unmade_parent)

    from ..node.local import cold_tier, tier_specs
    out: list[Check] = []
    for tier, spec in tier_specs(cfg).items():
        if tier not in (HOT, WARM):
            continue
        path = spec.path
        try:
            if os.path.lexists(path):
                d = open_tier_root(path, RootPolicy(spec.root_mode, spec.group), create=False)
                if d is not None:
                    d.close()
                if not os.access(path, os.W_OK | os.X_OK):
                    raise StorageUnavailable(str(path), f"not writable by uid {os.geteuid()}")
                why = foreign_root(tier, spec, cfg.settings.state_dir)
                if why is not None:
                    raise StorageUnavailable(str(path), why)
                out.append(Check(True, f"tier {tier}", f"{path}"))
                continue
            refused = unmade_parent(path)
            if refused is not None:
                raise refused
            parent = next(p for p in path.parents if p.exists())
            if not os.access(parent, os.W_OK | os.X_OK):
                raise StorageUnavailable(str(path), f"cannot be made: {parent} is not writable by uid {os.geteuid()}")
            out.append(Check(True, f"tier {tier}", f"{path} (made at first use)"))
        except (TieringError, OSError) as exc:
            out.append(Check(False, f"tier {tier}", str(exc)))
    cold = cfg.settings.tiers.cold
    what = COLD

    def look() -> str:
        store = cold_tier(cfg)
        if isinstance(store, os.PathLike):
            with open_cold_store(store):
                return str(store)
        names = store.names()
        return f"{cold.url} answers ({len(names)} name(s) published)"

    pool = ThreadPoolExecutor(1, "weightd-check")
    try:
        detail = pool.submit(look).result(timeout=COLD_TIMEOUT_S)
        out.append(Check(True, COLD, detail))
    except FutureTimeout:
        out.append(Check(False, what, f"no answer within {COLD_TIMEOUT_S:g} s (a hung mount or an unreachable "
                                      "endpoint?)"))
    except Exception as exc:   # (whatever the store's client raises: the check reports it, one line)
        out.append(Check(False, what, str(exc) if isinstance(exc, (TieringError, OSError))
                         else f"{type(exc).__name__}: {exc}"))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return out


def run_checks(cfg: "Config", depth: str) -> list[Check]:
    checks = [Check(True, "config", cfg.source)] + check_install()
    if depth == "all":
        checks += check_storage(cfg)
    return checks
