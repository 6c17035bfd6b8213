"""What an in-process command (``--no-daemon``) loads before it does its work: the start of ``path``,
``status`` and a ``preload`` (of a version in cold storage into warm, and of one already there) is
the tier code and click, never the code of a source or transport the command does not use (issue 35:
the registry's client, the object store's, asyncio, http.client, libtorrent cost ~0.1 s of each
start). Each command runs in a real interpreter through the console script's ``main``, and the
modules it imported are named from its ``sys.modules``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .test_daemon import publish

ROOT = Path(__file__).resolve().parent.parent

#: packages a command on a node whose cold tier is a path, without P2P origins, has no use for
UNUSED = ("libtorrent", "p2p", "asyncio", "http.client", "ssl", "email", "obstore", "huggingface_hub", "numpy",
          "prometheus_client", "tiering.sources.oci", "tiering.sources.s3", "tiering.sources.hf", "weightd.client")


def imported(args: list[str], env: dict[str, str]) -> list[str]:
    """Run ``weightd ARGS`` (it must succeed) and name the modules of :data:`UNUSED` it imported."""
    code = ("import sys; from weightd.cli import main; rc = main(sys.argv[1:]); "
            f"print(sorted({{m for m in sys.modules for u in {UNUSED!r} if m == u or m.startswith(u + '.')}}), "
            "file=sys.stderr); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                       env={**env, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    return eval(p.stderr.strip().splitlines()[-1])


def test_in_process_commands_load_no_unused_source_or_transport(node_env, isolated_env, wd, tmp_path: Path) -> None:
    publish(wd, tmp_path)
    env, cfg = dict(isolated_env), str(node_env.config)
    for case in (["--no-daemon", "preload", "org/d@v1", "--tier", "warm", "--lease", "0"],   # from cold
                 ["--no-daemon", "preload", "org/d@v1", "--tier", "warm", "--lease", "0"],   # already there
                 ["--no-daemon", "preload", "org/d@v1", "--tier", "hot", "--lease", "0"],    # from warm
                 ["--no-daemon", "path", "org/d@v1"],
                 ["--no-daemon", "status"],
                 ["--no-daemon", "ls"]):
        assert imported(["--config", cfg, *case], env) == [], case
    assert (node_env.warm / "org/d/v1").is_dir() and (node_env.hot / "org/d/v1").is_dir()


def test_with_p2p_origins_a_preload_still_asks_the_swarm(node_env, isolated_env, wd, tmp_path: Path) -> None:
    """The P2P fetcher is left out only where it could never serve (no [p2p] peers): with origins
    configured, an in-process preload brings it (and libtorrent) as before."""
    publish(wd, tmp_path)
    node_env.config.write_text(node_env.config.read_text().replace(
        '[p2p]\n', '[p2p]\npeers = ["127.0.0.1:9"]\nthreshold = "1GiB"\n'))
    env, cfg = dict(isolated_env), str(node_env.config)
    got = imported(["--config", cfg, "--no-daemon", "preload", "org/d@v1", "--tier", "warm", "--lease", "0"], env)
    assert {"p2p", "p2p.fetch", "libtorrent"} <= set(got), got
    # ... and the queries never do
    assert imported(["--config", cfg, "--no-daemon", "status"], env) == []


def test_in_process_path_and_status_without_click_say_what_click_says(node_env, isolated_env, wd,
                                                                      tmp_path: Path) -> None:
    """``--no-daemon path`` and ``status`` are answered by weightd.cli.fast without click: the same
    stdout, stderr and exit code as the click commands (``WEIGHTD_NO_FAST_PATH=1``), and no click."""
    import json

    from .test_fast_path import run
    publish(wd, tmp_path)
    assert wd("--no-daemon", "preload", "org/d@v1", "--tier", "hot").returncode == 0
    env, cfg = dict(isolated_env), str(node_env.config)
    for case in (["path", "org/d@v1"], ["path", "org/d@v1", "--json"], ["path", "org/d"], ["path", "org/d@v9"],
                 ["path", "org/nope@v1"], ["path", "bad name"], ["-q", "path", "org/d@v1"], ["status", "--json"],
                 ["status", "-o", "json"], ["status", "--output=wide"], ["-q", "status"], ["status"],
                 ["status", "--json", "-o", "table"]):
        args = ["--config", cfg, "--no-daemon", *case]
        fast, slow = run(args, env, tmp_path, True), run(args, env, tmp_path, False)
        if "status" in case and ("--json" in case or case[-1] == "json"):   # (residency and ages may move)
            f, s = json.loads(fast[1]), json.loads(slow[1])
            assert f.keys() == s.keys() and f["answered_by"] == s["answered_by"] == "in-process", case
            assert [c["name"] for c in f["checkpoints"]] == [c["name"] for c in s["checkpoints"]]
            assert fast[2] == slow[2]
        elif "status" in case:
            assert fast[0] == slow[0] == 0 and fast[2] == slow[2], case
            assert fast[1].splitlines()[0] == slow[1].splitlines()[0]
            assert len(fast[1].splitlines()) == len(slow[1].splitlines())
        else:
            assert fast == slow, case
    # the node's warnings as click logs them (a copied version whose manifest names another), none with -q
    shutil.copytree(node_env.cold / "org/d/v1", node_env.cold / "org/d/v2")
    for case in (["path", "org/d"], ["-q", "path", "org/d"]):
        args = ["--config", cfg, "--no-daemon", *case]
        fast, slow = run(args, env, tmp_path, True), run(args, env, tmp_path, False)
        assert fast == slow and ("WARNING" in fast[2]) == ("-q" not in case), (case, fast, slow)
    shutil.rmtree(node_env.cold / "org/d/v2")
    assert run(["--config", cfg, "--no-daemon", "path", "org/nope@v1"], env, tmp_path, True)[0] == 3
    assert run(["--config", cfg, "--no-daemon", "path", "bad name"], env, tmp_path, True)[0] == 2
    code = ("import sys; from weightd.cli import main; rc = main(sys.argv[1:]); "
            "print('click' in sys.modules, file=sys.stderr); sys.exit(rc)")
    for case in (["path", "org/d@v1"], ["status"]):
        p = subprocess.run([sys.executable, "-c", code, "--config", cfg, "--no-daemon", *case], capture_output=True,
                           text=True, timeout=60, env={**env, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 0 and p.stderr.strip().splitlines()[-1] == "False", (case, p.stderr)
    # storage not there as configured: the status is shown and the exit code is 2, both ways
    (node_env.config).write_text(node_env.config.read_text().replace(str(node_env.warm), str(tmp_path / "gone/w")))
    fast, slow = (run(["--config", cfg, "--no-daemon", "status"], env, tmp_path, f) for f in (True, False))
    assert fast[0] == slow[0] == 2 and fast[2] == slow[2]
