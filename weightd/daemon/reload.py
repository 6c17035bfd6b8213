"""SIGHUP: what a new config may change in a running daemon. A config that would move the state
directory, turn fleet TLS on or off, or switch to another fleet CA is refused (restart for those); the
socket, the metrics listener, the ``[listeners]`` timeouts and the P2P session's ``[p2p]`` keys are
kept until the next restart (the log names them, against what the session started with); certificates
rotate at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..config import Config, ConfigError

if TYPE_CHECKING:
    from .tracker import TrackerEndpoint

log = logging.getLogger(__name__)

# [p2p] on SIGHUP. At once: the fallback (read per download), what publish reads (threshold, piece_size;
# an object-store origin's mirror keeps the start's until a restart) and the certificate (rotate_tls;
# fleet TLS on or off, or another CA, is refused by check_reload). Both: each new download and the fleet
# client use the new value at once, the P2P session (its announces, filter, origins, rack) the one it
# started with. The rest only the session reads (its port, limits, plan, crossing, tracker, ...).
P2P_AT_ONCE = frozenset({"fallback_after_s", "threshold", "piece_size", "tls"})
P2P_BOTH = frozenset({"peers", "trackers", "allow", "rack"})


def check_reload(old: Config, new: Config) -> None:
    """ConfigError if ``new`` changes what only a restart can change."""
    old_state, new_state = old.settings.state_dir, new.settings.state_dir
    if new_state != old_state:  # the state lock is held for the old one: switching needs a restart
        raise ConfigError(new.source, f"changed from {old_state} to {new_state}; a running daemon keeps "
                          "its state dir (restart it to switch)", "state_dir")
    _check_tls_change(old, new)


def _check_tls_change(old: Config, new: Config) -> None:
    """Certificates rotate on SIGHUP; turning fleet TLS on or off, or another fleet CA, needs a restart
    (the listen port changes kind, and torrents carry their CA)."""
    a, b = old.settings.p2p.tls, new.settings.p2p.tls
    if (a is None) != (b is None):
        raise ConfigError(new.source, f"turning fleet TLS {'on' if b else 'off'} needs a restart", "p2p.tls")
    if a is not None and b is not None and a.fleet.ca_pem != b.fleet.ca_pem:
        raise ConfigError(new.source, f"{b.ca} is another fleet CA than the running one; restart to switch "
                          "(and publish again: torrents carry their CA)", "p2p.tls.ca")


def warn_restart_only(old: Config, new: Config) -> None:
    """Say which changed settings wait for the next restart."""
    old_api, new_api = old.settings.api, new.settings.api
    if (new_api.socket, new_api.group, new_api.request_timeout_s) != \
            (old_api.socket, old_api.group, old_api.request_timeout_s) or \
            new.settings.metrics.listen != old.settings.metrics.listen or \
            new.settings.listeners.model_dump() != old.settings.listeners.model_dump():
        log.warning("api.socket, api.group, api.request_timeout_s, metrics.listen and the [listeners] timeouts "
                    "take effect at the next restart ([listeners] caps and allow lists at once)")


def warn_p2p_restart(started: Any, new: Config, session: bool, role: str) -> None:
    """Name the ``[p2p]`` keys of ``new`` that differ from what the daemon's P2P part started with
    (``started``: its P2PSettings; ``session``: whether a P2P session runs) and wait for a restart."""
    b = new.settings.p2p
    ignored = P2P_AT_ONCE if role == "origin" else P2P_AT_ONCE | {"origin_request_queue", "tracker_listen"}
    changed = [k for k in type(b).model_fields if k not in ignored and getattr(started, k) != getattr(b, k)]
    if not session:   # (a worker that started with nothing to join: the app's _start_p2p)
        if changed and (b.peers or b.trackers or b.tracker_listen):
            log.warning("%s: P2P is off in this daemon (no peers or trackers when it started); it starts with "
                        "them at the next restart", ", ".join(f"p2p.{k}" for k in changed))
        return
    later = [f"p2p.{k}" for k in changed if k not in P2P_BOTH]
    both = [f"p2p.{k}" for k in changed if k in P2P_BOTH]
    if later:
        log.warning("%s: take effect at the next restart (the P2P session keeps the values it started with)",
                    ", ".join(later))
    if both:
        log.warning("%s: new downloads use the new value at once, the P2P session (its announces, filter and "
                    "rack) the one it started with until the next restart: restart to apply it alike",
                    ", ".join(both))


def rotate_tls(cfg: Config, session: Any, tracker: "TrackerEndpoint") -> None:
    """After a reload: every torrent of the session (and the tracker's HTTPS endpoint) presents the
    certificate the new config names (load_config checked it; same fleet CA, :func:`check_reload`)."""
    tls = cfg.settings.p2p.tls
    if tls is None or session is None:
        return
    n = session.set_tls(tls.fleet)
    tracker.rotate_certificate(tls)
    log.info("p2p: presenting %s (valid until %s) on %d torrent(s)", tls.cert, f"{tls.fleet.not_after:%Y-%m-%d}", n)
