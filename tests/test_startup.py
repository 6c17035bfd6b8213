"""What an in-process command (``--no-daemon``) loads before it does its work: the start of ``path``,
``status`` and a ``preload`` (of a version in cold storage into warm, and of one already there) is
the tier code and click, never the code of a source or transport the command does not use (issue 35:
the registry's client, the object store's, asyncio, http.client, libtorrent cost ~0.1 s of each
start). Each command runs in a real interpreter through the console script's ``main``, and the
modules it imported are named from its ``sys.modules``."""

from __future__ import annotations

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
