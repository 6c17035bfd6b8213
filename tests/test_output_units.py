"""One convention for sizes and rates in every output: binary (KiB, MiB, GiB; MiB/s, GiB/s), as the
docs promise. Every command that prints a size or a rate runs for real on a sample checkpoint, with the
embedded default config in a temporary HOME, and its output must carry no decimal unit (kB, MB, GB, TB,
and per second)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tiering.sample import make_checkpoint

DECIMAL = re.compile(r"\b\d+(?:\.\d+)?\s?[kKMGTP]B(?:/s)?\b")
BINARY = re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)(?:/s)?\b")


def test_no_command_prints_a_decimal_unit(weightd, tmp_path: Path) -> None:
    v1 = make_checkpoint(tmp_path / "v1", total_bytes=6 << 20, shards=3, layers=3, seed="v1")
    v2 = make_checkpoint(tmp_path / "v2", total_bytes=6 << 20, shards=3, layers=3, seed="v2")
    intent = tmp_path / "intent"
    intent.mkdir(mode=0o755)
    (intent / "a.toml").write_text('[[keep]]\nmodel = "t/m@v1"\nbandwidth = "200MB"\n')
    bench = tmp_path / "bench"
    bench.mkdir()
    commands = [   # (args, printed a size or a rate: at least one binary unit expected)
        (["manifest", "build", v1], True),
        (["verify", v1], False),
        (["residency", v1], True),
        (["warm", v1], True),
        (["cool", v1], False),
        (["manifest", "diff", v1, v2], True),
        (["manifest", "diff", v1, v2, "--plan"], True),
        (["publish", v1, "--name", "t/m", "--version", "v1"], True),
        (["preload", "t/m@v1", "--tier", "warm"], True),
        (["status"], True),
        (["config", "show"], True),
        (["intent", "check", intent], True),
        (["bench", "disk", bench, "--size", "8MiB", "--seconds", "0.2", "--depths", "1", "--no-record"], True),
        (["doctor", "--sample-s", "0.2"], True),
    ]
    try:
        for args, sized in commands:
            p = weightd(*args, timeout=120)
            out = p.stdout + p.stderr
            where = " ".join(map(str, args))
            assert p.returncode == 0 or args[0] == "doctor", (where, p.returncode, out)
            assert not DECIMAL.findall(out), (where, DECIMAL.findall(out), out)
            assert not sized or BINARY.search(out), (where, out)
    finally:   # (the embedded default's hot tier)
        shutil.rmtree(f"/dev/shm/weightd-{weightd.env['USER']}", ignore_errors=True)


def test_format_rate_is_binary() -> None:
    from tiering import format_rate
    assert format_rate(26.48e9) == "24.7 GiB/s"
    assert format_rate(300 << 20) == "300.0 MiB/s"
    assert format_rate(512) == "512 B/s"
