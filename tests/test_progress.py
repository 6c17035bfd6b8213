"""Progress a person can see: the phase model, the daemon's NDJSON progress stream (a real daemon, a
real slow file server as cold storage), the bar the CLI draws from it on a real terminal, and the
transfer rows of ``status``."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tiering.progress import Progress, set_phase
from tiering.sample import make_checkpoint

from .conftest import stop_process
from .test_daemon import daemon  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_phases_count_their_own_bytes_and_the_eta_is_never_a_guess() -> None:
    clock = Clock()
    p = Progress("org/m@v1", 0, clock=clock)
    assert p.snapshot()["phase"] == "queued" and p.snapshot()["eta_s"] is None
    set_phase(p, "copy", source="cold", total=100 * MiB, tier="hot")
    s = p.snapshot()
    assert (s["phase"], s["source"], s["tier"], s["done"], s["total"]) == ("copy", "cold", "hot", 0, 100 * MiB)
    assert s["rate"] == 0 and s["eta_s"] is None  # nothing moved yet: no ETA, not "0 s" or "forever"
    for _ in range(10):  # 10 MiB/s for a second
        clock.t += 0.1
        p(1 * MiB)
    s = p.snapshot()
    assert s["done"] == 10 * MiB and 9.5 * MiB < s["rate"] < 10.5 * MiB
    assert 8.5 < s["eta_s"] < 9.5
    clock.t += 20  # a stall: the rate is the last seconds', so the ETA says nothing rather than a lie
    p(0)
    clock.t += 0.3
    p(0)
    assert p.snapshot()["rate"] < 1 * MiB
    set_phase(p, "verify", total=100 * MiB)  # a new phase counts from zero, keeps the source and tier
    s = p.snapshot()
    assert (s["phase"], s["done"], s["source"], s["tier"]) == ("verify", 0, "cold", "hot")
    set_phase(p, "fsync", total=0)
    assert p.snapshot()["eta_s"] is None
    with pytest.raises(ValueError, match="unknown phase"):
        p.set_phase("teleport")
    set_phase(lambda n: None, "copy")  # a plain callback does not listen: nothing happens


def test_warming_shows_the_throttle() -> None:
    p = Progress("org/m@v1", 10)
    set_phase(p, "warm", total=10)
    p.watch_throttle(lambda: (64 * MiB, 3))
    assert p.snapshot()["throttle"] == {"cap_bytes_per_s": 64 * MiB, "backoffs": 3}
    from weightd.cli.progress import describe
    assert "yielding to serving: capped at 64.0 MiB/s" in describe(p.snapshot())
    set_phase(p, "done")
    assert p.snapshot()["throttle"] is None


def test_not_a_terminal_gets_a_plain_line_now_and_then(monkeypatch, capsys) -> None:
    """An init container's log is not a terminal: no bar, but a plain line every PLAIN_EVERY_S."""
    import weightd.cli.progress as wp
    monkeypatch.setattr(wp, "PLAIN_EVERY_S", 0.0)
    p = Progress("org/m@v1", 0)
    set_phase(p, "copy", source="p2p", total=8 * MiB, tier="warm")
    p(2 * MiB)
    with wp.TransferBar() as bar:  # (pytest's stderr is not a terminal)
        bar.update(p.snapshot())
    err = capsys.readouterr().err
    assert err.startswith("weightd: org/m@v1 → warm  copy from p2p  2.0 MiB / 8.0 MiB"), err
    monkeypatch.setattr(wp, "QUIET", True)  # -q: nothing
    with wp.TransferBar() as bar:
        bar.update(p.snapshot())
    assert capsys.readouterr().err == ""


# -- through a real daemon ----------------------------------------------------------------------------

