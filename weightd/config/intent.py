"""``[intent]``: fleet intent, what this node keeps and how it reports to the origin
(``IntentSettings``); ``[intent.prewarm]``, prediction-driven prewarming (``PrewarmSettings``).
"""

from __future__ import annotations

import re

from pathlib import Path
from typing import Any, Mapping

from tiering import parse_size

from .model import Field, field_validator
from .values import FrozenModel, abs_path


class PrewarmSettings(FrozenModel):
    """Prediction-driven prewarming (design §15): in ``window``, the top ``top`` models the forecaster
    expects in the next ``horizon_s`` are placed in ``tier`` (or warmed into the page cache when a warm
    copy is there), never evicting what intent wants or what is pinned, leased or in use."""
    window: str = Field("00:00-23:59", doc="when prewarming runs: HH:MM-HH:MM (UTC), or a cron expression with "
                                           "window_minutes")
    window_minutes: int | None = Field(None, unit="minutes", doc="with a cron window: how long each window lasts "
                                                                 "(1 to 10080)")
    tier: str = Field("warm", doc="hot or warm: where prewarmed models are placed")
    top: int = Field(default=3, ge=1, le=64, doc="the most expected models to place")
    min_score: float = Field(default=0.5, ge=0, doc="the least forecast score (expected loads in the horizon) a "
                                                    "model needs")
    horizon_s: float = Field(default=3600.0, ge=60, le=7 * 86400, unit="s",
                             doc="how far ahead the forecaster looks")

    @field_validator("window")
    @classmethod
    def _window(cls, v: Any) -> str:
        from ..intent.window import parse_window
        parse_window(v)
        return v

    @field_validator("tier")
    @classmethod
    def _tier(cls, v: Any) -> str:
        if v not in ("hot", "warm"):
            raise ValueError("expected hot or warm")
        return v


