"""Weight traffic yields the link to serving traffic (issue 37 part 1): the control rule on
deterministic samples, the session's limits under the fixed caps, the [network] config, and for
real: two network namespaces joined by a veth shaped with tc, an origin and a worker daemon, a
serving-like socket flow (root only; bounded in time, never a timed benchmark: bench/nic.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from weightd.config.network import NetworkSettings
from weightd.node import network
from weightd.node.network import BACKOFF, FULL, QUIET_ENTER, RAISE_PER_S, NetworkYield, Sample, YieldRule, wire
from weightd.node.network_routes import endpoints_of, find_interfaces

from .conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
C = 25_000_000   # bytes/s: a 200 Mbit/s link


def nics(tmp_path: Path, *names: str) -> str:
    """A /sys/class/net with these interfaces (no speed files: [network] capacity gives it)."""
    for n in names:
        (tmp_path / "net" / n).mkdir(parents=True, exist_ok=True)
    return str(tmp_path / "net")


class Session:
    """What the controller calls on a P2PSession, recorded (the real one: the fixed-caps test)."""

    def __init__(self) -> None:
        self.limits: list[tuple[int, int]] = []
        self.traffic_calls = 0

    def set_yield_limits(self, download: int, upload: int) -> tuple[int, int]:
        self.limits.append((download, upload))
        return download, upload

    def traffic(self) -> tuple[int, int]:
        self.traffic_calls += 1
        return 0, 0


def simulate(rule: YieldRule, ask: "list[float]", steps: int) -> list[tuple[float, float, float]]:
    """A link of capacity C shared by weightd (wanting all of it) and a flow asking ``ask[k]`` at step k:
    weightd sends at its limit of the step before (libtorrent follows a new limit a step late), but
    TCP leaves the flow at least half the link while both want more; the flow gets what it asks of
    what is left. (weightd's rate, the flow's, the new limit) per step."""
    limit, prev_limit, out = float(C), float(C), []
    for k in range(steps):
        w = min(prev_limit, C - min(ask[k], C / 2))
        f = min(ask[k], C - w)
        prev_limit = limit
        limit = rule.step(f, 1.0, own=w)
        out.append((w, f, limit))
    return out


def test_alone_weightd_may_fill_the_link() -> None:
    rule = YieldRule(C)
    for _ in range(5):
        assert rule.step(0.0, 1.0, own=C) == C
    # a trickle (tracker announces, ACKs) below QUIET_ENTER changes nothing
    assert rule.step(0.02 * C, 1.0, own=0.98 * C) == C


def test_a_flow_joining_gets_its_ask_within_a_few_steps_and_the_floor_holds() -> None:
    rule = YieldRule(C, ceiling=0.8, floor=0.05)
    ask = 0.7 * C
    run = simulate(rule, [0.0] * 2 + [ask] * 18, 20)
    assert run[1][0] == C                                           # alone: the whole link
    settled = run[2 + 4:]                                           # 4 steps to yield, with the lag
    assert all(f >= 0.9 * ask for _, f, _ in settled), run
    assert all(w >= 0.05 * C - 1 for w, _, _ in run), run          # weights still arrive
    assert all(w + f <= 0.8 * C + 1 for w, f, _ in settled), run   # the link under the ceiling
    limits = [lim for _, _, lim in settled]
    assert max(limits) - min(limits) < 1, limits                    # no oscillation once settled


def test_a_step_gives_one_fall_and_no_swing() -> None:
    """Without the full-link back-off (the flow gets its ask at once), one step of others' traffic
    gives one fall, held while it lasts: the limit never goes up and down again."""
    rule = YieldRule(C, ceiling=0.8, floor=0.05)
    limits = [rule.step(0.0 if k < 3 else 0.5 * C, 1.0, own=0.0) for k in range(15)]
    assert limits[:3] == [C] * 3
    assert limits[3:] == [pytest.approx(0.3 * C)] * 12


def test_return_after_the_flow_stops_is_bounded_and_monotonic() -> None:
    rule = YieldRule(C, ceiling=0.8, floor=0.05)
    for _ in range(10):
        rule.step(0.7 * C, 1.0, own=0.1 * C)
    assert rule.limit == pytest.approx(0.1 * C)
    back = [rule.step(0.0, 1.0, own=rule.limit) for _ in range(10)]
    assert back == sorted(back), back                               # rises only
    assert all(b - a <= RAISE_PER_S * C + 1 for a, b in zip([0.1 * C, *back], back)), back
    first_full = next(i for i, v in enumerate(back) if v >= 0.85 * C)
    assert first_full <= 6, back                                    # a few seconds, not a minute
    assert back[-1] == C


def test_the_floor_holds_against_a_flow_wanting_everything() -> None:
    rule = YieldRule(C, ceiling=0.8, floor=0.1)
    for _ in range(10):
        lim = rule.step(C, 1.0, own=0.1 * C)
    assert lim == pytest.approx(0.1 * C)


def test_full_link_backs_off_by_half_and_not_below_the_floor() -> None:
    rule = YieldRule(C, ceiling=0.8, floor=0.05)
    lim = rule.step(0.08 * C, 1.0, own=0.92 * C)          # others squeezed in at 8%: the link is full
    assert others_full(0.08, 0.92) and lim == pytest.approx(min(0.72 * C, BACKOFF * 0.92 * C))
    assert rule.step(0.9 * C, 1.0, own=0.06 * C) == pytest.approx(0.05 * C)


def others_full(others: float, own: float) -> bool:
    return others + own > FULL


def test_hysteresis_at_the_quiet_edge() -> None:
    rule = YieldRule(C)
    rule.step(0.2 * C, 1.0, own=0.0)
    assert not rule.quiet
    # others hovering at 4-5%: between QUIET_ENTER and QUIET_LEAVE, the rule stays where it is
    assert QUIET_ENTER < 0.04
    for k in range(20):
        rule.step((0.04 if k % 2 else 0.05) * C, 1.0, own=rule.limit)
        assert not rule.quiet and rule.limit < C


def test_controller_limits_reach_the_session_under_fixed_caps(tmp_path: Path) -> None:
    """The controller sets the session's limits (0 at capacity), and P2PSession keeps the lower of its
    fixed caps and the controller's (a real libtorrent session)."""
    from p2p import P2PConfig, P2PSession
    net = nics(tmp_path, "lo0x")
    ses = P2PSession(P2PConfig(listen="127.0.0.1:0", upload_limit=1_000_000, download_limit=0))
    try:
        ctl = NetworkYield()
        ctl.configure(NetworkSettings(capacity=C, interfaces=("lo0x",)), [], net)
        ctl.tick(Sample(0.0, {"lo0x": (0, 0)}), ses)
        view = ctl.tick(Sample(1.0, {"lo0x": (0, int(0.9 * C))}), ses)    # others at 90% of the link
        assert view["yielding"] and view["upload"]["others_bytes_per_s"] == int(0.9 * C)
        assert view["upload"]["limit_bytes_per_s"] == int(0.05 * C)         # the floor
        s = ses.ses.get_settings()
        assert s["upload_rate_limit"] == 1_000_000                          # the fixed cap is lower still
        assert s["download_rate_limit"] == 0                                # nothing on rx: no limit
        ctl.tick(Sample(2.0, {"lo0x": (int(1.8 * C), int(1.8 * C))}), ses)  # rx at 90% over the window
        assert ses.ses.get_settings()["download_rate_limit"] == int(0.05 * C)
        assert ses.ses.get_peer_class(ses.ses.local_peer_class_id)["download_limit"] == int(0.05 * C)
        assert ses.ses.get_peer_class(ses.ses.local_peer_class_id)["upload_limit"] == 1_000_000
        ctl.configure(NetworkSettings(enabled=False, capacity=C, interfaces=("lo0x",)), [], net)
        for t in (3.0, 4.0):
            ctl.tick(Sample(t, {"lo0x": (int(1.8 * C), int(1.8 * C))}), ses)
        s = ses.ses.get_settings()                                          # off: the fixed caps again
        assert (s["download_rate_limit"], s["upload_rate_limit"]) == (0, 1_000_000)
    finally:
        ses.close()


