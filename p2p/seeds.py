"""What a node seeds, as part of its session (``P2PSession`` is a ``Seeds``): whole verified copies in
seed mode, partial copies for the files they hold, one torrent per info-hash, and a seed given way to a
download of the same torrent and taken up again after it."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import libtorrent as lt

from .alerts import AlertPump
from .config import P2PConfig, tracker_urls
from .errors import P2PError, TorrentRejected
from .torrent import fleet_mismatch, placement, subset_of

if TYPE_CHECKING:
    from .certs import FleetTLS

log = logging.getLogger(__name__)


class Seeds:
    """The seeding half of ``P2PSession`` (it sets these up in its ``__init__``)."""
    cfg: P2PConfig
    ses: lt.session
    tls: "FleetTLS | None"
    lock: threading.Lock
    alerts: AlertPump
    seeding: dict[str, lt.torrent_handle]
    sources: dict[str, tuple[Path, "frozenset[str] | None", int]]
    _add: Callable[[lt.add_torrent_params, str], lt.torrent_handle]

    # -- seeding ------------------------------------------------------------------------------------
    def seed(self, ti: lt.torrent_info, data_dir: Path, *, super_seed: bool = False,
             files: "frozenset[str] | None" = None) -> bool:
        """Seed verified data in ``data_dir`` (seed mode: pieces are hashed on first upload, so a copy
        corrupted on disk is noticed and dropped out of seeding rather than served). ``super_seed``
        (the origin): hand each peer pieces nobody else has yet, so the swarm fans them out instead of
        the origin uploading the same rare pieces to everyone. False (and a warning) for a torrent this
        node must not use under its TLS setting (``fleet_mismatch``).

        ``files``: ``data_dir`` is a partial copy holding only these files of the torrent. Never in seed
        mode (it would claim every piece): the other files at priority 0, upload mode, and libtorrent
        checks the files it holds, so its bitfield tells peers which pieces it has (a file changed after
        placement fails its pieces and is not served). One torrent per info-hash: a partial copy gives way
        to the whole version, or to a partial copy holding more."""
        key = str(ti.info_hashes().v2)
        problem = fleet_mismatch(ti, self.tls)
        if problem is not None:
            log.warning("not seeding %s: %s", ti.name(), problem)
            return False
        subset = subset_of(ti, files) if files is not None else None   # (TorrentRejected: not seeded)
        save_path, renamed = placement(ti, data_dir)
        if renamed and subset is None:   # (seed mode would claim every piece for a partial copy)
            raise TorrentRejected(str(data_dir), "a partial copy is seeded only for the files it holds")
        with self.lock:
            if key in self.seeding:
                d, held, nbytes = self.sources[key]
                if held is None or d == data_dir or (subset is not None and subset.bytes <= nbytes):
                    return True   # (the whole version, this copy, or a partial copy holding as much)
                self._drop(key)   # a partial copy seeded so far: the whole version or a larger part replaces it
            atp = lt.add_torrent_params()
            atp.ti = ti
            atp.save_path = str(save_path)
            if renamed:
                atp.renamed_files = renamed
            # upload mode: never download, so a seed whose copy rotted never rewrites the tier copy under
            # a server reading it (it just stops serving the bad pieces; `weightd verify` finds the copy and
            # a re-preload replaces it); seed mode (whole copies): hash each piece on first upload
            atp.flags = (atp.flags | lt.torrent_flags.upload_mode) & ~lt.torrent_flags.auto_managed \
                & ~lt.torrent_flags.paused
            if subset is None:
                atp.flags |= lt.torrent_flags.seed_mode
            else:
                atp.file_priorities = subset.priorities
            if super_seed and subset is None:
                atp.flags |= lt.torrent_flags.super_seeding
            atp.trackers = tracker_urls(self.cfg)  # seeds announce too, so late joiners learn of them
            # (assign the list: the binding's ``atp.trackers`` is a copy, ``.append`` would be lost)
            self.seeding[key] = self._add(atp, f"cannot seed {ti.name()}")
            self.sources[key] = (data_dir, files, subset.bytes if subset is not None else ti.total_size())
        return True

    def source_of(self, ti: lt.torrent_info) -> Path | None:
        """The directory the seed of ``ti`` reads from (None: not seeded)."""
        with self.lock:
            got = self.sources.get(str(ti.info_hashes().v2))
            return got[0] if got is not None else None

    def partial_seeds(self) -> dict[str, Path]:
        """v2 info-hash -> the partial copy seeded for it."""
        with self.lock:
            return {k: d for k, (d, files, _) in self.sources.items() if files is not None}

    def _drop(self, key: str) -> None:
        """Stop seeding ``key`` (with the lock held)."""
        h = self.seeding.pop(key, None)
        self.sources.pop(key, None)
        if h is not None:
            self.alerts.add("uploaded_gone", h.status().all_time_upload)
            self.ses.remove_torrent(h)

    def seeds_announced(self, info_hash: bytes) -> bool:
        """Whether this session seeds the torrent a tracker announce names (the 20 bytes a v2 torrent
        announces: the first half of its SHA-256 info-hash)."""
        prefix = info_hash.hex()
        with self.lock:
            return len(prefix) == 40 and any(k.startswith(prefix) for k in self.seeding)

    def stop_seeding(self, ti: "lt.torrent_info | str") -> None:
        """Stop seeding a torrent (or its v2 info-hash, as ``partial_seeds`` names it)."""
        with self.lock:
            self._drop(ti if isinstance(ti, str) else str(ti.info_hashes().v2))

    def _displace(self, key: str) -> "tuple[Path, frozenset[str] | None] | None":
        """Stop seeding ``key`` for a download of the same torrent (with the lock held), and say what
        to seed again after it: (directory, files of a partial copy or None)."""
        if key not in self.seeding:
            return None
        data_dir, files, _ = self.sources[key]
        self._drop(key)
        return data_dir, files

    def _reseed(self, ti: lt.torrent_info, displaced: "tuple[Path, frozenset[str] | None]") -> None:
        data_dir, files = displaced
        if not data_dir.is_dir():
            return
        try:
            self.seed(ti, data_dir, files=files)
        except P2PError as exc:   # (the next seed_held round tries again)
            log.warning("p2p: cannot seed %s again after a download: %s", data_dir, exc)
