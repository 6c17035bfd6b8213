"""A file's whole-file digest (a signature's SHA-256, a registry blob's sha256) taken in order while its
ranges arrive out of order (:class:`InOrderDigest`), for :mod:`.fetch`'s downloads."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from ...errors import IntegrityError

READ_BACK = 4 << 20   # bytes read back from the file at a time (what arrived ahead of the hashed prefix)


class InOrderDigest:
    """A file's whole-file digest (a signature's SHA-256) taken in order while its ranges arrive out of
    order, in no memory beyond the hash: the range that begins where the hashed prefix ends is hashed
    as it streams (the one "live" range); a range that arrives ahead of the prefix, and bytes not
    downloaded (parts already here), are read back from the file (the page cache) once the prefix
    reaches them. ``read_back`` counts those bytes. Thread-safe (one live range at a time)."""

    def __init__(self, crypto: Callable[[], Any], fd: int, size: int, fetched: list[tuple[int, int]]) -> None:
        self.hasher, self.fd, self.size = crypto(), fd, size
        self.next = 0            # bytes hashed so far
        self.read_back = 0
        self.done: dict[int, int] = {}   # start -> end: in the file, not yet hashed
        pos = 0
        for s, e in sorted(fetched):
            if s > pos:
                self.done[pos] = s
            pos = max(pos, e)
        if self.size > pos:
            self.done[pos] = self.size
        self._live = False
        self._saved: Any = None
        self._lock = threading.Lock()

    def begin(self, start: int) -> Callable[[Any], None] | None:
        """The hash's update to feed this range's bytes to as they stream, when it begins at the
        prefix (else None: it is read back once the prefix reaches it)."""
        with self._lock:
            self._drain()
            if self._live or self.next != start:
                return None
            self._live, self._saved = True, self.hasher.copy()
            return self.hasher.update

    def finish(self, start: int, end: int, live: bool) -> None:
        with self._lock:
            if live:
                self.next, self._live = end, False
            else:
                self.done[start] = end
            self._drain()

    def abort(self, live: bool) -> None:
        """The live range failed midway (asked again): the hash as it was where the range began."""
        if live:
            with self._lock:
                self.hasher, self._live = self._saved, False

    def hexdigest(self) -> str:
        with self._lock:
            self._drain()
            assert self.next == self.size and not self.done, (self.next, self.size, self.done)
            return self.hasher.hexdigest()

    def _drain(self) -> None:
        while not self._live and self.next in self.done:
            end = self.done.pop(self.next)
            while self.next < end:
                piece = os.pread(self.fd, min(READ_BACK, end - self.next), self.next)
                if not piece:
                    raise IntegrityError(f"{self.size}-byte file ends at {self.next} while its digest is taken")
                self.hasher.update(piece)
                self.next += len(piece)
                self.read_back += len(piece)