def test_own_bytes_are_not_others(tmp_path: Path) -> None:
    ctl = NetworkYield()
    ctl.configure(NetworkSettings(capacity=C, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}, p2p=(0, 0)), None)
    own_rx = 20_000_000
    view = ctl.tick(Sample(1.0, {"x0": (int(wire((own_rx, 0))[0]), int(wire((own_rx, 0))[1]))}, p2p=(own_rx, 0)),
                    None)
    assert view["download"]["others_bytes_per_s"] == 0 and view["upload"]["others_bytes_per_s"] == 0
    assert not view["yielding"]


def test_endpoints_and_off_states(tmp_path: Path, isolated_env) -> None:
    from weightd.config import load_config
    cfg = tmp_path / "w.toml"
    cfg.write_text('[p2p]\nlisten = "10.9.0.5:6881"\npeers = ["10.9.0.1:6881"]\n'
                   'trackers = ["http://tracker.example:6969/announce"]\n')
    s = load_config(cfg, env=isolated_env).settings
    assert endpoints_of(s) == ["10.9.0.1", "10.9.0.5", "tracker.example"]
    ctl = NetworkYield()
    ctl.configure(NetworkSettings(interfaces=("speedless0",)), [], sys_net=nics(tmp_path, "speedless0"))
    assert not ctl.enabled and "speedless0 reports no speed" in ctl.reason
    ctl.configure(NetworkSettings(enabled=False, capacity=C, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    assert not ctl.enabled and "enabled = false" in ctl.reason


@pytest.mark.parametrize("body, needle", [
    ('ceiling = 1.5', "network.ceiling"),
    ('floor = "50%"\nceiling = "40%"', "floor (0.5) must be at most ceiling (0.4)"),
    ('interfaces = ["eth0/x"]', "'eth0/x' is not an interface name"),
    ('capacity = "fast"', "network.capacity"),
    ('ceiling = "eighty%"', "network.ceiling"),
    ('floor = 0', "network.floor: must be above 0"),
    ('floor = "0%"', "network.floor: must be above 0"),
    ('capacity = 100', "100 is 100 bytes/s, under 1 MB/s (a bare number is bytes/s)"),
    ('capacity = "100kbit"', "under 1 MB/s"),
    ('capacity = "10GBps"', "expected a rate like '100Gbit'"),
])
def test_bad_network_config_is_one_line(weightd, tmp_path: Path, body: str, needle: str) -> None:
    cfg = tmp_path / "w.toml"
    cfg.write_text(f"[network]\n{body}\n")
    assert_one_line_error(weightd("--config", cfg, "config", "show"), 2, needle)


def test_good_network_config(weightd, tmp_path: Path) -> None:
    cfg = tmp_path / "w.toml"
    cfg.write_text('[network]\ncapacity = "25MB"\nceiling = "75%"\nfloor = 0.1\ninterfaces = ["eth0"]\n')
    r = weightd("--config", cfg, "config", "show")
    assert r.returncode == 0, r.stderr
    assert "ceiling = 0.75" in r.stdout and "interfaces = [\"eth0\"]" in r.stdout
    for text, n in (("10Gbit", 1_250_000_000), ("100 Gbit/s", 12_500_000_000), ("25Gbps", 3_125_000_000),
                    ("400Mbit", 50_000_000), ("12.5GB/s", 12_500_000_000), ("12.5GB", 12_500_000_000), (0, 0),
                    (1_000_000, 1_000_000)):
        assert NetworkSettings(capacity=text).capacity == n, text
    cfg.write_text('[network]\ncapacity = "10Gbit"\n')
    r = weightd("--config", cfg, "config", "show")
    assert r.returncode == 0 and "capacity = 1250000000  # 1.2 GiB" in r.stdout, (r.stdout, r.stderr)


# -- review findings: each fails without its fix -------------------------------------------------------

def test_a_bad_host_name_is_skipped_not_raised() -> None:
    # "a..b" makes getaddrinfo raise UnicodeError (a ValueError), not OSError
    assert find_interfaces(["tracker..example"]) == ()


def _daemon(settings: Any, session: Any, ctl: NetworkYield) -> Any:
    return SimpleNamespace(network=ctl, config=SimpleNamespace(settings=settings), stopping=asyncio.Event(),
                           node=SimpleNamespace(roots=SimpleNamespace(object=None)), session=session)


def _settings(net: NetworkSettings, trackers: tuple[str, ...] = ()) -> Any:
    return SimpleNamespace(network=net, tiers=SimpleNamespace(cold=SimpleNamespace(url=None)),
                           p2p=SimpleNamespace(peers=(), listen="", tracker_listen=None, trackers=trackers))


def _run_loop(d: Any, seconds: float, check: Any = None) -> None:
    async def go() -> None:
        task = asyncio.create_task(network.network_loop(d))
        await asyncio.sleep(seconds)
        assert not task.done(), task    # (never dies: a task that ended would re-raise below)
        if check is not None:
            check()
        d.stopping.set()
        await asyncio.wait_for(task, 5)
    asyncio.run(go())


def test_the_loop_survives_a_failing_configure_and_lifts_the_limits(tmp_path: Path, monkeypatch, caplog) -> None:
    """configure raising (a reload to a config it cannot use) leaves the rule off with its limits lifted,
    the error logged once, and the loop ticking; a bad tracker name does not fail it at all."""
    ses = Session()
    ctl = NetworkYield()
    ctl.configure(NetworkSettings(capacity=C, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}), ses)
    ctl.tick(Sample(1.0, {"x0": (int(0.9 * C), 0)}), ses)
    assert ses.limits[-1][0] == int(0.05 * C) and ctl.view["yielding"]          # yielding, low

    def boom(hosts: Any) -> tuple[str, ...]:
        raise RuntimeError("no routes today")
    monkeypatch.setattr(network, "find_interfaces", boom)
    monkeypatch.setattr(network, "SAMPLE_S", 0.01)
    caplog.set_level(logging.DEBUG, "weightd.node.network")
    d = _daemon(_settings(NetworkSettings()), ses, ctl)
    _run_loop(d, 0.3, lambda: ctl.enabled is False and "no routes today" in ctl.view["state"]
              and not ctl.view["yielding"] or pytest.fail(str(ctl.view)))
    assert ses.limits[1] == (0, 0) and not ctl.enabled, ses.limits                          # lifted at once
    assert ses.traffic_calls >= 5                                              # and still sampling
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and "no routes today" in r.getMessage()]
    assert len(warned) == 1, warned

    monkeypatch.undo()
    monkeypatch.setattr(network, "SAMPLE_S", 0.01)
    d = _daemon(_settings(NetworkSettings(), ("http://tracker..example:6969/announce",)), Session(), NetworkYield())
    _run_loop(d, 0.1, lambda: "no interface carries" in d.network.reason or pytest.fail(d.network.reason))


