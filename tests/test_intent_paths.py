"""Intent files reached through a directory another uid (65534) owns: refused, whole path checked,
real symlinks, and a real daemon that logs why and keeps the intent it had."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from weightd.errors import IntentError
from weightd.intent.files import load_intent, read_labels

from .test_intent_daemon import intent_status, rows, until

GOOD = '[[keep]]\nmodel = "acme/chat@v1"\n'
OTHER = '[[keep]]\nmodel = "acme/other@v1"\ntier = "hot"\npin = true\n'


@pytest.fixture
def base():
    """A directory under /tmp (root's, 0755) where uid 65534 can own things."""
    b = Path(tempfile.mkdtemp(prefix="wd-intent-", dir="/tmp"))
    os.chmod(b, 0o755)
    try:
        yield b
    finally:
        shutil.rmtree(b, ignore_errors=True)


def _nobody_dir(p: Path) -> Path:
    p.mkdir(mode=0o755)
    os.chown(p, 65534, 65534)
    return p


def test_a_symlink_into_a_directory_another_uid_owns_is_refused(base: Path) -> None:
    idir = base / "intent.d"
    idir.mkdir()
    (idir / "a.toml").write_text(GOOD)
    assert len(load_intent(idir).entries) == 1
    # root's own file, but in uid 65534's directory: 65534 can swap it for any other file at will
    evil = _nobody_dir(base / "evil")
    (evil / "b.toml").write_text(OTHER)
    os.symlink(evil / "b.toml", idir / "b.toml")
    with pytest.raises(IntentError, match=rf"b.toml: .*reached through {evil}, which belongs to uid 65534"):
        load_intent(idir)
    os.unlink(idir / "b.toml")
    # a ConfigMap-like chain whose ..data points into 65534's directory (files themselves root's)
    cm = base / "cm"
    cm.mkdir()
    os.symlink(evil, cm / "..data")
    os.symlink("..data/b.toml", cm / "b.toml")
    with pytest.raises(IntentError, match="belongs to uid 65534"):
        load_intent(cm)
    # a root-owned directory that a symlink in 65534's directory leads on from
    root_only = base / "root-only"
    root_only.mkdir()
    (root_only / "c.toml").write_text(OTHER)
    os.symlink(root_only, evil / "hop")
    os.symlink(evil / "hop/c.toml", idir / "c.toml")
    with pytest.raises(IntentError, match="belongs to uid 65534"):
        load_intent(idir)
    os.unlink(idir / "c.toml")
    # the intent directory itself under a directory 65534 owns (it could rename the whole tree away)
    under = _nobody_dir(base / "nobody-parent")
    (under / "intent.d").mkdir()
    (under / "intent.d/a.toml").write_text(GOOD)
    with pytest.raises(IntentError, match="belongs to uid 65534"):
        load_intent(under / "intent.d")
    # a subdirectory writable by others on the way (no sticky bit)
    os.chmod(root_only, 0o777)
    os.symlink(root_only / "c.toml", idir / "c.toml")
    with pytest.raises(IntentError, match="writable by group or others"):
        load_intent(idir)
    os.unlink(idir / "c.toml")
    # the node labels file gets the same walk
    (evil / "labels").write_text("pool=chat\n")
    with pytest.raises(IntentError, match="belongs to uid 65534"):
        read_labels(evil / "labels", {})
    # root's own symlinks to root's own files are followed (a ConfigMap's are)
    os.chmod(root_only, 0o755)
    os.symlink(root_only / "c.toml", idir / "c.toml")
    assert len(load_intent(idir).entries) == 2


def test_a_daemon_keeps_its_intent_when_a_file_leads_into_another_uids_directory(
        node_env, isolated_env, wd, tmp_path: Path, base: Path) -> None:
    from .test_daemon import DaemonProc, publish
    publish(wd, tmp_path, "acme/chat", "v1", size=1 << 20)
    publish(wd, tmp_path, "acme/other", "v1", size=1 << 20)
    idir = base / "intent.d"
    idir.mkdir()
    node_env.config.write_text(node_env.config.read_text() + (
        f'[intent]\ndir = "{idir}"\nreconcile_s = 2\npoll_s = 0.2\n'))
    (idir / "chat.toml").write_text(GOOD)
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        until("acme/chat ready", lambda: (s := intent_status(wd)) and
              rows(s).get("acme/chat@v1", {}).get("state") == "ready" and s)
        evil = _nobody_dir(base / "evil")
        (evil / "other.toml").write_text(OTHER)
        os.symlink(evil / "other.toml", idir / "other.toml")
        st = until("the error shows", lambda: (s := intent_status(wd)) and s["error"] and s)
        assert "belongs to uid 65534" in st["error"]["error"], st["error"]
        assert list(rows(st)) == ["acme/chat@v1"] and rows(st)["acme/chat@v1"]["state"] == "ready"
        text = d.log_path.read_text()
        assert f"reached through {evil}, which belongs to uid 65534" in text and "keeping the previous intent" in text
        assert not (node_env.hot / "acme/other").exists()
    finally:
        d.stop()


def _as_nobody(fn) -> None:
    """Run ``fn`` in a forked child as uid 65534 (what that user can do, done by that user)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_symlink_another_uid_planted_in_a_sticky_directory_is_refused(base: Path) -> None:
    """uid 65534 makes ``<sticky>/rvlink`` pointing at root's intent directory (or anything). Root's own
    directories all the way, but the link is 65534's and it may replace it with another at any time
    (a sticky directory lets it remove what it owns). Was: followed and read."""
    sticky = base / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    idir = base / "intent.d"
    idir.mkdir()
    (idir / "a.toml").write_text(GOOD)
    _as_nobody(lambda: os.symlink(idir, sticky / "rvlink"))
    assert os.lstat(sticky / "rvlink").st_uid == 65534
    with pytest.raises(IntentError, match=rf"{sticky}/rvlink.*a symlink of uid 65534"):
        load_intent(sticky / "rvlink")
    _as_nobody(lambda: os.symlink(idir / "a.toml", sticky / "labels"))
    with pytest.raises(IntentError, match="a symlink of uid 65534"):
        read_labels(sticky / "labels", {})
    # root's own link in the same sticky directory: only root can replace it, so it is followed
    os.symlink(idir, sticky / "rootlink")
    assert len(load_intent(sticky / "rootlink").entries) == 1


def test_a_path_component_that_vanishes_is_an_intent_error_not_a_crash_nor_no_labels(base: Path) -> None:
    """A ConfigMap's ``..data`` caught mid-swap: the link still names the old timestamped directory that
    was just removed. Was: load_intent let a raw FileNotFoundError out, and read_labels took the labels
    file for absent (the node lost its labels: every entry with a node selector was dropped)."""
    cm = base / "cm"
    cm.mkdir()
    os.symlink("..2024_01_01_old", cm / "..data")   # (the old directory is gone)
    os.symlink("..data/a.toml", cm / "a.toml")
    with pytest.raises(IntentError, match=r"a\.toml: .*missing"):
        load_intent(cm)
    os.symlink("..data/labels", cm / "labels")
    with pytest.raises(IntentError, match=r"labels.*missing"):
        read_labels(cm / "labels", {"zone": "a"})
    # only a labels file that is itself absent means "no labels file"
    assert read_labels(base / "no-such-labels", {"zone": "a"}) == {"zone": "a"}
    # and a swap that completes is read through (the resolution is tried once more)
    new = cm / "..2024_01_02_new"
    new.mkdir()
    (new / "a.toml").write_text(GOOD)
    (new / "labels").write_text("pool=chat\n")
    os.unlink(cm / "..data")
    os.symlink(new.name, cm / "..data")
    assert len(load_intent(cm).entries) == 1
    assert read_labels(cm / "labels", {"zone": "a"}) == {"zone": "a", "pool": "chat"}


def test_configmap_swaps_while_reading_never_crash(base: Path) -> None:
    """Real ``..data`` swaps (kubelet's order: new directory, new link renamed over ``..data``, old
    directory removed) in a loop while intent and labels are read: every read is a whole intent or an
    IntentError, never another exception."""
    import threading
    import time
    cm = base / "cm"
    cm.mkdir()

    def publish(i: int) -> str:
        d = cm / f"..ts_{i}"
        d.mkdir()
        (d / "a.toml").write_text(GOOD)
        (d / "labels").write_text(f"gen={i}\n")
        return d.name

    old = publish(0)
    os.symlink(old, cm / "..data")
    os.symlink("..data/a.toml", cm / "a.toml")
    os.symlink("..data/labels", cm / "labels")
    stop = threading.Event()

    def swap() -> None:
        nonlocal old
        i = 1
        while not stop.is_set():
            new = publish(i)
            os.symlink(new, cm / "..data_tmp")
            os.rename(cm / "..data_tmp", cm / "..data")
            shutil.rmtree(cm / old)
            old, i = new, i + 1

    t = threading.Thread(target=swap)
    t.start()
    try:
        ok = errors = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for fn in (lambda: load_intent(cm), lambda: read_labels(cm / "labels", {})):
                try:
                    got = fn()
                    if isinstance(got, dict):
                        assert "gen" in got, got   # (never "no labels file": the file is always there)
                    else:
                        assert len(got.entries) == 1
                    ok += 1
                except IntentError:
                    errors += 1
    finally:
        stop.set()
        t.join(10)
    assert ok > 0
