"""systemd's notify protocol (sd_notify(3)): datagrams to ``$NOTIFY_SOCKET``; a no-op without it."""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if addr.startswith("@"):  # abstract namespace
            self.address = "\0" + addr[1:]
        elif addr.startswith("/"):
            self.address = addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_s: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self.sock: socket.socket | None = None
        self.dropped = 0
        if self.address is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def notify(self, **fields: str | int) -> None:
        """``notify(READY=1, STATUS="...")`` -> ``READY=1\\nSTATUS=...``."""
        if self.sock is None:
            return
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            # never block the event loop on a slow or full receiver: drop the message instead
            self.sock.sendto(msg, socket.MSG_DONTWAIT, self.address)  # type: ignore[arg-type]
        except BlockingIOError:
            self.dropped += 1
            log.debug("sd_notify receiver is full; dropped %r", msg[:80])
        except OSError as exc:
            log.warning("sd_notify failed: %s", exc)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
