"""What weightd itself looks like on this node, for ``doctor``: is the daemon up, how full is each
tier against its watermark, which preloads fell back or failed lately, can the daemon's user read
cold storage, and do the local copies still match their manifests (a sample of their parts).

Gathered live only (a recorded snapshot of /proc has none of it); the findings are made in
:mod:`weightd.doctor.tree` from the plain dict :func:`gather_node` returns."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Callable

VERIFY_VERSIONS = 8            # local copies spot-checked per run
VERIFY_BUDGET = 256 << 20      # bytes read for the spot checks, all copies together


def daemon_state(client: Any, socket_path: Path) -> dict[str, Any]:
    """``up`` (with its pid and status line), ``down`` (no socket), ``stale`` (a socket nobody
    listens on), ``denied`` (this user may not connect) or ``untrusted`` (served by a wrong uid)."""
    from ..errors import SocketDenied, UntrustedDaemon
    try:
        if client.available():
            h = client.health if isinstance(client.health, dict) else {}
            return {"state": "up", "socket": str(socket_path), "pid": h.get("pid"), "status": h.get("status")}
    except SocketDenied as exc:
        return {"state": "denied", "socket": str(socket_path), "reason": str(exc)}
    except UntrustedDaemon as exc:
        return {"state": "untrusted", "socket": str(socket_path), "reason": str(exc)}
    return {"state": "stale" if os.path.exists(socket_path) else "down", "socket": str(socket_path)}


def spot_check(checkpoints: list[dict[str, Any]], tier_paths: dict[str, Path], *,
               rng: random.Random | None = None) -> list[dict[str, Any]]:
    """Re-hash random parts of up to VERIFY_VERSIONS local copies (VERIFY_BUDGET bytes in all)."""
    from tiering import TieringError, open_tier_root, read_version, sample_verify
    rng = rng or random.Random()
    copies = [(c["name"], c["version"], t) for c in checkpoints for t in c["tiers"]]
    rng.shuffle(copies)
    copies = copies[:VERIFY_VERSIONS]
    out = []
    budget = VERIFY_BUDGET // max(1, len(copies))
    for name, version, tier in copies:
        row: dict[str, Any] = {"ref": f"{name}@{version}", "tier": tier}
        try:
            root = open_tier_root(tier_paths[tier], create=False)
            if root is None:
                continue
            with root:
                v = read_version(root, name, version)
                if v is None:
                    continue  # evicted meanwhile
                with root.sub(v.rel) as d:
                    r = sample_verify(d, v.manifest, budget_bytes=budget, rng=rng)
            row.update(bytes_checked=r.bytes_checked, problems=[str(p) for p in r.problems])
        except PermissionError as exc:
            row.update(bytes_checked=0, problems=[], skipped=f"{exc.strerror or exc}: run doctor as root or the "
                                                             "daemon's user to check the copies")
        except (OSError, TieringError) as exc:
            row.update(bytes_checked=0, problems=[str(exc)])
        out.append(row)
    return out


def gather_node(*, client: Any, socket_path: Path, in_process: Callable[[], Any] | None,
                tier_paths: dict[str, Path], verify: bool = True) -> dict[str, Any]:
    """The facts :func:`weightd.doctor.tree.diagnose` turns into findings. ``client``: the daemon's
    (None: --no-daemon); ``in_process()``: a read-only service when the daemon does not answer."""
    from ..errors import DaemonError
    facts: dict[str, Any] = {"daemon": daemon_state(client, socket_path) if client is not None
                             else {"state": "not asked", "socket": str(socket_path)}}
    ops = client if facts["daemon"]["state"] == "up" else (in_process() if in_process is not None else None)
    if ops is None:
        return facts
    try:
        st = ops.status()
        facts["tiers"] = st["tiers"]
        facts["recent_events"] = st.get("recent_events", [])
        facts["network"] = st.get("network") or {}   # ([network]: weightd's share of the link, its limits)
        try:
            facts["cold"] = ops.check_cold()
            facts["cold"]["by"] = "daemon" if ops is client else "this process"
        except DaemonError as exc:   # (the daemon's cold check is for admins; or cold storage is not answering)
            facts["cold_not_checked"] = str(exc)
        if verify:
            facts["verify"] = spot_check(st["checkpoints"], tier_paths)
    except (DaemonError, OSError) as exc:
        facts["error"] = f"could not ask {'the daemon' if ops is client else 'the tiers'}: {exc}"
    return facts
