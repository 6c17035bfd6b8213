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

    # -- downloading ----------------------------------------------------------------------------------
    def download(self, ti: lt.torrent_info, data_dir: Path, *, peers: tuple[str, ...] = (),
                 stall_s: float = 60.0, timeout_s: float | None = None,
                 progress: Callable[[int], None] | None = None) -> DownloadResult:
        """Download into ``data_dir`` from the swarm (starting at ``peers``); pieces are checked by
        libtorrent. Raises TransferStalled if nothing arrives for ``stall_s``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        atp = lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(save_path_for(ti, data_dir))
        atp.flags = atp.flags & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
        atp.trackers = list(self.cfg.trackers)
        h = self.ses.add_torrent(atp)
        result = DownloadResult()
        t0 = last_progress = time.monotonic()
        last_done = reported = 0
        fails0, bans0 = self.counters["hash_failures"], self.counters["peer_bans"]
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
                for pi in h.get_peer_info():
                    key = f"{pi.ip[0]}:{pi.ip[1]}"
                    result.bytes_by_peer[key] = max(result.bytes_by_peer.get(key, 0), pi.total_download)
                st = h.status()
                if st.total_wanted_done > last_done:
                    last_done, last_progress = st.total_wanted_done, now
                    if progress is not None:
                        progress(st.total_wanted_done - reported)
                        reported = st.total_wanted_done
                if st.is_finished or st.is_seeding:
                    break
                if now - last_progress > stall_s:
                    raise TransferStalled(f"no peer delivered for {stall_s:.0f} s "
                                          f"({st.total_wanted_done} of {st.total_wanted} bytes)")
                if timeout_s is not None and now - t0 > timeout_s:
                    raise TransferStalled(f"P2P download did not finish in {timeout_s:.0f} s")
            # a finished torrent may not be on disk yet: flush and wait for it
            h.flush_cache()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                self.ses.wait_for_alert(200)
                if any(isinstance(a, lt.cache_flushed_alert) for a in self._drain_alerts()):
                    break
            for pi in h.get_peer_info():
                key = f"{pi.ip[0]}:{pi.ip[1]}"
                result.bytes_by_peer[key] = max(result.bytes_by_peer.get(key, 0), pi.total_download)
            # per-peer counters vanish when peers disconnect at completion: scale the sampled shares
            # to libtorrent's exact payload total
            total = h.status().total_payload_download
            sampled = sum(result.bytes_by_peer.values())
            if sampled and total:
                result.bytes_by_peer = {k: round(v * total / sampled) for k, v in result.bytes_by_peer.items()}
            elif total:  # finished between two samples: only the peers we were told about were seen
                others = set(result.bytes_by_peer) - set(peers)
                result.bytes_by_peer = {peers[0] if peers and not others else "unattributed": total}
            self.counters["downloaded"] += total
            self.counters["uploaded_gone"] += h.status().all_time_upload
        finally:
            self.ses.remove_torrent(h)
        result.seconds = time.monotonic() - t0
        result.hash_failures = self.counters["hash_failures"] - fails0
        del bans0
        return result
