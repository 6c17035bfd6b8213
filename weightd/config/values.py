"""The base of every table and the value rules several tables share.

``FrozenModel``: a settings model (:mod:`.model`) that refuses unknown keys and cannot be changed once
built. ``abs_path``, ``cidrs``, ``host_port`` and ``group_id`` are ``field_validator(mode="before")``
rules: an absolute path (``~`` expanded), a list of CIDRs, an ``IP:PORT``, a group by name or gid;
each raises ``ValueError`` with the words the config error shows after the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .model import BaseModel, ConfigDict


class FrozenModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def abs_path(v: Any) -> Path:
    if not isinstance(v, (str, Path)) or not str(v):
        raise ValueError("expected a path")
    p = Path(os.path.expanduser(str(v)))
    if not p.is_absolute():
        raise ValueError(f"must be an absolute path, got {str(v)!r}")
    return p


def cidrs(v: Any) -> tuple[str, ...]:
    import ipaddress
    if not isinstance(v, (list, tuple)):
        raise ValueError("expected a list of CIDRs like '10.0.0.0/8'")
    out = []
    for cidr in v:
        try:
            out.append(str(ipaddress.ip_network(cidr, strict=False)))
        except (ValueError, TypeError):
            raise ValueError(f"{cidr!r} is not a CIDR like '10.0.0.0/8'") from None
    return tuple(out)


def host_port(v: Any) -> str:
    import ipaddress
    if not isinstance(v, str):
        raise ValueError("expected 'IP:PORT'")
    host, sep, port = v.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        ok = sep and port.isdigit() and 0 <= int(port) <= 65535
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"expected 'IP:PORT' like '127.0.0.1:9464', got {v!r}")
    return v


def group_id(v: Any) -> int | None:
    """A group by name or gid (the serving engine's, so it can read the tier); None = no group access."""
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        raise ValueError("expected a group name or gid")
    if isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
        gid = int(v)
        if not 0 <= gid < 2**32 - 1:
            raise ValueError(f"gid {v} is out of range")
        return gid
    if not isinstance(v, str):
        raise ValueError("expected a group name or gid")
    import grp
    try:
        return grp.getgrnam(v).gr_gid
    except KeyError:
        raise ValueError(f"no group named {v!r} on this host") from None
