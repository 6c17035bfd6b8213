"""The CLI's side of the admin API: JSON over HTTP/1.1 on the daemon's unix socket. The few lines of
HTTP it needs are here (:class:`_Exchange`: one request per connection, ``Content-Length`` or chunked
answers): the standard library's ``http.client`` costs ~10 ms of imports (``email``, ``ssl``), a
quarter of the start-up budget of ``weightd path`` and ``status``.

Neither end trusts the other blindly (design §13): the CLI checks who serves the socket
(``SO_PEERCRED``: root or the configured daemon user) before it sends anything, and the daemon uses
:func:`peer_credentials` and :func:`peer_groups` to decide who may change things.
"""

from __future__ import annotations

import errno
import json
import os
import struct

import _socket as socket   # (the C module: ``socket.py`` costs ~3 ms of imports, its enums and makefile unused)
import sys
import time

TYPE_CHECKING = False   # (typing costs ~3 ms of a start: annotations only)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Callable, Iterable

from tiering import MAX_SECONDS  # (tiering.content.units: a light module, the client stays fast to start)

from .compat import stamped
from .errors import BadAnswer, DaemonError, DaemonUnavailable, SocketDenied, UntrustedDaemon

__all__ = ["BadAnswer", "DaemonClient", "DaemonError", "MAX_SECONDS", "UntrustedDaemon", "peer_credentials", "peer_groups"]

RECONNECT_S = 120.0  # a request without a --timeout waits this long for a daemon to come back
STREAM_SILENCE_S = 30.0  # a progress stream sends a line every 0.5 s: this long without one, the daemon is hung
MAX_HEADERS = 100  # header lines an answer may have
LINE_LIMIT = 65537  # bytes of one status or header line, its newline included
MAX_CHUNK = 64 << 20  # bytes of one chunk of a chunked answer (the daemon's are one JSON line each)

_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13


def peer_credentials(sock: Any) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the other end of a connected unix socket, as the kernel recorded them at
    connect time (pid 0 when the peer is in another pid namespace)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_groups(sock: Any, pid: int, uid: int, gid: int) -> frozenset[int]:
    """The peer's primary and supplementary groups: ``SO_PEERGROUPS`` (as at connect time), else the
    ``Groups:`` line of /proc/<pid>/status, else the user database's list for that uid."""
    groups: set[int] = {gid}
    for size in (256, 65536):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 4 * size)
            return frozenset(groups | set(struct.unpack(f"{len(raw) // 4}I", raw)))
        except OSError as exc:
            if exc.errno != errno.ERANGE:
                break
    if pid > 0:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("Groups:"):
                        return frozenset(groups | {int(g) for g in line.split()[1:]})
        except (OSError, ValueError):
            pass
    try:
        import pwd
        return frozenset(groups | set(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)))
    except (KeyError, OSError):
        return frozenset(groups)


