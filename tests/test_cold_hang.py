"""Hung cold storage never wedges the daemon: a real daemon whose cold storage is a real FUSE file
server (tests/fuse_hang.py) where every read under ``org/hang/`` never returns, attacked as uid 65534
and as root, as a hung NFS export would."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest


from .test_trust import HungCold, publish
from .test_trust_api import NOBODY, call, in_child, root_only, set_api, shared_dir, start_daemon  # noqa: F401

MiB = 1 << 20


def call_slow(sock: Path, method: str, route: str, timeout: float) -> tuple[int, dict]:
    """One request whose answer may take ``timeout`` seconds (test_trust_api.call waits 10 s)."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect(str(sock))
        s.sendall(f"{method} /v1/{route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    finally:
        s.close()
    head, _, data = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(data)


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def main_ended(pid: int) -> bool:
    """The process's main thread has exited (what is left are threads of it the kernel still holds)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def kernel_waits(pid: int) -> list[str]:
    """Where each live thread of ``pid`` waits in the kernel."""
    out = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            if Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(Path(f"/proc/{pid}/task/{t}/wchan").read_text())
        except FileNotFoundError:
            pass
    return out


def wait_stuck_in_cold(pid: int, n: int, timeout: float = 20) -> None:
    """Until at least ``n`` threads of ``pid`` wait in the kernel for the FUSE server's answer (reads of
    the hung cold storage): the requests that read it have reached it."""
    deadline = time.monotonic() + timeout
    while sum(w == "request_wait_answer" for w in kernel_waits(pid)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} reads reached cold storage: {kernel_waits(pid)}"
        time.sleep(0.05)


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    out = fn(*a, **kw)
    return out, time.monotonic() - t0


@root_only
def test_hung_cold_storage_never_wedges_the_daemon(wd, node_env, isolated_env, tmp_path: Path, shared_dir) -> None:
    """uid 65534 may not run the cold check (403 at once); root's four checks each end within their
    bound while status, path, /metrics, /healthz and /readyz answer at once; 40 preloads with
    timeout_s 0.2 leave at most tiering.copy.STUCK_CAP threads stuck and the rest are refused at once
    with "cold storage is not answering" (exit 4); SIGTERM ends the daemon within its promise with
    threads stuck in the kernel."""
    pytest.importorskip("fuse", reason="fusepy missing (make tools)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse to mount a FUSE file system")
    from tiering.copy import STUCK_CAP
    from weightd.daemon.app import SHUTDOWN_GRACE_S
    from weightd.daemon.cold import COLD_CHECK_S
    publish(wd, tmp_path, name="org/hang", seed="a", size=2 * MiB)
    publish(wd, tmp_path, name="org/ok", seed="b", size=2 * MiB)
    assert wd("preload", "org/ok@v1", "--tier", "warm").returncode == 0   # (a copy here: path answers locally)
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    hung = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", "org/hang/")
    sock = shared_dir / "weightd.sock"
    set_api(node_env, sock, group=NOBODY)
    node_env.config.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{mnt}"'))
    d = None
    try:
        d = start_daemon(node_env, isolated_env, tmp_path, sock)
        pid = d.proc.pid
        base = threads_of(pid)

        # 1. the cold check is admin-only: uid 65534 is refused at once, nothing starts
        t0 = time.monotonic()
        for _ in range(4):
            status, doc = in_child(lambda: call(sock, "GET", "check-cold"), timeout=20)
            assert status == 403 and "may not check-cold" in doc["error"], (status, doc)
        assert time.monotonic() - t0 < 10

        # 2. root's checks hang in cold storage; each ends within its bound; meanwhile the read routes
        #    and the probes answer at once
        answers: list[tuple[int, dict, float]] = []

        def check() -> None:
            t = time.monotonic()
            st, doc = call_slow(sock, "GET", "check-cold", COLD_CHECK_S + 10)
            answers.append((st, doc, time.monotonic() - t))
        checks = [threading.Thread(target=check) for _ in range(4)]
        for t in checks:
            t.start()
        wait_stuck_in_cold(pid, 4)
        for route, body in (("status", None), ("path", {"ref": "org/ok@v1"})):
            (st, doc), took = timed(call, sock, "GET" if body is None else "POST", route, body)
            assert st == 200 and took < 3, (route, st, doc, took)
        st, doc = in_child(lambda: call(sock, "GET", "status"), timeout=10)   # (and for uid 65534)
        assert st == 200, doc
        for probe in ("metrics", "healthz", "readyz"):
            t = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/{probe}", timeout=5) as r:
                assert r.status == 200
            assert time.monotonic() - t < 3, probe
        for t in checks:
            t.join(COLD_CHECK_S + 15)
        assert len(answers) == 4
        for st, doc, took in answers:
            assert st == 504 and doc["exit_code"] == 4 and took < COLD_CHECK_S + 5, (st, doc, took)

        # 3. 40 preloads with a short timeout, from uid 65534: threads stay bounded by the cap, and once
        #    it is reached the refusal is immediate and says why
        def preloads() -> list:
            out = []
            for _ in range(40):
                t = time.monotonic()
                st, doc = call(sock, "POST", "preload", {"ref": "org/hang@v1", "tier": "warm", "timeout_s": 0.2})
                out.append([st, doc, time.monotonic() - t])
            return out
        results = in_child(preloads, timeout=120)
        assert all(st == 504 and doc["exit_code"] == 4 for st, doc, _ in results), results
        refused = [(doc, took) for _, doc, took in results if "cold storage is not answering" in doc["error"]]
        assert len(refused) >= 40 - STUCK_CAP - 4, results
        assert all(took < 0.5 for _, took in refused), refused
        assert "\n" not in refused[0][0]["error"] and "reads stuck for" in refused[0][0]["error"]
        cli = wd("preload", "org/hang@v1", "--tier", "warm", "--timeout", "5", timeout=30)
        assert cli.returncode == 4 and "cold storage is not answering" in cli.stderr, cli.stderr
        assert len(cli.stderr.strip().splitlines()) <= 2 and "Traceback" not in cli.stderr
        grown = threads_of(pid) - base
        assert grown <= STUCK_CAP + 6, (base, grown)   # (the cap, plus the checks' and pools' threads)
        st, doc = call(sock, "GET", "status")
        assert st == 200

        # 4. SIGTERM with threads stuck in the kernel: the daemon is done within its promise (socket gone,
        #    state lock free, its main thread ended). A thread inside a FUSE read the server has taken
        #    cannot be killed (not even by SIGKILL: the kernel waits for the answer), so the process is
        #    reaped when the file server answers or its connection is aborted, and then at once.
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        while time.monotonic() - t0 < SHUTDOWN_GRACE_S + 5 and d.proc.poll() is None and not main_ended(pid):
            time.sleep(0.1)
        took = time.monotonic() - t0
        assert d.proc.poll() is not None or main_ended(pid), f"still running {took:.1f} s after SIGTERM"
        assert took <= SHUTDOWN_GRACE_S + 2, took
        if d.proc.poll() is None:
            # (the other threads were killed with the main one; one still on its way out is seen for a
            # moment in another wait: a CI run of 2026-12-07 caught one. Within 2 s only the stuck remain)
            settle = time.monotonic() + 2
            while not all(w == "request_wait_answer" for w in kernel_waits(pid)) and time.monotonic() < settle:
                time.sleep(0.05)
            assert all(w == "request_wait_answer" for w in kernel_waits(pid)), kernel_waits(pid)
        assert not sock.exists()
        import fcntl
        with open(node_env.state / "daemon.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)   # (a new daemon could start now)
        hung.release()
        d.proc.wait(10)
        log = d.log_path.read_text()
        assert "Traceback" not in log, log[-3000:]
    finally:
        hung.release()   # first: stuck readers can end once the connection is aborted
        if d is not None:
            d.stop()


def post_slow(sock: Path, route: str, body: dict, timeout: float) -> tuple[int, dict]:
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    payload = json.dumps(body).encode()
    try:
        s.connect(str(sock))
        s.sendall(f"POST /v1/{route} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(payload)}"
                  f"\r\n\r\n".encode() + payload)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    finally:
        s.close()
    head, _, data = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(data)


@root_only
def test_a_read_only_caller_cannot_hold_the_pools_with_hung_cold_reads(wd, node_env, isolated_env, tmp_path: Path,
                                                                       shared_dir) -> None:
    """uid 65534 asks for things only hung cold storage can answer: ``path`` of a version published but
    not here (the not-found message lists cold), ``versions`` and ``preload --wait`` without a timeout.
    Meanwhile root's status, /metrics and hold renewal answer at once, and a read-only preload of a
    copy already here does too. Before: two such paths held both "query" threads (status hung), and
    versions and waits held every "misc" thread (hold and the lease checks hung)."""
    pytest.importorskip("fuse", reason="fusepy missing (make tools)")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse to mount a FUSE file system")
    from weightd.daemon.cold import PATH_COLD_S
    publish(wd, tmp_path, name="org/hang", seed="a", size=2 * MiB)
    publish(wd, tmp_path, name="org/ok", seed="b", size=2 * MiB)
    assert wd("preload", "org/ok@v1", "--tier", "warm", "--lease", "0").returncode == 0
    mnt = tmp_path / "cold-fuse"
    mnt.mkdir()
    hung = HungCold(node_env.cold, mnt, tmp_path / "fuse.log", "org/hang/")
    sock = shared_dir / "weightd.sock"
    set_api(node_env, sock, group=NOBODY)
    node_env.config.write_text(node_env.config.read_text().replace(f'path = "{node_env.cold}"', f'path = "{mnt}"'))
    d = None
    try:
        d = start_daemon(node_env, isolated_env, tmp_path, sock)

        def local_answers() -> None:
            (st, doc), took = timed(call, sock, "GET", "status")
            assert st == 200 and took < 3, (st, doc, took)
            t = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics", timeout=5) as r:
                assert r.status == 200
            assert time.monotonic() - t < 3

        # 1. two paths of a version not here, from uid 65534: plain "not on this node" within the bound
        def paths() -> list:
            out: list = []
            ts = [threading.Thread(target=lambda: out.append(timed(post_slow, sock, "path", {"ref": "org/hang@v1"},
                                                                   PATH_COLD_S + 20))) for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(PATH_COLD_S + 25)
            return out
        box: list = []
        child = threading.Thread(target=lambda: box.append(in_child(paths, timeout=PATH_COLD_S + 30)))
        child.start()
        wait_stuck_in_cold(d.proc.pid, 2)
        local_answers()
        child.join(PATH_COLD_S + 35)
        assert len(box[0]) == 2, box
        for (st, doc), took in box[0]:
            assert st == 404 and "org/hang@v1" in doc["error"] and "not on this node" in doc["error"], doc
            assert took < PATH_COLD_S + 3, took

        # 2. six listings and four waits for publication (no timeout) from uid 65534, kept open until
        #    the checks below are done (the parent closes its end of ``release``)
        stuck_before = sum(w == "request_wait_answer" for w in kernel_waits(d.proc.pid))
        release_r, release_w = os.pipe()

        def hog() -> int:
            import socket
            held = []
            for route, body in [("versions", {"name": "org/hang"})] * 6 + \
                               [("preload", {"ref": "org/hang@v1", "wait": True, "tier": "warm"})] * 4:
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(sock))
                payload = json.dumps(body).encode()
                s.sendall(f"POST /v1/{route} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                          + payload)
                held.append(s)
            os.close(release_w)
            select.select([release_r], [], [], 25)
            return len(held)
        child = threading.Thread(target=lambda: box.append(in_child(hog, timeout=30)))
        child.start()
        try:
            wait_stuck_in_cold(d.proc.pid, stuck_before + 6)   # (the listings, at least, read it)
            local_answers()
            (st, doc), took = timed(call, sock, "POST", "hold", {"ref": "org/ok@v1", "tier": "warm", "lease_s": 30})
            assert st == 200 and took < 3, (st, doc, took)
            (st, doc), took = timed(in_child, lambda: call(sock, "POST", "preload", {"ref": "org/ok@v1",
                                                                                     "tier": "warm", "lease_s": 60}),
                                    timeout=20)
            assert st == 200 and took < 5, (st, doc, took)
        finally:
            os.close(release_w)   # (the hog lets go)
            child.join(30)
            os.close(release_r)
        assert box[1] == 10
    finally:
        hung.release()
        if d is not None:
            d.stop()
