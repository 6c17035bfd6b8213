"""Several origins, the control plane (#39), with real daemons on 127.0.0.x: workers report to every
origin and ``weightd fleet status`` merges their views (one origin SIGKILLed: the other answers, and
the status says which is down; restarted, it gets the reports again without a worker restart); a
rollout with ``max_movers = 1`` never has two movers at once while the first origin is killed and
restarted mid-rollout, and completes once it is back."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

from tiering.sample import make_checkpoint

from .test_intent_daemon import _log_times, assert_one_mover_at_a_time, until
from .test_p2p import cluster, started  # noqa: F401 (cluster: the fixture)

MiB = 1 << 20


def two_origins(cluster, extra: str = "") -> list:  # noqa: F811
    return started([cluster(ip, role="origin", p2p_extra=f"\n[intent]\nmax_movers = 1\n{extra}", wait=False)
                    for ip in ("127.0.0.2", "127.0.0.3")])


def worker_p2p(origins: list, intent: str) -> str:
    """A worker's [p2p] lines naming both origins (peers and trackers), then its [intent] table."""
    peers = ", ".join(f'"{o.endpoint}"' for o in origins)
    trackers = ", ".join(f'"http://{o.ip}:{o.tracker_port}/announce"' for o in origins)
    return f"peers = [{peers}]\ntrackers = [{trackers}]\n{intent}"


def fleet(node, *origins) -> tuple[int, dict | None, str]:
    """``weightd fleet status --json`` on ``node`` (its origins, or ``--origin`` each of ``origins``)."""
    args = [a for o in origins for a in ("--origin", f"http://{o.ip}:{o.tracker_port}")]
    p = node.cli("fleet", "status", "--json", *args, timeout=60)
    return p.returncode, json.loads(p.stdout) if p.returncode == 0 else None, p.stderr


def names(doc: dict | None) -> set[str]:
    return {n["node"] for n in (doc or {}).get("nodes") or []}


def held(doc: dict | None, version: str = "v1") -> set[str]:
    """The nodes whose report holds ``version``."""
    return {n["node"] for n in (doc or {}).get("nodes") or [] if any(h["version"] == version for h in n["holdings"])}


def kill(origin) -> None:
    origin.proc.kill()                    # SIGKILL: no goodbye, no state written at exit
    origin.proc.wait(timeout=10)
    (origin.dir / "weightd.sock").unlink(missing_ok=True)


def restart(origin) -> None:
    origin.start()
    until(f"origin {origin.ip}'s tracker answers", lambda: _answers(origin), timeout=30)


def _answers(origin) -> bool:
    try:
        urllib.request.urlopen(f"http://{origin.ip}:{origin.tracker_port}/v1/fleet", timeout=2).read()
        return True
    except OSError:
        return False


def origins_and_workers(cluster, tmp_path: Path, model: str, keep: str, size: int, *, shards: int = 1,
                        jitter: bool = False) -> tuple:
    """Two origins with ``model``@v1 published (``size`` bytes) and three workers (w4-w6) listing both,
    following the intent file ``keep`` (reconciled every second, reporting every second)."""
    idir = tmp_path / "intent.d"
    idir.mkdir()
    (idir / "fleet.toml").write_text(keep)
    a, b = two_origins(cluster)
    src = make_checkpoint(tmp_path / "v1", total_bytes=size, shards=shards, layers=2, seed="v1")
    assert a.cli("publish", str(src), "--name", model, "--version", "v1").returncode == 0
    intent = f'[intent]\ndir = "{idir}"\nreconcile_s = 1\npoll_s = 0.2\n' + ("jitter_s = 1\n" if jitter else "") \
        + "report_s = 1\n"
    workers = started([cluster(f"127.0.0.{i}", p2p_extra=worker_p2p([a, b], intent + f'node_name = "w{i}"\n'),
                               wait=False) for i in (4, 5, 6)])
    return a, b, workers