class _Exchange:
    """One request and its answer on a fresh connection to the daemon's unix socket, whose peer is
    checked first (``SO_PEERCRED``: a trusted uid, else :class:`UntrustedDaemon` before anything is
    sent). A connection closed before or in the middle of the answer is ``ConnectionResetError``."""

    def __init__(self, path: str, timeout: float | None, trusted_uids: frozenset[int]) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            pid, uid, _ = peer_credentials(s)
        except OSError:
            s.close()
            raise
        if uid not in trusted_uids:
            s.close()
            want = " or ".join(f"uid {u}" for u in sorted(trusted_uids))
            raise UntrustedDaemon(f"{path} is served by uid {uid} (pid {pid}), not {want} "
                                  f"([api] daemon_user); refusing to talk to it")
        self.sock = s
        self._in = b""   # (received, not yet parsed)
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunked = False
        self._left: int | None = None   # (bytes of the body still to read; None: until the end)
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        self._in += data
        return bool(data)

    def _line(self, limit: int = LINE_LIMIT) -> bytes:
        """The next line received (with its newline; without one: the connection ended first)."""
        while b"\n" not in self._in and len(self._in) < limit and self._fill():
            pass
        end = self._in.find(b"\n", 0, limit)
        end = min(limit, len(self._in)) if end < 0 else end + 1
        line, self._in = self._in[:end], self._in[end:]
        return line

    def _exactly(self, n: int) -> bytes:
        """``n`` bytes received (fewer: the connection ended first)."""
        while len(self._in) < n and self._fill():
            pass
        data, self._in = self._in[:n], self._in[n:]
        return data

    def _some(self, n: int) -> bytes:
        """Up to ``n`` bytes received (b"": the connection ended)."""
        if not self._in:
            self._fill()
        data, self._in = self._in[:n], self._in[n:]
        return data

    def request(self, method: str, target: str, body: bytes | None = None) -> None:
        head = f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: identity\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode("ascii") + b"\r\n" + (body or b""))
        line = self._line()
        if not line:
            raise ConnectionResetError("the daemon closed the connection without an answer")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise BadAnswer(f"not an HTTP/1.1 status line: {line[:80]!r}")
        self.status = int(parts[1])
        for _ in range(MAX_HEADERS + 1):
            line = self._line()
            if not line.endswith(b"\n"):
                if len(line) >= LINE_LIMIT:
                    raise BadAnswer(f"a header line longer than {LINE_LIMIT - 1} bytes")
                raise ConnectionResetError("the daemon closed the connection in the middle of its headers")
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise BadAnswer(f"not an HTTP header: {line[:80]!r}")
            self.headers[name.strip().lower()] = value.strip()
        else:
            raise BadAnswer(f"more than {MAX_HEADERS} header lines")
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in self.headers:
            try:
                self._left = int(self.headers["content-length"])
            except ValueError:
                raise BadAnswer(f"Content-Length {self.headers['content-length']!r}") from None
            if self._left < 0:
                raise BadAnswer(f"Content-Length {self._left}")
        if method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self._left = 0

    def _more(self) -> bytes:
        """The next piece of the body (b"" at its end)."""
        if self._chunked:
            line = self._line()
            if not line.endswith(b"\n"):
                raise ConnectionResetError("the daemon closed the connection in the middle of its answer")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadAnswer(f"not a chunk size: {line[:80]!r}") from None
            if size > MAX_CHUNK:
                raise BadAnswer(f"a chunk of {size} bytes (at most {MAX_CHUNK})")
            if size == 0:
                self._chunked, self._left = False, 0
                while self._line() not in (b"\r\n", b"\n", b""):   # (trailers)
                    pass
                return b""
            data = self._exactly(size)
            if len(data) < size or self._line(3) not in (b"\r\n", b"\n"):
                raise ConnectionResetError("the daemon closed the connection in the middle of its answer")
            return data
        if self._left is None:
            return self._some(1 << 16)
        if self._left == 0:
            return b""
        data = self._some(min(self._left, 1 << 16))
        if not data:
            raise ConnectionResetError("the daemon closed the connection in the middle of its answer")
        self._left -= len(data)
        return data

    def read(self) -> bytes:
        """The rest of the body."""
        parts = [self._buf]
        self._buf = b""
        while data := self._more():
            parts.append(data)
        return b"".join(parts)

    def readline(self, limit: int) -> bytes:
        """The next line of the body, with its newline (without one: the body ended first)."""
        while b"\n" not in self._buf and len(self._buf) < limit:
            data = self._more()
            if not data:
                break
            self._buf += data
        end = self._buf.find(b"\n", 0, limit)
        end = limit if end < 0 else end + 1
        line, self._buf = self._buf[:end], self._buf[end:]
        return line


