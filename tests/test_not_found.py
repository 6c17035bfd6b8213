"""Not found is one answer (issue 31): every command that takes NAME[@VERSION] names what is missing in
one line, says whether it is published (and how to get it here) or what was probably meant, and exits 3,
the same line and code in-process and through the daemon; a mistyped command is suggested its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error
from .test_daemon import daemon  # noqa: F401 (the fixture)

MiB = 1 << 20
BIG = "acme/llama-big"

#: (command line, the one line it ends with, exit code) on a node where acme/llama-big@v1 is published
#: and nothing is local
CASES = [
    (["path", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                    "(did you mean acme/llama-big? versions: v1)", 3),
    (["path", f"{BIG}@v1"], f"{BIG}@v1: published but not on this node (get it with: weightd preload {BIG}@v1)", 3),
    (["path", BIG], f"{BIG}@v1: published but not on this node (get it with: weightd preload {BIG}@v1)", 3),
    (["path", f"{BIG}@v2"], f"{BIG}@v2: not published and not on this node (published versions: v1)", 3),
    (["evict", f"{BIG}@v1"], f"{BIG}@v1: published but not on this node (get it with: weightd preload {BIG}@v1)", 3),
    (["evict", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                     "(did you mean acme/llama-big? versions: v1)", 3),
    (["evict", BIG, "--all"], f"{BIG}: no version on this node (published versions: v1; get one with: "
                              f"weightd preload {BIG}@v1)", 3),
    (["unpin", f"{BIG}@v9"], f"{BIG}@v9: not published and not on this node (published versions: v1)", 3),
    (["unpin", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                     "(did you mean acme/llama-big? versions: v1)", 3),
    (["pin", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                   "(did you mean acme/llama-big? versions: v1)", 3),
    (["ls", "acme/llama-bgi"], "acme/llama-bgi: no version published and none on this node "
                               "(did you mean acme/llama-big? versions: v1)", 3),
    (["preload", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                       "(did you mean acme/llama-big? versions: v1)", 3),
    (["verify", "acme/llama-bgi@v1"], "acme/llama-bgi@v1: not published and not on this node "
                                      "(did you mean acme/llama-big? versions: v1)", 3),
    (["verify", f"{BIG}@v1"], f"{BIG}@v1: published but not on this node (get it with: weightd preload {BIG}@v1)", 3),
]


@pytest.fixture
def published(wd, tmp_path: Path) -> Path:
    src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2)
    assert wd("publish", src, "--name", BIG, "--version", "v1").returncode == 0
    return src


def _check(proc, line: str, code: int) -> None:
    assert_one_line_error(proc, code, line)
    assert proc.stderr.strip() == f"weightd: {line}", proc.stderr
    assert proc.stdout == "", proc.stdout


@pytest.mark.parametrize("args,line,code", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_not_found_in_process(wd, published, args, line, code) -> None:
    _check(wd("--no-daemon", *args), line, code)


def test_not_found_through_the_daemon_is_the_same(daemon, wd, published) -> None:  # noqa: F811
    for args, line, code in CASES:
        _check(wd(*args), line, code)                       # (path: the fast path; the others: click's)
        _check(wd("--daemon-only", *args), line, code)      # (it did answer through the daemon)
    # and through click's command, not the fast path, for path
    _check(wd("path", f"{BIG}@v1", env={"WEIGHTD_NO_FAST_PATH": "1"}), CASES[1][1], 3)


def test_what_exists_is_not_an_error(wd, published) -> None:
    """unpin of a version that exists but is not pinned, ls of a known name: exit 0 as before."""
    r = wd("--no-daemon", "unpin", f"{BIG}@v1")
    assert r.returncode == 0 and r.stdout.strip() == f"{BIG}@v1: was not pinned", r.stderr
    r = wd("--no-daemon", "ls", BIG)
    assert r.returncode == 0 and f"{BIG}@v1" in r.stdout, r.stderr


def test_a_copy_in_the_other_tier_is_named(wd, published) -> None:
    assert wd("--no-daemon", "preload", f"{BIG}@v1", "--tier", "warm", "--lease", "0").returncode == 0
    _check(wd("--no-daemon", "evict", f"{BIG}@v1", "--tier", "hot"), f"{BIG}@v1: not in the hot tier (it is in warm)", 3)
    r = wd("--no-daemon", "verify", f"{BIG}@v1")
    assert r.returncode == 0 and "ok:" in r.stdout, r.stderr


def test_an_unpublished_local_name_is_suggested(wd, published, node_env) -> None:
    """A version on this node whose cold copy is gone: a typo of its name is pointed at it."""
    import shutil
    assert wd("--no-daemon", "preload", f"{BIG}@v1", "--tier", "warm", "--lease", "0").returncode == 0
    shutil.rmtree(node_env.cold / "acme")
    _check(wd("--no-daemon", "path", "acme/llama-bgi@v1"), "acme/llama-bgi@v1: not published and not on this node "
           f"(did you mean {BIG}? on this node: v1)", 3)


def test_unpin_lifts_a_pin_of_what_is_gone(wd, published, node_env) -> None:
    """A pinned version removed from cold storage (and never local) can still be unpinned."""
    import shutil
    assert wd("--no-daemon", "pin", f"{BIG}@v1").returncode == 0
    shutil.rmtree(node_env.cold / "acme")
    r = wd("--no-daemon", "unpin", f"{BIG}@v1")
    assert r.returncode == 0 and r.stdout.strip() == f"{BIG}@v1: unpinned", r.stderr


@pytest.mark.parametrize("typed,meant", [("prelod", "preload"), ("stauts", "status"), ("evcit", "evict")])
def test_a_mistyped_command_is_suggested(weightd, typed, meant) -> None:
    for args in ([typed], ["--no-daemon", typed, "x"]):
        r = weightd(*args)
        assert_one_line_error(r, 2, f"No such command '{typed}'. Did you mean '{meant}'?")
    r = weightd("manifest", "biuld")   # (a group's commands, as before)
    assert_one_line_error(r, 2, "Did you mean 'build'?")
