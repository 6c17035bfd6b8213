"""``weightd hold``: keep one checkpoint version local for as long as this process runs.

The restart-safe way to serve from a node's tier (a native sidecar beside vLLM, docs/install.md "On
Kubernetes"): through the node daemon only (a container never copies into its own file system), it
preloads NAME@V, writes the path (atomically) once the copy is ready, and then renews its lease every
``every_s`` seconds, so the copy outlives every restart of the serving container. Each renewal is also
the check that the copy is still there: when it is gone (evicted with --force, deleted, a daemon that
came back without it), the path file is removed first, the version preloaded again and the path
rewritten, and stderr says so. A daemon that stops answering is asked again (the copy stays where it
is: nothing evicts it while no daemon runs). SIGTERM or SIGINT releases the lease, removes the path
file and ends with exit 0.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import DaemonError, Stopped, UsageError

#: while the daemon does not answer, ask it again this often (at most ``every_s``)
LOST_RETRY_S = 1.0
_LOST = (ConnectionRefusedError, FileNotFoundError, ConnectionResetError, BrokenPipeError, TimeoutError)


class Holder:
    """One held version. ``preload(ref)`` runs a preload through the daemon and returns its report
    (the path already checked); ``say`` writes a line on stderr; ``emit`` the path on stdout."""

    def __init__(self, client: Any, ref: str, *, tier: str, lease_s: float, every_s: float,
                 path_file: Path | None, preload: Callable[[str], dict[str, Any]],
                 say: Callable[[str], None], emit: Callable[[str], None]) -> None:
        self.client, self.ref, self.tier = client, ref, tier
        self.lease_s, self.every_s, self.path_file = lease_s, every_s, path_file
        self._preload, self.say, self.emit = preload, say, emit
        self.exact: str | None = None     # NAME@VERSION once resolved: a re-preload never moves to a newer one
        self.held_tier: str | None = None  # where the copy is (hot may fall back to warm)
        self.path: str | None = None

    # -- the path file -------------------------------------------------------------------------------
    def publish(self, path: str) -> None:
        """Write the path file atomically (a reader sees the old content, none, or the whole new line)."""
        self.path = path
        self.emit(path)
        if self.path_file is None:
            return
        tmp = self.path_file.with_name(f".{self.path_file.name}.{os.getpid()}.incomplete")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, f"{path}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path_file)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def unpublish(self) -> None:
        """Remove the path file, when it still says what this holder wrote (never a stale path)."""
        if self.path_file is None or self.path is None:
            return
        try:
            if self.path_file.read_text().strip() == self.path:
                self.path_file.unlink()
        except FileNotFoundError:
            pass

    # -- the loop ------------------------------------------------------------------------------------
    def load(self) -> None:
        r = self._preload(self.exact or self.ref)
        self.exact = f"{r['name']}@{r['version']}"
        self.held_tier = r["tier"]
        self.publish(r["path"])

    def run(self) -> None:
        """Preload, publish, then renew until a signal (:class:`Stopped`) or an error that ends it."""
        self.load()
        self.say(f"weightd hold: holding {self.exact} in {self.held_tier} at {self.path} (renewing a "
                 f"{self.lease_s:g} s lease every {self.every_s:g} s; SIGTERM releases it)")
        lost_since: float | None = None
        while True:
            time.sleep(min(self.every_s, LOST_RETRY_S) if lost_since is not None else self.every_s)
            try:
                r = self.client.hold(self.exact, tier=self.held_tier, lease_s=self.lease_s)
            except _LOST as exc:
                if lost_since is None:
                    lost_since = time.monotonic()
                    self.say(f"weightd hold: the node daemon does not answer ({type(exc).__name__}); "
                             f"{self.path} stays where it is; asking again")
                continue
            except DaemonError as exc:
                if not exc.retry:
                    raise
                if lost_since is None:
                    lost_since = time.monotonic()
                    self.say("weightd hold: the node daemon is restarting; asking again")
                continue
            if lost_since is not None:
                self.say(f"weightd hold: the node daemon answers again after {time.monotonic() - lost_since:.0f} s")
                lost_since = None
            if r.get("held"):
                if r.get("path") and r["path"] != self.path:  # (the same version, elsewhere: follow it)
                    self.unpublish()
                    self.publish(r["path"])
                continue
            self.say(f"weightd hold: {self.exact} is gone from the {self.held_tier} tier (evicted or deleted); "
                     f"removed {self.path_file or 'the path'} and preloading it again")
            self.unpublish()
            self.path = None
            self.load()
            self.say(f"weightd hold: {self.exact} is ready again in {self.held_tier} at {self.path}")

    def release(self) -> None:
        """Drop the lease (best effort: a daemon that does not answer lets it expire) and the path file."""
        self.unpublish()
        if self.exact is None or self.held_tier is None:
            return
        try:
            self.client.hold(self.exact, tier=self.held_tier, lease_s=0)
            self.say(f"weightd hold: released {self.exact} in {self.held_tier}")
        except (*_LOST, DaemonError, OSError, ValueError) as exc:
            self.say(f"weightd hold: could not release the lease on {self.exact} ({exc}); it expires within "
                     f"{self.lease_s:g} s")


def on_stop_signals() -> None:
    """SIGTERM and SIGINT raise :class:`Stopped` once (a second signal during the release is ignored)."""
    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise Stopped()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def check_options(lease_s: float, every_s: float, path_file: str | None) -> Path | None:
    """Bad options end before anything is asked of the daemon (exit 2, one line)."""
    if lease_s <= 0:
        raise UsageError("--lease must be more than 0 s: the lease is what keeps the copy from eviction")
    if not 0 < every_s < lease_s:
        raise UsageError(f"--every {every_s:g} must be more than 0 and less than --lease {lease_s:g}, or the "
                         f"lease lapses between renewals")
    if path_file is None:
        return None
    p = Path(path_file)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"--path-file {path_file}: directory {parent} does not exist")
    if p.is_dir():
        raise UsageError(f"--path-file {path_file}: is a directory")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--path-file {path_file}: directory {parent} is not writable by this user")
    return p
