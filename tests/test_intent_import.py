"""Intent's ``[[import]]`` entries: a daemon follows a Hugging Face Hub branch into cold storage (a real
olah mirror on 127.0.0.1 serving a git-lfs repository), and ``NAME@latest`` rolls forward to each new
commit; the entries' checks (one line naming file, entry and key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiering import validate_version
from tiering.sample import local_hub
from weightd.errors import IntentError
from weightd.intent.imports import imports_for, not_allowed, parse_every
from weightd.node.hub_import import default_label
from weightd.intent.spec import parse_document

from .conftest import assert_one_line_error
from .test_daemon import DaemonProc
from .test_hf_import import TOKEN, Hub, git
from .test_intent_daemon import intent_status, until


@pytest.fixture
def hub(tmp_path: Path):
    """A real olah mirror of its own for each test (test_hf_import's module shares one and puts back
    what its tests change; the test here stops its Hub)."""
    with local_hub(tmp_path / "hub") as h:
        yield h


def imports(text: str):
    return parse_document("f.toml", text)[1]


def test_an_import_entry_and_its_defaults() -> None:
    (e,) = imports('[[import]]\nsource = "hf://org/repo"\n')
    assert (e.source, e.name, e.every_s, e.nodes) == ("hf://org/repo@main", "org/repo", 600.0, None)
    assert e.selects({}, origin=True) and not e.selects({"pool": "chat"}, origin=False)
    (e,) = imports('[[import]]\nsource = "hf://org/repo@v2"\nname = "acme/m"\nnodes = "role=importer"\n'
                   'every = "1h"\ninclude = ["*.safetensors"]\n')
    assert (e.name, e.every_s, e.include) == ("acme/m", 3600.0, ("*.safetensors",))
    assert e.selects({"role": "importer"}, origin=False) and not e.selects({}, origin=True)
    assert [parse_every(v) for v in (10, "90s", "10m", "2h", "1d")] == [10, 90, 600, 7200, 86400]


@pytest.mark.parametrize("text, msg", [
    ('[[import]]\nname = "a/b"\n', "intent f.toml: import #1.source: missing key"),
    ('[[import]]\nsource = "s3://bucket/x"\n', "intent f.toml: import #1.source: 's3://bucket/x': not an hf://"),
    ('[[import]]\nsource = "hf://org/repo"\nevery = "5s"\n', "intent f.toml: import #1.every: 5 s: expected 10 s"),
    ('[[import]]\nsource = "hf://org/repo"\nevery = "soon"\n', "import #1.every: expected a duration"),
    ('[[import]]\nsource = "hf://org/repo"\nname = "../x"\n', "intent f.toml: import #1.name: invalid name"),
    ('[[import]]\nsource = "hf://org/repo"\nsoruce = 1\n', "import #1.soruce: unknown key (did you mean source?)"),
    ('[[import]]\nsource = "hf://org/repo"\ninclude = 3\n', "import #1.include: expected a list"),
    ('[[import]]\nsource = "hf://org/repo"\nnodes = "a in"\n', "import #1.nodes:"),
    ('import = 3\n', "intent f.toml: import: expected [[import]] entries"),
])
def test_bad_import_entries_name_file_entry_and_key(text: str, msg: str) -> None:
    with pytest.raises(IntentError) as ei:
        imports(text)
    assert msg in str(ei.value) and "\n" not in str(ei.value)


def test_two_imports_of_one_name_from_two_sources_the_second_is_refused_on_a_node_both_select() -> None:
    two = imports('[[import]]\nsource = "hf://org/a"\nname = "acme/m"\n'
                  '[[import]]\nsource = "hf://org/b"\nname = "acme/m"\nnodes = "pool=b"\n')
    run, refused = imports_for(tuple(two), {}, origin=True)
    assert [e.source for e in run] == ["hf://org/a@main"] and refused == []
    run, refused = imports_for(tuple(two), {"pool": "b"}, origin=True)
    assert [e.source for e in run] == ["hf://org/a@main"]
    assert [(e.index, why) for e, why in refused] == [(2, "imports acme/m as f.toml import #1 does, from another "
                                                          "source or selection: give one another name")]
    same = imports('[[import]]\nsource = "hf://org/a"\nname = "acme/m"\n'
                   '[[import]]\nsource = "hf://org/a@main"\nname = "acme/m"\nnodes = "pool=b"\n')
    assert [len(x) for x in imports_for(tuple(same), {"pool": "b"}, origin=True)] == [1, 0]


def test_only_what_the_daemons_config_allows_runs() -> None:
    (e,) = imports('[[import]]\nsource = "hf://meta-llama/Llama-3.1-8B@main"\nname = "meta/llama-8b"\n')
    assert not_allowed(e, {"meta/*": "hf://meta-llama/*"}) is None
    assert not_allowed(e, {"meta/*": "hf://meta-llama/Llama-3.1-8B@v2"}) is None      # (the revision is the entry's)
    for allow in ({}, {"acme/*": "hf://meta-llama/*"}, {"meta/*": "hf://evil/*"}):
        why = not_allowed(e, allow)
        assert why is not None and "not allowed by this daemon's [intent] import_allow" in why


def test_the_default_label_is_the_commit_and_the_selection() -> None:
    sha = "a" * 40
    assert default_label(sha, (), ()) == sha
    sel = default_label(sha, ("*.json",), ())
    assert sel.startswith(sha + "-") and len(sel) == 49 and sel != default_label(sha, (), ("*.json",))
    validate_version(sel)


def test_intent_check_shows_the_imports_and_refuses_a_bad_one(wd, node_env, tmp_path: Path) -> None:
    idir = tmp_path / "intent.d"
    idir.mkdir()
    (idir / "a.toml").write_text('[[import]]\nsource = "hf://org/repo@main"\nname = "acme/m"\nevery = "15m"\n')
    r = wd("intent", "check", str(idir), "--origin")
    assert r.returncode == 0 and "a.toml import #1" in r.stdout and "REFUSED" in r.stdout, r
    assert "not allowed by this daemon's [intent] import_allow (empty)" in r.stdout
    node_env.config.write_text(node_env.config.read_text() + '[intent]\nimport_allow = { "acme/*" = "hf://org/*" }\n')
    r = wd("intent", "check", str(idir), "--origin")
    assert r.returncode == 0 and "hf://org/repo@main every 15m" in r.stdout and "REFUSED" not in r.stdout, r
    r = wd("intent", "check", str(idir), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["imports"] == []      # (not the origin, no nodes)
    (idir / "a.toml").write_text('[[import]]\nsource = "hf://org/repo@main"\nevery = 1\n')
    assert_one_line_error(wd("intent", "check", str(idir)), 2, "intent a.toml: import #1.every: 1 s")


def test_a_daemon_follows_a_hub_branch_and_latest_rolls_forward(hub: Hub, node_env, isolated_env, wd,
                                                               tmp_path: Path) -> None:
    """The node the entry selects imports main's commit, a [[keep]] NAME@latest entry places it; a new
    commit on main is imported at the next check and the entry rolls forward (jitter_s = 1: the
    default's wait before a rollout, up to 30 s by a hash of the commit, made this test take 31-60 s);
    the token in the daemon's environment is never logged."""
    idir = tmp_path / "intent.d"
    idir.mkdir()
    assert wd("keygen", tmp_path / "k").returncode == 0      # a fleet signing key imports must not use unasked
    node_env.config.write_text(node_env.config.read_text() + (
        f'[publish]\nsigning_key = "{tmp_path / "k.pem"}"\n'
        f'[intent]\ndir = "{idir}"\nreconcile_s = 1\npoll_s = 0.2\njitter_s = 1\nlabels = {{importer = "yes"}}\n'
        'import_allow = { "acme/hub*" = "hf://org/*" }\n'))
    (idir / "hub.toml").write_text(
        '[[import]]\nsource = "hf://org/repo@main"\nname = "acme/hubbed"\nnodes = "importer=yes"\nevery = "10s"\n'
        '[[import]]\nsource = "hf://org/repo@main"\nname = "acme/other"\nnodes = "importer=yes"\n'
        '[[keep]]\nmodel = "acme/hubbed@latest"\ntier = "warm"\n')
    first = hub.commit()
    d = DaemonProc(node_env, {**isolated_env, **hub.env(HF_TOKEN=TOKEN)}, tmp_path)
    try:
        def at(version: str):
            st = intent_status(wd)
            keep = {r["model"]: r for r in st["entries"]}.get("acme/hubbed@latest", {})
            imp = {r["name"]: r for r in st.get("imports") or []}.get("acme/hubbed", {})
            return st if keep.get("state") == "ready" and keep.get("want") == version == imp.get("version") else None
        st = until("main's first commit imported and placed", lambda: at(first), timeout=60)
        rows = {r["name"]: r for r in st["imports"]}
        assert rows["acme/hubbed"]["state"] == "ready" and rows["acme/hubbed"]["commit"] == first
        assert rows["acme/other"]["state"] == "refused" and "import_allow" in rows["acme/other"]["reason"]
        assert "acme/other" not in wd("ls").stdout       # (an intent file alone publishes nothing)
        assert (node_env.warm / "acme/hubbed" / first / "config.json").is_file()
        assert d.metric('weightd_intent_imports_total{result="published"}') == 1

        (hub.repo / "config.json").write_text('{"model_type": "llama", "edited": true}\n')
        git(hub.repo, "commit", "-q", "-am", "second")
        second = hub.commit()
        until("the new commit imported and rolled to", lambda: at(second), timeout=60)
        assert (node_env.warm / "acme/hubbed" / second / "config.json").read_text().endswith('"edited": true}\n')
        until("a later check finds it up to date",
              lambda: 'weightd_intent_imports_total{result="up_to_date"}' in d.metrics(), timeout=30)
        assert d.metric('weightd_intent_imports_total{result="published"}') == 2
        r = wd("intent", "status")
        assert r.returncode == 0 and "hub.toml import #1" in r.stdout and f"commit {second}" in r.stdout, r.stdout

        hub.stop()   # the Hub goes away: the entry's row says so in one line, what is here stays
        st = until("the failed check shown", lambda: (s := intent_status(wd)) and
                   s["imports"][0]["state"] == "failed" and s, timeout=40)
        assert "does not answer" in st["imports"][0]["reason"] and "\n" not in st["imports"][0]["reason"]
        assert not list(node_env.cold.glob("acme/hubbed/*/.weightd/model.sig"))   # ([intent] import_sign is off)
        assert {r["model"]: r for r in st["entries"]}["acme/hubbed@latest"]["state"] == "ready"
    finally:
        d.stop()
    assert TOKEN not in d.log_path.read_text()


def test_a_hub_that_accepts_and_never_answers_is_given_up_on(tmp_path: Path, monkeypatch) -> None:
    """huggingface_hub's client waits for ever by default: weightd bounds every request it makes."""
    import socket
    import time

    import tiering.sources.hf as hf
    monkeypatch.setattr(hf, "READ_TIMEOUT_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)                 # (accepted by the kernel, never answered)
        t0 = time.monotonic()
        with pytest.raises(hf.HubUnreachable, match="does not answer"):
            hf.resolve_commit(hf.parse_hub_ref("hf://org/repo@main"),
                              endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}", token=False)
        assert time.monotonic() - t0 < 10
