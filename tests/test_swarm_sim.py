"""bench/swarm_sim.py: the model keeps the properties the calibration and the predictions rest on
(small runs, deterministic for a seed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("swarm_sim", ROOT / "bench" / "swarm_sim.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["swarm_sim"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("swarm_sim", None)


def test_the_plan_sends_each_piece_from_the_origin_once_and_stock_does_not(sim) -> None:
    net = sim.Net(8, 0, 10e6, 10e6)
    plan = sim.simulate(net, 20e6, 64, "plan", cal={"origin_tail_s": 0.0})
    stock = sim.simulate(net, 20e6, 64, "stock")
    assert plan["origin_upload_x"] == 1.0
    assert stock["origin_upload_x"] > 1.3
    # the origin's duplicates cost stock time: the plan is done sooner
    assert plan["seconds"] < stock["seconds"]
    assert plan == sim.simulate(net, 20e6, 64, "plan", cal={"origin_tail_s": 0.0})   # (a seed, one answer)


def test_with_racks_each_rack_takes_about_one_copy_from_outside(sim) -> None:
    net = sim.Net(16, 4, 10e6, 10e6)
    racked = sim.simulate(net, 20e6, 64, "plan", cal={"origin_tail_s": 0.0})
    flat = sim.simulate(net, 20e6, 64, "plan-flat", cal={"origin_tail_s": 0.0})
    assert racked["cross_rack_max_x"] <= 1.05          # the home slices from the origin + the gateway's
    assert flat["cross_rack_max_x"] > 2 * racked["cross_rack_max_x"]


def test_the_origin_tail_is_bounded_by_what_the_origin_allows(sim) -> None:
    """However high the cap, a worker asks the origin for at most what the origin allows (libtorrent's
    2,000 blocks of held pieces when it says nothing else, and the piece that crosses that line): 10 s
    at 10 GB/s would otherwise be 25x the checkpoint."""
    net = sim.Net(4, 0, 10e9, 10e9)
    r = sim.simulate(net, 4e9, 64, "plan", cal={"origin_tail_s": 10.0})
    assert r["origin_upload_x"] <= 1 + 4 * (2000 * 16384 / 4e9 + 1 / 64)


def test_the_origins_queue_bounds_the_tail(sim) -> None:
    """``origin_queue`` (``[p2p] origin_request_queue``: the origin's max_allowed_in_request_queue, which
    libtorrent makes the worker's own limit for that peer, above or below its 500) bounds each worker's
    tail from the origin, in both simulators; 0 or none is libtorrent's 2,000 (the measured runs before
    2026-12-07); predict's contenders run with the daemon's value."""
    assert sim._tail_bytes({"origin_tail_s": 10.0, "origin_queue": 8}, 10e9) == 8 * 16384
    assert sim._tail_bytes({"origin_tail_s": 10.0, "origin_queue": 1000}, 10e9) == 1000 * 16384
    assert sim._tail_bytes({"origin_tail_s": 10.0, "origin_queue": 0}, 10e9) == 2000 * 16384
    assert sim._tail_bytes({"origin_tail_s": 10.0}, 10e9) == 2000 * 16384
    from weightd.config import load_config   # (the model's "as shipped" is the daemon's default)
    default = load_config(None, env={"HOME": "/nonexistent", "USER": "nobody"}).settings.p2p.origin_request_queue
    assert sim.SHIPPED_ORIGIN_QUEUE == default == 128
    assert sim._tail_bytes({"origin_tail_s": 1e-6, "origin_queue": 8}, 10e9) == 1e-6 * 10e9
    net = sim.Net(4, 0, 10e9, 10e9)
    wide, narrow = (sim.simulate(net, 4e9, 64, "plan", cal={"origin_tail_s": 10.0, "origin_queue": q})
                    for q in (2000, 8))
    assert narrow["origin_upload_x"] <= min(wide["origin_upload_x"], 1 + 4 * (8 * 16384 / 4e9 + 1 / 64))
    racks = sim.Net(32, 4, 10e9, 10e9, 4.0)
    wide, narrow = (sim.simulate_by_symmetry(racks, 8e9, 128, cal={"start_s": 0.0, "origin_tail_s": 10.0,
                                                                   "origin_queue": q}) for q in (2000, 8))
    assert narrow["origin_upload_x"] <= wide["origin_upload_x"], (wide, narrow)


def test_one_rack_by_symmetry_agrees_with_the_whole_fleet(sim) -> None:
    """The 1,000-node prediction simulates one rack and the others by symmetry: on a fleet small
    enough for both, the two agree on time and cross-rack bytes (4 racks of 8 behind a 4:1 spine)."""
    net = sim.Net(32, 4, 10e6, 10e6, 4.0)
    full = sim.simulate(net, 50e6, 128, "plan", cal={"start_s": 0.0, "origin_tail_s": 0.0})
    sym = sim.simulate_by_symmetry(net, 50e6, 128, cal={"start_s": 0.0, "origin_tail_s": 0.0})
    assert abs(sym["seconds"] / full["seconds"] - 1) < 0.1, (full, sym)
    assert abs(sym["cross_rack_max_x"] - full["cross_rack_max_x"]) < 0.1, (full, sym)
    assert sym["origin_upload_x"] == full["origin_upload_x"] == 1.0


def test_held_out_runs_are_checked_apart_from_the_fitted_ones(sim, monkeypatch) -> None:
    """``calibrate --held-out`` asks the model for runs it was not fitted on: their error is reported
    apart and never enters the fitted runs' worst error (which ``fit`` minimises)."""
    size, cap = 20e6, 10e6
    net = sim.Net(4, 0, cap, cap, cores=2)
    t1 = sim.simulate(sim.Net(1, 0, cap, cap, cores=2), size, 64, "plan", seed=1)["seconds"]
    r4 = sim.simulate(net, size, 64, "plan", seed=1)
    # fitted: the model's own figures (error 0); held out: the same run measured 25% slower, 10% more origin
    fitted = [(cap, "plan", 0, 1, t1, 1.0, size, 64),
              (cap, "plan", 0, 4, r4["seconds"], r4["origin_upload_x"], size, 64)]
    held = [(cap, "plan", 0, 1, t1, 1.0, size, 64),
            (cap, "plan", 0, 4, r4["seconds"] * 1.25, r4["origin_upload_x"] * 1.1, size, 64)]
    monkeypatch.setattr(sim, "MEASURED", fitted)
    monkeypatch.setattr(sim, "HELD_OUT", held)
    alone = sim.calibrate(quiet=True)
    both = sim.calibrate(quiet=True, held_out=True)
    assert "held_out" not in alone
    assert alone["worst_error"] == both["worst_error"] == 0.0
    row = both["held_out"]["rows"][0]
    assert row["n"] == 4 and row["error"]["t_over_t1"] == 0.2
    assert row["error"]["origin_x"] == pytest.approx(0.091, abs=0.002)
    assert both["held_out"]["worst_error"] == 0.2


