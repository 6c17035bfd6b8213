"""What every command gets (global options, the config, the daemon's client), and the checks both
command lines make on a daemon's answers; light (no click), so weightd.cli.fast uses it too."""

from __future__ import annotations

import os
from typing import Any


class AppContext:
    def __init__(self, config_path: str | None, debug: bool, no_daemon: bool = False,
                 daemon_only: bool = False) -> None:
        self.config_path, self.debug, self.no_daemon, self.daemon_only = config_path, debug, no_daemon, daemon_only
        self._config: Any = None

    @property
    def config(self):  # -> weightd.config.Config; imported when first needed
        if self._config is None:
            from ..config import load_config
            self._config = load_config(self.config_path)
        return self._config

    def daemon_client(self):
        """The client of this node's daemon, trusting root and ``[api] daemon_user`` (default: our euid)."""
        from ..client import DaemonClient
        api = self.config.settings.api
        return DaemonClient(api.socket, None if api.daemon_user is None else [api.daemon_user])


def warn_other_config(app: AppContext, health: object) -> None:
    """--config names one file, the daemon that answered runs with another: its settings apply."""
    if app.config_path is None or not isinstance(health, dict) or not isinstance(health.get("config"), str):
        return
    theirs = health["config"]
    if os.path.realpath(app.config_path) != os.path.realpath(theirs):
        from .output import echo
        echo(f"weightd: the daemon on {app.config.settings.api.socket} answered; its config ({theirs}) "
             f"applies, not --config {app.config_path} (--no-daemon to use yours in-process)", err=True)


def checked_path(app: AppContext, r: Any) -> dict[str, Any]:
    """A path the daemon returned must lie inside a configured hot or warm tier (after symlinks)."""
    from ..errors import UntrustedDaemon
    tiers = app.config.settings.tiers
    roots = [os.path.realpath(t.path) for t in (tiers.hot, tiers.warm)]
    p = r.get("path") if isinstance(r, dict) else None
    real = os.path.realpath(p) if isinstance(p, str) and p and "\0" not in p else None
    if real is None or not any(real.startswith(root.rstrip(os.sep) + os.sep) for root in roots):
        raise UntrustedDaemon(f"the daemon on {app.config.settings.api.socket} answered path {p!r}, "
                              f"which is not inside the hot or warm tier ({', '.join(roots)}); refusing it")
    return r


__all__ = ["AppContext", "checked_path", "warn_other_config"]
