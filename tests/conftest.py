"""Shared fixtures: isolated environment for the real ``weightd`` subprocess, sample checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment where the embedded default config points into tmp_path (never at ~ or /etc)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIGHTD_", "XDG_"))}
    env.update(HOME=str(home), USER=f"wdtest{os.getpid()}", PYTHONPATH=str(ROOT))
    for k in ("WEIGHTD_CONFIG",):
        monkeypatch.delenv(k, raising=False)
    return env


class Weightd:
    """Runs the real ``weightd`` entry point in a subprocess, bounded in time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, timeout: float = 120, input: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "weightd", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env={**self.env, **(env or {})}, input=input,
                              cwd=ROOT)


@pytest.fixture
def weightd(isolated_env: dict[str, str]) -> Weightd:
    return Weightd(isolated_env)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A small 3-shard HF-style checkpoint (~6 MiB)."""
    return make_checkpoint(tmp_path / "ckpt", total_bytes=6 << 20, shards=3, layers=3, seed="v1")


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) <= 2, err
    for n in needles:
        assert n in err, (n, err)