def test_a_racks_row_may_name_its_own_gateways_and_intake_from_outside(sim, monkeypatch) -> None:
    """A row of racks runs with the daemon's gateways as shipped, unless it names its own (with the
    intake from outside measured in that run): the model then runs with those gateways, and the row
    says which it was checked with."""
    size, cap = 20e6, 10e6
    t1 = sim.simulate(sim.Net(1, 0, cap, cap, cores=2), size, 64, "plan", seed=1)["seconds"]
    r4 = sim.simulate(sim.Net(8, 2, cap, cap, cores=2), size, 64, "plan", cal={"gateways": 4}, seed=1)
    shipped = sim.simulate(sim.Net(8, 2, cap, cap, cores=2), size, 64, "plan",
                           cal={"gateways": sim.SHIPPED_GATEWAYS}, seed=1)
    # (else the row could not tell which gateways ran: an error under 2% would round away)
    assert abs(r4["seconds"] / shipped["seconds"] - 1) > 0.02, (r4, shipped)
    monkeypatch.setattr(sim, "MEASURED", [(cap, "plan", 0, 1, t1, 1.0, size, 64),
                                          (cap, "plan", 2, 8, r4["seconds"], r4["origin_upload_x"], size, 64,
                                           {"gateways": 4, "cross_rack": 1.5})])
    row = sim.calibrate(quiet=True)["rows"][0]
    assert row["gateways"] == 4 and row["error"]["t_over_t1"] == 0.0, row
    assert row["cross_rack_max_x"]["measured"] == 1.5
    monkeypatch.setattr(sim, "MEASURED", [(cap, "plan", 0, 1, t1, 1.0, size, 64),
                                          (cap, "plan", 2, 8, shipped["seconds"], 1.0, size, 64)])
    row = sim.calibrate(quiet=True)["rows"][0]
    assert row["gateways"] == sim.SHIPPED_GATEWAYS and row["error"]["t_over_t1"] == 0.0, row
    assert row["cross_rack_max_x"]["measured"] == sim.CROSS_RACK_MEASURED


def test_the_gateway_rate_fit_prefers_the_rate_the_racks_run_shows_and_refuses_bad_values(sim) -> None:
    """``fit-gateway-rate`` on the racks run as shipped: the calibrated value beats the full rate by
    far (the measured run is slower than gateways at their cap); a value that is no fraction of the
    cap (nan included) is a usage error, exit 2, before anything runs."""
    out = sim.fit_gateway_rate([sim.CALIBRATION["gateway_rate"], 1.0], [1])
    assert out["best"] == sim.CALIBRATION["gateway_rate"], out
    errs = {v["gateway_rate"]: v["worst_error_median"] for v in out["values"]}
    assert errs[sim.CALIBRATION["gateway_rate"]] <= 0.15 < errs[1.0], errs
    for bad in ("nan", "0", "1.5", "abc", "", "0.3,inf"):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "swarm_sim.py"), "fit-gateway-rate", "--values", bad,
                            "--seeds", "1"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--values" in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)


def test_predict_origin_queue_refuses_what_it_cannot_mean() -> None:
    for cmd, bad in (("predict", "8"), ("predict", "2001"), ("predict", "-1"), ("predict", "128"), ("predict", "x"),
                     ("predict", "0,0"), ("predict", "0,2000"), ("calibrate", "32")):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "swarm_sim.py"), cmd, "--origin-queue", bad,
                            "--seeds", "1"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--origin-queue" in r.stderr and "Traceback" not in r.stderr, (cmd, bad, r.stderr)


def test_predict_gateways_refuses_what_it_cannot_mean() -> None:
    """``predict --gateways``: counts the fleet's racks of 25 can have, each once, beside the two that
    always run; anything else (or the flag on another command) is a usage error, exit 2, before
    anything is simulated."""
    for cmd, bad in (("predict", "0"), ("predict", "26"), ("predict", "4,4"), ("predict", "2"),
                     ("predict", "1,7"), ("predict", "x"), ("calibrate", "4")):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "swarm_sim.py"), cmd, "--gateways", bad,
                            "--seeds", "1"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--gateways" in r.stderr and "Traceback" not in r.stderr, (cmd, bad, r.stderr)
