"""Two network namespaces joined by a veth pair shaped with tc, weightd daemons in them, and a
serving-like socket flow: what ``bench/nic.py`` and ``tests/test_network_yield.py`` run on.

    A (10.77.0.1, veth NAME-a, tbf at RATE on its egress) ---- B (10.77.0.2, veth NAME-b)
    origin daemon, flow sender                                  worker daemon, flow receiver

Weights and the flow both go A -> B through the shaped egress. Everything made here is removed by
``Link.close`` (namespaces, veths, processes) and ``Daemon.close`` (its hot tier in /dev/shm), also when
the caller fails, a daemon does not start, or the run gets SIGTERM (:func:`exit_on_sigterm`: the
``finally`` blocks run). Root only: :func:`usable` says why not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
A_IP, B_IP = "10.77.0.1", "10.77.0.2"
P2P_PORT, TRACKER_PORT, METRICS_PORT, FLOW_PORT = 6881, 6969, 9464, 7070


def usable() -> str | None:
    """None when namespaces and tc can be used here; else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    name = f"wdprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit (143), so the caller's ``finally`` blocks remove what was made
    (Python's default on SIGTERM is to die at once, leaving namespaces and daemons behind)."""
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Link:
    """The two namespaces and their shaped veth; ``close`` removes them and every process started."""

    def __init__(self, rate_mbit: int = 200) -> None:
        tag = uuid.uuid4().hex[:6]
        self.a, self.b = f"wda{tag}", f"wdb{tag}"
        self.va, self.vb = f"wdva{tag}", f"wdvb{tag}"
        self.rate_bytes = rate_mbit * 1_000_000 // 8
        self.procs: list[subprocess.Popen[Any]] = []
        self.made: list[str] = []
        try:
            self._make(rate_mbit)
        except BaseException:
            self.close()
            raise

    def _make(self, rate_mbit: int) -> None:
        for ns in (self.a, self.b):
            _ip("netns", "add", ns)
            self.made.append(ns)
        _ip("link", "add", self.va, "type", "veth", "peer", "name", self.vb)
        _ip("link", "set", self.va, "netns", self.a)
        _ip("link", "set", self.vb, "netns", self.b)
        for ns, dev, addr in ((self.a, self.va, A_IP), (self.b, self.vb, B_IP)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        subprocess.run(["ip", "netns", "exec", self.a, "tc", "qdisc", "add", "dev", self.va, "root", "tbf", "rate",
                        f"{rate_mbit}mbit", "burst", "64kb", "latency", "50ms"], check=True, capture_output=True)
        # an anchor process per namespace: /proc/PID/net/dev is that namespace's view
        self.anchor = {ns: self.spawn(ns, ["sleep", "86400"]) for ns in (self.a, self.b)}

    def spawn(self, ns: str, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        p = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], **kw)
        self.procs.append(p)
        return p

    def counters(self, ns: str, dev: str) -> tuple[int, int]:
        """(rx, tx) bytes of ``dev`` in namespace ``ns``."""
        for line in Path(f"/proc/{self.anchor[ns].pid}/net/dev").read_text().splitlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == dev:
                f = rest.split()
                return int(f[0]), int(f[8])
        raise LookupError(dev)

    def close(self) -> None:
        for p in reversed(self.procs):
            stop(p)
        for ns in self.made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.va], capture_output=True)   # (gone with its namespace, normally)


