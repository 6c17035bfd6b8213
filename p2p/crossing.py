"""Crossing sessions (``[p2p] crossing``): every worker of a rack takes its own share of the pieces that
cross into the rack, through a second libtorrent session that talks to other racks' crossing sessions
only, while the node's main session keeps to its rack and the origins.

Why (issue 38): libtorrent picks the sender of a piece, so one session open to other racks takes from
outside pieces its rack holds, and gateways that defer those (``plan.py``) are late. Two sessions part the jobs:

- the main session filters every worker of another rack out (not the origins: ``P2PSession.apply_plan``)
  and never asks for the pieces of this node's share that no rack-mate holds: the crossing session
  brings those. Once nothing has arrived for 5 s (``starving``) both rules are off, as the plan's own;
- the crossing session listens on ``crossing_port`` (the listen port + 1 by default; an SSL port with
  fleet TLS, and its torrents present this node's certificate, as the main session's), announces to
  the trackers with ``crossing=1`` and is told of other racks' crossing sessions only (``tracker.py``);
  its IP filter lets in only workers listed in other racks. It asks only for this node's share: every
  worker of a rack is a gateway (the plan's ``across``: rendezvous hashing over the rack's workers that
  are not skipped or dropped, so a stalled or dead worker's share moves to the others by the plan's
  rules, told through the trackers); and it serves the pieces homed in its rack the main session holds;
- pieces move between the two by reading the verified piece from disk and ``add_piece`` (libtorrent
  hashes it again: bytes changed in between fail and are read again later); the crossing torrent's
  files are a staging directory beside the download's (``.NAME.crossing``, mode 0700), removed when the
  download ends and before one starts (a crash's leftovers). A v2 file's last piece is handed over
  without its padding (``add_piece`` ignores it padded);
- the node's rate limits (configured, and the NIC controller's) are shared (``P2PSession.share``, every
  0.25 s): each session may take what the other left of them lately, never less than a tenth
  (:func:`split`; the most the two took together is in the download's trace).

A crossing session is used for a whole copy only, while it is the session's one download. One that
never connects to another rack's (their ports closed: UNREACHED_S) ends, and the racks go on without.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

import libtorrent as lt
import numpy as np

from .config import P2PConfig, address_allowed, crossing_urls, peer_address
from .errors import CrossingPortError, LibtorrentError, map_libtorrent_errors
from .results import apportion, received_by_ip
from .settings import session_settings, session_status, split

if TYPE_CHECKING:
    from .certs import FleetTLS
    from .plan import PiecePlan


class Lender(Protocol):
    """The node's session, as a crossing torrent sees it."""
    node_limits: tuple[int, int]   # (download, upload) in force for the node, bytes/s (0: none)

    def share(self, crossing: tuple[float, float]) -> tuple[float, float]: ...

log = logging.getLogger(__name__)

HAND_EVERY_S = 0.1     # pieces handed between the sessions at most this often
RETRY_S = 5.0          # a piece handed is handed again (its read, its hash or its write failed) after this long
# other racks' crossing sessions named by the trackers this long, this node's share lacking, none ever
# connected (their ports closed by a firewall): the crossing ends (before: 4 racks of 4 at 10 MB/s, the
# ports dropped, 104-112 s and the origin 2.8-3.0x; 2026-12-07)
UNREACHED_S = 15.0
HAND_BYTES = 16 << 20  # bytes handed over in one round at most (160 MB/s: the download's loop stays responsive,
#                        and libtorrent, which writes and hashes them on its network thread, keeps up)
SHARE_EVERY_S = 0.25   # the node's limits split again this often (libtorrent's rates: about 1 s averages)


