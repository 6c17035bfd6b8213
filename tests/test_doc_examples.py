"""The examples in README.md and docs/*.md work when copied: every fenced ``sh`` block marked runnable
is run for real, with the embedded default config in a temporary HOME, against sample checkpoints,
bounded in time. A command that changed or broke fails here.

The marker is an HTML comment on the line just before the fence (invisible when rendered)::

    <!-- runnable: samples=/models/llama-3-8b,v1,v2 skip=vllm,hold -->
    ```sh

``samples=P,...``: each P the block names is a sample checkpoint made beforehand (``weightd sample``'s
generator; an absolute P is made under the temporary directory and the block's text names it there, a
relative one in the block's working directory). ``skip=W,...``: lines whose command is W (or
``weightd W``, also inside ``$(...)``) are not run: a serving engine the example hands a path to, a
command that runs until stopped, or one whose exit status reports on this host (``doctor``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"<!--\s*runnable(?::\s*(.*?))?\s*-->")


def runnable_blocks() -> list[tuple[str, int, dict[str, list[str]], str]]:
    """(file, line of the fence, options, script) of every marked ``sh`` block."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines[:-1]):
            m = MARK.fullmatch(line.strip())
            if not m or lines[i + 1].strip() != "```sh":
                continue
            opts = {k: v.split(",") for k, _, v in (o.partition("=") for o in (m.group(1) or "").split())}
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            out.append((str(path.relative_to(ROOT)), i + 2, opts, "\n".join(lines[i + 2:end])))
    return out


BLOCKS = runnable_blocks()


def test_some_examples_are_marked_runnable() -> None:
    assert any(f == "README.md" for f, *_ in BLOCKS), "README.md's quick start has no <!-- runnable --> block"


def _skipped(line: str, words: list[str]) -> bool:
    cmd = line.strip()
    if m := re.match(r"\w+=\$\((.*)\)", cmd):
        cmd = m.group(1)
    parts = cmd.split()
    return bool(parts) and (parts[0] in words or (parts[0] == "weightd" and len(parts) > 1 and parts[1] in words))


@pytest.mark.parametrize("where,line,opts,script", BLOCKS, ids=[f"{f}:{n}" for f, n, _, _ in BLOCKS])
def test_a_runnable_example_runs(where: str, line: int, opts: dict[str, list[str]], script: str,
                                 isolated_env: dict[str, str], tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i, p in enumerate(x for x in opts.get("samples", []) if x):
        target = tmp_path / "samples" / p.lstrip("/") if p.startswith("/") else work / p
        make_checkpoint(target.resolve(), total_bytes=2 << 20, shards=2, layers=2, seed=f"s{i}")
        if p.startswith("/"):
            script = re.sub(re.escape(p.rstrip("/")) + r"(?=[/\s\"']|$)", str(target), script, flags=re.M)
    skip = [w for w in opts.get("skip", []) if w]
    script = "\n".join("# (skipped) " + ln if _skipped(ln, skip) else ln for ln in script.splitlines())
    env = {**isolated_env, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                              text=True, timeout=180)
    finally:
        shutil.rmtree(f"/dev/shm/weightd-{isolated_env['USER']}", ignore_errors=True)
    assert proc.returncode == 0, f"{where}:{line}: exit {proc.returncode}\n{script}\n--- stdout\n{proc.stdout}" \
                                 f"\n--- stderr\n{proc.stderr}"
