"""Weight traffic yields the link to serving traffic (issue 37 part 1): the control rule on
deterministic samples, the session's limits under the fixed caps, the [network] config, and for
real: two network namespaces joined by a veth shaped with tc, an origin and a worker daemon, a
serving-like socket flow (root only; bounded in time, never a timed benchmark: bench/nic.py)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from weightd.node.network import (BACKOFF, FULL, QUIET_ENTER, RAISE_PER_S, NetworkYield, Sample, YieldRule,
                                  endpoints_of, wire)

from .conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
C = 25_000_000   # bytes/s: a 200 Mbit/s link


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


def test_controller_limits_reach_the_session_under_fixed_caps() -> None:
    """The controller sets the session's limits (0 at capacity), and P2PSession keeps the lower of its
    fixed caps and the controller's (a real libtorrent session)."""
    from p2p import P2PConfig, P2PSession
    from weightd.config.network import NetworkSettings
    ses = P2PSession(P2PConfig(listen="127.0.0.1:0", upload_limit=1_000_000, download_limit=0))
    try:
        ctl = NetworkYield()
        ctl.configure(NetworkSettings(capacity=C, interfaces=("lo0x",)), [])
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
        ctl.configure(NetworkSettings(enabled=False, capacity=C, interfaces=("lo0x",)), [])
        for t in (3.0, 4.0):
            ctl.tick(Sample(t, {"lo0x": (int(1.8 * C), int(1.8 * C))}), ses)
        s = ses.ses.get_settings()                                          # off: the fixed caps again
        assert (s["download_rate_limit"], s["upload_rate_limit"]) == (0, 1_000_000)
    finally:
        ses.close()


def test_own_bytes_are_not_others() -> None:
    ctl = NetworkYield()
    from weightd.config.network import NetworkSettings
    ctl.configure(NetworkSettings(capacity=C, interfaces=("x0",)), [])
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
    from weightd.config.network import NetworkSettings
    ctl.configure(NetworkSettings(interfaces=("nosuchif0",)), [], sys_net=str(tmp_path))
    assert not ctl.enabled and "reports no speed" in ctl.reason
    ctl.configure(NetworkSettings(enabled=False, capacity=C, interfaces=("x0",)), [])
    assert not ctl.enabled and "enabled = false" in ctl.reason


@pytest.mark.parametrize("body, needle", [
    ('ceiling = 1.5', "network.ceiling"),
    ('floor = "50%"\nceiling = "40%"', "floor (0.5) must be at most ceiling (0.4)"),
    ('interfaces = ["eth0/x"]', "'eth0/x' is not an interface name"),
    ('capacity = "fast"', "network.capacity"),
    ('ceiling = "eighty%"', "network.ceiling"),
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


# -- for real: namespaces, tc, daemons -----------------------------------------------------------------

def _netns_skip() -> str | None:
    from bench._netns import usable
    return usable()


@pytest.mark.skipif(_netns_skip() is not None, reason=f"network namespaces: {_netns_skip()}")
def test_weights_yield_to_a_serving_flow_on_a_shaped_link(tmp_path: Path) -> None:
    """200 Mbit/s A -> B: the transfer alone near the link rate; a flow asking 70% of the link joins and
    gets >= 85% of its ask while weights still arrive; the state shows in status --json."""
    from bench._netns import A_IP, B_IP, Daemon, Flow, Link, publish
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
        if preload is not None and preload.poll() is None:
            preload.kill()
            preload.communicate()
        for d in daemons:
            d.close()
        link.close()
    out = json.dumps(net)
    assert "weightd_bytes_per_s" in out


def test_metrics_show_the_shares_and_the_limits() -> None:
    from prometheus_client import CollectorRegistry

    from weightd.config.network import NetworkSettings
    from weightd.metrics import NetworkGauges
    reg = CollectorRegistry()
    ctl = NetworkYield(NetworkGauges(reg))
    ctl.configure(NetworkSettings(capacity=C, interfaces=("x0",)), [])
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