class CrossingSession:
    """The node's second libtorrent session (one per ``P2PSession`` with ``[p2p] crossing``, started
    with it: a port in use fails the daemon's start, not a download)."""

    def __init__(self, cfg: P2PConfig) -> None:
        self.cfg = cfg
        host, port = cfg.crossing_listen
        settings = session_settings(cfg, host, port)
        settings.pop("max_allowed_in_request_queue", None)   # (an origin's bound: never a crossing session's)
        settings.update({"user_agent": "weightd-crossing/0.1", "peer_fingerprint": "-WX0100-",
                         "unchoke_slots_limit": -1, "aio_threads": 2, "hashing_threads": 1,
                         "alert_mask": int(lt.alert_category.error | lt.alert_category.status),
                         "alert_queue_size": 1000,
                         # its port or none (libtorrent would listen on the next free one, or any: said nowhere)
                         "max_retry_port_bind": 0, "listen_system_port_fallback": False})
        params = lt.session_params()
        params.settings = settings
        params.disk_io_constructor = "posix_disk_io_constructor"
        what = f"cannot start the crossing session on {host}:{port}"
        try:
            with map_libtorrent_errors(what):
                self.ses = lt.session(params)
        except LibtorrentError as exc:
            raise CrossingPortError(what, exc.reason) from None
        if not self.ses.is_listening():
            why = [a.message() for a in self.ses.pop_alerts() if isinstance(a, lt.listen_failed_alert)]
            del self.ses
            raise CrossingPortError(what, why[0] if why else "not listening")
        f = lt.ip_filter()   # (every peer in the global class: the session's limits hold on LAN and loopback)
        f.add_rule("0.0.0.0", "255.255.255.255", 1 << lt.session.global_peer_class_id)
        f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1 << lt.session.global_peer_class_id)
        self.ses.set_peer_class_filter(f)
        self.nets = [ipaddress.ip_network(c, strict=False) for c in cfg.allow]
        self.allowed: frozenset[str] = frozenset()
        self.allow(frozenset())
        self.hash_failures = 0

    @property
    def port(self) -> int:
        return self.ses.ssl_listen_port() if self.cfg.tls is not None else self.ses.listen_port()

    def allow(self, ips: frozenset[str]) -> None:
        """Let only these workers in and out (those inside ``[p2p] allow``); everyone else filtered."""
        self.allowed = ips
        f = lt.ip_filter()
        f.add_rule("0.0.0.0", "255.255.255.255", 1)
        f.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1)
        for text in sorted(ips):
            ip = peer_address(text)   # (as the accept guard and the tracker read it; unparsable: left out)
            if ip is not None and address_allowed(str(ip), self.nets):
                f.add_rule(str(ip), str(ip), 0)
        self.ses.set_ip_filter(f)

    def add(self, ti: lt.torrent_info, stage: Path, tls: "FleetTLS | None") -> lt.torrent_handle:
        """The crossing torrent of ``ti``, in ``stage``, asking for nothing yet."""
        atp = lt.add_torrent_params()
        atp.ti = ti
        atp.save_path = str(stage)
        atp.piece_priorities = [0] * ti.num_pieces()
        atp.flags = (atp.flags | lt.torrent_flags.paused) & ~lt.torrent_flags.auto_managed
        atp.trackers = crossing_urls(self.cfg)
        with map_libtorrent_errors(f"cannot cross racks for {ti.name()}"):
            h = self.ses.add_torrent(atp)
            if tls is not None:
                from .certs import present
                present(h, tls)
            h.resume()
        return h

    def set_limits(self, download: int, upload: int) -> None:
        self.ses.apply_settings({"download_rate_limit": download, "upload_rate_limit": upload})

    def traffic(self) -> tuple[int, int]:
        """(bytes received, bytes sent) since it started (``P2PSession.traffic``)."""
        st = session_status(self.ses)
        return int(st.total_download), int(st.total_upload)

    def drain(self) -> None:
        """Read its alerts (nobody else does): hash failures counted and logged, errors logged."""
        for a in self.ses.pop_alerts():
            if isinstance(a, lt.hash_failed_alert):
                self.hash_failures += 1
            if isinstance(a, (lt.hash_failed_alert, lt.torrent_error_alert, lt.file_error_alert,
                              lt.listen_failed_alert)):
                log.warning("p2p: crossing session: %s", a.message())

    def close(self) -> None:
        if hasattr(self, "ses"):
            for h in self.ses.get_torrents():
                self.ses.remove_torrent(h)
            del self.ses


