"""Fleet intent through real daemons: one node converging to a changed intent file (leases, pins, the
NFD feature file, metrics, a bad file that keeps the previous intent), and a rollout across an origin
and three workers on loopback where v2 is published mid-run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tiering import read_header
from tiering.sample import make_checkpoint, mutate_tensor

from .conftest import assert_one_line_error, stop_process
from .test_daemon import DaemonProc, publish
from .test_p2p import cluster  # noqa: F401 (fixture)

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent


def until(what: str, fn, timeout: float = 40.0, every: float = 0.3):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last})")


def intent_status(wd) -> dict:
    p = wd("intent", "status", "--json", timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def rows(st: dict) -> dict[str, dict]:
    return {r["model"]: r for r in st["entries"]}


def test_a_daemon_converges_to_a_changed_intent_file(node_env, isolated_env, wd, tmp_path: Path) -> None:
    publish(wd, tmp_path, "acme/chat", "v1", size=4 * MiB)
    publish(wd, tmp_path, "acme/embed", "v1", size=2 * MiB)
    idir, nfd = tmp_path / "intent.d", tmp_path / "features.d"
    idir.mkdir()
    nfd.mkdir()
    node_env.config.write_text(node_env.config.read_text() + (
        f'[intent]\ndir = "{idir}"\nreconcile_s = 2\npoll_s = 0.2\nnfd_dir = "{nfd}"\n'
        'labels = {pool = "chat"}\n'))
    (idir / "chat.toml").write_text('[[keep]]\nmodel = "acme/chat@latest"\nnodes = "pool=chat"\n'
                                    '[[keep]]\nmodel = "acme/embed@v1"\nnodes = "pool=batch"\n')
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        st = until("acme/chat ready", lambda: (s := intent_status(wd)) and
                   rows(s).get("acme/chat@latest", {}).get("state") == "ready" and s)
        assert list(rows(st)) == ["acme/chat@latest"]          # embed selects pool=batch only
        assert (node_env.warm / "acme/chat/v1").is_dir()
        status = json.loads(wd("status", "--json").stdout)
        leases = [le["holder"] for c in status["checkpoints"] for le in c["tiers"]["warm"]["leases"]]
        assert leases == ["intent chat.toml keep #1"]
        text = until("the NFD file", lambda: (nfd / "weightd").is_file() and (nfd / "weightd").read_text())
        assert re.search(r"^weightd\.io/acme\.chat=(warm|ready)$", text, re.M), text
        assert d.metric('weightd_model_ready{model="acme/chat",tier="warm",version="v1"}') == 1
        assert d.metric('weightd_intent_serving{model="acme/chat",tier="warm",version="v1"}') == 1

        # the file changes: chat is no longer wanted, embed is pinned in hot
        (idir / "chat.toml").write_text('[[keep]]\nmodel = "acme/embed@v1"\ntier = "hot"\npin = true\n')
        until("acme/embed pinned in hot", lambda: (s := intent_status(wd)) and
              rows(s).get("acme/embed@v1", {}).get("state") == "ready", timeout=30)
        status = json.loads(wd("status", "--json").stdout)
        by = {c["name"]: c for c in status["checkpoints"]}
        assert by["acme/embed"]["pinned"] and "hot" in by["acme/embed"]["tiers"]
        assert by["acme/chat"]["tiers"]["warm"]["leases"] == []      # evictable now (still there)
        until("NFD follows", lambda: "weightd.io/acme.embed=hot" in (nfd / "weightd").read_text()
              and "acme.chat=" in (nfd / "weightd").read_text())   # (chat is still held, just not wanted)

        # a bad file: one line naming file, entry and key; the previous intent keeps running
        (idir / "chat.toml").write_text('[[keep]]\nmodel = "acme/embed@v1"\ntier = "nvme"\n')
        st = until("the error shows", lambda: (s := intent_status(wd)) and s["error"] and s)
        assert st["error"]["error"] == "intent chat.toml: keep #1.tier: expected one of hot, warm, got 'nvme'"
        assert rows(st)["acme/embed@v1"]["state"] == "ready"
        p = wd("intent", "check", str(idir))
        assert_one_line_error(p, 2, "intent chat.toml: keep #1.tier: expected one of hot, warm, got 'nvme'")
        assert d.metric("weightd_intent_errors_total") >= 1

        # the pin intent made goes when no entry wants it; a pin an admin made stays
        assert wd("pin", "acme/chat@v1").returncode == 0
        (idir / "chat.toml").write_text('[[keep]]\nmodel = "acme/chat@v1"\npin = true\n')
        until("chat wanted", lambda: (s := intent_status(wd)) and
              rows(s).get("acme/chat@v1", {}).get("state") == "ready", timeout=30)
        (idir / "chat.toml").write_text("")

        def pins() -> dict[str, bool]:
            return {c["name"]: c["pinned"] for c in json.loads(wd("status", "--json").stdout)["checkpoints"]}
        until("unpinned", lambda: pins()["acme/embed"] is False, timeout=30)
        assert pins()["acme/chat"] is True
        # an admin who pins what intent had pinned makes it theirs: intent no longer unpins it
        (idir / "chat.toml").write_text('[[keep]]\nmodel = "acme/embed@v1"\ntier = "hot"\npin = true\n')
        until("embed pinned by intent", lambda: pins()["acme/embed"] is True, timeout=30)
        assert wd("pin", "acme/embed@v1").returncode == 0
        (idir / "chat.toml").write_text("")
        until("no entry", lambda: intent_status(wd)["entries"] == [], timeout=30)
        time.sleep(1.0)
        assert pins()["acme/embed"] is True
    finally:
        d.stop()


def test_intent_check_and_status_without_a_daemon(wd, tmp_path: Path) -> None:
    idir = tmp_path / "i"
    idir.mkdir()
    (idir / "a.toml").write_text('[[keep]]\nmodel = "acme/x@latest"\nnodes = "pool=chat"\n')
    p = wd("intent", "check", str(idir), "--label", "pool=chat", "--json")
    assert p.returncode == 0, p.stderr
    assert [e["model"] for e in json.loads(p.stdout)["entries"]] == ["acme/x@latest"]
    assert_one_line_error(wd("intent", "status"), 1, "intent status is the daemon's view")


def _log_times(log: Path, pattern: str) -> list[float]:
    import calendar
    out = []
    for line in log.read_text().splitlines():
        if re.search(pattern, line):
            ts = line.split(" ", 1)[0]     # 2026-12-04T10:00:00.123Z
            out.append(calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + int(ts[20:23]) / 1000)
    return out


def assert_one_mover_at_a_time(workers: list, model: str, version: str) -> None:
    """One mover at a time, fleet-wide: the workers' rollouts of ``model@version`` ([the intent's fetch
    start, the preload's end] in each daemon's log) do not overlap."""
    spans = []
    for w in workers:
        log = w.dir / "daemon.log"
        start = _log_times(log, rf"intent: fetching {re.escape(model)}@{re.escape(version)} .*\(rollout\)")
        end = _log_times(log, rf"preloaded name={re.escape(model)} version={re.escape(version)}")
        assert start and end, log.read_text()[-3000:]
        spans.append((start[-1], end[-1]))
    spans.sort()
    assert all(a[1] <= b[0] + 0.05 for a, b in zip(spans, spans[1:])), spans


def test_a_rollout_across_an_origin_and_three_workers(cluster, tmp_path: Path) -> None:  # noqa: F811
    """v2 is published while the workers serve v1: every worker moves to v2 as a delta, one at a time
    (max_movers = 1 at the origin), keeps v1 (versions = 2), and the v1 a server holds open stays."""
    idir = tmp_path / "intent.d"
    idir.mkdir()
    (idir / "fleet.toml").write_text('[[keep]]\nmodel = "org/roll@latest"\nversions = 2\n')
    intent = (f'\n[intent]\ndir = "{idir}"\nreconcile_s = 1\npoll_s = 0.2\njitter_s = 2\nreport_s = 1\n'
              'max_movers = 1\n')
    origin = cluster("127.0.0.2", role="origin", p2p_extra="\n[intent]\nmax_movers = 1\n")
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=3, layers=3, seed="v1")
    assert origin.cli("publish", str(src), "--name", "org/roll", "--version", "v1").returncode == 0
    workers = [cluster(f"127.0.0.{i}", origin=origin.endpoint, p2p_extra=intent + f'node_name = "w{i}"\n')
               for i in (3, 4, 5)]
    for w in workers:
        until(f"{w.ip} on v1", lambda w=w: (w.dir / "warm/org/roll/v1").is_dir(), timeout=60)
    # a server on worker 3 opens a file of v1 and keeps it open
    shard = sorted((workers[0].dir / "warm/org/roll/v1").glob("*.safetensors"))[0]
    server = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],'rb'); f.read(1); "
                               "print('open', flush=True); time.sleep(600)", str(shard)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout.readline().strip() == "open"
        src2 = tmp_path / "src2"
        shutil.copytree(src, src2, ignore=shutil.ignore_patterns(".weightd"))
        shard2 = sorted(src2.glob("*.safetensors"))[0]
        changed = mutate_tensor(shard2, read_header(shard2).tensors[1].name, "v2")
        assert origin.cli("publish", str(src2), "--name", "org/roll", "--version", "v2").returncode == 0
        for w in workers:
            until(f"{w.ip} on v2", lambda w=w: (w.dir / "warm/org/roll/v2").is_dir(), timeout=90)
        for w in workers:
            st = json.loads(w.cli("intent", "status", "--json").stdout)
            r = st["entries"][0]
            assert (r["state"], r["want"], sorted(r["kept"])) == ("ready", "v2", ["v1", "v2"]), r
            assert st["serving"]["org/roll@latest"] == {"version": "v2", "tier": "warm"}
            assert (w.dir / "warm/org/roll/v1").is_dir()                     # kept for rollback
            assert w.metric('weightd_model_ready{model="org/roll",tier="warm",version="v2"}') == 1
        # moved as a delta: far fewer bytes than the checkpoint from outside the node
        for w in workers:
            text = (w.dir / "daemon.log").read_text()
            m = re.search(r"preloaded name=org/roll version=v2 .*? cold=(\d+) origin=(\d+) peer=(\d+) local_reuse=(\d+)",
                          text)
            assert m and sum(map(int, m.groups()[:3])) < 24 * MiB / 3 and int(m.group(4)) > 24 * MiB / 2, m and m.group(0)
        assert changed > 0
        assert_one_mover_at_a_time(workers, "org/roll", "v2")
        # gc under no pressure and an admin's plain evict cannot take v1 on worker 3: the intent leases it
        # (kept for rollback), and a server has a file of it open
        assert workers[0].cli("gc").returncode == 0
        p = workers[0].cli("evict", "org/roll@v1")
        assert p.returncode == 1 and "org/roll@v1" in p.stderr and "leased in warm by intent " in p.stderr, p.stderr
        assert (workers[0].dir / "warm/org/roll/v1").is_dir() and shard.is_file()
        # the origin's fleet view: three workers, each serving v2 and holding v1
        def fleet_ok():
            p = origin.cli("fleet", "status", "--origin", f"http://127.0.0.2:{origin.tracker_port}", "--json")
            if p.returncode != 0:
                return None
            doc = json.loads(p.stdout)
            serving = {n["node"]: sorted(h["version"] for h in n["holdings"] if h["serving"]) for n in doc["nodes"]}
            return serving == {"w3": ["v2"], "w4": ["v2"], "w5": ["v2"]} and doc
        doc = until("the fleet view", fleet_ok, timeout=20)
        for n in doc["nodes"]:
            assert sorted(h["version"] for h in n["holdings"]) == ["v1", "v2"]
        p = origin.cli("fleet", "status", "--origin", f"http://127.0.0.2:{origin.tracker_port}")
        assert p.returncode == 0 and "w3" in p.stdout and "org/roll@v2" in p.stdout, p.stdout
        # the intent no longer keeps v1: its lease goes at the next round; the open file alone now refuses
        # the evict, naming the server's pid, and v1 stays
        (idir / "fleet.toml").write_text('[[keep]]\nmodel = "org/roll@latest"\nversions = 1\n')
        def evict_v1():   # (None while the intent's lease is still there)
            p = workers[0].cli("evict", "org/roll@v1")
            return None if p.returncode == 1 and "leased in warm by intent " in p.stderr else p
        p = until("v1's intent lease dropped on w3", evict_v1, timeout=30)
        assert p.returncode == 1 and f"in use in warm by pid {server.pid} " in p.stderr, p.stderr
        assert (workers[0].dir / "warm/org/roll/v1").is_dir() and shard.is_file()
        # and once the server is gone, nothing holds it: the same evict removes it
        stop_process(server)
        p = workers[0].cli("evict", "org/roll@v1")
        assert p.returncode == 0, p.stderr
        assert not (workers[0].dir / "warm/org/roll/v1").exists()
    finally:
        stop_process(server)
        server.stdout.close()


def test_prewarm_places_what_the_forecaster_expects_and_explains_it(node_env, isolated_env, wd,
                                                                      tmp_path: Path) -> None:
    """A load history where acme/daily is loaded at this hour every day for two weeks: in its window
    the daemon places it in warm before anyone asks, `intent explain` says why, and a model loaded
    only at other hours is left alone. Loads the daemon serves are added to the history file."""
    import json as _json
    publish(wd, tmp_path, "acme/daily", "v1", size=2 * MiB)
    publish(wd, tmp_path, "acme/night", "v1", size=2 * MiB)
    now = time.time()
    hour = 3600.0
    # (two loads 10 and 20 minutes after this time of day, every day: whatever the hour the test runs
    # at, the next hour expects at least ~0.6 of a load; the other model's hour is 8 hours away)
    events = {"acme/daily": sorted(now - d * 86400 + m for d in range(1, 15) for m in (600, 1200)),
              "acme/night": [now - d * 86400 + 8 * hour for d in range(1, 15)]}
    node_env.state.mkdir(parents=True, exist_ok=True)
    (node_env.state / "intent-loads.json").write_text(_json.dumps({"format": 1, "half_life_s": 14 * 86400.0,
                                                                   "weekly_weight": 0.6, "events": events}))
    node_env.config.write_text(node_env.config.read_text() + (
        '[intent]\nreconcile_s = 1\npoll_s = 0.2\n[intent.prewarm]\nwindow = "00:00-23:59"\ntier = "warm"\n'
        'top = 2\nmin_score = 0.3\n'))
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        until("acme/daily prewarmed", lambda: (node_env.warm / "acme/daily/v1").is_dir(), timeout=30)
        p = wd("intent", "explain", "--json")
        assert p.returncode == 0, p.stderr
        doc = _json.loads(p.stdout)
        pre = [x for x in doc["prewarms"] if x["model"] == "acme/daily"]
        assert pre and pre[0]["outcome"] == "placed acme/daily@v1 in warm", doc
        assert re.search(r"expected \d+\.\d loads .*: \d+ load\(s\) on \w+s at these hours and \d+ at these hours on any "
                         r"day \(half-life 14 d\)", pre[0]["reason"]), pre[0]["reason"]
        assert not (node_env.warm / "acme/night").exists()
        assert [f["model"] for f in doc["forecast"]][:1] == ["acme/daily"]
        text = wd("intent", "explain").stdout
        assert "acme/daily -> warm: placed acme/daily@v1 in warm" in text and "because expected" in text
        assert d.metric('weightd_intent_prewarms_total{tier="warm"}') >= 1
        # a load through the daemon is recorded in the history
        assert wd("preload", "acme/night@v1", "--tier", "hot").returncode == 0
        until("the history has the new load", lambda: len(_json.loads(
            (node_env.state / "intent-loads.json").read_text())["events"]["acme/night"]) == 15, timeout=20)
    finally:
        d.stop()


def test_intent_configured_by_a_reload_starts_without_a_restart(node_env, isolated_env, wd, tmp_path: Path) -> None:
    import signal
    publish(wd, tmp_path, "acme/late", "v1", size=2 * MiB)
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        assert intent_status(wd)["dir"] is None
        idir = tmp_path / "intent.d"
        idir.mkdir()
        (idir / "a.toml").write_text('[[keep]]\nmodel = "acme/late@latest"\n')
        node_env.config.write_text(node_env.config.read_text() + f'[intent]\ndir = "{idir}"\npoll_s = 0.2\n')
        d.proc.send_signal(signal.SIGHUP)
        until("converged after the reload", lambda: (s := intent_status(wd)) and s["entries"]
              and s["entries"][0]["state"] == "ready", timeout=30)
        assert (node_env.warm / "acme/late/v1").is_dir()
    finally:
        d.stop()


def test_intent_keeps_partial_copies_and_sets(node_env, isolated_env, wd, tmp_path: Path) -> None:
    """An entry with patterns keeps a partial copy of each version (its own object, leased by the
    entry); a models list keeps each adapter; a model's default patterns apply to a plain entry."""
    publish(wd, tmp_path, "acme/chat", "v1", size=4 * MiB)
    for i in range(3):
        publish(wd, tmp_path, f"lora/a{i}", "v1", size=1 * MiB)
    idir = tmp_path / "intent.d"
    idir.mkdir()
    node_env.config.write_text(node_env.config.read_text() + (
        f'[intent]\ndir = "{idir}"\nreconcile_s = 2\npoll_s = 0.2\n[models."lora/*"]\nexclude = ["*.md"]\n'))
    (idir / "chat.toml").write_text('[[keep]]\nmodel = "acme/chat@latest"\nexclude = ["original/"]\n'
                                    '[[keep]]\nmodels = ["lora/a0@v1", "lora/a1@latest", "lora/a2@v1"]\ntier = "hot"\n')
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        st = until("every entry ready", lambda: (s := intent_status(wd)) and
                   all(r["state"] == "ready" for r in s["entries"]) and len(s["entries"]) == 4 and s)
        assert {r["entry"] for r in st["entries"]} == {"chat.toml keep #1"} | {
            f"chat.toml keep #2 models[{i}]" for i in range(3)}
        status = json.loads(wd("status", "--json").stdout)
        by = {(c["name"], c["version"]): c for c in status["checkpoints"]}
        chat = [c for (n, v), c in by.items() if n == "acme/chat"]
        assert len(chat) == 1 and chat[0]["version"].startswith("v1~p")          # the partial copy, not v1
        assert chat[0]["part_of"]["selection"] == {"exclude": ["original/*"]}
        assert [le["holder"] for le in chat[0]["tiers"]["warm"]["leases"]] == ["intent chat.toml keep #1"]
        assert not (node_env.warm / "acme/chat/v1").exists()
        for i in range(3):   # (no .md in these checkpoints: the default patterns keep every file, the version)
            c = by[(f"lora/a{i}", "v1")]
            assert [le["holder"] for le in c["tiers"]["hot"]["leases"]] == [f"intent chat.toml keep #2 models[{i}]"]
        # a partial copy is not the model for a scheduler: no ready gauge says acme/chat is here
        assert 'weightd_model_ready{model="acme/chat"' not in d.metrics()
        assert d.metric('weightd_model_ready{model="lora/a0",tier="hot",version="v1"}') == 1
        # a second round changes nothing (the partial copy counts as held: no refetch)
        before = d.log_path.read_text().count("intent: fetching")
        r0 = intent_status(wd)["rounds"]   # two more full rounds (reconcile_s = 2), seen in intent status
        until("two more reconcile rounds", lambda: intent_status(wd)["rounds"] >= r0 + 2, timeout=30)
        assert d.log_path.read_text().count("intent: fetching") == before
    finally:
        d.stop()