class DaemonClient:
    def __init__(self, socket_path: Path, trusted_uids: Iterable[int] | None = None) -> None:
        """``trusted_uids``: who may serve the socket (default: root and this process's euid)."""
        self.socket_path = socket_path
        self.trusted_uids = frozenset({0, os.geteuid()} if trusted_uids is None else {0, *trusted_uids})
        self.health: Any = None

    def available(self) -> bool:
        """True when a daemon answers on the socket (a stale socket file does not count); a socket served
        by an untrusted uid raises :class:`UntrustedDaemon` instead of counting as "no daemon", one this
        user may not connect to raises :class:`SocketDenied`. ``health`` keeps what the daemon said."""
        try:
            if not self.socket_path.exists():  # (raises PermissionError for a directory we may not enter)
                return False
            self.health = self.call("GET", "health", timeout=5)
            return True
        except PermissionError:
            raise SocketDenied(self.socket_path) from None
        except (OSError, DaemonError, ValueError):
            return False

    def call(self, method: str, route: str, body: dict[str, Any] | None = None, *,
             timeout: float | None = None) -> Any:
        conn = _Exchange(str(self.socket_path), timeout, self.trusted_uids)
        try:
            conn.request(method, f"/v1/{route}", json.dumps(stamped(body)).encode() if body is not None else None)
            data = json.loads(conn.read() or b"null")
        finally:
            conn.close()
        return self._answer(conn.status, data)

    def stream(self, route: str, body: dict[str, Any], on_progress: Callable[[dict[str, Any]], None] | None) -> Any:
        """POST ``body`` with ``"stream": true`` and read the daemon's NDJSON answer: each progress
        line goes to ``on_progress``, the last line is the result (returned) or the error (raised as
        from :meth:`call`). A stream that ends without its last line, or stays silent for
        STREAM_SILENCE_S, is a lost daemon (``ConnectionResetError``: ``call_retrying`` asks again)."""
        conn = _Exchange(str(self.socket_path), STREAM_SILENCE_S, self.trusted_uids)
        try:
            conn.request("POST", f"/v1/{route}", json.dumps(stamped({**body, "stream": True})).encode())
            if conn.status >= 400 or "ndjson" not in conn.headers.get("content-type", ""):
                data = json.loads(conn.read() or b"null")
                return self._answer(conn.status, data)
            while True:
                try:
                    raw = conn.readline(1 << 20)
                except TimeoutError:
                    raise ConnectionResetError(f"the daemon sent nothing for {STREAM_SILENCE_S:.0f} s") from None
                if not raw.endswith(b"\n"):
                    raise ConnectionResetError("the daemon closed the progress stream before the result")
                line = json.loads(raw)
                if not isinstance(line, dict):
                    continue
                if "progress" in line:
                    if on_progress is not None and isinstance(line["progress"], dict):
                        on_progress(line["progress"])
                    continue
                if "result" in line:
                    return line["result"]
                return self._answer(500, line)
        finally:
            conn.close()

    def streams(self) -> bool:
        """Does the daemon stream progress? (An older one answers once, at the end: a new CLI during a
        rollout must not take its silence for a hung daemon.) Asked once, by ``health``."""
        if self.health is None:
            try:
                self.health = self.call("GET", "health", timeout=5)
            except (OSError, DaemonError, ValueError):
                return True  # (no answer now: the stream's own reconnecting decides)
        return isinstance(self.health, dict) and "stream" in (self.health.get("features") or ())

    @staticmethod
    def _answer(status: int, data: Any) -> Any:
        if status < 400:
            return data
        err = data if isinstance(data, dict) else {}
        hint = err.get("hint")
        raise DaemonError(str(err.get("error", f"daemon answered HTTP {status}")),
                          int(err.get("exit_code", 1)), hint if isinstance(hint, str) else None,
                          retry=err.get("retry") is True)

    def call_retrying(self, method: str, route: str, body: dict[str, Any], *, timeout_s: float | None,
                      what: str, on_progress: Callable[[dict[str, Any]], None] | None = None,
                      streamed: bool = False) -> Any:
        """``call`` for an idempotent request that must outlive a daemon restart (a rollout, ``systemctl
        restart``): a daemon that answers "stopping", goes away mid-request, or is not there yet is asked
        again, with back-off, until ``timeout_s`` (the request's own budget, passed on as what is left) or,
        without one, RECONNECT_S without a daemon. Says so once on stderr."""
        start = time.monotonic()
        deadline = None if timeout_s is None else start + timeout_s
        lost_at: float | None = None
        delay, said = 0.2, False
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            b = dict(body)
            if left is not None:
                b["timeout_s"] = left
            def heard(snap: dict[str, Any]) -> None:  # a daemon answered: the next loss gets a fresh budget
                nonlocal lost_at, delay
                lost_at, delay = None, 0.2
                if on_progress is not None:
                    on_progress(snap)
            try:
                if streamed and self.streams():
                    return self.stream(route, b, heard)
                return self.call(method, route, b, timeout=None if left is None else left + 60)
            except DaemonError as exc:
                if not exc.retry:
                    raise
                reason = "the daemon is restarting"
            except (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError) as exc:
                reason = f"the daemon went away ({type(exc).__name__})"
            now = time.monotonic()
            lost_at = lost_at or now
            if (deadline is not None and now + delay >= deadline) or (deadline is None and now - lost_at > RECONNECT_S):
                err = DaemonUnavailable(f"{what}: {reason}, and no daemon answered on {self.socket_path} "
                                        f"{'before the --timeout' if deadline is not None else f'within {RECONNECT_S:.0f} s'}")
                if deadline is not None:
                    err.exit_code = 4  # (the request's own --timeout ran out: as a preload that timed out)
                raise err
            if not said:
                print(f"weightd: {what}: {reason}; asking again until "
                      f"{'the --timeout' if deadline is not None else 'a daemon answers'}", file=sys.stderr)
                said = True
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- the operations, named as on weightd.node.service.NodeService -------------------------------------
    def publish(self, src: str | Path, name: str, version: str, *, sign_key: str | None = None,
                signature: str | None = None, companion: dict[str, str] | None = None, **_: Any) -> Any:
        body: dict[str, Any] = {"dir": os.path.abspath(src), "name": name, "version": version}
        if companion is not None:
            body["companion"] = companion
        if sign_key:
            body["sign_key"] = sign_key
        if signature:
            body["signature"] = signature
        return self.call("POST", "publish", body)

    def preload(self, ref: str, *, on_progress: Callable[[dict[str, Any]], None] | None = None, **kw: Any) -> Any:
        """``kw``: tier, strict, lease_s (absent: the daemon's default), timeout_s, wait. The answer
        is streamed: ``on_progress`` gets each progress snapshot, and a hung daemon is noticed."""
        kw.pop("progress", None)
        t = kw.get("timeout_s")
        budget = t if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < float("inf") else None
        return self.call_retrying("POST", "preload", {"ref": ref, **kw}, timeout_s=budget, what=f"preload {ref}",
                                  on_progress=on_progress, streamed=True)

    def preload_set(self, refs: list[str], **kw: Any) -> Any:
        """Every model of a set as one request (``kw`` as for preload); one summary back."""
        t = kw.get("timeout_s")
        budget = t if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < float("inf") else None
        return self.call_retrying("POST", "preload-set", {"refs": refs, **kw}, timeout_s=budget,
                                  what=f"preload of a set of {len(refs)}")

    def hold(self, ref: str, *, tier: str, lease_s: float) -> Any:
        """Renew this process's lease on NAME@V's copy in ``tier`` (``lease_s`` 0: release it); ``held``
        False: the copy is gone. Needs a daemon whose health lists the "hold" feature."""
        return self.call("POST", "hold", {"ref": ref, "tier": tier, "lease_s": lease_s}, timeout=30)

    def path(self, ref: str, **kw: Any) -> Any:
        """``kw``: selection, whole, companion (as for preload)."""
        return self.call("POST", "path", {"ref": ref, **{k: v for k, v in kw.items() if v not in (None, False)}})

    def status(self) -> Any:
        return self.call("GET", "status")

    def check_cold(self) -> Any:
        return self.call("GET", "check-cold", timeout=60)

    def versions(self, name: str | None = None) -> Any:
        return self.call("POST", "versions", {"name": name})

    def pin(self, ref: str) -> Any:
        return self.call("POST", "pin", {"ref": ref})

    def unpin(self, ref: str) -> Any:
        return self.call("POST", "unpin", {"ref": ref})

    def evict(self, ref: str, tier: str | None = None, force: bool = False, all_versions: bool = False) -> Any:
        return self.call("POST", "evict", {"ref": ref, "tier": tier, "force": force, "all": all_versions})

    def gc(self) -> Any:
        return self.call("POST", "gc", {})
