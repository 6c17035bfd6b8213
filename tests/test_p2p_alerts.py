"""libtorrent's alert queue has one consumer (p2p/alerts.py): real sessions on 127.0.0.x, bounded in time.

``pop_alerts`` hands each alert to one caller. A metrics scrape or a second download popping the
queue takes the alerts a download waits for (its ``cache_flushed_alert``: up to a minute's flush wait;
its ``torrent_error_alert``: a fast failure turned into a stall). The tests wrap the session's
``pop_alerts`` with a shim that records the calling thread, and check that one thread (the pump) is
the only caller while a scraper calls ``stats()`` in a tight loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from p2p import P2PConfig, P2PError, P2PSession, TransferStalled, load_torrent, make_torrent
from tiering import build_manifest, make_checkpoint, verify_checkpoint

MiB = 1 << 20


class PopShim:
    """Counts ``pop_alerts`` calls by thread (test-only: the session code never sees it)."""

    def __init__(self, session: P2PSession) -> None:
        self.by_thread: Counter[str] = Counter()
        self._pop = session.ses.pop_alerts
        session.ses.pop_alerts = self

    def __call__(self):
        self.by_thread[threading.current_thread().name] += 1
        return self._pop()


class Scraper:
    """A metrics scrape in a tight loop on its own thread."""

    def __init__(self, session: P2PSession) -> None:
        self.stop, self.calls = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, args=(session,), name="scraper", daemon=True)

    def _run(self, session: P2PSession) -> None:
        while not self.stop.is_set():
            session.stats()
            self.calls += 1

    def __enter__(self) -> "Scraper":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def torrent_of(tmp_path: Path, name: str, seed: str):
    ckpt = make_checkpoint(tmp_path / "src" / name / "v1", total_bytes=6 * MiB, shards=2, layers=2, seed=seed)
    m = build_manifest(ckpt)
    return ckpt, m, load_torrent(make_torrent(ckpt, m), m)


@pytest.fixture
def sessions():
    made: list[P2PSession] = []

    def start(ip: str) -> P2PSession:
        s = P2PSession(P2PConfig(listen=f"{ip}:0"))
        made.append(s)
        return s
    try:
        yield start
    finally:
        for s in made:
            s.close()


def only_the_pump_popped(shim: PopShim, *consumers: str) -> None:
    assert sum(shim.by_thread.values()) > 0, "nobody read the alert queue"
    assert len(shim.by_thread) == 1, dict(shim.by_thread)   # one consumer ...
    assert not set(shim.by_thread) & {*consumers, "scraper"}, dict(shim.by_thread)  # ... and not these


@pytest.mark.timeout(120)
def test_a_scrape_never_takes_a_downloads_alerts(sessions, tmp_path: Path) -> None:
    ckpt, m, ti = torrent_of(tmp_path, "a", "scrape")
    origin, leecher = sessions("127.0.0.2"), sessions("127.0.0.3")
    origin.seed(ti, ckpt)
    shim = PopShim(leecher)
    with Scraper(leecher) as scraper:
        t0 = time.monotonic()
        r = leecher.download(ti, tmp_path / "dl" / "v1", peers=(f"127.0.0.2:{origin.port}",), stall_s=20)
        elapsed = time.monotonic() - t0
    assert scraper.calls > 10
    only_the_pump_popped(shim, threading.current_thread().name)
    assert r.flushed, "the download never saw its cache_flushed_alert"
    assert elapsed < 30, elapsed  # (a stolen cache_flushed_alert alone costs the 60 s flush wait)
    assert verify_checkpoint(tmp_path / "dl" / "v1", m).ok
    assert sum(r.bytes_by_peer.values()) == m.total_bytes
    assert leecher.stats()["download_bytes"] == m.total_bytes


@pytest.mark.timeout(120)
def test_two_concurrent_downloads_on_one_session_both_complete(sessions, tmp_path: Path) -> None:
    sources = [torrent_of(tmp_path, n, n) for n in ("a", "b")]
    origin, leecher = sessions("127.0.0.2"), sessions("127.0.0.4")
    for ckpt, _, ti in sources:
        origin.seed(ti, ckpt)
    shim = PopShim(leecher)
    results: dict[str, object] = {}

    def run(name: str, ti) -> None:
        try:
            results[name] = leecher.download(ti, tmp_path / "dl" / name / "v1",
                                             peers=(f"127.0.0.2:{origin.port}",), stall_s=20)
        except Exception as exc:  # noqa: BLE001 (reported by the assertion below)
            results[name] = exc
    threads = [threading.Thread(target=run, args=(n, ti), name=f"download-{n}") for n, (_, _, ti) in
               zip("ab", sources)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)
    assert time.monotonic() - t0 < 30
    only_the_pump_popped(shim, "download-a", "download-b")
    for name, (_, m, _) in zip("ab", sources):
        r = results[name]
        assert not isinstance(r, Exception), r
        assert r.flushed and sum(r.bytes_by_peer.values()) == m.total_bytes, r
        assert verify_checkpoint(tmp_path / "dl" / name / "v1", m).ok
    assert leecher.stats()["download_bytes"] == sum(m.total_bytes for _, m, _ in sources)


@pytest.mark.timeout(120)
def test_a_torrent_error_reaches_its_download_fast(sessions, tmp_path: Path) -> None:
    """A directory where a file must go: libtorrent fails the torrent at once (file_error_alert,
    torrent_error_alert); the download raises that error, never a stall after ``stall_s``."""
    ckpt, m, ti = torrent_of(tmp_path, "a", "error")
    origin, leecher = sessions("127.0.0.2"), sessions("127.0.0.5")
    origin.seed(ti, ckpt)
    dest = tmp_path / "dl" / "v1"
    for f in m.files:
        (dest / f.path).mkdir(parents=True)
    shim = PopShim(leecher)
    with Scraper(leecher):
        t0 = time.monotonic()
        with pytest.raises(P2PError) as info:
            leecher.download(ti, dest, peers=(f"127.0.0.2:{origin.port}",), stall_s=40)
        elapsed = time.monotonic() - t0
    only_the_pump_popped(shim, threading.current_thread().name)
    assert not isinstance(info.value, TransferStalled), info.value
    assert "Is a directory" in str(info.value) and elapsed < 10, (elapsed, info.value)
    assert info.value.reason and info.value.info_hash == str(ti.info_hashes().v2)


@pytest.mark.timeout(60)
def test_subscribers_get_events_on_their_loop(sessions, tmp_path: Path) -> None:
    """The daemon's way: subscribe a callback that hands each event to its asyncio loop."""
    ckpt, _, ti = torrent_of(tmp_path, "a", "subscribe")
    origin, leecher = sessions("127.0.0.2"), sessions("127.0.0.6")
    origin.seed(ti, ckpt)
    key = str(ti.info_hashes().v2)

    async def main() -> tuple[list, int]:
        loop, got = asyncio.get_running_loop(), asyncio.Queue()
        unsubscribe = leecher.subscribe(lambda ev: loop.call_soon_threadsafe(got.put_nowait, ev))
        try:
            await asyncio.to_thread(leecher.download, ti, tmp_path / "dl" / "v1",
                                    peers=(f"127.0.0.2:{origin.port}",), stall_s=20)
        finally:
            unsubscribe()
        await asyncio.sleep(0.5)  # what the pump had handed to the loop before unsubscribe
        seen = got.qsize()
        await asyncio.to_thread(leecher.seed, ti, tmp_path / "dl" / "v1")  # more alerts, for no one
        await asyncio.sleep(0.5)
        return [got.get_nowait() for _ in range(got.qsize())], seen
    events, seen = asyncio.run(main())
    kinds = {ev.kind for ev in events if ev.info_hash == key}
    assert {"torrent_finished_alert", "cache_flushed_alert"} <= kinds, kinds
    assert len(events) == seen  # nothing is delivered after unsubscribe


def test_close_stops_the_pump(sessions) -> None:
    s = sessions("127.0.0.7")
    pump = s.alerts
    assert pump.is_alive()
    s.close()
    assert not pump.is_alive()
    s.close()  # twice is fine
