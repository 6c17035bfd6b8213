"""One libtorrent session per node, configured for a data centre and never for the open internet.

No DHT, LSD, UPnP, NAT-PMP or uTP; listen and outgoing interface from config (so several nodes on
127.0.0.x behave like separate hosts); upload and download limits that hold for LAN and loopback
peers too (libtorrent exempts its "local" peer class unless told otherwise); an allowlist of CIDRs
as an ``ip_filter``; the posix disk back-end (the mmap one maps whole files into RSS); torrents are
never auto-managed (queueing would stop all but a few seeds). libtorrent's errors become ``P2PError``
here and nowhere else.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import libtorrent as lt

from .errors import P2PError, TransferStalled
from .plan import PiecePlan
from .torrent import save_path_for

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class P2PConfig:
    listen: str = "0.0.0.0:6881"
    upload_limit: int = 0            # bytes/s, 0 = unlimited
    download_limit: int = 0
    allow: tuple[str, ...] = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8")
    max_connections: int = 200
    peers: tuple[str, ...] = ()      # "IP:PORT" of the origin(s): where every download starts
    trackers: tuple[str, ...] = ()


@dataclass(slots=True)
class DownloadResult:
    bytes_by_peer: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    hash_failures: int = 0
    banned: list[str] = field(default_factory=list)
    local_bytes: int = -1    # bytes that passed libtorrent's check before any download (prefill, resume)

    def split(self, origins: set[str]) -> tuple[int, int]:
        """(bytes from origins, bytes from other peers)."""
        o = sum(v for k, v in self.bytes_by_peer.items() if k in origins or k.split(":")[0] in origins)
        return o, sum(self.bytes_by_peer.values()) - o


def _ip_filter(allow: tuple[str, ...]) -> lt.ip_filter:
    f = lt.ip_filter()
    f.add_rule("0.0.0.0", "255.255.255.255", 1)        # everything blocked ...
    f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1)
    for cidr in allow:                                   # ... but the allowed networks
        net = ipaddress.ip_network(cidr, strict=False)
        f.add_rule(str(net[0]), str(net[-1]), 0)
    return f


_LOCAL_NETS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8", "::1/128",
               "fe80::/10", "fc00::/7")


def _class_filter(origin_ips: set[str], origin_class: int) -> lt.ip_filter:
    """libtorrent's default peer classes (global for everyone, local for LAN and loopback instead),
    plus the origin class for the origin addresses."""
    f = lt.ip_filter()
    glob, local = 1 << lt.session.global_peer_class_id, 1 << lt.session.local_peer_class_id
    f.add_rule("0.0.0.0", "255.255.255.255", glob)
    f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", glob)
    for cidr in _LOCAL_NETS:
        net = ipaddress.ip_network(cidr)
        f.add_rule(str(net[0]), str(net[-1]), local)
    for ip in sorted(origin_ips):
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            continue  # a host name: libtorrent resolves it, the origin then simply has no class of its own
        base = local if any(addr in ipaddress.ip_network(c) for c in _LOCAL_NETS if
                            ipaddress.ip_network(c).version == addr.version) else glob
        f.add_rule(str(addr), str(addr), base | (1 << origin_class))
    return f


def _endpoint(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


class P2PSession:
    def __init__(self, cfg: P2PConfig) -> None:
        self.cfg = cfg
        host, port = _endpoint(cfg.listen)
        settings = {
            "listen_interfaces": f"{host}:{port}",
            "enable_dht": False, "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False,
            "enable_incoming_utp": False, "enable_outgoing_utp": False,
            "upload_rate_limit": cfg.upload_limit, "download_rate_limit": cfg.download_limit,
            "connections_limit": cfg.max_connections,
            "active_downloads": -1, "active_seeds": -1, "active_limit": -1, "active_checking": 4,
            "alert_mask": int(lt.alert_category.error | lt.alert_category.peer | lt.alert_category.status
                              | lt.alert_category.storage),
            "alert_queue_size": 10000,
            "user_agent": "weightd/0.1", "peer_fingerprint": "-WD0100-",
            "aio_threads": 4, "hashing_threads": 2,
            # a worker waiting for a slice owner is briefly "finished" (upload only): keep its
            # connections to seeds, the plan will want pieces from them again in a moment
            "close_redundant_connections": False,
        }
        if host not in ("0.0.0.0", "::"):
            settings["outgoing_interfaces"] = host
        params = lt.session_params()
        params.settings = settings
        params.disk_io_constructor = "posix_disk_io_constructor"
        try:
            self.ses = lt.session(params)
        except RuntimeError as exc:
            raise P2PError(f"cannot start the P2P session on {cfg.listen}: {exc}") from None
        local = {"upload_limit": cfg.upload_limit, "download_limit": cfg.download_limit, "label": "local"}
        self.ses.set_peer_class(lt.session.local_peer_class_id, local)
        self.ses.set_ip_filter(_ip_filter(cfg.allow))
        # the origins get a class of their own, so a worker whose own slice of the piece plan is done can
        # slow its pulls from the origin and take the rest from the other workers
        self.origin_class = self.ses.create_peer_class("origin")
        self.ses.set_peer_class_filter(_class_filter({_endpoint(p)[0] for p in cfg.peers}, self.origin_class))
        self.active_downloads = 0
        self.lock = threading.Lock()
        self.seeding: dict[str, lt.torrent_handle] = {}
        self.counters = {"hash_failures": 0, "peer_bans": 0, "blocked": 0, "downloaded": 0, "uploaded_gone": 0}

    @property
    def port(self) -> int:
        return self.ses.listen_port()

    def close(self) -> None:
        with self.lock:
            for h in list(self.seeding.values()):
                self.ses.remove_torrent(h)
            self.seeding.clear()
        del self.ses

    def _drain_alerts(self) -> list[lt.alert]:
        out = []
        for a in self.ses.pop_alerts():
            if isinstance(a, lt.hash_failed_alert):
                self.counters["hash_failures"] += 1
            elif isinstance(a, lt.peer_ban_alert):
                self.counters["peer_bans"] += 1
            elif isinstance(a, lt.peer_blocked_alert):
                self.counters["blocked"] += 1
            out.append(a)
        return out

    # -- seeding ------------------------------------------------------------------------------------
    def seed(self, ti: lt.torrent_info, data_dir: Path, *, super_seed: bool = False) -> None:
        """Seed verified data in ``data_dir`` (seed mode: pieces are hashed on first upload, so a copy
        corrupted on disk is noticed and dropped out of seeding rather than served). ``super_seed``
        (the origin): hand each peer pieces nobody else has yet, so the swarm fans them out instead of
        the origin uploading the same rare pieces to everyone."""
        key = str(ti.info_hashes().v2)
        with self.lock:
            if key in self.seeding:
                return
            atp = lt.add_torrent_params()
            atp.ti = ti
            atp.save_path = str(save_path_for(ti, data_dir))
            # seed mode: hash each piece on first upload; upload mode: never download, so a seed whose copy
            # rotted never rewrites the published tier copy under a server reading it (it just stops
            # serving the bad pieces; `weightd verify` finds the copy and a re-preload replaces it)
            atp.flags = ((atp.flags | lt.torrent_flags.seed_mode | lt.torrent_flags.upload_mode)
                         & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused)
            if super_seed:
                atp.flags |= lt.torrent_flags.super_seeding
            atp.trackers = list(self.cfg.trackers)  # seeds announce too, so late joiners learn of them
            # (assign the list: the binding's ``atp.trackers`` is a copy, ``.append`` would be lost)
            self.seeding[key] = self.ses.add_torrent(atp)

    def stop_seeding(self, ti: lt.torrent_info) -> None:
        with self.lock:
            h = self.seeding.pop(str(ti.info_hashes().v2), None)
            if h is not None:
                self.counters["uploaded_gone"] += h.status().all_time_upload
                self.ses.remove_torrent(h)

    def stats(self) -> dict[str, int]:
        """Totals for metrics: payload uploaded and downloaded, connected peers, corrupt pieces seen."""
        with self.lock:
            handles = list(self.seeding.values())
        self._drain_alerts()
        statuses = [h.status() for h in handles]
        return {"upload_bytes": self.counters["uploaded_gone"] + sum(st.all_time_upload for st in statuses),
                "download_bytes": self.counters["downloaded"], "peers": sum(st.num_peers for st in statuses),
                "hash_failures": self.counters["hash_failures"], "peer_bans": self.counters["peer_bans"],
                "seeding": len(statuses)}

    def _apply_plan(self, h: lt.torrent_handle, planner: PiecePlan, st: lt.torrent_status,
                    origin_ips: set[str], now: float, progressed: bool, current: list[int] | None) -> list[int]:
        workers: dict[str, list[bool]] = {}
        seeds, self_ip = 0, _endpoint(self.cfg.listen)[0]
        for pi in h.get_peer_info():
            ip = pi.ip[0]
            if ip in origin_ips:
                continue
            local = pi.local_endpoint()
            if local and local[0] not in ("0.0.0.0", "::"):
                self_ip = local[0]
            if pi.flags & lt.peer_info.seed:
                seeds += 1
            else:
                workers[ip] = list(pi.pieces)
        have = list(st.pieces)
        prio = planner.priorities(have, self_ip, workers, seeds, now, progressed)
        # own slice done, peers to take the rest from: pull from the origin only at a trickle (what is
        # already asked of it still arrives; the origin's upload goes to workers still on their slice)
        # (but not while nothing completes: then the peers are not delivering and the origin must)
        own_done = bool(workers) and not planner.open_all and all(have[p] for p in planner.own)
        if progressed:
            planner.last_progress = now
        starving = now - planner.last_progress > 5.0
        if self.active_downloads == 1:
            limit = max(self.cfg.download_limit // 256, 32 << 10) if own_done and not starving else 0
            if limit != planner.origin_limit:
                self.ses.set_peer_class(self.origin_class, {"download_limit": limit})
                planner.origin_limit = limit
        if prio != current:
            h.prioritize_pieces(prio)
        return prio

    @staticmethod
    def _sample_peers(h: lt.torrent_handle, result: DownloadResult) -> None:
        # by IP (one node per address): a peer can hold two connections for a moment, and an incoming
        # connection shows an ephemeral port
        now: dict[str, int] = {}
        for pi in h.get_peer_info():
            now[pi.ip[0]] = now.get(pi.ip[0], 0) + pi.total_download
        for ip, n in now.items():
            result.bytes_by_peer[ip] = max(result.bytes_by_peer.get(ip, 0), n)

    # -- downloading ----------------------------------------------------------------------------------
    def download(self, ti: lt.torrent_info, data_dir: Path, *, peers: tuple[str, ...] = (),
                 stall_s: float = 60.0, timeout_s: float | None = None, plan: bool = True,
                 progress: Callable[[int], None] | None = None) -> DownloadResult:
        """Download into ``data_dir`` from the swarm (starting at ``peers``, the origins); pieces are
        checked by libtorrent. With ``plan`` the pieces are requested by a PiecePlan (each worker
        takes its own slice from the origin, the rest from other workers). Raises TransferStalled if
        nothing arrives for ``stall_s``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        atp = lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(save_path_for(ti, data_dir))
        atp.flags = atp.flags & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
        atp.trackers = list(self.cfg.trackers)
        h = self.ses.add_torrent(atp)
        self.active_downloads += 1
        result = DownloadResult()
        t0 = last_progress = time.monotonic()
        last_done = reported = 0
        origin_ips = {_endpoint(p)[0] for p in peers}
        planner = PiecePlan(ti.num_pieces()) if plan and origin_ips else None
        if planner is not None:
            planner.last_progress = time.monotonic()
        next_plan, planned_done, current = 0.0, -1, None
        fails0 = self.counters["hash_failures"]
        try:
            next_connect = 0.0
            while True:
                now = time.monotonic()
                if now >= next_connect:
                    for p in peers:
                        try:
                            h.connect_peer(_endpoint(p))
                        except RuntimeError:
                            pass
                    next_connect = now + 2.0
                self.ses.wait_for_alert(100)
                for a in self._drain_alerts():
                    if isinstance(a, lt.peer_ban_alert):
                        result.banned.append(str(a.endpoint))
                    if isinstance(a, (lt.torrent_error_alert, lt.file_error_alert)):
                        raise P2PError(f"P2P download failed: {a.message()}")
                self._sample_peers(h, result)
                plan_due = planner is not None and now >= next_plan
                st = h.status(lt.torrent_handle.query_pieces if plan_due else 0)  # (the bitfield only when used)
                if result.local_bytes < 0 and st.state in (lt.torrent_status.downloading, lt.torrent_status.finished,
                                                           lt.torrent_status.seeding):
                    result.local_bytes = st.total_done - st.total_payload_download
                if st.total_done > last_done:
                    last_done, last_progress = st.total_done, now
                    if progress is not None:
                        progress(st.total_done - reported)
                        reported = st.total_done
                if st.is_seeding or (not planner and st.is_finished):
                    break
                if plan_due and st.state in (lt.torrent_status.downloading, lt.torrent_status.finished):
                    current = self._apply_plan(h, planner, st, origin_ips, now, st.total_done > planned_done,
                                               current)
                    planned_done, next_plan = st.total_done, now + 0.25
                if now - last_progress > stall_s:
                    raise TransferStalled(f"no peer delivered for {stall_s:.0f} s "
                                          f"({st.total_done} of {ti.total_size()} bytes)")
                if timeout_s is not None and now - t0 > timeout_s:
                    raise TransferStalled(f"P2P download did not finish in {timeout_s:.0f} s")
            # a finished torrent may not be on disk yet: flush and wait for it
            h.flush_cache()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                self.ses.wait_for_alert(200)
                if any(isinstance(a, lt.cache_flushed_alert) for a in self._drain_alerts()):
                    break
            self._sample_peers(h, result)
            # per-peer counters vanish when peers disconnect at completion: scale the sampled shares
            # to libtorrent's exact payload total
            total = h.status().total_payload_download
            sampled = sum(result.bytes_by_peer.values())
            if sampled and total:
                result.bytes_by_peer = {k: round(v * total / sampled) for k, v in result.bytes_by_peer.items()}
            elif total:  # finished between two samples: only the peers we were told about were seen
                others = set(result.bytes_by_peer) - origin_ips
                result.bytes_by_peer = {_endpoint(peers[0])[0] if peers and not others else "unattributed": total}
            self.counters["downloaded"] += total
            self.counters["uploaded_gone"] += h.status().all_time_upload
        finally:
            self.active_downloads -= 1
            self.ses.set_peer_class(self.origin_class, {"download_limit": 0})
            self.ses.remove_torrent(h)
        result.seconds = time.monotonic() - t0
        result.local_bytes = max(0, result.local_bytes)
        result.hash_failures = self.counters["hash_failures"] - fails0
        return result
