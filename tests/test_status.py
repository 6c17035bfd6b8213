"""``status`` and ``ls`` as an operator reads them (issue #15): what holds each copy (pins, leases
with their holder and time left, processes using it), wide output, --watch, the note when the answer
came in-process, and published versions that are not local."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import os
from pathlib import Path

from tiering.sample import make_checkpoint

from .test_daemon import daemon  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _publish(wd, tmp: Path, version: str) -> None:
    src = make_checkpoint(tmp / f"src-{version}", total_bytes=2 * MiB, shards=1, layers=2, seed=version)
    assert wd("publish", src, "--name", "acme/x", "--version", version).returncode == 0


def test_status_shows_who_holds_each_copy(daemon, wd, node_env, tmp_path: Path) -> None:
    from weightd.client import DaemonClient
    _publish(wd, tmp_path, "v1")
    _publish(wd, tmp_path, "v2")
    leased_at = time.monotonic()
    DaemonClient(daemon.socket_path).preload("acme/x@v1", tier="hot", lease_s=600)
    assert wd("pin", "acme/x@v1").returncode == 0
    shard = next((node_env.hot / "acme/x/v1").glob("*.safetensors"))
    with open(shard, "rb"):  # this process uses the copy
        time.sleep(1.1)   # (status may reuse a scan of /proc up to 1 s old: one the daemon made just before the open)
        r = wd("status")
        wide = wd("status", "-o", "wide")
        js = json.loads(wd("status", "-o", "json").stdout)
        in_use = daemon.metric('weightd_copies_in_use{tier="hot"}')
        since = time.monotonic() - leased_at
    assert r.returncode == 0 and r.stderr == "", r.stderr  # through the daemon: no note
    lines = r.stdout.splitlines()
    row = next(line for line in lines if line.startswith("acme/x@v1 "))
    assert row.split()[5] == "now", row                 # READY IN: in the hot tier, resident
    assert row.split()[6:9] == ["yes", "1", "1"], row  # PIN, LEASES, IN USE
    held = [line for line in lines[lines.index(next(x for x in lines if x.startswith("HELD"))) + 1:]]
    me = f"pid {os.getpid()}"
    assert any(h.startswith("acme/x@v1") and "pinned" in h for h in held), held
    lease = next(h for h in held if "lease," in h)
    assert f"lease, {me} (" in lease and f"uid {os.geteuid()}" in lease, lease
    left = re.fullmatch(r"(\d+)m(\d\d)s", lease.split()[-1])   # (what is left of the 600 s: a loaded
    assert left and 600 - since - 1 <= int(left[1]) * 60 + int(left[2]) <= 600, (lease, since)   # machine takes seconds)
    assert any(f"in use, {me} (" in h for h in held), held
    assert js["answered_by"] == "daemon" and js["transfers"] == [] and in_use == 1
    t = js["checkpoints"][0]["tiers"]["hot"]
    assert t["in_use"][0]["pid"] == os.getpid() and t["leases"][0]["holder"].startswith(me)
    assert js["checkpoints"][0]["digest"] in wide.stdout and f"path {node_env.hot}/acme/x/v1" in wide.stdout
    assert "HIGH/LOW" in wide.stdout and " 95%/" in wide.stdout

    ls = wd("ls")
    assert ls.returncode == 0, ls.stderr
    rows = {line.split()[0]: line.split() for line in ls.stdout.splitlines()[1:]}
    assert rows["acme/x@v1"][-3] == "hot" and rows["acme/x@v2"][-3] == "-"  # published, not local
    assert rows["acme/x@v1"][-2] == "now"                                     # READY IN: resident in hot
    assert [v["version"] for v in json.loads(wd("ls", "acme/x", "--json").stdout)["versions"]] == ["v1", "v2"]
    none = wd("ls", "acme/none", "--json")   # a name nothing is known of: not found, as for every command
    assert none.returncode == 3 and none.stdout == "" and "acme/none" in none.stderr, none.stderr
    assert wd("ls", "../x").returncode == 2


def test_in_process_status_says_so(wd, node_env) -> None:
    r = wd("status")
    assert r.returncode == 0
    assert r.stderr.strip() == (f"(the daemon did not answer on {node_env.state / 'weightd.sock'}: this is what this "
                                "process sees in the tiers; transfers the daemon runs are not shown)")
    assert wd("--no-daemon", "status").stderr == ""  # asked for in-process: no note
    assert wd("-q", "status").stderr == ""  # -q: only errors


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child, before exec: SIGINT at its default and not blocked, as a shell gives it. A child
    inherits an ignored SIGINT (and Python then never raises KeyboardInterrupt), and in the full suite
    something leaves the test process's SIGINT ignored: the CI runs hung in ``time.sleep`` of the watch
    loop 30 s after Ctrl-C (faulthandler's dump)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_status_watch_redraws_until_ctrl_c(wd, node_env, isolated_env) -> None:
    p = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(node_env.config), "--no-daemon", "status",
                          "--watch", "0.3"], env={**isolated_env, "PYTHONFAULTHANDLER": "1"}, cwd=ROOT,
                         preexec_fn=_ctrl_c_as_in_a_terminal, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    # both pipes drained as the child writes (a child blocked on a full stderr pipe cannot act on
    # Ctrl-C: the test, not weightd, would hang), three frames drawn, then Ctrl-C (a fixed sleep raced
    # the start-up on a loaded machine)
    lines: list[str] = []
    errs: list[str] = []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(iter(f.readline, "")), daemon=True)
               for f, into in ((p.stdout, lines), (p.stderr, errs))]
    for r in readers:
        r.start()
    try:
        deadline = time.monotonic() + 60
        while sum("(Ctrl-C to stop)" in line for line in list(lines)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:   # (every thread's stack, by faulthandler, for the report)
            p.send_signal(signal.SIGABRT)
            time.sleep(2)
            raise AssertionError(f"no exit 30 s after Ctrl-C; stderr: {''.join(errs)[-6000:]}") from None
        for r in readers:
            r.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        for f in (p.stdout, p.stderr):   # (closed even when the test fails)
            f.close()
    out, err = "".join(lines), "".join(errs)
    assert p.returncode == 0, err
    assert out.count("(Ctrl-C to stop)") >= 3 and out.count("TIER ") >= 3, out
    assert "Traceback" not in err
    assert wd("status", "--watch", "0").returncode == 2


def test_a_hostile_process_name_carries_no_escape_sequence(daemon, wd, node_env, tmp_path: Path) -> None:
    """Any process names itself (prctl PR_SET_NAME): a caller named with an ANSI escape takes a lease;
    its name reaches status and the evict refusal as printable text only."""
    _publish(wd, tmp_path, "v1")
    code = (
        "import ctypes, sys\n"
        "ctypes.CDLL(None).prctl(15, b'\\x1b[2J\\x1b]0;pwn\\x07', 0, 0, 0)\n"  # PR_SET_NAME
        "from weightd.client import DaemonClient\n"
        f"DaemonClient(__import__('pathlib').Path({str(daemon.socket_path)!r})).preload('acme/x@v1', lease_s=600)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = wd("status").stdout + wd("evict", "acme/x@v1").stderr
    assert "\x1b" not in out and "\x07" not in out
    assert "lease, pid " in out and "(?[2J?]0;pwn?)" in out, out


def test_status_reuses_a_recent_proc_scan_but_eviction_never_does(tmp_path: Path) -> None:
    from tiering.inuse import processes_using
    d = tmp_path / "copy"
    d.mkdir()
    (d / "f").write_bytes(b"x")
    assert processes_using([d], max_age_s=60) == {}  # a scan, remembered
    with open(d / "f", "rb"):
        assert processes_using([d], max_age_s=60) == {}  # status: the remembered scan (cheap, <= its age)
        assert processes_using([d]) == {d: {os.getpid()}}  # eviction: always a fresh scan
        assert processes_using([d], max_age_s=60) == {d: {os.getpid()}}  # (which is now the remembered one)
