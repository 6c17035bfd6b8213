"""One download on a session: its torrent handle, its own alert queue, its piece plan, what it measured.

The loop reads only its own events (the pump hands them over by info-hash), so neither a metrics
scrape nor another download can take the ``cache_flushed_alert`` or the ``torrent_error_alert`` it
waits for.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Callable, Collection, Protocol

import libtorrent as lt

from .alerts import AlertEvent, AlertPump
from .config import P2PConfig, endpoint
from .errors import TransferFailed, TransferStalled
from .members import Membership
from .origins import OriginShare
from .plan import HELD, PiecePlan
from .results import DownloadResult, apportion, received_by_ip

if TYPE_CHECKING:
    from .crossing import Crossing
    from .torrent import Subset


def peer_rates(h: lt.torrent_handle, budget: int = 480) -> list[str]:
    """This node's download and upload rate (kB/s) and, per connected peer, ``ip:down/up/queued[/choked]``:
    kB/s from it and to it, the blocks asked of it and not yet in, and whether it chokes this node
    (the debug log's per-peer lines, once a second; bench/swarm_peers.py reads them). Split into
    parts of at most ``budget`` characters: a log record keeps 512 of each argument."""
    st = h.status()
    by_ip: dict[str, list[int]] = {}   # (one node per address: a peer can hold two connections a moment)
    for pi in h.get_peer_info():
        x = by_ip.setdefault(pi.ip[0], [0, 0, 0, 1])
        x[0] += pi.down_speed // 1000
        x[1] += pi.up_speed // 1000
        x[2] += pi.download_queue_length
        x[3] &= bool(pi.flags & lt.peer_info.remote_choked)
    parts = [f"down={st.download_rate // 1000} up={st.upload_rate // 1000} have={st.num_pieces}"]
    for ip in sorted(by_ip):
        d, u, q, choked = by_ip[ip]
        entry = f"{ip}:{d}/{u}/{q}" + ("/choked" if choked else "")
        if len(parts[-1]) + 1 + len(entry) > budget:
            parts.append(entry)
        else:
            parts[-1] += " " + entry
    return parts


class SessionSide(Protocol):
    """What a download uses of the session it runs on (:class:`~p2p.session.P2PSession` is one): its
    configuration and alert pump, and the session-wide filters a piece plan sets (peer classes by
    rack, the origins blocked or not). Declared here so the session imports its downloads, never the
    other way round."""
    cfg: P2PConfig
    alerts: AlertPump
    blocked: frozenset[str]
    active_downloads: int

    def set_other_racks(self, racks: dict[str, str], members: "dict[str, str] | None" = None,
                        others: Collection[str] = ()) -> None: ...

    def block_peers(self, ips: frozenset[str]) -> None: ...

    def apply_plan(self, h: lt.torrent_handle, planner: PiecePlan, st: lt.torrent_status,
                   origin_ips: set[str], now: float, progressed: bool, current: list[int] | None,
                   members: dict[str, str] | None = None, racks_seen: dict[str, str] | None = None, *,
                   others: Collection[str] = (), share: OriginShare | None = None,
                   crossing: bool = False) -> list[int]: ...

log = logging.getLogger(__name__)

CONNECT_EVERY_S = 2.0
PLAN_EVERY_S = 0.25
WAIT_S = 0.1
RACK_WIDE = 1 << 16   # gateways a rack with a crossing session: every worker takes its share across
GATHER_S = 2.5   # with a tracker: ask for nothing in the first moments, until the member list stops growing


BLOCK = 16 << 10  # libtorrent's request size: what one block_finished_alert stands for


class Transfer:
    def __init__(self, session: SessionSide, ti: lt.torrent_info, h: lt.torrent_handle,
                 events: "queue.SimpleQueue[AlertEvent]", peers: tuple[str, ...], *, plan: bool,
                 progress: Callable[[int], None] | None, clock: Callable[[], float] = time.monotonic,
                 held_back: bool = False, subset: "Subset | None" = None, crossing: "Crossing | None" = None) -> None:
        self.session, self.ti, self.h, self.events, self.peers = session, ti, h, events, peers
        # the pieces wanted (a partial copy: its files' pieces), None: every piece
        self.wanted = None if subset is None else subset.pieces
        self.wanted_bytes = ti.total_size() if subset is None else subset.bytes
        if subset is not None and subset.ranged:   # (pieces, not files: before the first peer is dialed)
            h.prioritize_pieces(subset.piece_priorities)
        self.progress, self.clock = progress, clock
        self.key = str(ti.info_hashes().v2)
        self.origin_ips = {endpoint(p)[0] for p in peers}
        cfg = session.cfg
        host = endpoint(cfg.listen)[0]
        self.planner = PiecePlan(ti.num_pieces(), "" if host in ("0.0.0.0", "::") else host, rack=cfg.rack,
                                 gather_s=GATHER_S if cfg.trackers else 0.0, piece_bytes=ti.piece_length(),
                                 cap=cfg.download_limit, wanted=self.wanted,
                                 gateways=RACK_WIDE if crossing is not None else cfg.gateways) \
            if plan and self.origin_ips else None
        # (a partial copy registers with its files' tag: it plans with the workers that want the same)
        self.membership = Membership(tuple(cfg.trackers), bytes.fromhex(self.key)[:20], cfg.tls, rack=cfg.rack,
                                     source_ip=host, want=subset.tag if subset is not None else "",
                                     allow=cfg.allow) \
            if cfg.trackers and (self.planner is not None or cfg.rack) else None   # (racks: to say whose bytes)
        # several origins: this worker's home origin, the others filtered out while it is connected
        self.share = OriginShare(self.origin_ips) if self.planner is not None and len(self.origin_ips) > 1 else None
        self._moves = 0   # the home origin's moves so far
        self.result = DownloadResult()
        self.result.trace.traced = session.cfg.trace
        self._blocks: set[int] = set()   # (traced) piece * 2**20 + block received so far
        self._stalled: set[str] = set()
        self._debug_at: float | None = None
        self._prio: list[int] | None = None   # the priorities last given to libtorrent
        self._gateway = ""                  # the rack's gateway as of the last plan (racks only)
        self._skipped: set[str] = set()     # gateways the plan skipped, as of the last plan
        self._racks: dict[str, str] = {}   # ip -> rack, every member list of this download (one that
        # finished and left the list is still its rack's: for the plan, the other-rack class, and bytes)
        self._reported = 0
        self._cap = 0                       # the download limit this transfer set (its progress's cap)
        self.held_back = held_back   # added paused: resumed once the member list is in (racks)
        self.crossing = crossing if self.planner is not None and self.membership is not None else None

    def run(self, *, stall_s: float, timeout_s: float | None, flush_timeout_s: float) -> DownloadResult:
        t0 = self.clock()
        cap = self._cap = int(getattr(self.progress, "rate_bytes_per_s", 0) or 0)
        if cap:  # a cap on this transfer (an intent entry's bandwidth) is the torrent's own limit
            self.h.set_download_limit(cap)
        if self.membership is not None:
            self.membership.start()
        try:
            self._download(t0, stall_s, timeout_s)
        finally:
            if self.crossing is not None:
                self.crossing.close()
            self.session.block_peers(frozenset())   # (in, or failed: nobody is filtered while it flushes)
            if self.membership is not None:
                self.membership.stop()
        self._flush(flush_timeout_s)
        self._attribute()
        self.result.seconds = self.clock() - t0
        self.result.local_bytes = max(0, self.result.local_bytes)
        return self.result

    def _download(self, t0: float, stall_s: float, timeout_s: float | None) -> None:
        h, planner, result = self.h, self.planner, self.result
        last_progress = t0
        if planner is not None:
            planner.last_progress = t0
        last_done, next_connect, next_plan, next_racks, planned_done, current = 0, 0.0, 0.0, 0.0, -1, None
        last_plan: float | None = None
        while True:
            now = self.clock()
            if self.held_back and not self._resume_when_listed(now - t0):
                time.sleep(WAIT_S)
                continue
            if now >= next_connect:
                self._connect()
                next_connect = now + CONNECT_EVERY_S
            self._take_events(WAIT_S)
            self._sample_peers()
            if self.membership is not None and now >= next_racks:   # (who is in which rack, as listed)
                self._racks.update(self.membership.others)
                self._racks.update(self.membership.members or {})
                next_racks = now + PLAN_EVERY_S
            plan_due = planner is not None and now >= next_plan
            # (the bitfield only when used: by the plan, or to see that every wanted piece is in)
            xing = self.crossing is not None and self.crossing.active
            st = h.status(lt.torrent_handle.query_pieces if plan_due or self.wanted is not None or xing else 0)
            if result.local_bytes < 0 and st.state in (lt.torrent_status.downloading, lt.torrent_status.finished,
                                                       lt.torrent_status.seeding):
                result.local_bytes = st.total_done - st.total_payload_download
            if st.total_done > last_done:
                last_done, last_progress = st.total_done, now
                self._report(st.total_done)
            if xing:
                self.crossing.step(st, now, self._cap)
            if self._complete(st, planner is not None):
                return
            if plan_due and st.state in (lt.torrent_status.downloading, lt.torrent_status.finished):
                own = planner.own
                members, others = self._listed(planner, now - t0)
                current = self.session.apply_plan(h, planner, st, self.origin_ips, now,
                                                  st.total_done > planned_done, current, members, self._racks,
                                                  others=others, share=self.share,
                                                  crossing=self.crossing is not None and self.crossing.active)
                if self.crossing is not None:
                    self.crossing.after_plan(planner, self._racks, st)
                if self.membership is not None:   # (and the ones this plan dropped or skipped, for the others)
                    m = self.membership
                    m.dropping, m.skipping = frozenset(planner.found), frozenset(planner.skipped_gateways)
                self._dial_new_home()
                self._traced_plan(planner, own, now, t0, last_plan)
                self._prio = current
                planned_done, next_plan, last_plan = st.total_done, now + PLAN_EVERY_S, now
            if now - last_progress > stall_s:
                raise TransferStalled(f"no peer delivered for {stall_s:.0f} s "
                                      f"({st.total_done} of {self.wanted_bytes} bytes)")
            if timeout_s is not None and now - t0 > timeout_s:
                raise TransferStalled(f"P2P download did not finish in {timeout_s:.0f} s")

    def _resume_when_listed(self, since_start: float) -> bool:
        """A torrent added paused (racks) resumed once the member list stopped growing (at most
        ``GATHER_S`` after the start), with the other racks' class set up first; False: not yet."""
        members = self.membership.settled(1.0) if self.membership is not None else None
        if members is None and since_start < GATHER_S:
            return False
        if members is None and self.membership is not None:
            members = self.membership.members
        others = self.membership.others if self.membership is not None else {}
        if self.session.active_downloads == 1:   # (the classes are the session's: see apply_plan)
            self.session.set_other_racks({**others, **(members or {})}, members, others)
        self.h.resume()
        self.held_back = False
        return True

    def _listed(self, planner: PiecePlan, since_start: float) -> tuple[dict[str, str] | None, dict[str, str]]:
        """The tracker's list of workers downloading what this node wants (in the first moments, only a
        list that stopped growing; None: no list) and of those wanting other files; the owners another
        worker's plan dropped are told to ``planner``."""
        if self.membership is None:
            return None, {}
        m = self.membership
        if (told := m.dropped) is not None:   # (no tracker answering: what was told stands)
            planner.told_dropped(told)
        if (skips := m.skipped) is not None:
            planner.told_skipped(skips)
        return (m.members if since_start >= GATHER_S else m.settled(1.0)), m.others

    def _complete(self, st: lt.torrent_status, planned: bool) -> bool:
        """Every wanted piece is in. With a plan, libtorrent's "finished" means only that the pieces it
        was asked for so far are in (the plan asks for nothing yet of some): every piece, or for a
        partial copy every one of its pieces, by the bitfield."""
        if self.wanted is None:
            return bool(st.is_seeding or (not planned and st.is_finished))
        have = st.pieces
        return len(have) == len(self.wanted) and all(h for h, w in zip(have, self.wanted) if w)

    def _traced_plan(self, planner: PiecePlan, own_before: frozenset[int], now: float, t0: float,
                     last_plan: float | None) -> None:
        trace = self.result.trace
        trace.workers_max = max(trace.workers_max, planner.workers)
        members = self.membership.members if self.membership is not None else None
        trace.members_max = max(trace.members_max, len(members or ()))
        for ip in sorted(planner.stalled - self._stalled):
            log.info("p2p: %s: planning without %s from now on (%s; its pieces go to the others)", self.ti.name(),
                     ip, planner.why.get(ip, "stalled"))
        self._stalled |= planner.stalled
        for ip in sorted(planner.skipped_gateways - self._skipped):
            log.info("p2p: %s: %s is no longer the gateway for this node's plan (%s)", self.ti.name(), ip,
                     planner.why.get(ip, "skipped"))
        self._skipped = set(planner.skipped_gateways)
        if planner.gateway and planner.gateway != self._gateway:
            self._gateway = planner.gateway
            if planner.gateway == planner.self_ip:
                log.info("p2p: %s: this node is rack %s's gateway: it takes pieces across racks for it",
                         self.ti.name(), planner.rack)
            trace.gateways += 1
        trace.stalled_owners = len(self._stalled)
        trace.late_owners = sum(planner.why.get(ip, "").startswith("late") for ip in self._stalled)
        if log.isEnabledFor(logging.DEBUG) and (self._debug_at is None or now - self._debug_at >= 1.0):
            self._debug_at = now
            log.debug("p2p: %s t=%.1f workers=%d own=%d origin_left=%d gateway=%s crossing=%d blocked=%s "
                      "open_all=%s", self.ti.name(), now - t0, planner.workers, len(planner.own),
                      planner.origin_left, planner.gateway or "-", planner.crossing,
                      ",".join(sorted(self.session.blocked)) or "-", planner.open_all)
            for i, part in enumerate(peer_rates(self.h)):
                log.debug("p2p: %s t=%.1f rack=%s rates%s %s", self.ti.name(), now - t0, planner.rack or "-",
                          "+" if i else "", part)
        if last_plan is not None:
            trace.slice_changes += planner.own != own_before
            if planner.workers == 1 and not planner.open_all:
                trace.alone_s += now - last_plan
        if planner.open_all and trace.open_all_after_s is None:
            trace.open_all_after_s = now - t0
        if planner.crossed and trace.crossed_after_s is None:
            trace.crossed_after_s = now - t0
            log.info("p2p: %s: this gateway's share is in: the rest from rack %s (other racks' workers filtered "
                     "out)", self.ti.name(), planner.rack)

    def _dial_new_home(self) -> None:
        """A home origin just chosen again (the last one died): dial it now, not at the next round."""
        if self.share is not None and self.share.moves != self._moves:
            self._moves = self.share.moves
            self._connect()

    def _connect(self) -> None:
        for p in self.peers:
            try:
                self.h.connect_peer(endpoint(p))
            except RuntimeError:  # (a peer libtorrent will not dial: the others and PEX still work)
                pass

    def _take_events(self, wait_s: float) -> list[AlertEvent]:
        """This torrent's events: wait up to ``wait_s`` for the first, then take what is there."""
        out: list[AlertEvent] = []
        try:
            out.append(self.events.get(timeout=wait_s))
            while True:
                out.append(self.events.get_nowait())
        except queue.Empty:
            pass
        failed = None
        for ev in out:  # (all of them first: a flush can be confirmed in the batch that also fails)
            if ev.kind == "peer_ban_alert" and ev.endpoint is not None:
                self.result.banned.append(ev.endpoint)
            elif ev.kind == "hash_failed_alert":
                self.result.hash_failures += 1
            elif ev.kind == "cache_flushed_alert":
                self.result.flushed = True
            elif ev.kind == "block_finished_alert" and ev.piece is not None:
                self._block(ev)
            failed = failed or (ev if ev.error else None)
        if failed is not None:
            raise TransferFailed(self.key, failed.message)
        return out

    def _block(self, ev: AlertEvent) -> None:
        trace, ip = self.result.trace, (ev.endpoint or "").rpartition(":")[0].strip("[]")
        key = ev.piece * (1 << 20) + (ev.block or 0)
        if key in self._blocks:
            trace.duplicate_bytes += BLOCK
        self._blocks.add(key)
        if ip in self.origin_ips:
            trace.origin_bytes += BLOCK
            if self.planner is not None and not self.planner.open_all and ev.piece not in self.planner.own:
                trace.origin_outside_slice_bytes += BLOCK
            if self._prio is not None and ev.piece < len(self._prio) and self._prio[ev.piece] == HELD:
                trace.origin_held_bytes += BLOCK
                if self.planner is not None and self.planner.origin_left == 0:
                    trace.origin_held_after_own_bytes += BLOCK

    def _report(self, total_done: int) -> None:
        if self.progress is not None:
            cap = int(getattr(self.progress, "rate_bytes_per_s", 0) or 0)
            if cap != self._cap:   # (lifted: a caller without a cap joined)
                self.h.set_download_limit(cap or -1)
                self._cap = cap
            if getattr(self.progress, "rate_bytes_per_s", 0):  # (libtorrent paces it: see run())
                self.progress(total_done - self._reported, paced=False)
            else:
                self.progress(total_done - self._reported)
            self._reported = total_done

    def _sample_peers(self) -> None:
        by = self.result.bytes_by_peer
        for ip, n in received_by_ip(self.h).items():
            if n and not by.get(ip):   # (once per peer and download: who this node is receiving from)
                log.info("p2p: %s: receiving from %s", self.ti.name(), ip)
            by[ip] = max(by.get(ip, 0), n)

    def _flush(self, timeout_s: float) -> None:
        """A finished torrent may not be on disk yet: flush, and wait for libtorrent to say so."""
        self.h.flush_cache()
        deadline = self.clock() + timeout_s
        while not self.result.flushed and self.clock() < deadline:
            try:
                self._take_events(0.2)
            except TransferFailed as exc:  # (as before: the node verifies every file against the manifest)
                log.warning("p2p: error while flushing %s: %s", exc.info_hash, exc.reason)
        if not self.result.flushed:
            log.warning("p2p: no cache_flushed_alert for %s within %.0f s", self.ti.name(), timeout_s)

    def _attribute(self) -> None:
        self._sample_peers()
        # per-peer counters vanish when peers disconnect at completion: scale the sampled shares
        # to libtorrent's exact payload total
        result, st = self.result, self.h.status()
        total = st.total_payload_download
        sampled = sum(result.bytes_by_peer.values())
        if sampled and total:
            result.bytes_by_peer = apportion(result.bytes_by_peer, total)
        elif total:  # finished between two samples: only the peers we were told about were seen
            others = set(result.bytes_by_peer) - self.origin_ips
            result.bytes_by_peer = {endpoint(self.peers[0])[0] if self.peers and not others else "unattributed": total}
        if self.crossing is not None:   # (what its own session received and sent)
            for ip, n in self.crossing.received.items():
                result.bytes_by_peer[ip] = result.bytes_by_peer.get(ip, 0) + n
            x, result.trace.crossing_bytes_out = result.trace, self.crossing.sent
            x.crossing_bytes_in, x.crossing_peak = sum(self.crossing.received.values()), self.crossing.peak
        result.trace.redundant_bytes, result.trace.failed_bytes = st.total_redundant_bytes, st.total_failed_bytes
        by_rack: dict[str, int] = {}
        for ip, n in result.bytes_by_peer.items():
            rack = "origin" if ip in self.origin_ips else self._racks.get(ip, "")
            by_rack[rack] = by_rack.get(rack, 0) + n
        result.trace.bytes_by_rack = by_rack
        self.session.alerts.add("downloaded", total + result.trace.crossing_bytes_in)
        self.session.alerts.add("uploaded_gone", st.all_time_upload + result.trace.crossing_bytes_out)
