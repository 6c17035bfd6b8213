"""A file's manifest parts checked as its bytes stream past (:class:`PartCheck`): what the one-pass copy
(:mod:`tiering.verified_copy`) hashes each buffer with before it writes it."""

from __future__ import annotations

from typing import Any, Callable

import xxhash

from ..errors import ChecksumMismatch, FileChanged

class PartCheck:
    """The manifest's parts of one file checked as its bytes stream past, in order (a copy's bytes,
    hashed from the very buffer they are written from: no second read). Each part's xxh3-128 is
    compared as its last byte arrives (:class:`ChecksumMismatch` at once, before the rest is read), the
    file's tree hash at :meth:`finish`; with ``crypto`` (a hasher factory, e.g. ``hashlib.sha256``) the
    file's digest for a signature is taken over the same bytes. Parts may come in any order in the
    manifest (a safetensors header lists tensors as it likes); bytes no part covers (padding) count for
    the crypto digest only, as they do for a signature."""

    __slots__ = ("path", "entry", "parts", "order", "first", "open", "digests", "crypto", "fed")

    def __init__(self, path: str, entry: Any, chunk_size: int, crypto: Callable[[], Any] | None = None) -> None:
        self.path, self.entry = path, entry
        self.parts = entry.parts(chunk_size)
        self.order = sorted(range(len(self.parts)), key=lambda k: (self.parts[k].begin, self.parts[k].end))
        self.first = 0                        # (in ``order``: every part before it is checked)
        self.open: dict[int, Any] = {}        # part index -> its running hasher
        self.digests: list[str | None] = [None] * len(self.parts)
        self.crypto = crypto() if crypto is not None else None
        self.fed = 0

    def update(self, chunk: "memoryview | bytes", off: int) -> None:
        """The file's bytes ``[off, off + len(chunk))``; every call continues where the last ended."""
        if off != self.fed:
            raise ValueError(f"{self.path}: bytes fed out of order (at {off}, expected {self.fed})")
        end = off + len(chunk)
        self.fed = end
        if self.crypto is not None:
            self.crypto.update(chunk)
        parts, order = self.parts, self.order
        i = self.first
        while i < len(order):
            k = order[i]
            p = parts[k]
            if p.begin >= end:
                break
            if self.digests[k] is None:
                lo, hi = max(p.begin, off), min(p.end, end)
                if p.end <= end and lo == p.begin:   # the whole part in this chunk: one call
                    self._check(k, xxhash.xxh3_128_hexdigest(chunk[lo - off:hi - off]))
                else:
                    h = self.open.get(k)
                    if h is None:
                        h = self.open[k] = xxhash.xxh3_128()
                    if hi > lo:
                        h.update(chunk[lo - off:hi - off])
                    if p.end <= end:
                        del self.open[k]
                        self._check(k, h.hexdigest())
            i += 1
        while self.first < len(order) and self.digests[order[self.first]] is not None:
            self.first += 1

    def _check(self, k: int, got: str) -> None:
        p = self.parts[k]
        if got != p.xxh3_128:
            raise ChecksumMismatch(self.path, p.label, str(p.xxh3_128), got)
        self.digests[k] = got

    def finish(self) -> str | None:
        """After the file's last byte: the parts not closed yet (empty ones), the file's tree hash
        (ChecksumMismatch), and the crypto digest (hex) when asked for."""
        from .manifest import tree_hash
        if self.fed != self.entry.size:
            raise FileChanged(self.path, f"{self.fed} bytes read, expected {self.entry.size}")
        for k, d in enumerate(self.digests):
            if d is None:
                h = self.open.pop(k, None)
                self._check(k, h.hexdigest() if h is not None else xxhash.xxh3_128_hexdigest(b""))
        tree = tree_hash([d for d in self.digests if d is not None])
        if tree != self.entry.xxh3_128:
            raise ChecksumMismatch(self.path, "file", self.entry.xxh3_128, tree)
        return self.crypto.hexdigest() if self.crypto is not None else None
