"""The CLI's side of the admin API: JSON over HTTP on the daemon's unix socket (standard library only,
so commands that talk to the daemon start fast)."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any

from .errors import WeightdError


class DaemonError(WeightdError):
    """An error the daemon reported; carries its exit code so the CLI behaves the same either way."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


class DaemonClient:
    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path

    def available(self) -> bool:
        """True when a daemon answers on the socket (a stale socket file does not count)."""
        if not self.socket_path.exists():
            return False
        try:
            self.call("GET", "health", timeout=5)
            return True
        except (OSError, DaemonError, http.client.HTTPException, ValueError):
            return False

    def call(self, method: str, route: str, body: dict[str, Any] | None = None, *,
             timeout: float | None = None) -> Any:
        conn = _UnixConnection(str(self.socket_path), timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, f"/v1/{route}", body=payload,
                         headers={"Content-Type": "application/json"} if payload is not None else {})
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"null")
        finally:
            conn.close()
        if resp.status >= 400:
            err = data if isinstance(data, dict) else {}
            raise DaemonError(str(err.get("error", f"daemon answered HTTP {resp.status}")),
                              int(err.get("exit_code", 1)))
        return data