def stop(p: subprocess.Popen[Any], timeout: float = 15) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Daemon:
    """One weightd daemon in a namespace, its own tiers and state, the shared cold directory."""

    def __init__(self, link: Link, base: Path, ns: str, ip: str, cold: Path, *, role: str, capacity: int,
                 network: str = "", env: dict[str, str] | None = None) -> None:
        self.dir = base / f"node-{ip}"
        self.dir.mkdir(parents=True)
        self.hot = Path(f"/dev/shm/weightd-nic-{uuid.uuid4().hex[:8]}")
        self.env = env if env is not None else {**os.environ, "PYTHONPATH": str(ROOT)}
        peer = "" if role == "origin" else (f'peers = ["{A_IP}:{P2P_PORT}"]\n'
                                            f'trackers = ["http://{A_IP}:{TRACKER_PORT}/announce"]\n')
        self.config = self.dir / "weightd.toml"
        self.config.write_text(
            f'state_dir = "{self.dir}/state"\n'
            f'[tiers.hot]\npath = "{self.hot}"\ncapacity = "256MiB"\n'
            f'[tiers.warm]\npath = "{self.dir}/warm"\ncapacity = "4GiB"\n[tiers.cold]\npath = "{cold}"\n'
            f'[api]\nsocket = "{self.dir}/weightd.sock"\n[metrics]\nlisten = "{ip}:{METRICS_PORT}"\n'
            f'[p2p]\nthreshold = "1MiB"\nlisten = "{ip}:{P2P_PORT}"\nallow = ["10.77.0.0/24"]\n'
            f'upload_limit = 0\ndownload_limit = 0\nfallback_after_s = 120\n'
            + (f'tracker_listen = "{ip}:{TRACKER_PORT}"\n' if role == "origin" else peer)
            + f'[network]\ncapacity = {capacity}\n{network}')
        self.log = open(self.dir / "daemon.log", "a")
        self.proc: subprocess.Popen[Any] | None = None
        try:   # (a daemon that does not start is stopped and its hot tier removed here: nobody else can)
            self.proc = link.spawn(ns, [sys.executable, "-m", "weightd", "-v", "--config", str(self.config),
                                        "serve", "--role", role], stdout=self.log, stderr=subprocess.STDOUT,
                                   env=self.env, cwd=ROOT)
            deadline = time.monotonic() + 30
            while not (self.dir / "weightd.sock").exists():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((self.dir / "daemon.log").read_text()[-3000:])
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "weightd", "--config", str(self.config), *args],
                              capture_output=True, text=True, timeout=timeout, env=self.env, cwd=ROOT)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(self.config), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env, cwd=ROOT)

    def network(self) -> dict[str, Any]:
        r = self.cli("status", "--json", timeout=30)   # (exit 2 with storage problems: the document still)
        try:
            return json.loads(r.stdout).get("network", {})
        except ValueError:
            return {"error": r.stderr.strip()[-300:]}

    def close(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        self.log.close()
        shutil.rmtree(self.hot, ignore_errors=True)


FLOW_RECEIVER = """
import socket, sys, time, os
out = sys.argv[1]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[3]))); s.listen(4)
open(out + ".tmp", "w").write("0"); os.replace(out + ".tmp", out)
total, last = 0, 0.0
while True:
    c, _ = s.accept()
    c.settimeout(0.1)
    while True:
        try:
            b = c.recv(1 << 20)
        except socket.timeout:
            b = None
        if b == b"":
            break
        total += len(b or b"")
        now = time.monotonic()
        if now - last > 0.05:
            open(out + ".tmp", "w").write(str(total)); os.replace(out + ".tmp", out); last = now
    c.close()
"""

#: paced at its ask; what it could not send in time is dropped, not caught up later (a reply that is
#: late is late: a burst after it would take the link from weightd and pass for a yield that worked)
FLOW_SENDER = """
import socket, sys, time
rate = float(sys.argv[3]); chunk = b"x" * (64 << 10)
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
t0, sent = time.monotonic(), 0
while True:
    due = t0 + sent / rate
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
    elif now - due > 0.1:
        t0, sent = now, 0
    c.sendall(chunk); sent += len(chunk)
"""


class Flow:
    """The serving-like flow: a socket stream A -> B paced at ``rate`` bytes/s while on."""

    def __init__(self, link: Link, base: Path) -> None:
        self.link, self.count = link, base / "flow.bytes"
        self.receiver = link.spawn(link.b, [sys.executable, "-c", FLOW_RECEIVER, str(self.count), B_IP,
                                            str(FLOW_PORT)])
        deadline = time.monotonic() + 10
        while not self.count.exists():
            assert time.monotonic() < deadline and self.receiver.poll() is None, "flow receiver did not start"
            time.sleep(0.05)
        self.sender: subprocess.Popen[Any] | None = None

    def start(self, rate: float) -> None:
        self.sender = self.link.spawn(self.link.a, [sys.executable, "-c", FLOW_SENDER, B_IP, str(FLOW_PORT),
                                                    str(rate)])

    def stop_sending(self) -> None:
        if self.sender is not None:
            stop(self.sender)
            self.sender = None

    def received(self) -> int:
        try:
            return int(self.count.read_text() or 0)
        except (OSError, ValueError):
            return 0


def tear_down(preload: "subprocess.Popen[Any] | None", daemons: "list[Daemon]", link: Link) -> None:
    """The end of a run, whatever happened: the preload killed if still running, the daemons stopped
    (their hot tiers and logs removed), the namespaces deleted."""
    if preload is not None and preload.poll() is None:
        preload.kill()
        preload.communicate()
    for d in daemons:
        d.close()
    link.close()


def publish(origin: Daemon, base: Path, size: int, name: str = "org/nic", version: str = "v1") -> str:
    """A checkpoint of ``size`` bytes published through the origin (its torrent made); the ref."""
    from tiering.sample import make_checkpoint
    src = make_checkpoint(base / "src", total_bytes=size, shards=max(1, size >> 28), layers=4)
    r = origin.cli("publish", str(src), "--name", name, "--version", version, "--json")
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    shutil.rmtree(src, ignore_errors=True)
    return f"{name}@{version}"


def sampler(link: Link, flow: Flow) -> "Any":
    """A function giving, each call, (t, link bytes A -> B at B's rx, flow bytes received)."""
    def sample() -> tuple[float, int, int]:
        return time.monotonic(), link.counters(link.b, link.vb)[0], flow.received()
    return sample