class Crossing:
    """One download's crossing torrent: what it asks for, what it is handed, its part of the limits. Its
    calls from the download's loop never raise: a failure ends the crossing (``failed``, logged once),
    and the download goes on in the main session alone."""

    def __init__(self, side: CrossingSession, lender: Lender, ti: lt.torrent_info, h: lt.torrent_handle,
                 save_path: Path, data_dir: Path, tls: "Callable[[], FleetTLS | None]", gateways: int) -> None:
        self.side, self.lender, self.ti, self.h, self.tls = side, lender, ti, h, tls
        self.gateways = gateways   # [p2p] gateways: the plan's if the crossing fails
        self.data = save_path   # (libtorrent's save path of the download: its files' paths start there)
        self.stage = data_dir.parent / f".{data_dir.name}.crossing"
        self.n = ti.num_pieces()
        self.fs = ti.layout()   # (a copy of the file list: once, not per piece handed)
        self.xh: lt.torrent_handle | None = None
        self.want = np.zeros(self.n, dtype=bool)    # this node's share: taken across by the crossing torrent
        self.serve = np.zeros(self.n, dtype=bool)   # pieces homed in this rack: handed to it to serve
        self.other: frozenset[str] = frozenset()
        self.tried: dict[tuple[int, int], float] = {}   # (direction, piece) -> when last handed
        self.handed = [0, 0]   # pieces handed to the main torrent, to the crossing one
        self.next_hand = self.next_share = self.next_debug = 0.0
        self.failed = ""       # why it ended early (the main session takes everything from then on)
        self.received: dict[str, int] = {}   # payload bytes by sender (scaled to the exact total at close)
        self.sent = 0
        self.peak = 0.0   # the most the two sessions took together (in or out), over the node's limit
        self.capped = False   # the download's own cap split onto the two torrents
        self.reached = False  # a crossing session of another rack was connected once
        self.listed_since: float | None = None   # since when other racks' crossing sessions are known, none reached

    @property
    def active(self) -> bool:
        return self.xh is not None and not self.failed

    def fail(self, why: str) -> None:
        """End the crossing for this download (logged once): its torrent paused, removed at ``close``."""
        if not self.failed:
            self.failed = why
            log.warning("p2p: %s: no crossing session for this download from now on (%s): this node's share "
                        "crosses in the main session, late (other racks' main sessions filter it out; the "
                        "plan's recovery, then the origin)", self.ti.name(), why)
            try:   # (paused: no other rack's crossing session takes it for a live one; the limits whole again)
                self.xh is not None and self.xh.pause()
                self.lender.share((0.0, 0.0))
            except Exception as exc:   # noqa: BLE001 (close removes it anyway)
                log.warning("p2p: %s: pausing the crossing torrent: %s", self.ti.name(), exc)

    def start(self, need: int) -> bool:
        """The staging directory made afresh and the torrent added; False (``fail``) if that cannot be, or
        if its file system has not ``need`` bytes free and a tenth more."""
        try:
            if self.stage.is_symlink() or self.stage.exists():
                if self.stage.is_symlink() or not self.stage.is_dir():
                    raise OSError(errno.EEXIST, "in the way, not a directory this node made", str(self.stage))
                shutil.rmtree(self.stage)
            vfs = os.statvfs(self.stage.parent)
            if vfs.f_bavail * vfs.f_frsize < need * 1.1:
                raise OSError(errno.ENOSPC, f"{vfs.f_bavail * vfs.f_frsize} bytes free, {need} needed and a "
                                            "tenth more")
            self.stage.mkdir(mode=0o700)
            self.xh = self.side.add(self.ti, self.stage, self.tls())
        except (OSError, RuntimeError, ValueError) as exc:
            self.fail(f"cannot stage at {self.stage}: {exc}")
            return False
        return True

    def after_plan(self, planner: "PiecePlan", racks_seen: dict[str, str], st: lt.torrent_status) -> None:
        """After each plan (``st``: the main torrent's, with its pieces): the other racks' workers let in
        (and asked of the trackers again when more are listed), this node's share it lacks asked for,
        the rack's pieces to serve; once failed, the plan's gateways as configured from the next plan."""
        if self.failed:
            planner.k = self.gateways
            return
        if planner.across is None or planner.homed is None or len(st.pieces) != self.n:
            return
        try:
            self._after_plan(planner, racks_seen, np.fromiter(st.pieces, dtype=bool, count=self.n), st)
        except (RuntimeError, ValueError, OSError) as exc:   # (libtorrent's calls raise RuntimeError)
            self.fail(f"crossing session: {exc}")

    def _after_plan(self, planner: "PiecePlan", racks_seen: dict[str, str], have: np.ndarray,
                    st: lt.torrent_status) -> None:
        if self.xh is None:
            # it stages the pieces homed in this rack and its share (4 racks of 4: 0.44 of the checkpoint;
            # 40 racks of 25: 0.06), beside what the main download still has to write (its files are sparse)
            staged = int(np.count_nonzero(planner.homed | planner.across)) * self.ti.piece_length()
            if not self.start(staged + max(0, st.total_wanted - st.total_wanted_done)):
                planner.k = self.gateways
                return
        other = frozenset(ip for ip, r in racks_seen.items() if r and r != planner.rack)
        if other != self.other:
            grew = bool(other - self.other)
            self.other = other
            self.side.allow(other)
            if grew:   # (peers the filter refused before are dropped from libtorrent's list: ask again)
                self.xh.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)
        # (a piece of its share a rack-mate brought in meanwhile is handed over, not taken across again)
        want = planner.across & ~have if planner.wanted is None else planner.across & ~have & planner.wanted
        if not np.array_equal(want, self.want):
            self.want = want
            self.xh.prioritize_pieces(want.astype(np.int8).tolist())
        self.serve = planner.homed

    def step(self, st: lt.torrent_status, now: float, cap: int = 0) -> None:
        """From the download's loop (``st``: the main torrent's, with its pieces; ``cap``: the download's
        own limit, 0: none): hand verified pieces between the two torrents, split the limits again."""
        if not self.active or now < self.next_hand:
            return
        self.next_hand = now + HAND_EVERY_S
        try:
            self._step(st, now, cap)
        except (RuntimeError, ValueError, OSError) as exc:
            self.fail(f"crossing session: {exc}")

    def _step(self, st: lt.torrent_status, now: float, cap: int) -> None:
        self.side.drain()
        self._sample()
        xst = self.xh.status(lt.torrent_handle.query_pieces)
        if xst.errc.value():   # (its staging space full, a file it cannot write: not a crossing any more)
            self.fail(f"crossing torrent: {xst.errc.message()}")
            return
        if not self.reached and self._unreached(xst.num_peers, xst.list_peers, now):
            return
        if len(xst.pieces) != self.n or len(st.pieces) != self.n:
            return
        x = np.fromiter(xst.pieces, dtype=bool, count=self.n)
        m = np.fromiter(st.pieces, dtype=bool, count=self.n)
        budget = self._hand(0, np.flatnonzero(x & ~m), self.stage, self.h, now, HAND_BYTES)
        self._hand(1, np.flatnonzero(m & ~x & (self.serve | self.want)), self.data, self.xh, now, budget)
        if now >= self.next_share:
            self.next_share = now + SHARE_EVERY_S
            mine = (float(xst.download_payload_rate), float(xst.upload_payload_rate))
            main = self.lender.share(mine)
            for i, limit in enumerate(self.lender.node_limits):
                if limit:
                    self.peak = max(self.peak, (mine[i] + main[i]) / limit)
            if cap:   # (the download's own cap, an intent entry's bandwidth, split the same way)
                ours, theirs = split(cap, mine[0], st.download_payload_rate)
                self.h.set_download_limit(ours)
                self.xh.set_download_limit(theirs)
            elif self.capped:   # (lifted: the main torrent's by the transfer, this one's here)
                self.xh.set_download_limit(-1)
            self.capped = bool(cap)
            if log.isEnabledFor(logging.DEBUG) and now >= self.next_debug:
                self.next_debug = now + 1.0
                log.debug("p2p: %s crossing: in %d/%d kB/s, out %d/%d kB/s (crossing/main), node limits %d/%d "
                          "kB/s; share %d of %d pieces in, %d lacking; %d peers", self.ti.name(), mine[0] // 1000,
                          main[0] // 1000, mine[1] // 1000, main[1] // 1000,
                          *(v // 1000 for v in self.lender.node_limits), np.count_nonzero(self.want & x),
                          np.count_nonzero(self.want), np.count_nonzero(~(x | m)), xst.num_peers)

    def _unreached(self, peers: int, known: int, now: float) -> bool:
        """Whether the crossing ends: other racks' crossing sessions known (``known``) UNREACHED_S, none connected."""
        self.reached = peers > 0
        if self.reached or not self.want.any() or (self.listed_since is None and not known):
            return False
        self.listed_since = now if self.listed_since is None else self.listed_since
        if now - self.listed_since < UNREACHED_S:
            return False
        self.fail(f"no crossing session of another rack answered in {UNREACHED_S:g} s, {len(self.other)} of their "
                  f"workers listed: is p2p.crossing_port open between racks (the firewall)?")
        return True

    def _sample(self) -> None:
        for ip, n in received_by_ip(self.xh).items():
            self.received[ip] = max(self.received.get(ip, 0), n)

    def _hand(self, way: int, pieces: np.ndarray, base: Path, to: lt.torrent_handle, now: float,
              budget: int) -> int:
        """Hand ``pieces`` over, at most ``budget`` bytes (returned: what is left); a piece handed is not
        handed again for ``RETRY_S`` (libtorrent writes and hashes it meanwhile: no pile of copies)."""
        for p in pieces.tolist():
            if budget <= 0:
                break
            if now - self.tried.get((way, p), -RETRY_S) < RETRY_S:
                continue
            data = self._read(base, p)
            # (one not read, written but a moment ago or short: tried again in 0.5 s)
            self.tried[(way, p)] = now if data is not None else now - RETRY_S + 0.5
            if data is not None:
                to.add_piece(p, data, 0)
                self.handed[way] += 1
                budget -= len(data)
        return budget

    def _read(self, base: Path, p: int) -> bytes | None:
        """Piece ``p`` as ``add_piece`` takes it (a v2 file's last piece without its padding), read
        from the files under ``base``; None if short or unreadable (handed again later)."""
        fs = self.fs
        out = bytearray()
        want = 0
        for sl in self.ti.map_block(p, 0, self.ti.piece_size(p)):
            if fs.file_flags(sl.file_index) & lt.file_storage.flag_pad_file:
                continue
            want += sl.size
            try:
                fd = os.open(base / fs.file_path(sl.file_index), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                out += os.pread(fd, sl.size, sl.offset)
            except OSError:
                return None
            finally:
                os.close(fd)
        return bytes(out) if len(out) == want else None

    def close(self) -> None:
        """The crossing torrent removed with its files, its staging directory deleted, the node's limits
        whole again. Never raises (it runs on the download's way out, whatever happened)."""
        if self.xh is not None:
            try:
                self._sample()
                st = self.xh.status()
                if st.total_payload_download and sum(self.received.values()):
                    self.received = apportion(self.received, st.total_payload_download)
                self.sent = st.total_payload_upload
                log.info("p2p: %s: crossing session: %d B in, %d B out; %d pieces handed to the main "
                         "session, %d to the crossing one", self.ti.name(), st.total_payload_download,
                         st.total_payload_upload, *self.handed)
                # (libtorrent deletes the files once its writes are done: none lands after the removal)
                self.side.ses.remove_torrent(self.xh, lt.session.delete_files)
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline and self.xh.is_valid():
                    time.sleep(0.02)
                self.side.allow(frozenset())
                self.side.drain()
            except Exception as exc:   # noqa: BLE001 (logged; the download's own outcome stands)
                log.warning("p2p: %s: closing the crossing session: %s", self.ti.name(), exc)
            try:
                self.lender.share((0.0, 0.0))
            except Exception as exc:   # noqa: BLE001
                log.warning("p2p: %s: the node's limits after the crossing session: %s", self.ti.name(), exc)
        shutil.rmtree(self.stage, ignore_errors=True)
