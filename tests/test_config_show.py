"""What the operator sees of the configuration (issue 31 item 7): ``config show`` in binary units with
where each value came from (``--json``: raw values), and the daemon's start-up line naming weightd's
version and its config source. Through the real ``weightd`` subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from weightd import __version__

from .conftest import ROOT, stop_process
from .test_daemon import free_port

GiB = 1 << 30


def _config(node_env) -> Path:
    """The node's config, with one size set in the file and the warm tier's path left to the default."""
    text = node_env.config.read_text()
    text = text.replace(f'[tiers.warm]\npath = "{node_env.warm}"\n', "[tiers.warm]\n")
    node_env.config.write_text(text.replace('[p2p]\n', '[p2p]\nthreshold = "20GiB"\n'))
    return node_env.config


def test_config_show_gives_units_and_where_each_value_came_from(weightd, node_env, tmp_path: Path) -> None:
    cfg = _config(node_env)
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}
    r = weightd("--config", cfg, "config", "show", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"# source: {cfg} (--config)"
    assert f'threshold = "20.0 GiB"  # {cfg}' in lines                      # set in the file, in binary units
    assert 'part_size = "16.0 MiB"  # default' in lines                       # a default size
    assert "upload_limit = 1000000000  # 953.7 MiB; default" in lines      # not a whole unit: exact
    assert f'capacity = "256.0 MiB"  # {cfg}' in lines
    warm = lines[lines.index("[tiers.warm]") + 1]
    assert warm == f'path = "{tmp_path}/xdg-cache/weightd"  # environment ($XDG_CACHE_HOME)', warm
    assert "high_watermark = 0.95  # default" in lines
    # what it prints reads back as the same configuration (its sizes as written)
    again = tmp_path / "again.toml"
    again.write_text(r.stdout)
    j1 = json.loads(weightd("--config", cfg, "config", "show", "--json", env=env).stdout)
    j2 = json.loads(weightd("--config", again, "config", "show", "--json", env=env).stdout)
    assert j2["config"]["p2p"]["threshold"] == j1["config"]["p2p"]["threshold"] == 20 * GiB
    assert j2["config"] == j1["config"]
    # --json: raw values, and the source of every key
    assert j1["config"]["tiers"]["hot"]["capacity"] == 256 << 20 and j1["config"]["p2p"]["upload_limit"] == 10 ** 9
    src = j1["sources"]
    assert src["p2p.threshold"] == str(cfg) and src["p2p.upload_limit"] == "default"
    assert src["tiers.warm.path"] == "environment ($XDG_CACHE_HOME)" and src["tiers.hot.path"] == str(cfg)
    assert set(src) >= {"state_dir", "api.socket", "tiers.cold.bandwidth", "warm.bandwidth"}
    # $WEIGHTD_CONFIG is named as what chose the file
    r = weightd("config", "show", env={**env, "WEIGHTD_CONFIG": str(cfg)})
    assert r.returncode == 0 and r.stdout.splitlines()[0] == f"# source: {cfg} ($WEIGHTD_CONFIG)", r.stdout[:200]


def _serve_until_ready(env: dict[str, str], args: list[str], log: Path) -> str:
    """Start ``weightd serve``, wait (bounded) for its "serving" line, stop it; the line."""
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "weightd", *args, "serve"], env=env, cwd=ROOT,
                                stdout=fh, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                found = [ln for ln in log.read_text().splitlines() if " serving role=" in ln]
                if found:
                    return found[0]
                time.sleep(0.1)
            raise AssertionError(f"no serving line (exit {proc.poll()}): {log.read_text()[-2000:]}")
        finally:
            stop_process(proc)


def test_the_start_up_line_names_the_version_and_the_config(isolated_env, node_env, tmp_path: Path) -> None:
    cfg = node_env.config
    cfg.write_text(cfg.read_text() + f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n')
    line = _serve_until_ready(isolated_env, ["--config", str(cfg)], tmp_path / "a.log")
    assert f"version={__version__} config={cfg} (--config) " in line, line
    line = _serve_until_ready({**isolated_env, "WEIGHTD_CONFIG": str(cfg)}, [], tmp_path / "b.log")
    assert f"version={__version__} config={cfg} ($WEIGHTD_CONFIG) " in line, line
