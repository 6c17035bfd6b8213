"""Where weightd's traffic goes (for :mod:`weightd.node.network`, the NIC yield): the hosts of the
``[p2p]`` peers, trackers and listen addresses and of cold storage, and the interfaces the routes to
them leave by (``ip -j route get``; a local address: the interface holding it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from typing import Any, Iterable
from urllib.parse import urlsplit


def endpoints_of(settings: Any) -> list[str]:
    """The addresses weightd's traffic goes to or comes from: [p2p] peers, trackers, listen addresses,
    and the cold tier's host."""
    p = settings.p2p
    hosts = [x.rpartition(":")[0].strip("[]") for x in (*p.peers, p.listen, p.tracker_listen or "") if x]
    for url in (*p.trackers, cold_url(settings.tiers.cold)):
        host = urlsplit(url).hostname if url else None
        if host:
            hosts.append(host)
    return [h for h in hosts if h not in ("0.0.0.0", "::")]


def cold_url(cold: Any) -> str:
    """The URL whose host the cold tier's traffic goes to: an oci:// registry's; for s3://BUCKET (a
    bucket, not a host) the ``endpoint``, else AWS's regional S3 host (``region``, AWS_REGION,
    AWS_DEFAULT_REGION), else none; a path: none (the kernel's NFS traffic is others')."""
    url = getattr(cold, "url", None) or ""
    if not url.startswith("s3://"):
        return url
    if getattr(cold, "endpoint", None):
        return cold.endpoint if "//" in cold.endpoint else f"https://{cold.endpoint}"
    region = getattr(cold, "region", None) or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    return f"https://s3.{region}.amazonaws.com" if region else ""


def find_interfaces(hosts: Iterable[str]) -> tuple[str, ...]:
    """The interfaces the routes to ``hosts`` leave by (a local address: the interface holding it);
    loopback is left out (it has no link to share)."""
    found: list[str] = []
    for host in hosts:
        try:
            addr = socket.getaddrinfo(host, None)[0][4][0]
        except (OSError, IndexError, ValueError):   # (ValueError: UnicodeError, a name like "a..b")
            continue
        dev = _ip_json(["route", "get", addr])
        name = dev[0].get("dev") if dev else None
        if name == "lo":
            name = _holder(addr)
        if name and name != "lo" and name not in found:
            found.append(name)
    return tuple(found)


def _holder(addr: str) -> str | None:
    """The interface holding the local address ``addr``."""
    for link in _ip_json(["addr", "show"]):
        if any(a.get("local") == addr for a in link.get("addr_info", ())):
            return link.get("ifname")
    return None


def _ip_json(args: list[str]) -> list[dict[str, Any]]:
    try:
        out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=5, check=True).stdout
        got = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return got if isinstance(got, list) else []