class IntentSettings(FrozenModel):
    """Fleet intent (design §15): ``dir`` holds ``*.toml`` files of ``[[keep]]`` entries; none: off."""
    dir: Path | None = Field(None, doc="the directory of *.toml files of [[keep]] entries; unset: intent is off")
    labels: dict[str, str] = Field({}, doc="this node's labels, for the entries' node selectors (an inline table, "
                                           "{ pool = \"chat\" })")
    labels_file: Path | None = Field(None, doc="key=value lines overlaid on labels, read every round (a provisioner "
                                               "writes them)")
    node_name: str = Field("", doc="how the origin's fleet view names this node; empty: the host name")
    reconcile_s: float = Field(default=30.0, ge=1, le=3600, unit="s",
                               doc="a full round at least this often (a file change is seen within poll_s)")
    poll_s: float = Field(default=2.0, gt=0, le=60, unit="s", doc="how often dir is checked for changes")
    jitter_s: float = Field(default=30.0, ge=0, le=86400, unit="s",
                            doc="a rollout starts within this long of a new version (per node, stable)")
    max_movers: int = Field(default=0, ge=0, doc="on the origin: nodes rolling forward at once, fleet-wide; 0: no cap")
    origin: tuple[str, ...] = Field((), doc="the origins' base URLs (one, or a list of several), where holdings are "
                                            "reported and rollout slots asked; empty: one per [p2p] trackers host")
    report_s: float = Field(default=30.0, ge=1, le=3600, unit="s", doc="how often holdings are sent to the origin")
    # origin: bytes of worker reports held for the fleet view, and reports one address may send a second
    fleet_budget: int = Field(64 << 20, unit="bytes", doc="on the origin: worker reports held for the fleet view "
                                                          "(at least 1 MiB)")
    fleet_reports_per_s: float = Field(default=1.0, gt=0, le=1000, unit="1/s",
                                       doc="on the origin: reports one address may send a second (bursts of 16)")
    nfd_dir: Path | None = Field(None, doc="Node Feature Discovery's features.d: weightd writes labels "
                                           "weightd.io/<model>=hot|warm|ready there every round")
    prewarm: PrewarmSettings | None = Field(None, doc="prediction-driven prewarming; unset: off")
    # [[import]] entries publish into cold storage with the daemon's rights and Hub token: the daemon's own
    # config (root's) says which, never an intent file alone
    import_allow: dict[str, str] = Field({}, doc="[[import]] entries this daemon runs: NAME glob = hf://ORG/REPO "
                                                  "glob, e.g. { \"meta/*\" = \"hf://meta-llama/*\" }; empty: none "
                                                  "(entries show as refused)")
    import_sign: bool = Field(False, doc="sign [[import]] versions with [publish] signing_key (off: they are "
                                         "published unsigned)")

    @field_validator("import_allow")
    @classmethod
    def _import_allow(cls, v: Any) -> dict[str, str]:
        for name, source in v.items():
            if not name or not isinstance(source, str) or not source.startswith("hf://") or len(source) < 6:
                raise ValueError(f"{name!r} = {source!r}: expected NAME-GLOB = \"hf://ORG/REPO-GLOB\"")
        return v

    _paths = field_validator("dir", "labels_file", "nfd_dir", mode="before")(
        lambda v: None if v is None else abs_path(v))

    @field_validator("fleet_budget", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> int:
        n = parse_size(v)
        if n < 1 << 20:
            raise ValueError("expected at least 1MiB (a single report may be that large)")
        return n

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: Any) -> dict[str, str]:
        from ..intent.selector import _check_key, _check_value
        if not isinstance(v, Mapping) or not all(isinstance(x, str) for x in v.values()):
            raise ValueError("expected a table of label = \"value\"")
        return {_check_key(str(k)): _check_value(x) for k, x in v.items()}

    @field_validator("origin", mode="before")
    @classmethod
    def _origin(cls, v: Any) -> tuple[str, ...]:
        urls = [] if v is None or v == "" else [v] if isinstance(v, str) else v
        if not isinstance(urls, (list, tuple)) or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                          for u in urls):
            raise ValueError("expected an origin's tracker base URL, like 'https://10.0.0.1:6969', or a list of them")
        for u in urls:
            if (why := origin_problem(u)) is not None:
                raise ValueError(f"{u[:100]!r}: {why}; expected an origin's tracker base URL, like 'https://10.0.0.1:6969'")
        return tuple(dict.fromkeys(u.rstrip("/") for u in urls))

    @field_validator("node_name", mode="before")
    @classmethod
    def _node(cls, v: Any) -> str:
        import re
        if not isinstance(v, str) or (v and not re.fullmatch(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,252}", v)):
            raise ValueError("expected a host name (letters, digits, '-', '_', '.')")
        return v


def origin_problem(url: str) -> str | None:
    """Why ``url`` is not an origin's base URL (``[intent] origin``, ``fleet status --origin``): http or
    https, a host, a port 1-65535 if any, no path but "/" (the fleet endpoints are under it:
    '/announce' would 404 every request), no query."""
    import urllib.parse
    if not url.startswith(("http://", "https://")):
        return "not an http:// or https:// URL"
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError as exc:
        return "the port must be 1-65535" if "port" in str(exc).lower() else str(exc)
    host = u.hostname or ""
    if not host or any(c.isspace() for c in host) or any(c.isspace() for c in u.netloc):
        return "no host"
    if port is not None and not 1 <= port <= 65535 or u.netloc.endswith(":"):
        return "the port must be 1-65535"
    if u.path not in ("", "/"):
        return f"a path ({u.path[:40]!r}): give the base URL only, the fleet endpoints are under it"
    if "?" in url or "#" in url or u.username is not None:
        return "a query, fragment or user name"
    if not _NETLOC.fullmatch(u.netloc):
        return "not a host name or IP address (and port)"
    return None


_NETLOC = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::[0-9]{1,5})?")

