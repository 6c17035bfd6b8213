"""The swarm as a transfer source: tiering's ``Fetcher`` protocol, ``fetch(FetchRequest) -> FetchResult``.

For a P2P-sized version with a torrent beside it, download from the swarm (starting at ``peers``, the
origins; workers find each other by peer exchange and the tracker) into the staging area ``LocalNode``
opened, then hand it back filled, and the node publishes it atomically, as for any source.

Whether the node reads the files back to check them against the manifest (``FetchResult.verified``):
libtorrent has checked every piece it wrote, and every donor piece it kept, against the torrent's
SHA-256 merkle trees. That check is the manifest's when the torrent is **bound** to it (``bound_to``:
made by ``make_torrent`` from bytes checked against this manifest in the same read) and the version is
**unsigned** (a torrent beside the manifest in cold storage is then exactly as trusted as the manifest:
whoever can rewrite one can rewrite the other). So the read-back is skipped when the torrent is bound,
the version has no signature beside it, libtorrent confirmed its writes were flushed, and the staged
files are exactly the manifest's names and sizes (a walk, no read). Otherwise (a torrent made by
another tool or an older weightd, a signed version: its signature covers each file's SHA-256, not the
torrent) the node reads every file back and checks it; bytes that fail there mark the torrent bad
(``bad_torrents``: not used again by this daemon) and the node copies from cold.

If no peer delivers for ``fallback_after_s`` (or libtorrent fails the transfer) the fetcher leaves the
staging area as it found it and says so, and the node copies from cold.
With fleet TLS (``P2PConfig.tls``), a torrent that carries no CA or another CA than the fleet's is not
used at all: the same fallback, with the reason.

Staging, step by step (every step by directory descriptor, never by a path that could be swapped):

1. ``mark_resumable()``: a crash keeps the verified pieces for the next try;
2. libtorrent writes under ``staging/<version>/`` (the torrent's root is the version label), a directory
   weightd made inside its own staging area, which no one else can write;
3. with a delta plan, donor bytes are pre-filled at their new offsets first (their pieces then pass
   libtorrent's check and only the rest moves);
4. ``fsync_tree(files=True)``: durable before anything leaves the inner directory (libtorrent does not
   fsync), then every file is renamed up into the staging directory itself, the ``.pad`` files dropped.

A partial copy (``FetchRequest.files``: some files of the published version ``source``) is the same
download of the whole version's torrent with the other files at priority 0: only its files' pieces are
asked for, counted (progress, bytes by source) and waited for; every file starts at a piece boundary
(``subset_of`` checks it), so none of their pieces carries another file's bytes; only its files are
renamed up. The threshold applies to the bytes it wants.

An expert-parallel copy (``FetchRequest.ranges``: byte ranges of some files, its kept tensors) narrows
that to the pieces covering those ranges (``subset_of(..., ranges)``; libtorrent's piece priorities):
the staged files are sparse, whole-sized, holes where no piece was asked for. Its pieces pass
libtorrent's SHA-256 check, and the caller repacks from them checking every tensor against the
manifest (``verified`` stays False; its ``reject`` is for bytes that fail there). A range's edges bring
whole pieces: at most a piece more per range than the bytes kept, neighbours' bytes the repack skips.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from tiering import (DIR_MODE, DeltaPlan, Dir, FetchRequest, FetchResult, Manifest, SourceFallback, TieringError,
                     is_whole, prefill_delta, scan_dir, set_phase)

from .config import P2PConfig
from .errors import P2PError, TorrentRejected
from .seeding import is_signed, read_bound_torrent
from .torrent import Subset, fleet_mismatch, subset_of

if TYPE_CHECKING:
    import libtorrent as lt

    from .session import P2PSession
    from .transfer import DownloadResult

log = logging.getLogger(__name__)


class P2PFetcher:
    def __init__(self, config: P2PConfig, session: "P2PSession | None" = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.clock = config, clock
        self._session = session
        self.own_session = session is None

    @property
    def session(self) -> "P2PSession":
        if self._session is None:  # in-process CLI use: a session for this download only
            from .session import P2PSession
            self._session = P2PSession(self.config)
        return self._session

    def close(self) -> None:
        if self.own_session and self._session is not None:
            self._session.close()
            self._session = None

    def fetch(self, request: FetchRequest) -> FetchResult:
        src, cfg = request.source, self.config
        if not is_whole(src):   # (a companion artefact: an object of its own, never a torrent)
            return FetchResult(False)
        wanted = _wanted_bytes(request)
        if wanted < cfg.threshold or not cfg.peers:
            return FetchResult(False)
        try:
            got = read_bound_torrent(src)
        except TorrentRejected as exc:
            log.warning("not using P2P for %s: %s", src.ref, exc)
            return FetchResult(False, fallback=SourceFallback("p2p", "cold", str(exc)))
        if got is None:
            return FetchResult(False)
        ti, bound = got
        subset, problem = _subset(request, ti, cfg)
        key = str(ti.info_hashes().get_best())
        if problem is None and key in self.session.bad_torrents:
            problem = (f"its torrent ({key[:16]}) gave bytes that fail the manifest before: it describes other bytes "
                       "than the version (replaced in cold storage?), so the swarm is not asked for it again")
        if problem is not None:
            log.warning("not using P2P for %s, copying from cold instead: %s", src.ref, problem)
            return FetchResult(False, fallback=SourceFallback("p2p", "cold", problem))
        if subset is None or not subset.ranged:   # (ranged: sparse files its caller removes, never resumed)
            request.staging.mark_resumable()
        set_phase(request.progress, "copy", source="p2p", total=subset.bytes if subset is not None else wanted)
        try:
            result = self._download(request, ti, subset)
        except P2PError as exc:  # (TransferStalled, TransferFailed, LibtorrentError, ...)
            log.warning("P2P download of %s failed, copying from cold instead: %s", src.ref, exc)
            request.staging.dir.remove(src.version)
            return FetchResult(False, fallback=SourceFallback("p2p", "cold", str(exc)))
        request.staging.dir.remove(src.version)
        origin, peers = result.split({e.rpartition(":")[0] for e in cfg.peers})
        session = self.session

        def reject(why: str) -> str:
            """The node found these bytes are not the manifest's. Every block passed the torrent's SHA-256
            hashes (libtorrent checks each, and bans a peer that sends one that fails), so it is the torrent
            that describes other bytes (a cold writer replaced it), not a peer that lied: no peer is banned
            (honest ones seeding that torrent would be), the torrent is not used again by this daemon."""
            session.bad_torrents.add(key)
            return f"; the torrent {key[:16]} describes other bytes than the manifest: not used again"
        # (ranged: sparse files; the caller checks every tensor it takes from them)
        verified = not (subset is not None and subset.ranged) and \
            _checked_by_libtorrent(src, bound, result.flushed, request.staging.dir, subset)
        log.debug("p2p: %s downloaded, %s", src.ref, "checked by libtorrent against a torrent bound to the manifest"
                  if verified else "to be read back and checked against the manifest")
        return FetchResult(True, {"origin": origin, "peer": peers, "local_reuse": result.local_bytes},
                           verified=verified, reject=reject,
                           swarm={"seconds": round(result.seconds, 2), "read_back": not verified,
                                  **result.trace.to_dict()})

    def _download(self, request: FetchRequest, ti: "lt.torrent_info", subset: Subset | None) -> "DownloadResult":
        """Download into ``staging/<version>/`` and move the files up into the staging directory; the
        inner directory is closed (not removed) on the way out, whatever happens."""
        src, staging, deadline, cfg = request.source, request.staging, request.deadline, self.config
        with staging.dir.sub(src.version, create=True, mode=DIR_MODE) as inner:
            delta = request.delta
            if delta is not None and subset is not None:   # (donor bytes for the files it wants only)
                delta = DeltaPlan(delta.target, delta.donors,
                                  [fp for fp in delta.files if fp.entry.path in subset.files])
            if delta is not None:
                # donor bytes at their new offsets: libtorrent's check passes their pieces, only the rest
                # moves (a donor that rotted just fails its pieces, which are then downloaded)
                prefill_delta(delta, inner, deadline=deadline)
            timeout_s = None if deadline is None else max(1.0, deadline - self.clock())
            result = self.session.download(ti, staging.path / src.version, peers=cfg.peers,
                                           stall_s=cfg.fallback_after_s, timeout_s=timeout_s,
                                           progress=request.progress,
                                           files=subset.files if subset is not None else None,
                                           ranges=request.ranges if subset is not None and subset.ranged else None)
            _move_up(inner, staging.dir, subset.files if subset is not None else None)
            if subset is not None and subset.ranged:
                _whole_sized(staging.dir, src.manifest, subset.files)
        return result


def _wanted_bytes(request: FetchRequest) -> int:
    """The bytes a request wants (the threshold applies to them): the version's, its files', or the
    bytes of its ranges (an expert-parallel copy's kept tensors; the pieces around them are not counted)."""
    src, files, ranges = request.source, request.files, request.ranges
    if files is None:
        return int(src.size)
    return sum(sum(e - b for b, e in ranges[f.path]) if ranges is not None and f.path in ranges else f.size
               for f in src.manifest.files if f.path in files)


def _subset(request: FetchRequest, ti: "lt.torrent_info", cfg: P2PConfig) -> "tuple[Subset | None, str | None]":
    """The pieces a request wants (None: every piece), or why the torrent cannot serve it: with fleet TLS
    only torrents made with the fleet CA; a partial copy's files must start at piece boundaries."""
    problem = fleet_mismatch(ti, cfg.tls)
    if problem is not None or request.files is None:
        return None, problem
    try:
        return subset_of(ti, request.files, request.ranges), None
    except TorrentRejected as exc:
        return None, str(exc)


def _staged_as_listed(staging: Dir, m: Manifest, subset: Subset | None) -> bool:
    """The staging directory holds exactly the manifest's files (a partial copy: its files), each with
    its size, and nothing else: read from the directory entries and inodes, not from the files."""
    want = sorted((f.path, f.size) for f in m.files if subset is None or f.path in subset.files)
    try:
        have = sorted((f.relpath, f.size) for f in scan_dir(staging))
    except (OSError, TieringError) as exc:
        log.warning("p2p: cannot list the staged files (%s): they are read back and checked", exc)
        return False
    if have != want:
        log.warning("p2p: the staged files are not the manifest's (%d staged, %d listed): they are read back and "
                    "checked", len(have), len(want))
        return False
    return True


def _move_up(inner: Dir, staging: Dir, files: frozenset[str] | None = None) -> None:
    """Durable, then every file renamed up into the staging directory, the ``.pad`` files dropped;
    with ``files`` (a partial copy), anything else is dropped too (libtorrent writes no file at
    priority 0: none is expected)."""
    # durable before it is renamed into place, as copies are: libtorrent does not fsync
    inner.fsync_tree(files=True)
    if files is not None:
        stray = [rel for rel, _ in inner.walk_files() if rel not in files and not rel.startswith(".pad/")]
        for rel in stray:
            inner.unlink(rel)
        if stray:
            log.warning("p2p: %d file(s) not in the partial copy were written, dropped (first: %s)", len(stray),
                        stray[0])
        tops = {f.split("/", 1)[0] for f in files}
    for child, _ in inner.entries():  # move the files up into the staging directory itself
        if child == ".pad" or (files is not None and child not in tops):
            inner.remove(child)
            continue
        inner.rename(child, staging, child)


def _whole_sized(staging: Dir, m: Manifest, files: frozenset[str]) -> None:
    """Every file of a ranged download at its manifest size: libtorrent leaves out a file it wrote no
    piece of (and may stop one short of its end); the holes read as zeros, which fail the check of any
    byte the caller takes from them."""
    for f in m.files:
        if f.path not in files:
            continue
        st = staging.lstat(f.path)
        if st is not None and st.st_size >= f.size:
            continue
        fd = staging.create(f.path, 0o600, exclusive=False)
        try:
            os.ftruncate(fd, f.size)
        finally:
            os.close(fd)


def _checked_by_libtorrent(src: Any, bound: bool, flushed: bool, staged: Any, subset: "Subset | None") -> bool:
    """Whether libtorrent's piece checks were the manifest's check, so the node reads nothing back: a
    torrent bound to the manifest, of an unsigned version, in a path cold tier (the module docstring
    says why), its cache flushed and the staged files exactly the manifest's names and sizes. In object
    storage (S3, OCI) the torrent is not written by the publisher but by whichever origin reads the
    version first, so its record binds nothing a store credential could not forge: read back there."""
    return bound and src.store is None and flushed and not is_signed(src) and \
        _staged_as_listed(staged, src.manifest, subset)