@pytest.fixture
def slow_cold(node_env, tmp_path: Path):
    """Cold storage behind a real FUSE file server that serves each reader at 4 MiB/s (a busy NFS)."""
    pytest.importorskip("fuse", reason="fusepy missing (make tools)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    from .test_trust import HungCold
    node_env.cold.mkdir(exist_ok=True)
    src = make_checkpoint(tmp_path / "src", total_bytes=12 * MiB, shards=6, layers=6, seed="slow")
    from tiering import LocalNode  # noqa: F401 (published straight into cold, before the mount hides it)
    node = node_env.node()
    try:
        node.publish(src, "org/slow", "v1")
    finally:
        node.close()
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    fs = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", "//never//", rate=4 * MiB)
    node_env.config.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{mnt}"'))
    try:
        yield fs
    finally:
        fs.release()


def test_progress_streams_from_a_real_daemon(slow_cold, node_env, isolated_env, wd, tmp_path: Path) -> None:
    from weightd.client import DaemonClient
    from .test_daemon import DaemonProc
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        client = DaemonClient(d.socket_path)
        snaps: list[dict] = []      # the first caller's stream
        snaps2: list[dict] = []     # the stream of the caller who joined
        rows: list[dict] = []
        scraped: list[str] = []
        joined: list[dict] = []
        copying_seen = threading.Event()

        def watch_status() -> None:  # status while it runs: a row for the transfer in flight
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not rows:
                st = client.status()
                rows.extend(t for t in st.get("transfers", []) if t["phase"] == "copy" and t["done"] > 0)
                if rows:
                    scraped.append(d.metrics())
                    copying_seen.set()
                time.sleep(0.2)

        def second() -> None:  # a second waiter shares the transfer and sees the same progress
            if copying_seen.wait(30):   # (joins once status shows the copy in flight)
                joined.append(DaemonClient(d.socket_path).preload("org/slow@v1", tier="hot",
                                                                  on_progress=snaps2.append))

        threads = [threading.Thread(target=watch_status), threading.Thread(target=second)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        r = client.preload("org/slow@v1", tier="hot", on_progress=snaps.append)
        took = time.monotonic() - t0
        for t in threads:
            t.join(40)
        first_stream = list(snaps)
        snaps.extend(snaps2)
        assert r["path"] == str(node_env.hot / "org/slow/v1") and r["bytes_by_source"]["cold"] == r["bytes"]
        assert joined and joined[0]["path"] == r["path"] and joined[0]["shared_transfer"] is True
        # the caller who joined holds a lease of its own, not only the first caller's
        leases = client.status()["checkpoints"][0]["tiers"]["hot"]["leases"]
        assert len(leases) == 2 and joined[0]["lease_expires_at"] >= r["lease_expires_at"], leases
        assert took > 1.0, took  # (the slow server really was slow: otherwise this test proves nothing)
        copying = [s for s in snaps if s["phase"] == "copy"]
        assert copying, [s["phase"] for s in snaps]
        assert all(s["label"] == "org/slow@v1" and s["tier"] == "hot" and s["source"] == "cold" for s in copying)
        assert all(s["total"] == r["bytes"] for s in copying)
        moving = [s for s in copying if s["done"] > 0 and s["rate"] > 0]
        assert moving and all(s["eta_s"] is not None for s in moving), copying
        assert max(s["waiters"] for s in snaps) == 2  # both callers are counted on the one transfer
        order = ["resolve", "queued", "wait", "copy", "verify", "fsync", "warm", "done"]
        for stream in (first_stream, snaps2):   # each stream in order (the joined one starts mid-copy)
            seen = [order.index(s["phase"]) for s in stream]
            assert stream and seen == sorted(seen), [s["phase"] for s in stream]
        assert first_stream[0]["phase"] in ("resolve", "queued", "wait", "copy")
        assert any(s["phase"] == "copy" for s in snaps2), [s["phase"] for s in snaps2]  # (joined while copying)
        assert rows and rows[0]["name"] == "org/slow" and rows[0]["version"] == "v1" and rows[0]["total"] == r["bytes"]
        assert client.status()["transfers"] == []  # done: no row left behind
        # the metrics saw it too (live, not from the 2 s status cache)
        assert 'weightd_transfer_progress_ratio{model="org/slow",phase="copy",tier="hot",version="v1"}' in scraped[0]
        assert 'weightd_transfer_phase{phase="copy"} 1.0' in scraped[0]
        assert "weightd_transfer_phase{" not in d.metrics()
    finally:
        slow_cold.release()
        d.stop()


def test_the_cli_draws_the_bar_from_the_daemon(slow_cold, node_env, isolated_env, tmp_path: Path) -> None:
    """The real CLI on a real terminal (a pty) through the real daemon: the bar names NAME@V, the tier,
    the phase and source, in binary units; the last stdout line is still the path."""
    from .test_daemon import DaemonProc
    d = DaemonProc(node_env, isolated_env, tmp_path)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI with its stderr (and stdout) on the terminal
        os.environ.clear()
        os.environ.update({**isolated_env, "COLUMNS": "160", "TERM": "xterm"})
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload",
                                  "org/slow@v1", "--tier", "hot"])
    out = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
        _, status = os.waitpid(pid, 0)
        text = out.decode(errors="replace")
        assert os.waitstatus_to_exitcode(status) == 0, text[-2000:]
        assert "org/slow@v1 → hot" in text and "copy from cold" in text, text[-2000:]
        assert "MiB" in text and " MB" not in text  # one set of units
        assert text.rstrip().splitlines()[-1].strip() == str(node_env.hot / "org/slow/v1")
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
        slow_cold.release()
        d.stop()


