"""The CLI's side of the admin API: JSON over HTTP/1.1 on the daemon's unix socket, spoken by the
standard library's ``http.client`` (:class:`_Connection`: one request per connection, which connects
to the unix socket instead of a TCP port). What the daemon answers is read with limits (status and
header lines, header count, chunk and body sizes): an answer the client cannot read is one
:class:`~weightd.errors.BadAnswer`, a connection that ends in the middle of one is
``ConnectionResetError`` (a daemon going away: ``call_retrying`` asks again).

Neither end trusts the other blindly (design §13): the CLI checks who serves the socket
(``SO_PEERCRED``: root or the configured daemon user) before it sends anything, and the daemon uses
:func:`peer_credentials` and :func:`peer_groups` to decide who may change things.
"""

from __future__ import annotations

import errno
import http.client
import io
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from tiering import MAX_SECONDS  # (tiering's names load lazily: this one is tiering.content.units)

from .compat import stamped
from .errors import BadAnswer, DaemonError, DaemonUnavailable, SocketDenied, UntrustedDaemon

__all__ = ["BadAnswer", "DaemonClient", "DaemonError", "MAX_SECONDS", "UntrustedDaemon", "peer_credentials", "peer_groups"]

RECONNECT_S = 120.0  # a request without a --timeout waits this long for a daemon to come back
STREAM_SILENCE_S = 30.0  # a progress stream sends a line every 0.5 s: this long without one, the daemon is hung
LINE_LIMIT = 65536  # bytes of a chunk-size line (http.client bounds status and header lines alike, and counts headers)
MAX_CHUNK = 64 << 20  # bytes of one chunk of a chunked answer (the daemon's are one JSON line each)
MAX_BODY = 64 << 20  # bytes of an answer's Content-Length (http.client allocates it in one piece)
MAX_PROGRESS_LINE = 1 << 20  # bytes of one line of a progress stream

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


_HEX = frozenset(b"0123456789abcdefABCDEF")


class _Reader(io.BufferedReader):
    """The answer's bytes as http.client reads them, noting a line that the connection cut short
    (http.client takes the end of the connection for the end of the headers)."""

    cut = False

    def readline(self, size: int | None = -1) -> bytes:
        line = super().readline(size)
        if not line.endswith(b"\n") and (size is None or size < 0 or len(line) < size):
            self.cut = True
        return line


