"""Leases a read-only caller (a real uid 65534 on the admin socket, in the socket's group) may take,
against a real daemon: a week-long lease is refused (``[api] max_lease_s_readonly``, 1 h by default),
and the copies one such uid leases in a tier stay within ``[api] lease_share_readonly`` of its
capacity (25 % by default), by preload and by hold alike: root's next ``preload --tier hot --strict``
finds the room it needs (it failed with exit 6 when uid 65534 had leased two models for a week)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

from .test_trust_api import NOBODY, WEEK_S, call, in_child, set_api, shared_dir, start_daemon  # noqa: F401

MiB = 1 << 20
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to play a second uid (65534)")


@root_only
@pytest.mark.timeout(300)
def test_a_read_only_uid_cannot_hold_the_hot_tier(node_env, isolated_env, wd, tmp_path: Path,
                                                  shared_dir: Path) -> None:  # noqa: F811
    node_env.write_config("64MiB", "512MiB")
    sock = shared_dir / "weightd.sock"
    set_api(node_env, sock, group=NOBODY)
    for name, size in (("org/a", 15 * MiB), ("org/b", 15 * MiB), ("org/big", 44 * MiB)):
        src = make_checkpoint(tmp_path / name.replace("/", "-"), total_bytes=size, shards=2, layers=2, seed=name)
        assert wd("--no-daemon", "publish", src, "--name", name, "--version", "v1").returncode == 0
    d = start_daemon(node_env, isolated_env, tmp_path, sock)
    try:
        def attack() -> list[tuple[int, object]]:
            out = []
            for ref, lease in (("org/a@v1", WEEK_S), ("org/b@v1", WEEK_S), ("org/a@v1", 3600), ("org/b@v1", 3600)):
                status, doc = call(sock, "POST", "preload", {"ref": ref, "tier": "hot", "lease_s": lease})
                out.append((status, doc.get("exit_code") if isinstance(doc, dict) else None,
                            doc.get("error", "") if isinstance(doc, dict) else doc))
            return out
        week_a, week_b, hour_a, hour_b = in_child(attack)
        # a week is refused; an hour within its share is granted; past its share, refused with exit 6
        for status, code, error in (week_a, week_b):
            assert (status, code) == (403, 2) and "max_lease_s_readonly" in error and "\n" not in error, error
        assert hour_a[0] == 200, hour_a
        assert tuple(hour_b[:2]) == (403, 6) and "lease_share_readonly" in hour_b[2] and f"uid {NOBODY}" in hour_b[2], hour_b
        # without a lease it may still preload (nothing is kept from eviction for it)
        assert in_child(lambda: call(sock, "POST", "preload", {"ref": "org/b@v1", "tier": "warm",
                                                              "lease_s": 0})[0]) == 200

        # root's strict preload into hot finds its room (org/b is not leased there: evictable, or absent)
        p = wd("preload", "org/big@v1", "--tier", "hot", "--strict", "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["path"].startswith(str(node_env.hot)), p.stdout

        # hold cannot lease past the share either, nor for a week (root's copy of org/big: about 41 MiB)
        def hold() -> list[tuple[int, object]]:
            return [call(sock, "POST", "hold", {"ref": "org/big@v1", "tier": "hot", "lease_s": s})[:2] for s in
                    (WEEK_S, 3600)]
        (s1, d1), (s2, d2) = in_child(hold)
        assert s1 == 403 and "max_lease_s_readonly" in d1["error"], d1
        assert s2 == 403 and d2["exit_code"] == 6 and "lease_share_readonly" in d2["error"], d2
        # and an admin is not limited
        assert call(sock, "POST", "hold", {"ref": "org/big@v1", "tier": "hot", "lease_s": WEEK_S})[0] == 200

        # a 400-digit lease_s from uid 65534: one line, 400 exit 2, for preload, preload-set and hold alike
        # (before: OverflowError formatting it, 500 and a traceback in the log)
        def huge() -> list:
            return [call(sock, "POST", route, {**body, "lease_s": 10 ** 400})[:2] for route, body in (
                ("preload", {"ref": "org/a@v1", "tier": "warm"}), ("preload-set", {"refs": ["org/a@v1"]}),
                ("hold", {"ref": "org/a@v1", "tier": "warm"}))]
        for st, doc in in_child(huge):
            assert (st, doc["exit_code"]) == (400, 2) and "lease_s" in doc["error"], (st, doc)
            assert "\n" not in doc["error"] and len(doc["error"]) < 300, doc
    finally:
        d.stop()
    assert "Traceback" not in d.log_path.read_text()


@root_only
@pytest.mark.timeout(300)
def test_a_read_only_lease_is_sized_by_what_it_places_and_checked_where_it_lands(
        node_env, isolated_env, wd, tmp_path: Path, shared_dir: Path) -> None:  # noqa: F811
    """uid 65534's share (25 % of hot: 16 MiB) is counted with what a preload places: one shard of a
    30 MiB model (about 15 MiB) fits it (before: refused as the whole version's 30 MiB). A preload into
    hot that falls back to warm (hot full of root's leased copies) is held to its share of warm too
    (10 MiB of 40 MiB: refused with exit 6; before: granted in warm, unchecked)."""
    node_env.write_config("64MiB", "40MiB")
    sock = shared_dir / "weightd.sock"
    set_api(node_env, sock, group=NOBODY)
    for name, size in (("org/a", 15 * MiB), ("org/b", 15 * MiB), ("org/big", 44 * MiB), ("org/two", 30 * MiB)):
        src = make_checkpoint(tmp_path / name.replace("/", "-"), total_bytes=size, shards=2, layers=2, seed=name)
        assert wd("--no-daemon", "publish", src, "--name", name, "--version", "v1").returncode == 0
    d = start_daemon(node_env, isolated_env, tmp_path, sock)
    try:
        one_shard = {"include": ["*00001-of-00002.safetensors"]}
        st, doc = in_child(lambda: call(sock, "POST", "preload", {"ref": "org/two@v1", "tier": "hot", "strict": True,
                                                                 "lease_s": 3600, "selection": one_shard}))
        assert st == 200 and doc["part_of"]["bytes"] < 16 * MiB, (st, doc)
        label = doc["version"]
        assert wd("evict", f"org/two@{label}", "--tier", "hot", "--force").returncode == 0
        # root fills hot with leased copies; uid 65534's org/a (15 MiB, within its hot share) would land in warm
        for ref in ("org/big@v1", "org/b@v1"):
            p = wd("preload", ref, "--tier", "hot", "--strict")
            assert p.returncode == 0, p.stderr
        st, doc = in_child(lambda: call(sock, "POST", "preload", {"ref": "org/a@v1", "tier": "hot", "lease_s": 3600}))
        assert (st, doc.get("exit_code")) == (403, 6), (st, doc)
        assert "warm tier" in doc["error"] and "lease_share_readonly" in doc["error"], doc
        # without a lease it still preloads (into warm)
        st, doc = in_child(lambda: call(sock, "POST", "preload", {"ref": "org/a@v1", "tier": "hot", "lease_s": 0}))
        assert st == 200 and doc["tier"] == "warm", (st, doc)
    finally:
        d.stop()