def test_the_loop_lifts_its_limits_when_it_ends(tmp_path: Path, monkeypatch) -> None:
    ses = Session()
    ctl = NetworkYield()
    net = NetworkSettings(capacity=C, interfaces=("x0",))
    ctl.configure(net, [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}), ses)
    ctl.tick(Sample(1.0, {"x0": (int(0.9 * C), 0)}), ses)
    monkeypatch.setattr(network, "SAMPLE_S", 0.01)
    monkeypatch.setattr(NetworkYield, "configure", lambda self, *a: None)   # (keep the x0 set up above)
    d = _daemon(_settings(net), ses, ctl)

    async def go() -> None:   # (the daemon cancels its duties when it stops)
        task = asyncio.create_task(network.network_loop(d))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())
    assert ses.limits[-1] == (0, 0) and not ctl.enabled and "stopped" in ctl.view["state"]


def test_the_limit_never_reaches_0_which_is_no_limit(tmp_path: Path) -> None:
    ses = Session()
    ctl = NetworkYield()
    ctl.configure(NetworkSettings(capacity=C, floor=1e-9, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}), ses)
    view = ctl.tick(Sample(1.0, {"x0": (C, 0)}), ses)          # others take the whole link: the floor, 0.025 B/s
    assert ses.limits[-1] == (1, 0) and ctl.enabled and view["download"]["limit_bytes_per_s"] == 1


