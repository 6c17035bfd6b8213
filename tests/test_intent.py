"""Fleet intent, in-process: the files (good, bad, conflicting: exact messages), selectors, windows on
an injected clock, and the plan (rollouts keep what a node serves, jitter, back-off)."""

from __future__ import annotations

import calendar
import os
from pathlib import Path

import pytest

from weightd.intent.reconcile import Failure, jitter_s, plan
from weightd.errors import IntentError
from weightd.intent.files import load_intent, read_labels
from weightd.intent.selector import parse_selector
from weightd.intent.spec import parse_text
from weightd.intent.window import parse_window


def utc(y: int, mo: int, d: int, h: int, mi: int = 0) -> float:
    return float(calendar.timegm((y, mo, d, h, mi, 0)))


def write(d: Path, name: str, text: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    p.write_text(text)
    return p


GOOD = """
[[keep]]
model = "acme/llama-70b@latest"
nodes = "pool=chat"
versions = 2
window = "02:00-05:00"
bandwidth = "200MB"

[[keep]]
model = "acme/llama-70b@latest"
tier = "hot"
pin = true
nodes = {pool = "chat-premium"}
priority = 10

[[keep]]
model = "acme/embed@v3"
window = "0 2 * * 1-5"
window_minutes = 90
"""


def test_a_good_file_and_what_selects_this_node(tmp_path: Path) -> None:
    write(tmp_path / "i", "10-chat.toml", GOOD)
    intent = load_intent(tmp_path / "i")
    assert len(intent.entries) == 3
    chat = intent.for_node({"pool": "chat"})
    assert [(e.where, e.model, e.tier, e.versions, e.bandwidth) for e in chat] == [
        ("10-chat.toml keep #1", "acme/llama-70b@latest", "warm", 2, 200_000_000),
        ("10-chat.toml keep #3", "acme/embed@v3", "warm", 1, 0)]
    premium = intent.for_node({"pool": "chat-premium"})
    assert [(e.model, e.tier, e.pin, e.priority) for e in premium] == [
        ("acme/llama-70b@latest", "hot", True, 10), ("acme/embed@v3", "warm", False, 0)]
    assert str(chat[1].window) == "0 2 * * 1-5 for 90 min (UTC)"


@pytest.mark.parametrize("text, message", [
    ('[[keep]]\nmodel = "acme/x"\n',
     "intent f.toml: keep #1.model: expected NAME@VERSION or NAME@latest, got 'acme/x'"),
    ('[[keep]]\ntier = "hot"\n', "intent f.toml: keep #1.model: missing key (NAME@VERSION or NAME@latest; or models = [...])"),
    ('[[keep]]\nmodel = "a/b@latest"\ntier = "cold"\n',
     "intent f.toml: keep #1.tier: expected one of hot, warm, got 'cold'"),
    ('[[keep]]\nmodel = "a/b@latest"\nprio = 3\n',
     "intent f.toml: keep #1.prio: unknown key (did you mean priority?)"),
    ('[[keep]]\nmodel = "a/b@v1"\nversions = 3\n',
     "intent f.toml: keep #1.versions: goes with NAME@latest only (a/b@v1 names one version)"),
    ('[[keep]]\nmodel = "a/b@latest"\nversions = 0\n',
     "intent f.toml: keep #1.versions: expected a whole number from 1 to 16 (the newest plus rollbacks)"),
    ('[[keep]]\nmodel = "a/b@latest"\nwindow = "25:00-03:00"\n',
     "intent f.toml: keep #1.window: '25:00-03:00' is neither HH:MM-HH:MM nor a 5-field cron expression"),
    ('[[keep]]\nmodel = "a/b@latest"\nwindow = "02:00-02:00"\n',
     "intent f.toml: keep #1.window: '02:00-02:00' is empty (start equals end); leave window out to allow any time"),
    ('[[keep]]\nmodel = "a/b@latest"\nwindow_minutes = 5\n',
     "intent f.toml: keep #1.window_minutes: goes with a cron window"),
    ('[[keep]]\nmodel = "a/b@latest"\nnodes = "pool in ()"\n',
     "intent f.toml: keep #1.nodes: 'pool in ()' lists no values"),
    ('[[keep]]\nmodel = "a/b@latest"\nnodes = "pool=chat,"\n', "intent f.toml: keep #1.nodes: ends with ','"),
    ('[[keep]]\nmodel = "a/b@latest"\nbandwidth = "fast"\n', None),
    ('[[keep]]\nmodel = "a/b@latest"\npin = "yes"\n', "intent f.toml: keep #1.pin: expected true or false"),
    ('[[keep]]\nmodel = "../etc@latest"\n', None),
    ('[model]\nx = 1\n', "intent f.toml: model: unknown table (an intent file holds [[keep]] and [[import]] entries)"),
    ('keep = 3\n', "intent f.toml: keep: expected [[keep]] entries (an array of tables)"),
    ('[[keep]\n', None),
    ('[[keep]]\nmodel = "a/b@v1"\nlayers = "9-1"\n', "intent f.toml: keep #1.layers: expected A-B with 0 <= A <= B, got 9-1"),
    ('[[keep]]\nmodel = "a/b@v1"\ntp_rank = "2/2"\n', "intent f.toml: keep #1.tp_rank: expected R/N with 0 <= R < N, got 2/2"),
    ('[[keep]]\nmodel = "a/b@v1"\nexclude = ["/etc"]\n', None),
    ('[[keep]]\nmodels = ["a/b@v1", "a/b@v1"]\n', "intent f.toml: keep #1.models: a model is listed twice"),
    ('[[keep]]\nmodels = []\n', None),
    ('[[keep]]\nmodels = ["a/b@v1"]\nmodel = "a/c@v1"\n', "intent f.toml: keep #1.models: give model or models, not both"),
    ('[[keep]]\nmodels = ["a/b@v1", "a/c"]\n', "intent f.toml: keep #1.models[1]: expected NAME@VERSION or NAME@latest, got 'a/c'"),
])
def test_bad_entries_name_file_entry_and_key(text: str, message: str | None) -> None:
    with pytest.raises(IntentError) as ei:
        parse_text("f.toml", text)
    assert "\n" not in str(ei.value)
    if message is None:
        assert str(ei.value).startswith("intent f.toml")
    else:
        assert str(ei.value) == message


def test_conflicting_entries_for_one_node(tmp_path: Path) -> None:
    d = tmp_path / "i"
    write(d, "a.toml", '[[keep]]\nmodel = "acme/m@latest"\ntier = "warm"\n')
    write(d, "b.toml", '[[keep]]\nmodel = "acme/m@latest"\ntier = "hot"\nnodes = "gpu"\n')
    intent = load_intent(d)
    assert [e.tier for e in intent.for_node({})] == ["warm"]   # (b does not select a node without gpu)
    with pytest.raises(IntentError) as ei:
        intent.for_node({"gpu": "h100"})
    assert str(ei.value) == ("intent b.toml: keep #1: conflicts with a.toml keep #1 for this node: same model "
                             "(acme/m@latest) and priority, different tier (warm vs hot); give one a higher "
                             "priority or a node selector that leaves the other out")
    write(d, "b.toml", '[[keep]]\nmodel = "acme/m@latest"\ntier = "hot"\nnodes = "gpu"\npriority = 1\n')
    assert [e.tier for e in load_intent(d).for_node({"gpu": "h100"})] == ["hot"]   # higher priority wins


def test_files_others_could_write_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "i"
    p = write(d, "a.toml", GOOD)
    os.chmod(p, 0o666)
    with pytest.raises(IntentError, match=r"a.toml: writable by every user: refused \(chmod o-w\)"):
        load_intent(d)
    os.chmod(p, 0o644)
    with pytest.raises(IntentError, match="owned by uid"):
        load_intent(d, trusted_uids=(12345,))
    assert load_intent(tmp_path / "nothing-here").entries == ()


def test_configmap_layout_symlinks_are_read(tmp_path: Path) -> None:
    """A ConfigMap volume: NAME -> ..data/NAME, ..data -> ..2026_12_04_...; hidden entries skipped."""
    d = tmp_path / "cm"
    real = d / "..2026_12_04_10_00_00.1"
    write(real, "chat.toml", GOOD)
    os.symlink(real.name, d / "..data")
    os.symlink("..data/chat.toml", d / "chat.toml")
    assert len(load_intent(d).entries) == 3


@pytest.mark.parametrize("sel, labels, ok", [
    ("pool=chat", {"pool": "chat"}, True),
    ("pool=chat", {"pool": "batch"}, False),
    ("pool!=chat", {}, True),
    ("gpu in (h100, a100)", {"gpu": "a100"}, True),
    ("gpu notin (h100,a100)", {"gpu": "a100"}, False),
    ("gpu", {"gpu": "x"}, True),
    ("!draining", {"draining": "true"}, False),
    ("pool=chat,!draining,gpu in (h100)", {"pool": "chat", "gpu": "h100"}, True),
    ("", {}, True),
])
def test_selectors(sel: str, labels: dict[str, str], ok: bool) -> None:
    assert parse_selector(sel).matches(labels) is ok


def test_labels_file_overlays_config(tmp_path: Path) -> None:
    p = tmp_path / "labels"
    p.write_text("# from the provisioner\npool=chat\nzone = z1\n")
    assert read_labels(p, {"pool": "batch", "gpu": "h100"}) == {"pool": "chat", "gpu": "h100", "zone": "z1"}
    p.write_text("pool chat\n")
    with pytest.raises(IntentError, match=r"labels: line 1: expected key=value"):
        read_labels(p, {})


def test_windows_on_an_injected_clock() -> None:
    w = parse_window("02:00-05:00")
    assert w.is_open(utc(2026, 12, 4, 3))
    assert not w.is_open(utc(2026, 12, 4, 5))
    assert w.opens_in(utc(2026, 12, 4, 23)) == 3 * 3600
    night = parse_window("22:00-02:00")   # spans midnight
    assert night.is_open(utc(2026, 12, 4, 23)) and night.is_open(utc(2026, 12, 5, 1))
    assert not night.is_open(utc(2026, 12, 5, 12))
    cron = parse_window("0 2 * * 1-5", 90)    # weekdays 02:00-03:30
    assert cron.is_open(utc(2026, 12, 4, 3, 29))       # a Friday
    assert not cron.is_open(utc(2026, 12, 4, 3, 31))
    assert not cron.is_open(utc(2026, 12, 5, 2, 30))   # Saturday
    assert cron.opens_in(utc(2026, 12, 5, 2, 30)) == utc(2026, 12, 7, 2) - utc(2026, 12, 5, 2, 30)


# -- the plan --------------------------------------------------------------------------------------
def entries(text: str, labels: dict[str, str] | None = None):
    return sorted(parse_text("f.toml", text), key=lambda e: (-e.priority, e.index))


def run_plan(es, *, published, held, now=utc(2026, 12, 4, 12), first_seen=None, failures=None, inflight=(),
             spread_s=0.0):
    return plan(es, published=published, held=held, now=now, first_seen=first_seen or {}, node="n1",
                spread_s=spread_s, failures=failures or {}, inflight=set(inflight))


def test_missing_is_fetched_in_priority_order() -> None:
    es = entries('[[keep]]\nmodel = "a/x@latest"\n[[keep]]\nmodel = "a/y@v1"\ntier = "hot"\npriority = 5\n')
    p = run_plan(es, published={"a/x": ["v2", "v1"], "a/y": ["v1"]}, held={})
    assert [(f.entry.name, f.version, f.entry.tier, f.rollout) for f in p.fetches] == [
        ("a/y", "v1", "hot", False), ("a/x", "v2", "warm", False)]
    assert [r["state"] for r in p.rows] == ["pending", "pending"]


def test_a_rollout_keeps_what_the_node_serves_until_the_new_one_is_here() -> None:
    es = entries('[[keep]]\nmodel = "a/x@latest"\n')          # versions = 1
    p = run_plan(es, published={"a/x": ["v2", "v1"]}, held={("a/x", "v1"): {"warm"}})
    assert [(h.version, h.tier) for h in p.holds] == [("v1", "warm")]    # v1 held while v2 comes
    assert p.fetches[0].version == "v2" and p.fetches[0].rollout
    assert p.serving == {"a/x@latest": ("v1", "warm")}
    p = run_plan(es, published={"a/x": ["v2", "v1"]}, held={("a/x", "v1"): {"warm"}, ("a/x", "v2"): {"warm"}})
    assert [h.version for h in p.holds] == ["v2"]      # versions = 1: v1 is evictable now
    assert p.serving == {"a/x@latest": ("v2", "warm")} and p.rows[0]["state"] == "ready"
    es2 = entries('[[keep]]\nmodel = "a/x@latest"\nversions = 2\n')
    p = run_plan(es2, published={"a/x": ["v3", "v2", "v1"]},
                 held={("a/x", "v1"): {"warm"}, ("a/x", "v2"): {"warm"}, ("a/x", "v3"): {"warm"}})
    assert [h.version for h in p.holds] == ["v3", "v2"]   # the newest plus one rollback; v1 evictable


def test_rollout_jitter_spreads_nodes_and_waits() -> None:
    spreads = sorted(jitter_s(f"node{i}", "a/x", "v2", 60.0) for i in range(200))
    assert 0 <= spreads[0] < 3 and 57 < spreads[-1] < 60            # spread over the whole range
    es = entries('[[keep]]\nmodel = "a/x@latest"\n')
    seen = utc(2026, 12, 4, 12)
    delay = jitter_s("n1", "a/x", "v2", 60.0)
    kw = dict(published={"a/x": ["v2", "v1"]}, held={("a/x", "v1"): {"warm"}}, first_seen={("a/x", "v2"): seen},
              spread_s=60.0)
    p = run_plan(es, now=seen + delay - 1, **kw)
    assert p.fetches == [] and p.rows[0]["state"] == "waiting" and "rollout to a/x@v2 starts in" in p.rows[0]["reason"]
    assert run_plan(es, now=seen + delay + 0.5, **kw).fetches[0].version == "v2"
    # a first placement is not a rollout: no jitter
    assert run_plan(es, now=seen, **{**kw, "held": {}}).fetches[0].rollout is False


def test_a_window_defers_a_transfer() -> None:
    es = entries('[[keep]]\nmodel = "a/x@v1"\nwindow = "02:00-05:00"\n')
    p = run_plan(es, published={"a/x": ["v1"]}, held={}, now=utc(2026, 12, 4, 12))
    assert p.fetches == []
    assert p.rows[0]["state"] == "waiting"
    assert p.rows[0]["reason"] == "waiting for window 02:00-05:00 (opens in 14h00m)"
    p = run_plan(es, published={"a/x": ["v1"]}, held={}, now=utc(2026, 12, 5, 2, 1))
    assert [f.version for f in p.fetches] == ["v1"]


def test_a_failure_is_shown_and_retried_after_a_backoff() -> None:
    es = entries('[[keep]]\nmodel = "a/x@v1"\n')
    t = utc(2026, 12, 4, 12)
    fail = {("a/x", "v1", "warm"): Failure(t, "no space in warm: need 8.0 GiB, 1.0 GiB free")}
    p = run_plan(es, published={"a/x": ["v1"]}, held={}, now=t + 10, failures=fail)
    assert p.fetches == [] and p.rows[0]["state"] == "failed"
    assert p.rows[0]["reason"] == ("failed at 12:00:00 UTC (10s ago): no space in warm: need 8.0 GiB, 1.0 GiB free; "
                                   "retrying in 20s")
    assert run_plan(es, published={"a/x": ["v1"]}, held={}, now=t + 31, failures=fail).fetches


def test_unpublished_and_in_flight_say_so() -> None:
    es = entries('[[keep]]\nmodel = "a/x@v9"\n[[keep]]\nmodel = "a/y@latest"\n[[keep]]\nmodel = "a/z@v1"\n')
    p = run_plan(es, published={"a/x": ["v1"], "a/z": ["v1"]}, held={}, inflight={("a/z", "v1", "warm")})
    assert [(r["state"], r["reason"]) for r in p.rows] == [
        ("waiting", "a/x@v9 is not published yet"), ("waiting", "no version of a/y is published yet"),
        ("transferring", "fetching a/z@v1 into warm")]


def test_mover_slots_cap_renew_expire_release() -> None:
    from weightd.fleet.rollout import MoverSlots
    now = [0.0]
    s = MoverSlots(2, ttl_s=120, clock=lambda: now[0])
    assert s.ask("10.0.0.1", "w1: a/x@v2")["granted"] and s.ask("10.0.0.2", "w2: a/x@v2")["granted"]
    assert s.ask("10.0.0.3", "w3: a/x@v2") == {"granted": False, "movers": 2, "cap": 2, "free": []}
    assert s.ask("10.0.0.1", "w1: a/x@v2")["granted"]            # a holder renews
    now[0] = 100
    s.ask("10.0.0.1", "w1: a/x@v2")
    now[0] = 130                                                   # 10.0.0.2 went quiet for 130 s
    assert s.ask("10.0.0.3", "w3: a/x@v2")["granted"]
    s.release("10.0.0.1")
    assert [m["node"] for m in s.movers()] == ["10.0.0.3"]
    assert MoverSlots(0).ask("x", "y")["granted"]                  # no cap


def test_the_labels_file_gets_the_intent_files_checks(tmp_path: Path) -> None:
    p = tmp_path / "labels"
    p.write_text("pool=chat\n")
    os.chmod(p, 0o666)
    with pytest.raises(IntentError, match="writable by every user: refused"):
        read_labels(p, {})
    os.chmod(p, 0o644)
    with pytest.raises(IntentError, match="owned by uid"):
        read_labels(p, {}, trusted_uids=(12345,))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(IntentError, match="not a regular file"):
        read_labels(fifo, {})                      # (and never blocks on it)
    p.write_text("a=b\n" * 20000)
    with pytest.raises(IntentError, match="larger than 65536 bytes"):
        read_labels(p, {})
