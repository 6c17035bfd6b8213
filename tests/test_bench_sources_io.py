"""bench/sources_io.py's own logic, quickly (the benchmark itself is run by hand: it wants root, a memory
cgroup and minutes on an idle machine): its argument errors, the per-process I/O it reads, its byte
ratios against the checkpoint, and its refusal of a run that did not come from the source it is named for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import _iocount  # noqa: E402
import sources_io  # noqa: E402


@pytest.mark.parametrize("args, says", [
    (["--size", "64MiB", "--memory", "64MiB"], "--memory (64.0 MiB) must be smaller than --size"),
    (["--sources", "cold,nfs"], "unknown source 'nfs'"),
    (["--rounds", "0"], "--rounds: give at least 1"),
    (["--changed", "0.9"], "--changed"),
    (["--size", "lots"], "argument --size"),
    (["--timeout", "-1"], "--timeout"),
])
def test_a_bad_argument_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "bench/sources_io.py"), *args], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], p.stderr


def test_arguments_parse_to_the_sources_asked() -> None:
    a = sources_io.parse_args(["--size", "512MiB", "--memory", "128MiB", "--sources", "s3, p2p"])
    assert (a.size, a.memory, a.sources, a.rounds) == (512 << 20, 128 << 20, ["s3", "p2p"], 3)


def test_proc_io_counts_this_process_writing_to_disk(tmp_path: Path) -> None:
    start = _iocount.proc_io("self")
    with open(tmp_path / "f", "wb") as fh:
        fh.write(os.urandom(1 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    read, written = _iocount.io_since("self", start)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if fs == "tmpfs":
        pytest.skip("tmp_path is on tmpfs: no storage I/O to count")
    assert written >= 1 << 20
    assert _iocount.proc_io(2 ** 22 + 7) == (0, 0)   # (no such process)


def test_times_checkpoint_is_the_median_over_the_checkpoint_with_the_per_round_range() -> None:
    row = _iocount.times_checkpoint([100, 125, 110], 100, "delta device reads", target_at_most=1.1)
    assert row == {"of": "delta device reads", "vs": "checkpoint", "rounds": 3, "per_round_min": 1.0,
                   "per_round_max": 1.25, "ratio": 1.1, "target_at_most": 1.1, "met": True}
    assert _iocount.times_checkpoint([0, 300], 100, "x", target_at_most=1.05)["met"] is False


def test_targets_follow_what_must_come_from_the_disk() -> None:
    run = type("R", (), {"read_bytes": 0, "written_bytes": 100})()
    rows = {r["of"]: r for s in ("cold", "s3") for r in sources_io.byte_ratios(
        s, [{"run": run, "process_read": 0, "process_written": 100}], 100)}
    assert rows["cold device reads"]["target_at_most"] == 1.1 and rows["cold device reads"]["met"] is True
    assert rows["s3 device reads"]["target_at_most"] == sources_io.FLOOR_X
    assert rows["s3 device writes"]["target_at_most"] == 1.05 and rows["s3 device writes"]["ratio"] == 1.0


def test_a_run_that_did_not_use_its_source_is_refused() -> None:
    total = 1000
    sources_io.check_sources("cold", {"bytes_by_source": {"cold": total, "local_reuse": 0}}, total)
    sources_io.check_sources("delta", {"bytes_by_source": {"cold": 100, "local_reuse": 900}}, total)
    sources_io.check_sources("p2p", {"bytes_by_source": {"origin": 600, "peer": 400, "cold": 0}}, total)
    with pytest.raises(SystemExit, match="delta"):   # (no donor: a full copy, not a delta build)
        sources_io.check_sources("delta", {"bytes_by_source": {"cold": total, "local_reuse": 0}}, total)
    with pytest.raises(SystemExit, match="p2p"):     # (read from the shared cold path instead of the swarm)
        sources_io.check_sources("p2p", {"bytes_by_source": {"cold": total, "origin": 0, "peer": 0}}, total)
    with pytest.raises(SystemExit, match="cold"):    # (a copy left over: nothing was copied)
        sources_io.check_sources("cold", {"bytes_by_source": {"cold": 0}}, total)
