"""The daemon's sockets: ``[api]``, the admin socket and who may use it (``ApiSettings``);
``[metrics]``, the metrics and probes listener (``MetricsSettings``); ``[listeners]``, every TCP
listener's connection caps and timeouts (``ListenerSettings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .model import Field, field_validator, model_validator
from .values import FrozenModel, abs_path, cidrs, group_id, host_port


def _user_id(v: Any) -> int | None:
    """A user as a uid or a name that resolves here."""
    if v is None or isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if isinstance(v, str) and v.isdigit():
        return int(v)
    if isinstance(v, str) and v:
        import pwd
        try:
            return pwd.getpwnam(v).pw_uid
        except KeyError:
            raise ValueError(f"no user named {v!r} on this host") from None
    raise ValueError("expected a user name or uid")


class ApiSettings(FrozenModel):
    """The admin socket: who may connect (``group``), who may change things (``admin_group``), which
    uid the CLI accepts as its daemon (``daemon_user``), and how long a request may take to arrive."""
    socket: Path = Field(doc="the admin socket's path (absolute); the embedded default is in $XDG_RUNTIME_DIR, "
                             "else in state_dir")
    group: int | None = Field(None, unit="gid", doc="a group name or gid: the socket is chowned to it, mode 0660: "
                                                    "who may connect and read; unset: weightd's user only")
    admin_group: int | None = Field(None, unit="gid", doc="a group name or gid: besides root and the daemon's user, "
                                                          "who may publish, evict, pin, unpin and gc")
    daemon_user: int | None = Field(None, unit="uid", doc="a user name or uid the CLI trusts as its daemon besides "
                                                          "root; unset: the CLI's own user")
    request_timeout_s: float = Field(default=30.0, gt=0, le=3600, unit="s",
                                     doc="idle or half-sent requests on the socket are dropped after this")
    # callers who are not admins (anyone else the socket's group lets in): how long one lease may be,
    # and how much of a tier's capacity one uid's leases may hold (admins and the daemon: no limit)
    max_lease_s_readonly: float = Field(default=3600.0, ge=0, le=7 * 24 * 3600, unit="s",
                                        doc="the longest lease a caller who is not an admin may take (admins and "
                                            "the daemon: not limited by this)")
    lease_share_readonly: float = Field(default=0.25, ge=0, le=1, unit="fraction",
                                        doc="the share of a tier's capacity one such caller's (uid's) leases may hold")

    _path = field_validator("socket", mode="before")(abs_path)
    _groups = field_validator("group", "admin_group", mode="before")(group_id)
    _user = field_validator("daemon_user", mode="before")(_user_id)


class MetricsSettings(FrozenModel):
    """The metrics and probes listener. ``allow``: who may connect, everyone by default (Prometheus
    scrapes it from the pod network and the kubelet probes it from the node; it serves nothing secret
    and changes nothing): the connection caps and timeouts of ``[listeners]`` are what protect it."""
    listen: str = Field("127.0.0.1:9464", doc="IP:PORT of /metrics, /healthz and /readyz")
    allow: tuple[str, ...] = Field(("0.0.0.0/0", "::/0"), doc="CIDRs that may connect; everyone by default (it serves "
                                                              "nothing secret and changes nothing)")
    _listen = field_validator("listen", mode="before")(host_port)
    _allow = field_validator("allow", mode="before")(cidrs)


class ListenerSettings(FrozenModel):
    """Every TCP listener of the daemon (metrics; the origin's tracker and fleet endpoints): caps on
    open connections, and how long a connection may take to send a request and to finish it."""
    max_connections: int = Field(default=256, ge=1, le=65536,
                                 doc="open connections per listener; more are reset at accept")
    max_connections_per_address: int = Field(default=32, ge=1, le=65536,
                                             doc="open connections per listener from one address (at most "
                                                 "max_connections)")
    idle_timeout_s: float = Field(default=10.0, gt=0, le=3600, unit="s",
                                  doc="a request's headers must arrive within this of connecting or of the last answer")
    request_timeout_s: float = Field(default=30.0, gt=0, le=3600, unit="s",
                                     doc="a request's body and handler (else 408); an answer not read for this long: "
                                         "reset")
    tls_handshake_timeout_s: float = Field(default=10.0, gt=0, le=600, unit="s",
                                           doc="with [p2p] tls: the tracker's TLS handshake")

    @model_validator(mode="after")
    def _per_address(self) -> "ListenerSettings":
        if self.max_connections_per_address > self.max_connections:
            raise ValueError(f"max_connections_per_address ({self.max_connections_per_address}) is more than "
                             f"max_connections ({self.max_connections})")
        return self