def test_a_waiting_stream_beats_while_the_version_is_not_published(daemon, wd, node_env, tmp_path: Path) -> None:
    """--wait for a version nobody has published yet: the stream says so every half second (a hung
    daemon would go silent, and the client notices silence), then carries the transfer."""
    from weightd.client import DaemonClient
    snaps: list[dict] = []
    out: list[dict] = []
    t = threading.Thread(target=lambda: out.append(DaemonClient(daemon.socket_path).preload(
        "org/later@v1", tier="warm", wait=True, timeout_s=60, on_progress=snaps.append)))
    t.start()
    try:
        deadline = time.monotonic() + 30   # (two beats of the stream, each saying what it waits for)
        while len([s for s in snaps if s["phase"] == "resolve"]) < 2 and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting = [s for s in snaps if s["phase"] == "resolve"]
        assert len(waiting) >= 2 and "waiting for org/later@v1 to be published" in waiting[-1]["detail"], snaps
        src = make_checkpoint(tmp_path / "later", total_bytes=4 * MiB, shards=2, layers=2, seed="later")
        assert wd("publish", src, "--name", "org/later", "--version", "v1").returncode == 0
    finally:
        t.join(60)
    assert out and out[0]["path"] == str(node_env.warm / "org/later/v1")


def test_a_client_that_goes_away_leaves_the_transfer_running(slow_cold, node_env, isolated_env, wd,
                                                             tmp_path: Path) -> None:
    """Ctrl-C on a streaming preload ends that wait only: the daemon finishes the transfer, logs that
    the client left, and the next preload finds the copy there."""
    from .test_daemon import DaemonProc
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        p = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "preload",
                              "org/slow@v1", "--tier", "warm"], env=isolated_env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from weightd.client import DaemonClient
        client = DaemonClient(d.socket_path)
        deadline = time.monotonic() + 30   # the client leaves once its transfer is copying (status shows it)
        while not [t for t in client.status().get("transfers", []) if t["phase"] == "copy" and t["done"] > 0]:
            assert p.poll() is None and time.monotonic() < deadline, "the transfer never showed in status"
            time.sleep(0.1)
        stop_process(p)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not (node_env.warm / "org/slow/v1").is_dir():
            time.sleep(0.2)
        assert (node_env.warm / "org/slow/v1").is_dir()
        again = wd("preload", "org/slow@v1", "--tier", "warm", "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["already_present"] is True
        assert "client went away" in d.log_path.read_text()
    finally:
        slow_cold.release()
        d.stop()


def test_waits_abandoned_by_their_clients_free_the_daemon(daemon, wd) -> None:
    """Six clients wait (no --timeout) for a version nobody publishes, then leave: their waits end
    with them, so the daemon's pool for everything else (status, path, pin...) is not held forever."""
    import socket as s_
    socks = []
    for i in range(6):
        c = s_.socket(s_.AF_UNIX, s_.SOCK_STREAM)
        c.connect(str(daemon.socket_path))
        body = json.dumps({"ref": f"org/never{i}@v1", "wait": True, "stream": True}).encode()
        c.sendall(b"POST /v1/preload HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        socks.append(c)
    for i, c in enumerate(socks):  # each is waiting in the daemon: its stream says so
        c.settimeout(30)
        got = b""
        while f"waiting for org/never{i}@v1 to be published".encode() not in got:
            chunk = c.recv(4096)
            assert chunk, got
            got += chunk
    for c in socks:
        c.close()
    deadline = time.monotonic() + 30   # the daemon saw each client go (its next beat fails), and ends its wait
    while daemon.log_path.read_text().count("a streamed preload's client went away") < 6:
        assert time.monotonic() < deadline, daemon.log_path.read_text()[-3000:]
        time.sleep(0.1)
    t0 = time.monotonic()
    r = wd("status", timeout=30)
    assert r.returncode == 0 and time.monotonic() - t0 < 10, r.stderr
    assert "abandoned" not in r.stderr


def test_a_capped_transfer_is_paced_where_its_bytes_move(node_env, tmp_path: Path) -> None:
    """A transfer's cap (an intent entry's bandwidth) paces a real copy from cold: 6 MiB at 4 MB/s
    takes about 1.5 s; uncapped it takes a fraction of that. Bytes another party paced (libtorrent's
    own limit) are counted without waiting."""
    src = make_checkpoint(tmp_path / "src", total_bytes=6 << 20, shards=2, layers=2)
    with node_env.node() as node:
        node.publish(src, "org/capped", "v1")
        size = node.resolve("org/capped", "v1").size
        t0 = time.monotonic()
        node.preload("org/capped", "v1", tier="warm", progress=Progress("x", rate_bytes_per_s=4_000_000), lease_s=0)
        capped = time.monotonic() - t0
        node.evict("org/capped", "v1", "warm", force=True)
        t0 = time.monotonic()
        node.preload("org/capped", "v1", tier="warm", progress=Progress("x"), lease_s=0)
        free = time.monotonic() - t0
    assert capped >= 0.9 * size / 4_000_000 - 0.2 and capped > 2 * free, (capped, free)
    p = Progress("p2p", rate_bytes_per_s=1000)
    p.set_phase("copy")
    t0 = time.monotonic()
    p(10_000, paced=False)
    assert time.monotonic() - t0 < 0.1 and p.done == 10_000


def test_a_cap_lifted_mid_transfer_stops_pacing() -> None:
    """A server joining an intent's capped transfer lifts the cap (it must not wait for it)."""
    p = Progress("x", rate_bytes_per_s=1_000_000)
    p.set_phase("copy")
    p(1_000_000)                      # (the first second's worth goes at once; the bucket is now ahead)
    p.lift_cap()
    t0 = time.monotonic()
    p(5_000_000)
    assert time.monotonic() - t0 < 0.2 and p.rate_bytes_per_s == 0


@pytest.mark.parametrize("size,rate", [(16 * MiB, 4 * MiB), (96 * MiB, 24 * MiB)],
                         ids=["a file copied in memory", "a file copied by the kernel"])
def test_status_counts_the_bytes_of_a_file_as_they_move(node_env, isolated_env, tmp_path: Path, size: int,
                                                        rate: int) -> None:
    """Issue 31: a preload through the daemon showed 0 B until a whole file was copied (half a minute
    on a 5 GB shard). One large file from a real slow file server (FUSE, ``rate`` bytes/s): while it
    is being copied, ``status`` shows its bytes growing, many times before the file is complete."""
    pytest.importorskip("fuse", reason="fusepy missing (make tools)")
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("needs root and /dev/fuse to mount a FUSE file system")
    from tiering.verified_copy import IN_MEMORY_MAX
    from weightd.client import DaemonClient
    from .test_daemon import DaemonProc
    from .test_trust import HungCold
    src = make_checkpoint(tmp_path / "src", total_bytes=size, shards=1, layers=2, seed="one-file")
    shard = max(p.stat().st_size for p in src.rglob("*.safetensors"))
    assert (shard > IN_MEMORY_MAX) == (size > IN_MEMORY_MAX)   # (each case takes the copy path it names)
    node_env.cold.mkdir(exist_ok=True)
    with node_env.node() as node:
        node.publish(src, "org/one", "v1")
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    fs = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", "//never//", rate=rate)
    node_env.config.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{mnt}"'))
    d = None
    try:
        d = DaemonProc(node_env, isolated_env, tmp_path)
        client = DaemonClient(d.socket_path)
        out: list = []
        t = threading.Thread(target=lambda: out.append(client.preload("org/one@v1", tier="hot", lease_s=0,
                                                                       timeout_s=60)))
        t.start()
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while t.is_alive() and time.monotonic() < deadline:
            seen += [(r["done"], r["total"]) for r in client.status().get("transfers", []) if r["phase"] == "copy"]
            time.sleep(0.1)
        t.join(60)
        assert out and out[0]["bytes"] == sum(p.stat().st_size for p in src.rglob("*") if p.is_file()
                                               and ".weightd" not in p.parts), out
        # the shard is copied first (largest first): every figure below its size was counted inside it
        inside = sorted({done for done, _ in seen if 0 < done < shard})
        assert len(inside) >= 3, (shard, seen)
        assert all(total == out[0]["bytes"] for _, total in seen)
    finally:
        fs.release()
        if d is not None:
            d.stop()