def test_workers_report_to_both_origins_and_fleet_status_merges_and_rides_out_one(cluster, tmp_path: Path
                                                                                  ) -> None:  # noqa: F811
    a, b, workers = origins_and_workers(cluster, tmp_path, "org/m", '[[keep]]\nmodel = "org/m@latest"\n', 4 * MiB)
    want = {"w4", "w5", "w6"}
    # every origin has every worker's report, v1 held: each view alone is the whole fleet
    for o in (a, b):
        until(f"{o.ip}'s view", lambda o=o: held(fleet(workers[0], o)[1]) == want, timeout=60)
    rc, doc, err = fleet(workers[0])           # (the worker's own config: both origins, merged)
    assert rc == 0 and names(doc) == want and not err, (rc, err)
    assert [o["url"] for o in doc["origins"]] == [f"http://{o.ip}:{o.tracker_port}" for o in (a, b)]
    assert all(o["nodes"] == 3 and "error" not in o for o in doc["origins"]), doc["origins"]
    assert {v["model"]: v["nodes"]["total"] for v in doc["versions"]} == {"org/m": 3}, doc["versions"]
    p = workers[0].cli("fleet", "status")
    assert p.returncode == 0 and "reporting to 2 of 2 origins" in p.stdout and "org/m@v1" in p.stdout, p.stdout
    # the first origin dies: the status still answers from the other, and says which is down
    kill(a)
    rc, doc, err = fleet(workers[0])
    assert rc == 0 and names(doc) == want, (rc, err)
    down = [o for o in doc["origins"] if "error" in o]
    assert [o["url"] for o in down] == [f"http://{a.ip}:{a.tracker_port}"], doc["origins"]
    assert f"{a.ip}:{a.tracker_port}" in err and "warning" in err.lower(), err
    p = workers[0].cli("fleet", "status")
    assert p.returncode == 0 and f"reporting to 1 of 2 origins (http://{b.ip}:{b.tracker_port})" in p.stdout, p.stdout
    # the only origin asked is down: an error, one line
    rc, _doc, err = fleet(workers[0], a)
    assert rc == 1 and len(err.strip().splitlines()) == 1 and a.ip in err, err
    # it comes back with an empty view and the workers, not restarted, report to it again
    restart(a)
    until("the restarted origin's view", lambda: names(fleet(workers[0], a)[1]) == want, timeout=30)
    assert all(w.proc.poll() is None for w in workers)


def _moving(node) -> int:
    """1 while ``node`` runs a transfer (its own metrics: the single flights in progress), else 0."""
    listen = re.search(r'\[metrics\]\nlisten = "([^"]+)"', node.config.read_text()).group(1)
    try:
        text = urllib.request.urlopen(f"http://{listen}/metrics", timeout=5).read().decode()
    except OSError:
        return 0
    return int(any(float(v) > 0 for v in re.findall(r"^weightd_transfer_phase\{[^}]*\} (\S+)$", text, re.M)))


class Movers:
    """How many workers move at once, sampled from each worker's metrics every 0.1 s in a thread."""

    def __init__(self, workers: list) -> None:
        self.workers, self.most, self.seen, self.samples = workers, 0, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            n = sum(_moving(w) for w in self.workers)
            self.most, self.seen, self.samples = max(self.most, n), self.seen + (n > 0), self.samples + 1
            self.stop.wait(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=20)


def test_a_rollout_with_one_mover_across_an_origin_restart(cluster, tmp_path: Path) -> None:  # noqa: F811
    """max_movers = 1 on both origins; the first origin is SIGKILLed while the first worker moves and
    restarted 2 s later: never two movers at once (sampled continuously from the workers' metrics,
    and by their logs' rollout spans), and every worker reaches v2 once the origin is back."""
    # (v1 is only what the workers hold before the rollout: 4 MiB. v2, 12 MiB at the entry's 4 MB/s, is
    # ~3.5 s a mover; the first, stalled while the origin is down, takes ~7 s and still moves when the
    # origin is back, ~3.5 s after it started: in three runs it ended 3.4-3.7 s after the restarted
    # origin answered. 16 MiB, ~4.5 s a mover, gave the same picture ~4 s later)
    a, b, workers = origins_and_workers(cluster, tmp_path, "org/roll", '[[keep]]\nmodel = "org/roll@latest"\n'
                                        'versions = 2\nbandwidth = "4MB"\n', 4 * MiB, shards=2, jitter=True)
    for w in workers:
        until(f"{w.ip} on v1", lambda w=w: (w.dir / "warm/org/roll/v1").is_dir(), timeout=90)
    until("reports at both origins", lambda: all(len(names(fleet(workers[0], o)[1])) == 3 for o in (a, b)), timeout=30)
    until("no transfer left of v1", lambda: sum(_moving(w) for w in workers) == 0, timeout=30)
    movers = Movers(workers)
    try:
        v2 = make_checkpoint(tmp_path / "v2", total_bytes=12 * MiB, shards=2, layers=2, seed="v2")
        assert a.cli("publish", str(v2), "--name", "org/roll", "--version", "v2").returncode == 0
        until("a first mover", lambda: any(_log_times(w.dir / "daemon.log", r"intent: fetching org/roll@v2 .*\(rollout\)")
                                           for w in workers), timeout=60, every=0.05)
        time.sleep(0.5)
        kill(a)
        time.sleep(2)
        restart(a)
        for w in workers:
            until(f"{w.ip} on v2", lambda w=w: (w.dir / "warm/org/roll/v2").is_dir(), timeout=120)
    finally:
        movers.close()
    assert movers.most == 1 and movers.seen >= 5, (movers.most, movers.seen, movers.samples)
    assert_one_mover_at_a_time(workers, "org/roll", "v2")
    # the restarted origin kept the held slot (state_dir/rollout-slots.json) and its view is back
    assert "held slot(s) restored from" in (a.dir / "daemon.log").read_text()
    for w in workers:
        st = json.loads(w.cli("intent", "status", "--json").stdout)
        assert (st["entries"][0]["state"], st["entries"][0]["want"]) == ("ready", "v2"), st["entries"]
    until("the restarted origin's view", lambda: names(fleet(workers[0], a)[1]) == {"w4", "w5", "w6"}, timeout=30)