class _Answer(http.client.HTTPResponse):
    """http.client's response with this client's checks: headers cut short by the end of the connection
    (``ConnectionResetError``), headers that do not parse, a Content-Length that is not a number of at
    most MAX_BODY bytes, a chunk size that is not one of at most MAX_CHUNK bytes (``HTTPException``,
    told as :class:`BadAnswer`)."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = _Reader(self.fp.detach())   # (nothing read yet: the same socket, now counted by _Reader)

    def begin(self) -> None:
        reader = self.fp
        super().begin()
        if reader.cut:
            raise ConnectionResetError("the daemon closed the connection in the middle of its headers")
        if self.msg.defects:
            raise http.client.HTTPException(f"headers that do not parse ({type(self.msg.defects[0]).__name__})")
        lengths = [] if self.chunked else self.headers.get_all("content-length", [])
        if len(set(lengths)) > 1:
            raise http.client.HTTPException(f"{len(set(lengths))} different Content-Lengths")
        if lengths:
            text = lengths[0].strip()
            if not (text.isascii() and text.isdigit()):
                raise http.client.HTTPException(f"Content-Length {lengths[0][:80]!r}")
            if len(text) > 20 or int(text) > MAX_BODY:
                raise http.client.HTTPException(f"a Content-Length of {text[:20]} bytes (at most {MAX_BODY})")

    def _read_next_chunk_size(self) -> int:
        line = self.fp.readline(LINE_LIMIT + 1)
        if len(line) > LINE_LIMIT:
            raise http.client.LineTooLong("chunk size")
        if not line.endswith(b"\n"):
            raise ConnectionResetError("the daemon closed the connection in the middle of its answer")
        text = line.split(b";", 1)[0].strip()
        if not text or not _HEX.issuperset(text):
            raise http.client.HTTPException(f"not a chunk size: {line[:80]!r}")
        size = int(text, 16)
        if size > MAX_CHUNK:
            raise http.client.HTTPException(f"a chunk of {size} bytes (at most {MAX_CHUNK})")
        return size


class _Connection(http.client.HTTPConnection):
    """One request and its answer on a fresh connection to the daemon's unix socket, whose peer is
    checked when it connects (``SO_PEERCRED``: a trusted uid, else :class:`UntrustedDaemon` before
    anything is sent). The request goes in one write (http.client sends the head, then the body): the
    daemon reads it whole, and one that answers once it has the head still had the body."""

    response_class = _Answer

    def __init__(self, path: str, timeout: float | None, trusted_uids: frozenset[int]) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path
        self.trusted_uids = trusted_uids
        self._unsent: list[bytes] = []

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
            pid, uid, _ = peer_credentials(s)
        except OSError:
            s.close()
            raise
        if uid not in self.trusted_uids:
            s.close()
            want = " or ".join(f"uid {u}" for u in sorted(self.trusted_uids))
            raise UntrustedDaemon(f"{self.socket_path} is served by uid {uid} (pid {pid}), not {want} "
                                  f"([api] daemon_user); refusing to talk to it")
        self.sock = s

    def send(self, data: bytes) -> None:   # (http.client's request() calls it for the head, then the body)
        self._unsent.append(data)

    def ask(self, method: str, target: str, body: bytes | None = None) -> _Answer:
        """Send the request; the answer with its status and headers read."""
        headers = {"Connection": "close"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        self.request(method, target, body, headers)
        self.connect()
        self.sock.sendall(b"".join(self._unsent))
        return cast(_Answer, self.getresponse())


def _unreadable(exc: http.client.HTTPException) -> Exception:
    """What the client raises for what http.client raised while reading an answer: a connection that
    ended in the middle of it is ``ConnectionResetError``, anything else :class:`BadAnswer`."""
    if isinstance(exc, http.client.RemoteDisconnected):
        return ConnectionResetError("the daemon closed the connection without an answer")
    if isinstance(exc, http.client.IncompleteRead):
        return ConnectionResetError("the daemon closed the connection in the middle of its answer")
    if isinstance(exc, http.client.UnknownProtocol):
        return BadAnswer(f"not an HTTP/1.1 answer: {exc.args[0][:80]!r}")
    if isinstance(exc, http.client.BadStatusLine):
        return BadAnswer(f"not an HTTP/1.1 status line: {exc.line[:80]!r}")
    return BadAnswer(str(exc) or type(exc).__name__)


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
        conn = _Connection(str(self.socket_path), timeout, self.trusted_uids)
        try:
            with conn.ask(method, f"/v1/{route}",
                          json.dumps(stamped(body)).encode() if body is not None else None) as answer:
                status, data = answer.status, json.loads(answer.read() or b"null")
        except http.client.HTTPException as exc:
            raise _unreadable(exc) from None
        finally:
            conn.close()
        return self._answer(status, data)

    def stream(self, route: str, body: dict[str, Any], on_progress: Callable[[dict[str, Any]], None] | None) -> Any:
        """POST ``body`` with ``"stream": true`` and read the daemon's NDJSON answer: each progress
        line goes to ``on_progress``, the last line is the result (returned) or the error (raised as
        from :meth:`call`). A stream that ends without its last line, or stays silent for
        STREAM_SILENCE_S, is a lost daemon (``ConnectionResetError``: ``call_retrying`` asks again)."""
        conn = _Connection(str(self.socket_path), STREAM_SILENCE_S, self.trusted_uids)
        try:
            request = json.dumps(stamped({**body, "stream": True})).encode()
            with conn.ask("POST", f"/v1/{route}", request) as answer:
                if answer.status >= 400 or "ndjson" not in answer.headers.get("content-type", ""):
                    data = json.loads(answer.read() or b"null")
                    return self._answer(answer.status, data)
                while True:
                    try:
                        raw = answer.readline(MAX_PROGRESS_LINE)
                    except TimeoutError:
                        raise ConnectionResetError(f"the daemon sent nothing for {STREAM_SILENCE_S:.0f} s") from None
                    if not raw.endswith(b"\n"):
                        if len(raw) >= MAX_PROGRESS_LINE:
                            raise BadAnswer(f"a progress line longer than {MAX_PROGRESS_LINE} bytes")
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
        except http.client.HTTPException as exc:
            raise _unreadable(exc) from None
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
