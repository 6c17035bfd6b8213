"""One libtorrent session per node, configured for a data centre and never for the open internet.

No DHT, LSD, UPnP, NAT-PMP or uTP; listen and outgoing interface from config (so several nodes on
127.0.0.x behave like separate hosts); upload and download limits that hold for LAN and loopback
peers too (libtorrent exempts its "local" peer class unless told otherwise); an allowlist of CIDRs
as an ``ip_filter`` (a network filter, not access control); with fleet TLS (``P2PConfig.tls``) the
listen port is an SSL one and every torrent presents this node's certificate (only SSL torrents made
with the fleet CA are added: libtorrent then talks to no peer without a certificate from it); the posix disk back-end (the mmap one maps whole files into RSS); torrents are
never auto-managed (queueing would stop all but a few seeds). One alert pump (``alerts.py``) is the
only reader of the session's alert queue; libtorrent's errors become ``P2PError`` through
``map_libtorrent_errors``. The settings pack and the filters are built in ``settings.py``; what the
peers of a download are to its piece plan is read in ``swarm_view.py``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Collection, Mapping, Sequence

import libtorrent as lt

from .alerts import AlertEvent, AlertPump
from .config import P2PConfig, endpoint, tracker_urls
from .crossing import Crossing, CrossingSession
from .errors import TorrentRejected, map_libtorrent_errors
from .origins import OriginShare, origins_to_block
from .plan import XRACK, PiecePlan
from .racks import RackClasses, update_class
from .settings import ip_filter, lower_limit, session_settings, session_status, split
from .seeds import Seeds
from .swarm_view import read_swarm
from .torrent import fleet_mismatch, save_path_for, subset_of
from .transfer import DownloadResult, Transfer

if TYPE_CHECKING:
    from .certs import FleetTLS

__all__ = ["P2PConfig", "P2PSession", "DownloadResult"]


class P2PSession(Seeds):
    def __init__(self, cfg: P2PConfig) -> None:
        self.cfg = cfg
        self.cross = CrossingSession(cfg) if cfg.crossing else None   # (crossing.py; its port fails the start)
        try:
            self._start(cfg)
        except BaseException:
            if self.cross is not None:
                self.cross.close()
            raise

    def _start(self, cfg: P2PConfig) -> None:
        params = lt.session_params()
        params.settings = session_settings(cfg, *endpoint(cfg.listen))
        params.disk_io_constructor = "posix_disk_io_constructor"
        with map_libtorrent_errors(f"cannot start the P2P session on {cfg.listen}"):
            self.ses = lt.session(params)
            update_class(self.ses, lt.session.local_peer_class_id, upload_limit=cfg.upload_limit,
                              download_limit=cfg.download_limit)
            self.ses.set_ip_filter(ip_filter(cfg.allow))
            # with racks, workers of other racks get a class of their own, and some are kept choked (racks.py)
            self.racks = RackClasses(self.ses, cfg.rack, cfg.gateways, choke=cfg.choke_other_racks)
            self.rack_class = self.racks.rack_class
            self.origin_ips = {endpoint(p)[0] for p in cfg.peers}
            self.blocked: frozenset[str] = frozenset()   # (filtered out: origins_to_block, RackClasses.done_across)
            self.bad_torrents: set[str] = set()   # info-hashes whose bytes failed their manifest (p2p.fetch)
        self.active_downloads = 0
        self.tls = cfg.tls  # replaced by set_tls (certificate rotation)
        self.lock = threading.Lock()
        self.seeding: dict[str, lt.torrent_handle] = {}
        # what each seeded torrent is read from: info-hash -> (directory, the files of a partial copy or None, bytes)
        self.sources: dict[str, tuple[Path, "frozenset[str] | None", int]] = {}
        self.alerts = AlertPump(self.ses)  # the only caller of pop_alerts from here on
        self.limits_lock = threading.RLock()   # (the NIC controller's thread and the download's share them)
        self.yielded = (0, 0)   # the NIC controller's limits (0: none of its own)
        self.node_limits = (cfg.download_limit, cfg.upload_limit)   # in force for the node (0: none)
        self.taken = ((0.0, 0.0), (0.0, 0.0))   # (crossing, main) sessions' rates (in, out) lately: ``share``

    @property
    def port(self) -> int:
        return self.ses.ssl_listen_port() if self.cfg.tls is not None else self.ses.listen_port()

    def _add(self, atp: lt.add_torrent_params, what: str) -> lt.torrent_handle:
        """Add a torrent; with fleet TLS, only one made with the fleet CA, and it presents this node's
        certificate before it talks to anyone (added paused, certificate set, resumed: the handle's calls
        run in order on libtorrent's network thread)."""
        problem = fleet_mismatch(atp.ti, self.tls)
        if problem is not None:
            raise TorrentRejected(atp.ti.name(), problem)
        paused = bool(atp.flags & lt.torrent_flags.paused)
        if self.tls is not None:
            atp.flags |= lt.torrent_flags.paused
        with map_libtorrent_errors(what):
            h = self.ses.add_torrent(atp)
            if self.tls is not None:
                self._present(h, self.tls)
                if not paused:
                    h.resume()
        return h

    @staticmethod
    def _present(h: lt.torrent_handle, tls: "FleetTLS") -> None:
        from .certs import present   # (cryptography loads with a TLS session only)
        present(h, tls)

    def set_tls(self, tls: "FleetTLS") -> int:
        """Certificate rotation: present ``tls`` (same fleet CA, new certificate and key) on every torrent
        of the session from now on, the ones already added included; connections already up keep the TLS
        session they made. Returns the number of torrents updated."""
        if self.cfg.tls is None:
            raise ValueError("this session was started without fleet TLS")
        n = 0
        with self.lock:  # (torrents are added under it too: none is left with the old certificate)
            self.tls = tls
            for h in self.ses.get_torrents() + (self.cross.ses.get_torrents() if self.cross is not None else []):
                try:
                    self._present(h, tls)
                except RuntimeError:  # removed meanwhile (a download that just ended)
                    continue
                n += 1
        return n

    def subscribe(self, callback: Callable[[AlertEvent], None]) -> Callable[[], None]:
        """Every alert of this session, as an ``AlertEvent``, passed to ``callback`` on the pump thread
        (it must not block; the daemon does ``loop.call_soon_threadsafe(handler, event)``). Returns the
        function that unsubscribes."""
        return self.alerts.subscribe(callback)

    def close(self) -> None:
        """Stop the alert pump, drop every torrent, free the session (idempotent). A session that is
        never closed lives as long as the process: its pump thread holds it."""
        if not hasattr(self, "ses"):
            return
        self.alerts.stop()
        if self.cross is not None:
            self.cross.close()
        with self.lock:
            for h in list(self.seeding.values()):
                self.ses.remove_torrent(h)
            self.seeding.clear()
            self.sources.clear()
        del self.ses

    def stats(self) -> dict[str, int]:
        """Totals for metrics: payload uploaded and downloaded, connected peers, corrupt pieces seen.
        Reads counters the alert pump keeps; never touches the alert queue."""
        with self.lock:
            handles = list(self.seeding.values())
        statuses = [h.status() for h in handles]
        c = self.alerts.counters()
        return {"upload_bytes": c["uploaded_gone"] + sum(st.all_time_upload for st in statuses),
                "download_bytes": c["downloaded"], "peers": sum(st.num_peers for st in statuses),
                "hash_failures": c["hash_failures"], "peer_bans": c["peer_bans"], "seeding": len(statuses)}

    def traffic(self) -> tuple[int, int]:
        """(bytes received, bytes sent) by the whole session since it started, protocol overhead
        included: what the NIC controller (``weightd.node.network``) counts as weightd's own P2P bytes.
        ``session.status()`` is deprecated but still kept by libtorrent 2.x, and is the one call that
        gives both totals without a session-stats alert through the pump."""
        st = session_status(self.ses)
        x = self.cross.traffic() if self.cross is not None else (0, 0)
        return int(st.total_download) + x[0], int(st.total_upload) + x[1]

    def set_yield_limits(self, download: int, upload: int) -> tuple[int, int]:
        """Cap the session's download and upload at these rates (bytes/s; 0: no cap of its own), under
        the configured ``download_limit``/``upload_limit``, which still hold (the lower of the two
        wins), on the global and the local (LAN, loopback) peer class. Returns the limits now in force
        (0: unlimited). With a crossing session, each of the two takes what the other leaves (``share``)."""
        with self.limits_lock:
            return self._apply_limits(download, upload)

    def _apply_limits(self, download: int, upload: int) -> tuple[int, int]:
        self.yielded = (download, upload)
        dl, ul = self.node_limits = tuple(   # (libtorrent's limits are 32-bit ints: larger ones wrap)
            min(2**31 - 1, lower_limit(fixed, mine))
            for fixed, mine in ((self.cfg.download_limit, download), (self.cfg.upload_limit, upload)))
        (xd, xu), (md, mu) = self.taken
        (mine_d, cross_d), (mine_u, cross_u) = split(dl, xd, md), split(ul, xu, mu)
        self.ses.apply_settings({"download_rate_limit": mine_d, "upload_rate_limit": mine_u})
        update_class(self.ses, lt.session.local_peer_class_id, upload_limit=mine_u, download_limit=mine_d)
        if self.cross is not None:
            self.cross.set_limits(cross_d, cross_u)
        return dl, ul

    def share(self, crossing: tuple[float, float]) -> tuple[float, float]:
        """The crossing session took ``crossing`` (in, out; bytes/s) lately: the limits split again by
        what each session took (``settings.split``). Returns what the main session took (in, out)."""
        st = session_status(self.ses)
        main = (float(st.payload_download_rate), float(st.payload_upload_rate))
        with self.limits_lock:
            self.taken = (crossing, main)
            self._apply_limits(*self.yielded)
        return main

    def apply_plan(self, h: lt.torrent_handle, planner: PiecePlan, st: lt.torrent_status,
                   origin_ips: set[str], now: float, progressed: bool, current: list[int] | None,
                   members: dict[str, str] | None = None, racks_seen: dict[str, str] | None = None, *,
                   others: "Collection[str]" = (), share: "OriginShare | None" = None,
                   crossing: bool = False) -> list[int]:
        """Piece priorities from ``planner``, and the origins and workers filtered out (``share``: origins, see
        :mod:`.origins`); ``members``: the tracker's list of downloading workers now (ip -> rack);
        ``racks_seen``: every worker listed during this download (a rack-mate that finished left the list, and
        is still one: its pieces are the rack's, and it still sends); ``others``: workers downloading other
        files of the torrent (partial copies). Neither they nor a peer seeding a partial copy (upload only, off
        the list) own a piece of the plan: what they hold counts as held (:func:`~p2p.swarm_view.read_swarm`).
        ``crossing``: a crossing session takes this node's share across (``crossing.py``): other racks'
        workers filtered out, the share's pieces no rack-mate holds not asked for; neither while starving."""
        racks = members or {}
        seen = racks_seen if racks_seen is not None else racks
        racked = bool(self.cfg.rack) or any(racks.values())
        view = read_swarm(h, st, planner, origin_ips, members, seen, others, racked)
        prio = planner.priorities(view.have, view.peers, view.held, members, view.seeds, view.rack_seeds, now,
                                  progressed, view.outside)
        # own pieces in, peers to take the rest from: disconnect from the origin, so its upload goes to
        # the workers still on their own pieces (a trickle limit let the origin's send buffers through:
        # measured, half of its bytes of pieces other workers held came after); not while nothing
        # arrives: then the peers are not delivering and the origin must
        own_done = planner.workers > 1 and not planner.open_all and planner.origin_left == 0
        if progressed:
            planner.last_progress = now
        starving = now - planner.last_progress > 5.0
        with self.lock:
            alone = self.active_downloads == 1   # (the filters are the session's: one download at a time)
        if alone:   # (a gateway whose share is in takes the rest from its rack alone: racks.py)
            away = self.racks.done_across(seen, planner, view, starving, others) - self.origin_ips
            if crossing and not starving:   # (not workers of partial copies of other files: no crossing there)
                away |= frozenset(ip for ip, r in seen.items() if r and r != self.cfg.rack) - self.origin_ips \
                    - frozenset(others)
            self.block_peers(origins_to_block(share, self.origin_ips, planner.self_ip, members, view.origins,
                                              own_done, starving, now) | away)
            if racked:
                self._pace_other_racks(planner, seen, starving, members, others)
        else:   # (another download's list must not choose for this one's swarm, nor filter it)
            self.block_peers(frozenset())
            self._redial(self.racks.unchoke_all())
        if crossing and not starving:   # (XRACK: its share, held in no rack-mate; a torrent's own priorities)
            prio = [0 if q == XRACK else q for q in prio]
        if prio != current:
            h.prioritize_pieces(prio)
        return prio

    def block_peers(self, ips: "frozenset[str]") -> None:
        """Filter these origins and workers out (disconnecting them), the others back in (locked: one truth)."""
        with self.lock:
            if ips != self.blocked:
                self.blocked = ips
                self.ses.set_ip_filter(ip_filter(self.cfg.allow, ips))

    def set_other_racks(self, racks: dict[str, str], members: "Mapping[str, str] | None" = None,
                        others: "Collection[str]" = (), skipped: "Collection[str]" = ()) -> None:
        """Workers of other racks into the other-rack class, and those not their rack's gateways kept
        choked (``racks.py``: ``RackClasses.set_racks``)."""
        self._redial(self.racks.set_racks(racks, members, others, skipped))

    def _redial(self, new: "frozenset[str]") -> None:
        """Drop once the connections of workers unchoked now and not before (they dial again, into their new class)."""
        if new:
            self.ses.set_ip_filter(ip_filter(self.cfg.allow, self.blocked | new))
            self.racks.wait_gone(new)
            self.ses.set_ip_filter(ip_filter(self.cfg.allow, self.blocked))

    def _pace_other_racks(self, planner: PiecePlan, racks: dict[str, str], starving: bool,
                          members: "Mapping[str, str] | None", others: "Collection[str]") -> None:
        """What arrives from other racks: no limit on a gateway while it has pieces to take across
        (XRACK), a trickle on every other worker (libtorrent picks the sender of a piece: every worker
        open at twice its share of the rack's intake, each rack received 2.3-2.6x the checkpoint from
        outside, 4 racks x 4 workers on loopback); no limit while nothing arrives at all (the plan
        must never strand a piece). The trickle lets a request already sent outside finish."""
        self.set_other_racks(racks, members, others, planner.told | planner.told_skips)
        trickle = max(self.cfg.download_limit // 256, 32 << 10) if self.cfg.download_limit else 1 << 20
        limit = 0 if starving or planner.crossing else trickle
        if limit != planner.rack_limit:
            update_class(self.ses, self.rack_class, download_limit=limit)
            planner.rack_limit = limit

    # -- downloading ----------------------------------------------------------------------------------
    def download(self, ti: lt.torrent_info, data_dir: Path, *, peers: tuple[str, ...] = (),
                 stall_s: float = 60.0, timeout_s: float | None = None, plan: bool = True,
                 progress: Callable[[int], None] | None = None, flush_timeout_s: float = 60.0,
                 files: "frozenset[str] | None" = None,
                 ranges: "Mapping[str, Sequence[tuple[int, int]]] | None" = None) -> DownloadResult:
        """Download into ``data_dir`` from the swarm (starting at ``peers``, the origins); pieces are
        checked by libtorrent. With ``plan`` the pieces are requested by a PiecePlan (each worker
        takes its own slice from the origin, the rest from other workers). Raises TransferStalled if
        nothing arrives for ``stall_s``, TransferFailed as soon as libtorrent fails the torrent. Safe
        to call from several threads at once (each download reads only its own torrent's events).

        ``files``: only these files (a partial copy): the others at priority 0, and only their pieces
        are planned, counted and waited for. A torrent this session seeds from a partial copy (the same
        info-hash: one torrent per info-hash in a session) stops seeding for the download, and is seeded
        again after it.

        ``ranges`` (with ``files``): only the pieces covering these byte ranges of those files (an
        expert-parallel copy's kept tensors, :func:`~p2p.torrent.subset_of`)."""
        subset = subset_of(ti, files, ranges) if files is not None else None
        data_dir.mkdir(parents=True, exist_ok=True)
        atp = lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(save_path_for(ti, data_dir))
        atp.flags = atp.flags & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
        if subset is not None:
            atp.file_priorities = subset.priorities
        # with racks, the torrent waits (paused) for the member list: libtorrent gives a connection its
        # peer classes when it is made, so the other racks' class must be in place before the first one
        hold = bool(plan and self.cfg.plan and self.cfg.rack and self.cfg.trackers and peers)
        if hold:
            atp.flags |= lt.torrent_flags.paused
        atp.trackers = tracker_urls(self.cfg)
        what = f"P2P download of {ti.name()} failed"
        key = str(ti.info_hashes().v2)
        with self.alerts.transfer(key) as events:  # registered before the torrent exists
            with self.lock:  # (a certificate rotation sees this torrent, or this torrent sees the new one)
                displaced = self._displace(key)
                h = self._add(atp, what)
            with self.lock:
                self.active_downloads += 1
                alone = self.active_downloads == 1
            crossing = self._crossing(ti, h, data_dir) if alone and subset is None and hold else None
            try:
                with map_libtorrent_errors(what):
                    return Transfer(self, ti, h, events, peers, plan=plan and self.cfg.plan, progress=progress,
                                    held_back=hold, subset=subset, crossing=crossing).run(
                        stall_s=stall_s, timeout_s=timeout_s, flush_timeout_s=flush_timeout_s)
            finally:
                with self.lock:
                    self.active_downloads -= 1
                    last = self.active_downloads == 0
                try:
                    self.block_peers(frozenset())   # (whatever happens below, the origins and workers are let back in)
                    update_class(self.ses, self.rack_class, download_limit=0)
                    if last:   # (a seed chokes no one, on connections made before too)
                        self._redial(self.racks.unchoke_all())
                finally:
                    self.ses.remove_torrent(h)
                    if displaced is not None:
                        self._reseed(ti, displaced)

    def _crossing(self, ti: lt.torrent_info, h: lt.torrent_handle, data_dir: Path) -> Crossing | None:
        """A crossing torrent for a download (a whole copy, with racks, the session's one download when it
        starts), if this node has a crossing session and the torrent is v2-only (``Crossing._read``)."""
        if self.cross is None or ti.info_hashes().has_v1():
            return None
        return Crossing(self.cross, self, ti, h, save_path_for(ti, data_dir), data_dir, lambda: self.tls,
                        self.cfg.gateways)
