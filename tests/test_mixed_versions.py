"""Two adjacent weightd versions in one fleet (design §17, docs/install.md "Upgrades, rollbacks and versions that may be mixed"):
a real origin daemon on loopback hears a *newer* worker (a higher message version, keys this version
does not know, at the top and inside a holding) and an *older* one (no version, none of the optional
keys): both are accepted, both are in the fleet view, both get rollout slots; a key this version knows
with a value of the wrong type is still refused (400, one line naming it). A real current worker's
report carries the version it was sent with. The daemon's admin API takes a body with keys it does
not know the same way, and still refuses a known key of the wrong type."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import pytest

import weightd
from tiering.sample import make_checkpoint
from weightd.client import DaemonClient
from weightd.errors import DaemonError

from .test_p2p import cluster  # noqa: F401 (fixture)

MiB = 1 << 20
NEWER_IP, OLDER_IP, CURRENT_IP = "127.0.0.3", "127.0.0.4", "127.0.0.5"


def holding(**kw: Any) -> dict[str, Any]:
    return {"model": "org/mix", "version": "v1", "tier": "warm", "resident": 0.5, "bytes": 4 * MiB,
            "since": time.time() - 60, "serving": False, **kw}


# what a worker of the next release might send: a higher message version, its weightd version, and
# keys this release has never heard of (top level, in a holding, in a slot request)
NEWER_REPORT = {"v": 2, "weightd": "0.2.0", "node": "w-newer", "rack": "r1", "labels": {"pool": "chat"},
                "holdings": [holding(tier="hot", resident=1.0, serving=True, numa_node=1,
                                     engine={"name": "vllm", "pid": 4242})],
                "intent": {"org/mix@latest": "v1"},
                "gpus": [{"uuid": "GPU-0", "memory_bytes": 80 << 30}], "ready_estimate_s": {"org/mix@v1": 0.0}}
# what a worker of the previous release sent: no version, only the keys it must
OLDER_REPORT = {"node": "w-older", "holdings": [holding()]}


def publish(wd, tmp_path: Path) -> None:
    """org/mix@v1 into the cold storage the cluster's nodes share (tmp_path/cold: ``wd``'s too)."""
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=1, seed="v1")
    p = wd("--no-daemon", "publish", src, "--name", "org/mix", "--version", "v1")
    assert p.returncode == 0, p.stderr


def post(src_ip: str, port: int, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    """POST JSON to the origin's fleet endpoint from ``src_ip`` (the address the origin knows a node by)."""
    conn = http.client.HTTPConnection("127.0.0.2", port, timeout=10, source_address=(src_ip, 0))
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def fleet(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.2", port, timeout=10)
    try:
        conn.request("GET", "/v1/fleet")
        r = conn.getresponse()
        assert r.status == 200
        return json.loads(r.read())
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_an_origin_takes_reports_and_slot_requests_from_an_older_and_a_newer_worker(cluster, wd, tmp_path: Path
                                                                                  ) -> None:  # noqa: F811
    publish(wd, tmp_path)
    origin = cluster("127.0.0.2", role="origin", p2p_extra="\n[intent]\nmax_movers = 2\n")
    port = origin.tracker_port

    # both accepted
    assert post(NEWER_IP, port, "/v1/fleet/report", NEWER_REPORT) == (200, {"ok": True})
    assert post(OLDER_IP, port, "/v1/fleet/report", OLDER_REPORT) == (200, {"ok": True})
    nodes = {n["node"]: n for n in fleet(port)["nodes"]}
    assert set(nodes) == {"w-newer", "w-older"}
    newer, older = nodes["w-newer"], nodes["w-older"]
    # what this version knows is kept; what it does not know is dropped, never echoed to others
    assert newer["holdings"] == [{k: v for k, v in NEWER_REPORT["holdings"][0].items() if k not in
                                  ("numa_node", "engine")}]
    assert "gpus" not in newer and "ready_estimate_s" not in newer
    assert (newer["weightd"], newer["rack"], newer["labels"]) == ("0.2.0", "r1", {"pool": "chat"})
    assert (older["weightd"], older["rack"], older["labels"], older["intent"]) == (None, None, {}, {})
    assert older["holdings"] == OLDER_REPORT["holdings"]
    # and the weightd fleet status of this version reads it
    p = origin.cli("fleet", "status", "--origin", f"http://127.0.0.2:{port}", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "weightd.fleet.status/v1" and {n["node"] for n in doc["nodes"]} == {"w-newer", "w-older"}

    # rollout slots: granted to both (max_movers = 2), whatever else the request says
    status, got = post(NEWER_IP, port, "/v1/rollout/slot", {"v": 2, "node": "w-newer", "moving": "org/mix@v2",
                                                             "priority": "high", "eta_s": 12.5})
    assert status == 200 and got["granted"] is True, got
    status, got = post(OLDER_IP, port, "/v1/rollout/slot", {"node": "w-older", "moving": "org/mix@v2"})
    assert status == 200 and got["granted"] is True, got
    assert {m["node"] for m in fleet(port)["movers"]} == {NEWER_IP, OLDER_IP}
    assert post(NEWER_IP, port, "/v1/rollout/release", {"v": 2, "node": "w-newer", "reason": "done"})[0] == 200
    assert post(OLDER_IP, port, "/v1/rollout/release", {"node": "w-older"})[0] == 200
    assert fleet(port)["movers"] == []

    # a key this version knows, with the wrong type or value, is still refused (one line naming it),
    # and the node's last good report stays
    bad_cases = [
        ({**NEWER_REPORT, "holdings": [holding(bytes="4MiB", numa_node=1)]}, "holdings[0].bytes"),
        ({**NEWER_REPORT, "rack": 7}, "rack"),
        ({**NEWER_REPORT, "v": "2"}, "'v'"),
        ({**NEWER_REPORT, "v": True}, "'v'"),
        ({**NEWER_REPORT, "v": 0}, "'v'"),
        ({**NEWER_REPORT, "weightd": {"version": "0.2.0"}}, "'weightd'"),
        ({**NEWER_REPORT, "weightd": "0.2.0\n[fake]"}, "'weightd'"),
        ({k: v for k, v in NEWER_REPORT.items() if k != "node"}, "'node'"),
        ([NEWER_REPORT], "JSON object"),
    ]
    for body, needle in bad_cases:
        status, answer = post(NEWER_IP, port, "/v1/fleet/report", body)
        assert status == 400 and needle in answer["error"] and "\n" not in answer["error"], (body, answer)
    for body, needle in [({"v": 2, "node": 5, "moving": "org/mix@v2"}, "'node'"),
                         ({"v": "two", "node": "w-newer", "moving": "org/mix@v2"}, "'v'")]:
        status, answer = post(NEWER_IP, port, "/v1/rollout/slot", body)
        assert status == 400 and needle in answer["error"], (body, answer)
    assert {n["node"]: n["holdings"][0]["bytes"] for n in fleet(port)["nodes"]}["w-newer"] == 4 * MiB

    # a real worker of this version reports with its message version and its weightd version
    cluster(CURRENT_IP, origin=origin.endpoint,
            p2p_extra=f'\n[intent]\norigin = "http://127.0.0.2:{port}"\nreport_s = 1\nnode_name = "w-current"\n')
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        current = {n["node"]: n for n in fleet(port)["nodes"]}.get("w-current")
        if current is not None:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"no report from the current worker: {fleet(port)}")
    assert current["weightd"] == weightd.__version__ and current["ip"] == CURRENT_IP
    # the operator sees which versions the fleet runs
    p = origin.cli("fleet", "status", "--origin", f"http://127.0.0.2:{port}")
    assert p.returncode == 0, p.stderr
    runs = ", ".join(f"{v} (1 node)" for v in sorted(["0.2.0", weightd.__version__, "not said"]))
    assert f"weightd versions: {runs}\n" in p.stdout, p.stdout


@pytest.mark.timeout(120)
def test_the_admin_api_takes_a_body_with_unknown_keys_and_refuses_a_known_key_of_the_wrong_type(
        cluster, wd, tmp_path: Path) -> None:  # noqa: F811
    publish(wd, tmp_path)
    node = cluster("127.0.0.2")
    client = DaemonClient(node.dir / "weightd.sock")
    # a newer CLI: a higher message version and keys this daemon does not know
    r = client.call("POST", "preload", {"v": 2, "weightd": "0.2.0", "ref": "org/mix@v1", "tier": "warm",
                                        "priority": "interactive", "trace_id": "abc"}, timeout=60)
    assert r["path"] == str(node.dir / "warm/org/mix/v1") and r["tier"] == "warm"
    assert client.call("POST", "versions", {"v": 2, "name": "org/mix", "sort": "newest"})["versions"]
    # an older CLI: no version
    assert client.call("POST", "path", {"ref": "org/mix@v1"})["path"] == r["path"]
    # known keys are checked as before; a bad version is refused too (400, exit code 2, one line)
    for route, body, needle in [
            ("path", {"v": 2, "ref": 5}, "'ref'"),
            ("preload", {"v": 2, "ref": "org/mix@v1", "tier": "cold-ish", "priority": 1}, "tier"),
            ("preload", {"v": 2, "ref": "org/mix@v1", "lease_s": "10m"}, "'lease_s'"),
            ("path", {"v": "2", "ref": "org/mix@v1"}, "'v'"),
            ("path", {"v": -1, "ref": "org/mix@v1"}, "'v'"),
            ("versions", {"v": 2.0}, "'v'"),
            ("path", {"v": 2, "ref": "org/mix@v1", "weightd": ["0.2.0"]}, "'weightd'")]:
        with pytest.raises(DaemonError) as e:
            client.call("POST", route, body)
        assert e.value.exit_code == 2 and needle in str(e.value) and "\n" not in str(e.value), (body, str(e.value))
