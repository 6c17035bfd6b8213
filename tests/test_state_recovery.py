"""A corrupt state.db never bricks the node (issue 12, item 8): moved aside, rebuilt, pins kept.

Real files throughout: a real garbage / truncated / wrong-schema database, a real garbage ``-wal``,
the real CLI in a subprocess and a real ``weightd serve`` scraped over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tiering.errors import UnsafePath
from tiering.state import db as state_mod
from tiering.state import KEEP_CORRUPT, State

from .conftest import assert_one_line_error, stop_process

PINS = {("org/a", "v1"), ("org/b", "2024-01"), ("solo", "v.3")}


def make_db(state_dir: Path, pins=PINS, copies: int = 200) -> Path:
    """A real state.db with pins, copies (enough for several pages) and a lease, cleanly closed."""
    with State(state_dir) as s:
        for n, v in sorted(pins):
            assert s.pin(n, v)
        with s.db:
            for i in range(copies):
                s.record_copy("hot", f"org/m{i}", "v1", f"{i:032x}", 1000 + i)
        s.add_lease("hot", "org/a", "v1", 3600)
    db = state_dir / "state.db"
    assert db.stat().st_size > 8 * 4096 and not (state_dir / "state.db-wal").exists()
    return db


def _garbage(db: Path) -> None:
    db.write_bytes(os.urandom(64 * 1024))


def _truncated(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])


def _wrong_schema(db: Path) -> None:
    db.unlink()
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE pins (ref TEXT)")
        c.execute("CREATE TABLE something_else (x)")
        c.execute("INSERT INTO pins VALUES ('org/a@v1')")
    c.close()


def _sql(statement: str):
    """A corruption made by one SQL statement on a real state.db."""
    def corrupt(db: Path) -> None:
        with sqlite3.connect(db) as c:
            c.execute(statement)
        c.close()
    return corrupt


_wrong_columns = _sql("ALTER TABLE copies DROP COLUMN last_access")
_no_version = _sql("DELETE FROM meta")
_other_version = _sql("UPDATE meta SET value='99' WHERE key='schema'")


def _garbage_wal(db: Path) -> None:
    (db.parent / "state.db-wal").write_bytes(os.urandom(32 * 1024))


CORRUPTIONS = {"garbage": (_garbage, "SQLITE_NOTADB"), "truncated": (_truncated, "SQLITE_CORRUPT"),
               "wrong_schema": (_wrong_schema, "table copies missing"),
               "wrong_columns": (_wrong_columns, "table copies has columns"),
               "no_version": (_no_version, "schema version missing"),
               "other_version": (_other_version, "schema version '99'"),
               "garbage_wal": (_garbage_wal, "state.db-wal is not a SQLite write-ahead log")}
MAIN_KINDS = ["garbage", "truncated", "wrong_schema", "garbage_wal"]


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def corrupt_files(state_dir: Path) -> list[Path]:
    return sorted(state_dir.glob("state.db.corrupt-*"))


# -- (a) State itself --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_db_is_moved_aside_and_pins_come_back(kind: str, tmp_path: Path, caplog) -> None:
    sd = tmp_path / "state"
    db = make_db(sd)
    corrupt, reason = CORRUPTIONS[kind]
    corrupt(db)
    before = {p.name: sha(p) for p in sd.glob("state.db*")}
    count = State.recoveries
    with caplog.at_level(logging.WARNING, logger="tiering.state"):
        s = State(sd)
    try:
        assert s.recovered and reason in s.recovered, s.recovered
        assert State.recoveries == count + 1
        # the old files, byte for byte, under the moved-aside name (db and its -wal alike)
        moved = corrupt_files(sd)
        assert s.moved_to in moved and moved[0].name.startswith("state.db.corrupt-2")
        assert {p.name.replace(s.moved_to.name, "state.db"): sha(p) for p in moved} == before
        # logged once, at WARNING, with the path it moved aside and why
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and str(s.moved_to) in warnings[0].getMessage()
        assert reason in warnings[0].getMessage()
        # a fresh, working database: pins are back (from pins.json), copies are for reconcile, leases lost
        assert s.pinned() == PINS
        assert s.copies() == [] and s.leases() == []
        assert s.db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        s.record_copy("hot", "org/a", "v1", "d" * 32, 5)
        assert s.unpin("org/a", "v1") and s.pinned() == PINS - {("org/a", "v1")}
    finally:
        s.close()
    # the next open is an ordinary one
    with State(sd) as again:
        assert again.recovered is None and again.pinned() == PINS - {("org/a", "v1")}
        assert [c.name for c in again.copies()] == ["org/a"]
    assert len(corrupt_files(sd)) == len(moved)


def test_only_a_few_corrupt_copies_are_kept(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    made = []
    for _ in range(KEEP_CORRUPT + 2):
        _garbage(sd / "state.db")
        with State(sd) as s:
            assert s.recovered and s.pinned() == PINS
            made.append(s.moved_to.name)
    assert len(set(made)) == len(made)  # several in one second get distinct names
    assert [p.name for p in corrupt_files(sd)] == made[-KEEP_CORRUPT:]


def test_two_processes_opening_a_corrupt_db_recover_it_once(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    _garbage(sd / "state.db")
    code = ("import sys; from pathlib import Path; from tiering.state import State\n"
            "s = State(Path(sys.argv[1])); print(bool(s.recovered), len(s.pinned())); s.close()")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(sd)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            stop_process(p)
    assert all(p.returncode == 0 for p in procs), outs
    assert sorted(o for o, _ in outs) == ["False 3\n"] * 3 + ["True 3\n"]
    assert len(corrupt_files(sd)) == 1


def test_healthy_db_is_left_alone(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    db = make_db(sd)
    with State(sd) as s:
        assert s.recovered is None and s.pinned() == PINS and len(s.copies()) == 200
        assert len(s.leases()) == 1
    assert corrupt_files(sd) == [] and db.exists()


def test_pins_json_follows_pin_and_unpin(tmp_path: Path) -> None:
    sd = tmp_path / "missing" / "state"
    with State(sd) as s:
        assert stat.S_IMODE(sd.stat().st_mode) == 0o700
        pj = sd / "pins.json"
        assert not pj.exists()
        s.pin("org/x", "v1")
        assert stat.S_IMODE(pj.stat().st_mode) == 0o600
        doc = json.loads(pj.read_text())
        assert doc["format"] == 1 and [(p["name"], p["version"]) for p in doc["pins"]] == [("org/x", "v1")]
        s.pin("org/y", "v2")
        s.unpin("org/x", "v1")
        assert [(p["name"], p["version"]) for p in json.loads(pj.read_text())["pins"]] == [("org/y", "v2")]
        assert not s.unpin("org/x", "v1")
    assert sorted(p.name for p in sd.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_first_start_imports_pins_json(tmp_path: Path) -> None:
    """A state dir whose db was deleted (or never made) takes its pins from pins.json: no recovery."""
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    for suffix in ("", "-wal", "-shm"):
        (sd / f"state.db{suffix}").unlink(missing_ok=True)
    with State(sd) as s:
        assert s.recovered is None and s.pinned() == PINS


def test_healthy_db_without_pins_json_writes_it(tmp_path: Path) -> None:
    """An upgraded node (pins only in the db) gets its pins.json at the next open."""
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    (sd / "pins.json").unlink()
    with State(sd) as s:
        assert s.recovered is None
    assert {(p["name"], p["version"]) for p in json.loads((sd / "pins.json").read_text())["pins"]} == PINS


@pytest.mark.parametrize("content", [b"{not json", b'{"format": 1, "pins": [{"name": "../etc", "version": "v1", '
                                     b'"created_at": 1}]}', b'{"format": 2, "pins": []}', b"[]",
                                     b'{"format": 1, "pins": [{"name": "a", "version": "v1", "created_at": NaN}]}'])
def test_invalid_pins_json_is_ignored_with_a_warning(content: bytes, tmp_path: Path, caplog) -> None:
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    _garbage(sd / "state.db")
    (sd / "pins.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="tiering.state"):
        with State(sd) as s:
            assert s.recovered and s.pinned() == set()
            s.pin("org/new", "v1")  # and the next pin rewrites it properly
    assert any("invalid" in r.getMessage() and "pins.json" in r.getMessage() for r in caplog.records)
    assert [p["name"] for p in json.loads((sd / "pins.json").read_text())["pins"]] == ["org/new"]


def test_symlinked_pins_json_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    victim = tmp_path / "victim.json"
    victim.write_text('{"format": 1, "pins": [{"name": "evil", "version": "v1", "created_at": 1}]}')
    before = sha(victim)
    (sd / "pins.json").unlink()
    (sd / "pins.json").symlink_to(victim)
    _garbage(sd / "state.db")
    with State(sd) as s:
        assert s.recovered and s.pinned() == set()
        s.pin("org/a", "v1")
    assert sha(victim) == before
    assert not (sd / "pins.json").is_symlink() and "org/a" in (sd / "pins.json").read_text()


@pytest.mark.parametrize("name", ["state.db", "state.db-wal", "state.db-shm"])
def test_symlinked_db_files_are_refused(name: str, tmp_path: Path) -> None:
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    link = sd / name
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        State(sd)
    assert victim.read_bytes() == b"precious\n" and link.is_symlink()
    assert corrupt_files(sd) == []


def test_db_that_is_a_directory_is_refused(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    (sd / "state.db").mkdir(parents=True)
    with pytest.raises(UnsafePath, match="not a regular file"):
        State(sd)


def test_a_busy_database_is_not_corruption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Locked is not corrupt: never move a healthy database aside because another process writes."""
    sd = tmp_path / "state"
    make_db(sd, copies=0)
    holder = sqlite3.connect(sd / "state.db", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    real_connect = sqlite3.connect
    monkeypatch.setattr(state_mod.sqlite3, "connect", lambda *a, **kw: real_connect(*a, **{**kw, "timeout": 0.2}))
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            State(sd)
    finally:
        holder.close()
    assert corrupt_files(sd) == []
    monkeypatch.undo()
    with State(sd) as s:
        assert s.recovered is None and s.pinned() == PINS


# -- (b) the real CLI ------------------------------------------------------------------------------

def publish_preload_pin(node_env, ckpt: Path) -> None:
    """org/m@v1 published, in hot and pinned: what ``weightd publish``, ``preload`` and ``pin`` leave,
    made through the library they run (three interpreter start-ups fewer; the commands under test are
    the ones that follow)."""
    with node_env.node() as node:
        node.publish(ckpt, "org/m", "v1")
        node.preload("org/m", "v1", tier="hot")
        node.pin("org/m", "v1")


@pytest.mark.parametrize("kind", MAIN_KINDS)
def test_cli_keeps_working_on_a_corrupt_db(kind: str, wd, node_env, ckpt: Path) -> None:
    publish_preload_pin(node_env, ckpt)
    db = node_env.state / "state.db"
    assert db.exists() and (node_env.state / "pins.json").exists()
    CORRUPTIONS[kind][0](db)

    path = wd("path", "org/m@v1")
    assert path.returncode == 0, path.stderr
    assert path.stdout.strip() == str(node_env.hot / "org/m/v1")
    assert path.stderr.count("moved it aside") == 1 and "state.db.corrupt-" in path.stderr
    assert len(corrupt_files(node_env.state)) >= 1

    st = wd("status", "--json")
    assert st.returncode == 0, st.stderr
    assert "moved it aside" not in st.stderr  # once, not at every command
    doc = json.loads(st.stdout)
    (c,) = doc["checkpoints"]
    assert (c["name"], c["version"], c["pinned"]) == ("org/m", "v1", True)
    assert "hot" in c["tiers"] and doc["pins"] == ["org/m@v1"]
    # the pin is a real one again: evicting it is refused
    assert_one_line_error(wd("evict", "org/m@v1"), 1, "pinned")


def test_cli_refuses_a_symlinked_db(wd, node_env, ckpt: Path, tmp_path: Path) -> None:
    publish_preload_pin(node_env, ckpt)
    victim = tmp_path / "victim.db"
    victim.write_bytes(b"not yours\n" * 100)
    before = sha(victim)
    db = node_env.state / "state.db"
    db.unlink()
    db.symlink_to(victim)
    for r in wd.at_once(["status"], ["path", "org/m@v1"], ["serve"], timeout=60):   # (each refuses: at once)
        assert_one_line_error(r, 2, str(db), "symbolic link")
    assert sha(victim) == before and db.is_symlink()
    assert not any(p.name.startswith("victim.db-") for p in tmp_path.iterdir())  # no -wal/-shm next to it


# -- (c) a real daemon ------------------------------------------------------------------------------

def test_daemon_starts_on_a_corrupt_db_and_counts_it(wd, node_env, ckpt: Path, isolated_env, tmp_path: Path) -> None:
    from .test_daemon import DaemonProc

    publish_preload_pin(node_env, ckpt)
    _garbage(node_env.state / "state.db")
    d = None
    try:
        d = DaemonProc(node_env, isolated_env, tmp_path)  # waits (bounded) for READY=1
        assert d.metric("weightd_state_recoveries_total") == 1
        assert d.metric('weightd_checkpoint_pinned{model="org/m",version="v1"}') == 1
        st = wd("status", "--json")
        assert st.returncode == 0, st.stderr
        (c,) = json.loads(st.stdout)["checkpoints"]
        assert c["pinned"] and "hot" in c["tiers"]
        assert len(corrupt_files(node_env.state)) == 1
    finally:
        if d is not None:
            d.stop()
    assert "moved it aside" in d.log_path.read_text()
