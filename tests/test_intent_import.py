"""Intent's ``[[import]]`` entries: a daemon follows a Hugging Face Hub branch into cold storage (a real
olah mirror on 127.0.0.1 serving a git-lfs repository), and ``NAME@latest`` rolls forward to each new
commit; the entries' checks (one line naming file, entry and key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightd.errors import IntentError
from weightd.intent.imports import imports_for, parse_every
from weightd.intent.spec import parse_document

from .conftest import assert_one_line_error
from .test_daemon import DaemonProc
from .test_hf_import import TOKEN, Hub, git, hub  # noqa: F401  (the olah fixture)
from .test_intent_daemon import intent_status, until


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


def test_two_imports_of_one_name_from_two_sources_conflict_on_a_node_both_select() -> None:
    two = imports('[[import]]\nsource = "hf://org/a"\nname = "acme/m"\n'
                  '[[import]]\nsource = "hf://org/b"\nname = "acme/m"\nnodes = "pool=b"\n')
    assert [e.source for e in imports_for(tuple(two), {}, origin=True)] == ["hf://org/a@main"]
    with pytest.raises(IntentError, match=r"import #2: imports acme/m as f.toml import #1 does"):
        imports_for(tuple(two), {"pool": "b"}, origin=True)
    same = imports('[[import]]\nsource = "hf://org/a"\nname = "acme/m"\n' * 1 +
                   '[[import]]\nsource = "hf://org/a@main"\nname = "acme/m"\nnodes = "pool=b"\n')
    assert len(imports_for(tuple(same), {"pool": "b"}, origin=True)) == 1


def test_intent_check_shows_the_imports_and_refuses_a_bad_one(wd, tmp_path: Path) -> None:
    idir = tmp_path / "intent.d"
    idir.mkdir()
    (idir / "a.toml").write_text('[[import]]\nsource = "hf://org/repo@main"\nname = "acme/m"\nevery = "15m"\n')
    r = wd("intent", "check", str(idir), "--origin")
    assert r.returncode == 0 and "a.toml import #1" in r.stdout and "hf://org/repo@main every 15m" in r.stdout, r
    r = wd("intent", "check", str(idir), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["imports"] == []      # (not the origin, no nodes)
    (idir / "a.toml").write_text('[[import]]\nsource = "hf://org/repo@main"\nevery = 1\n')
    assert_one_line_error(wd("intent", "check", str(idir)), 2, "intent a.toml: import #1.every: 1 s")


def test_a_daemon_follows_a_hub_branch_and_latest_rolls_forward(hub: Hub, node_env, isolated_env, wd,  # noqa: F811
                                                               tmp_path: Path) -> None:
    """The node the entry selects imports main's commit, a [[keep]] NAME@latest entry places it; a new
    commit on main is imported at the next check and the entry rolls forward; the token in the
    daemon's environment is never logged."""
    idir = tmp_path / "intent.d"
    idir.mkdir()
    node_env.config.write_text(node_env.config.read_text() + (
        f'[intent]\ndir = "{idir}"\nreconcile_s = 1\npoll_s = 0.2\nlabels = {{importer = "yes"}}\n'))
    (idir / "hub.toml").write_text(
        '[[import]]\nsource = "hf://org/repo@main"\nname = "acme/hubbed"\nnodes = "importer=yes"\nevery = "10s"\n'
        '[[keep]]\nmodel = "acme/hubbed@latest"\ntier = "warm"\n')
    first = hub.commit()
    d = DaemonProc(node_env, {**isolated_env, **hub.env(HF_TOKEN=TOKEN)}, tmp_path)
    try:
        def at(version: str):
            st = intent_status(wd)
            keep = {r["model"]: r for r in st["entries"]}.get("acme/hubbed@latest", {})
            imp = (st.get("imports") or [{}])[0]
            return st if keep.get("state") == "ready" and keep.get("want") == version == imp.get("version") else None
        st = until("main's first commit imported and placed", lambda: at(first), timeout=60)
        assert st["imports"][0]["state"] == "ready" and st["imports"][0]["commit"] == first
        assert (node_env.warm / "acme/hubbed" / first / "config.json").is_file()
        assert d.metric('weightd_intent_imports_total{result="published"}') == 1

        (hub.repo / "config.json").write_text('{"model_type": "llama", "edited": true}\n')
        git(hub.repo, "commit", "-q", "-am", "second")
        second = hub.commit()
        until("the new commit imported and rolled to", lambda: at(second), timeout=60)
        assert (node_env.warm / "acme/hubbed" / second / "config.json").read_text().endswith('"edited": true}\n')
        until("a later check finds it up to date",
              lambda: d.metric('weightd_intent_imports_total{result="up_to_date"}') >= 1, timeout=30)
        assert d.metric('weightd_intent_imports_total{result="published"}') == 2
        r = wd("intent", "status")
        assert r.returncode == 0 and "hub.toml import #1" in r.stdout and f"commit {second}" in r.stdout, r.stdout

        hub.stop()   # the Hub goes away: the entry's row says so in one line, what is here stays
        st = until("the failed check shown", lambda: (s := intent_status(wd)) and
                   s["imports"][0]["state"] == "failed" and s, timeout=40)
        assert "does not answer" in st["imports"][0]["reason"] and "\n" not in st["imports"][0]["reason"]
        assert {r["model"]: r for r in st["entries"]}["acme/hubbed@latest"]["state"] == "ready"
    finally:
        d.stop()
    assert TOKEN not in d.log_path.read_text()