def test_a_missing_interface_is_named_and_a_vanished_one_holds_the_limits(tmp_path: Path) -> None:
    ctl = NetworkYield()
    ctl.configure(NetworkSettings(capacity=C, interfaces=("eht0",)), [], nics(tmp_path, "eth0"))
    assert not ctl.enabled and ctl.reason == "off: no such interface eht0 ([network] interfaces)"
    ses = Session()
    ctl.configure(NetworkSettings(capacity=C, interfaces=("eth0",)), [], nics(tmp_path, "eth0"))
    ctl.tick(Sample(0.0, {"eth0": (0, 0)}), ses)
    ctl.tick(Sample(1.0, {"eth0": (int(0.6 * C), 0)}), ses)
    held = ses.limits[-1]
    assert held[0] == pytest.approx(0.2 * C, abs=1)
    for t in (2.0, 3.0, 4.0):                                    # eth0 gone from /proc/net/dev
        view = ctl.tick(Sample(t, {}), ses)
    assert ses.limits[-1] == held and view["enabled"] and view["yielding"], (ses.limits, view)
    assert view["state"] == "on, but eth0 is missing: the last limits hold"
    assert view["download"]["limit_bytes_per_s"] == held[0]


def test_nics_of_different_speeds_take_the_busy_ones_limit(tmp_path: Path) -> None:
    """A busy fast NIC (10x C) beside a quiet slow one (C): the fast one's limit holds, though it is over
    the slow one's capacity (the quiet slow NIC sets no limit, not one at its capacity)."""
    ses = Session()
    ctl = NetworkYield()
    net = nics(tmp_path, "fast0", "slow0")
    (Path(net) / "fast0" / "speed").write_text(str(10 * C * 8 // 10**6))   # Mbit/s
    (Path(net) / "slow0" / "speed").write_text(str(C * 8 // 10**6))
    ctl.configure(NetworkSettings(interfaces=("fast0", "slow0")), [], net)
    assert ctl.enabled and ctl.capacity == {"fast0": 10 * C, "slow0": C}, ctl.capacity
    ctl.tick(Sample(0.0, {"fast0": (0, 0), "slow0": (0, 0)}), ses)
    view = ctl.tick(Sample(1.0, {"fast0": (5 * C, 0), "slow0": (0, 0)}), ses)    # others: 50% of fast0
    assert ses.limits[-1] == (3 * C, 0) and ctl.enabled, ses.limits                        # 0.8 * 10C - 5C
    assert view["download"]["limit_bytes_per_s"] == 3 * C and view["yielding"]


def test_a_late_sample_keeps_the_one_before(tmp_path: Path) -> None:
    ses = Session()
    ctl = NetworkYield()
    ctl.configure(NetworkSettings(capacity=C, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    rate = 0.6 * C
    for t in (0.0, 1.0, 2.0):
        ctl.tick(Sample(t, {"x0": (int(rate * t), 0)}), ses)
    view = ctl.tick(Sample(6.0, {"x0": (int(rate * 6), 0)}), ses)              # 4 s late, the flow still on
    assert view["download"]["others_bytes_per_s"] == pytest.approx(rate, rel=1e-6)
    assert ses.limits[-1][0] == pytest.approx(0.2 * C, abs=1) and view["yielding"]


def test_an_s3_cold_tier_routes_by_its_endpoint_or_regional_host(tmp_path: Path, isolated_env, monkeypatch) -> None:
    from weightd.config import load_config
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "w.toml"

    def hosts(cold: str) -> list[str]:
        cfg.write_text(f'[tiers.cold]\nurl = "s3://weights-bucket/models"\n{cold}')
        return endpoints_of(load_config(cfg, env=isolated_env).settings)
    assert hosts('endpoint = "http://minio.lan:9000"\n') == ["minio.lan"]
    assert hosts('region = "eu-west-1"\n') == ["s3.eu-west-1.amazonaws.com"]
    assert hosts("") == []                                                     # not the bucket's name
    monkeypatch.setenv("AWS_REGION", "us-east-2")
    assert hosts("") == ["s3.us-east-2.amazonaws.com"]


def test_interfaces_are_found_again_while_off_or_discovered(tmp_path: Path, monkeypatch) -> None:
    asked: list[list[str]] = []

    def found(hosts: Any) -> tuple[str, ...]:
        asked.append(list(hosts))
        return ()
    monkeypatch.setattr(network, "find_interfaces", found)
    monkeypatch.setattr(network, "SAMPLE_S", 0.01)
    monkeypatch.setattr(network, "RECONFIGURE_S", 0.05)
    d = _daemon(_settings(NetworkSettings(), ("http://10.9.0.1:6969/announce",)), Session(), NetworkYield())
    _run_loop(d, 0.4)
    assert len(asked) >= 3 and asked[0] == ["10.9.0.1"], asked
    # configured again with the same outcome: the rules and samples carry on
    ctl = NetworkYield()
    net = NetworkSettings(capacity=C, interfaces=("x0",))
    ctl.configure(net, [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}), None)
    ctl.tick(Sample(1.0, {"x0": (int(0.6 * C), 0)}), None)
    rules, last = dict(ctl.rules), ctl.last
    ctl.configure(net, [], nics(tmp_path, "x0"))
    assert ctl.rules == rules and all(ctl.rules[k] is rules[k] for k in rules) and ctl.last is last



def test_limits_above_libtorrents_32_bits_are_held_at_its_highest(tmp_path: Path) -> None:
    """A 100 Gbit link with others at 3 GB/s: the rule's 7 GB/s is more than libtorrent's 32-bit limit
    can hold (it would wrap to 205 MB/s or to 0, no limit): the session gets its highest, 2**31-1."""
    ses = Session()
    ctl = NetworkYield()
    big = 12_500_000_000
    ctl.configure(NetworkSettings(capacity=big, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}), ses)
    ctl.tick(Sample(1.0, {"x0": (3_000_000_000, 0)}), ses)
    assert ses.limits[-1] == (2**31 - 1, 0) and ctl.enabled, ses.limits


def test_a_rediscovery_that_finds_nothing_keeps_the_interfaces(tmp_path: Path, monkeypatch) -> None:
    """Interfaces found from the routes, then a DNS blip at the next discovery: the rule stays on over
    the interfaces it had (it switched off and lifted every limit for a minute)."""
    net = nics(tmp_path, "x0")
    found = iter([("x0",), ()])
    monkeypatch.setattr(network, "find_interfaces", lambda hosts: next(found))
    settings = NetworkSettings(capacity=C)
    ctl = NetworkYield()
    ctl.configure(settings, ["10.9.0.1"], net)
    assert ctl.enabled and ctl.interfaces == ("x0",)
    ctl.configure(settings, ["10.9.0.1"], net)
    assert ctl.enabled and ctl.interfaces == ("x0",), ctl.reason


@pytest.mark.parametrize("capacity", ["9" * 310 + "Gbit", "9" * 400, 10**30])
def test_an_absurd_capacity_is_a_config_error_not_a_traceback(capacity: Any) -> None:
    from weightd.config.network import parse_capacity
    with pytest.raises(ValueError):
        parse_capacity(capacity)

# -- for real: namespaces, tc, daemons -----------------------------------------------------------------

def _netns_skip() -> str | None:
    from bench._netns import usable
    return usable()


@pytest.mark.skipif(_netns_skip() is not None, reason=f"network namespaces: {_netns_skip()}")
def test_weights_yield_to_a_serving_flow_on_a_shaped_link(tmp_path: Path) -> None:
    """200 Mbit/s A -> B: the transfer alone near the link rate; a flow asking 70% of the link joins and
    gets >= 85% of its ask while weights still arrive; the state shows in status --json."""
    from bench._netns import A_IP, B_IP, Daemon, Flow, Link, publish, tear_down
    link = Link(200)
    rate = link.rate_bytes
    daemons: list[Daemon] = []
    preload = None
    try:
        origin = Daemon(link, tmp_path, link.a, A_IP, tmp_path / "cold", role="origin", capacity=rate)
        daemons.append(origin)
        ref = publish(origin, tmp_path, 320 << 20)
        worker = Daemon(link, tmp_path, link.b, B_IP, tmp_path / "cold", role="worker", capacity=rate)
        daemons.append(worker)
        flow = Flow(link, tmp_path)
        preload = worker.popen("preload", ref, "--tier", "warm", "--json", "--timeout", "300")

        def rates(seconds: float) -> tuple[float, float]:
            t0, l0, f0 = time.monotonic(), link.counters(link.b, link.vb)[0], flow.received()
            time.sleep(seconds)
            t1, l1, f1 = time.monotonic(), link.counters(link.b, link.vb)[0], flow.received()
            return (l1 - l0) / (t1 - t0), (f1 - f0) / (t1 - t0)
        deadline = time.monotonic() + 60
        while rates(0.5)[0] < 0.3 * rate:
            assert time.monotonic() < deadline and preload.poll() is None, "the transfer never started"
        alone, _ = rates(3.0)
        assert alone >= 0.85 * rate, alone
        flow.start(0.7 * rate)
        time.sleep(4.0)   # (the rule yields within a few samples: bench/nic.py has the time series)
        link_b, flow_b = rates(4.0)
        assert flow_b >= 0.85 * 0.7 * rate, (flow_b, link_b)
        assert link_b - flow_b >= 0.02 * rate, (flow_b, link_b)   # the floor: weights still arrive
        net = worker.network()
        assert net["enabled"] and net["yielding"], net
        assert net["download"]["limit_bytes_per_s"] is not None, net
        assert net["download"]["others_bytes_per_s"] > 0.5 * rate, net
        plain = worker.cli("status", timeout=30).stdout
        assert "yielding to serving traffic: " in plain, plain
        flow.stop_sending()
        assert preload.poll() is None or preload.returncode == 0
    finally:
        tear_down(preload, daemons, link)
    out = json.dumps(net)
    assert "weightd_bytes_per_s" in out


def test_metrics_show_the_shares_and_the_limits(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from weightd.metrics import NetworkGauges
    reg = CollectorRegistry()
    ctl = NetworkYield(NetworkGauges(reg))
    ctl.configure(NetworkSettings(capacity=C, interfaces=("x0",)), [], nics(tmp_path, "x0"))
    ctl.tick(Sample(0.0, {"x0": (0, 0)}), None)
    ctl.tick(Sample(1.0, {"x0": (int(0.6 * C), 0)}), None)
    share = lambda d, who: reg.get_sample_value("weightd_network_share_bytes_per_second",  # noqa: E731
                                                {"direction": d, "who": who})
    assert share("download", "others") == int(0.6 * C) and share("download", "weightd") == 0
    assert reg.get_sample_value("weightd_network_limit_bytes_per_second", {"direction": "download"}) == \
        pytest.approx(0.2 * C)
    assert reg.get_sample_value("weightd_network_limit_bytes_per_second", {"direction": "upload"}) == 0


def test_doctor_names_weightds_share_of_a_saturated_nic(tmp_path: Path) -> None:
    """The daemon's network block (as ``weightd doctor`` gathers it from status) in the nic-saturated
    finding; an interface with no reported speed is judged against [network] capacity."""
    import dataclasses

    from weightd.doctor import diagnose, gather_snapshot

    from .test_doctor import Snap
    snap = Snap(tmp_path / "snap")
    snap.nic_delta["eth0"] = (22 * 10 ** 9, 10 ** 9)        # 11 GB/s on a 100 Gbit/s link: 88%
    net = {"enabled": True, "yielding": True, "interfaces": ["eth0"], "capacity_bytes_per_s": 12_500_000_000,
           "download": {"weightd_bytes_per_s": 1_250_000_000, "others_bytes_per_s": 9_750_000_000,
                        "limit_bytes_per_s": 1_250_000_000}, "upload": {"weightd_bytes_per_s": 0}}
    inputs = dataclasses.replace(gather_snapshot(snap.write(), []), node={"network": net})
    r = diagnose(inputs)
    nic = next(f for f in r.findings if f.id == "nic-saturated")
    assert "weightd's own share: 10%" in nic.summary and "yielding" in nic.summary, nic.summary
    assert "already yields" in nic.recommendation and r.measurements["weightd_network"] == net
    speedless = dataclasses.replace(inputs, nic_speed={})
    assert any(f.id == "nic-saturated" for f in diagnose(speedless).findings)


def _leftovers() -> set[str]:
    """What bench/_netns.py and bench/nic.py make and must remove: namespaces, hot tiers in /dev/shm,
    the bench's directory."""
    import glob
    import subprocess
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return {x for x in ns if x.startswith("wd")} | set(glob.glob("/dev/shm/weightd-nic-*")) | \
        set(glob.glob("/var/tmp/weightd-nic-*"))


@pytest.mark.skipif(_netns_skip() is not None, reason=f"network namespaces: {_netns_skip()}")
def test_netns_leaves_nothing_when_a_daemon_fails_or_the_bench_gets_sigterm(tmp_path: Path) -> None:
    import signal
    import subprocess

    from bench._netns import Daemon, Link
    before = _leftovers()
    link = Link(200)
    try:   # (an address not in the namespace: the daemon starts, makes its tiers, then fails on metrics)
        with pytest.raises(RuntimeError, match="Cannot assign requested address"):
            Daemon(link, tmp_path, link.a, "10.77.0.9", tmp_path / "cold", role="origin", capacity=link.rate_bytes)
        assert not set(__import__("glob").glob("/dev/shm/weightd-nic-*")) - before
    finally:
        link.close()
    assert _leftovers() == before
    with (tmp_path / "bench.err").open("w") as err:
        bench = subprocess.Popen([sys.executable, str(ROOT / "bench" / "nic.py"), "--size", "8MiB"],
                                 stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while not __import__("glob").glob("/var/tmp/weightd-nic-*/node-*/weightd.sock"):   # (a daemon is up)
                assert bench.poll() is None and time.monotonic() < deadline, (tmp_path / "bench.err").read_text()
                time.sleep(0.1)
            bench.send_signal(signal.SIGTERM)
            assert bench.wait(60) == 128 + signal.SIGTERM
        finally:
            if bench.poll() is None:
                bench.kill()
                bench.wait()
    assert _leftovers() == before
