"""The page-cache engine against the real kernel: residency agrees with fincore/vmtouch, warming
fills the cache without SIGBUS, bandwidth caps and await back-off, mlock, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiering import pagecache as pc
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
# This VM's kernel reclaims idle page cache on its own (kdamond), so residency is compared within
# moments of each measurement and "fully resident" means at least 97%.
FULL = 97.0


def big_file(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        for _ in range(size // MiB):
            fh.write(os.urandom(MiB))
    return path


def fincore_bytes(path: Path) -> int:
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def vmtouch_pages(path: Path) -> int:
    out = subprocess.run(["vmtouch", str(path)], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"Resident Pages: (\d+)/", out).group(1))


@pytest.mark.skipif(not shutil.which("fincore") or not shutil.which("vmtouch"), reason="fincore/vmtouch missing (make tools)")
@pytest.mark.parametrize("method", ["cachestat", "mincore"])
def test_residency_agrees_with_fincore_and_vmtouch(tmp_path: Path, method: str) -> None:
    f = big_file(tmp_path / "f.bin", 64 * MiB)
    pc.drop_from_cache(f)
    with open(f, "rb") as fh:  # bring about the first 40% in
        fh.read(26 * MiB)
    for _ in range(3):  # the cache decays on its own: bracket the external tools between our readings
        before = pc.residency([f], method=method).resident_bytes
        fin = fincore_bytes(f)
        vmt = vmtouch_pages(f) * pc.PAGE
        after = pc.residency([f], method=method).resident_bytes
        lo, hi = min(before, after) - 0.01 * f.stat().st_size, max(before, after) + 0.01 * f.stat().st_size
        if lo <= fin <= hi and lo <= vmt <= hi:
            break
    else:
        pytest.fail(f"weightd {before}..{after}, fincore {fin}, vmtouch {vmt}")
    assert 10 * MiB < before < 60 * MiB  # partly resident (read-ahead may add a few MiB)


def test_warm_then_cool(tmp_path: Path) -> None:
    f = big_file(tmp_path / "w.bin", 48 * MiB)
    pc.drop_from_cache(f)
    assert pc.residency([f]).percent < 50
    r = pc.warm([f])
    assert r.warmed_bytes > 24 * MiB and not r.skipped
    assert pc.residency([f]).percent >= FULL
    again = pc.warm([f])  # already resident: checked first, nothing read again
    assert again.already_resident_bytes >= 0.9 * again.bytes and again.warmed_bytes <= 0.1 * again.bytes
    dropped, skipped = pc.cool([f])
    assert dropped == 48 * MiB and not skipped
    assert pc.residency([f]).percent < 5


@pytest.mark.parametrize("tuning", [dict(window=4 * MiB), dict(hint="willneed"), dict(hint="none"),
                                    dict(precheck=False), dict(probe=False)])
def test_every_tuning_warms_the_whole_file(tmp_path: Path, tuning: dict) -> None:
    """The choices bench/warm.py --explore compares all fill the cache (an odd tail window included)."""
    from tiering.pagecache.warming import Tuning
    f = big_file(tmp_path / "w.bin", 21 * MiB)
    pc.drop_from_cache(f)
    r = pc.warm([f], tuning=Tuning(**tuning))
    assert not r.skipped and r.warmed_bytes + r.already_resident_bytes == 21 * MiB
    assert pc.residency([f]).percent >= FULL


def test_loader_order(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "c", total_bytes=6 * MiB, shards=3, layers=2)
    files, _ = pc.collect_files([ckpt])
    names = [Path(f.path).name for f in files]
    shards = [n for n in names if n.endswith(".safetensors")]
    assert shards == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                      "model-00003-of-00003.safetensors"]
    assert names.index("config.json") < names.index(shards[0])


def test_hard_links_and_symlinks_counted_once(tmp_path: Path) -> None:
    f = big_file(tmp_path / "a.bin", 2 * MiB)
    os.link(f, tmp_path / "b.bin")
    (tmp_path / "c.bin").symlink_to(f)
    files, skipped = pc.collect_files([tmp_path])
    assert len(files) == 1 and not skipped


def test_token_bucket_caps_rate() -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    b = pc.TokenBucket(100, clock=lambda: clock[0], sleep=sleep)
    for _ in range(10):
        b.consume(50)
    assert clock[0] == pytest.approx(4.5)  # 500 bytes at 100 B/s: the first chunk is free
    assert pc.TokenBucket(0).consume(10**12) == 0.0


def test_warm_rate_limit_end_to_end(tmp_path: Path) -> None:
    f = big_file(tmp_path / "r.bin", 64 * MiB)
    pc.drop_from_cache(f)
    r = pc.warm([f], rate_bytes_per_s=64 * MiB)
    # four 16 MiB windows at 64 MiB/s: the first is free, the other three wait 0.25 s each
    assert r.rate_limit == 64 * MiB and r.seconds >= 0.7


def test_backoff_on_slow_random_reads() -> None:
    clock = [0.0]

    def sleep(x: float) -> None:
        clock[0] += x

    probes = iter([20.0, 20.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 30.0])  # 20 ms twice, then 1 ms, then 30 ms
    # 20 ms per request; the device reads 1 GB per interval: far more than warming asks (others read)
    stats = iter([{(8, 0): (1000 + 100 * i, 1000 + 2000 * i, 2_000_000 * i)} for i in range(9)] +
                 [{(8, 0): (1900, 19000, 16_000_000 + 20480)}])  # then only the 10 MB warming read
    mon = pc.AwaitMonitor({(8, 0)}, 5.0, interval_s=1.0, read=lambda: next(stats), probe=lambda: next(probes),
                          floor_bytes_per_s=10 << 20, clock=lambda: clock[0], sleep=sleep)
    MB = 1 << 20
    clock[0] += 1.0
    mon.pause(400 * MB)          # 400 MB/s achieved, probe slow: cap at half of that
    assert mon.backoffs == 1 and mon.rate_cap == 200 * MB and mon.max_probe_ms == 20.0
    assert mon.max_await_ms == pytest.approx(20.0)  # diskstats: 2000 ms over 100 reads
    clock[0] += 1.0
    mon.pause(15 * MB)           # still slow: halve again but never under the floor
    assert mon.rate_cap == 10 * MB and mon.backoff_s > 0
    for _ in range(6):           # fast probes: the cap rises by half each time, then is lifted
        clock[0] += 1.0
        mon.pause(10 * MB)
    assert mon.rate_cap == 0 and mon.backoffs == 2
    clock[0] += 1.0
    mon.pause(10 * MB)           # slow, but the device read no more than warming did: nobody to yield to
    assert mon.rate_cap == 0 and mon.backoffs == 2


def test_probe_measures_real_reads(tmp_path: Path) -> None:
    f = big_file(tmp_path / "p.bin", 4 * MiB)
    probe = pc.LatencyProbe(files=pc.collect_files([f])[0])
    try:
        if not probe.targets:
            pytest.skip("no block device or no O_DIRECT under this tmp directory")
        ms = probe()
        assert ms is not None and 0 < ms < 10_000
    finally:
        probe.close()


def test_diskstats_parses_this_machine() -> None:
    stats = pc.read_diskstats()
    assert stats and all(len(v) == 3 for v in stats.values())


TRUNCATE_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[2])
    from tiering import pagecache as pc
    path = sys.argv[1]
    pc.drop_from_cache(path)
    done = []
    def progress(n):
        if not done:  # after the first window: someone truncates the file
            done.append(1)
            os.truncate(path, pc.WINDOW)
    r = pc.warm([path], concurrency=1, progress=progress)
    print("skipped:", [s.reason for s in r.skipped])
""")


def test_truncated_while_warming_is_not_a_sigbus(tmp_path: Path) -> None:
    f = big_file(tmp_path / "t.bin", 96 * MiB)
    proc = subprocess.run([sys.executable, "-c", TRUNCATE_CHILD, str(f), str(ROOT)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # -7 would be SIGBUS
    assert "truncated" in proc.stdout


# -- CLI -----------------------------------------------------------------------------------------------

def test_cli_warm_residency_cool(weightd, tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "c", total_bytes=24 * MiB, shards=2, layers=2)
    assert weightd("cool", ckpt).returncode == 0
    r = json.loads(weightd("warm", ckpt, "--json").stdout)
    assert r["files"] == len([p for p in ckpt.rglob("*") if p.is_file()]) and not r["skipped"]
    res = json.loads(weightd("residency", ckpt, "--json").stdout)
    assert res["percent"] >= FULL and res["files"][0]["method"] in ("cachestat", "mincore")
    text = weightd("residency", ckpt).stdout
    assert text.strip().splitlines()[-1].startswith("total: ")


def test_cli_bad_input_warns_and_goes_on(weightd, tmp_path: Path) -> None:
    good = big_file(tmp_path / "good.bin", 4 * MiB)
    pc.drop_from_cache(good)
    (tmp_path / "empty.bin").write_bytes(b"")
    proc = weightd("warm", tmp_path / "missing.bin", good, tmp_path / "empty.bin")
    assert proc.returncode == 3, proc.stderr
    assert "missing.bin: no such file" in proc.stderr and "empty file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert pc.residency([good]).percent >= FULL  # the rest was warmed
    os.mkfifo(tmp_path / "fifo")
    assert_one_line_error(weightd("residency", tmp_path / "fifo"), 2, "not a regular file")
    proc = weightd("warm", tmp_path)  # a directory holding a FIFO: the files are warmed, the FIFO reported
    assert proc.returncode == 2 and "fifo: not a regular file" in proc.stderr
    assert_one_line_error(weightd("warm", good, "--rate", "fast"), 2, "--rate")


def test_unreadable_file_is_skipped(weightd, isolated_env, tmp_path: Path) -> None:
    """Mode 0 is unreadable to anyone without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH: as root (CI), weightd
    runs with both dropped from its bounding set, so the file really cannot be opened (the checkout, root's
    own, stays readable by its owner bits). The readable file beside it is still warmed."""
    f = big_file(tmp_path / "secret.bin", MiB)
    f.chmod(0)
    good = big_file(tmp_path / "good.bin", 2 * MiB)
    if os.geteuid() == 0:
        caps = "-dac_override,-dac_read_search"
        proc = subprocess.run(["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", sys.executable, "-m",
                               "weightd", "warm", "--json", str(f), str(good)], env=isolated_env, capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
    else:
        proc = weightd("warm", "--json", f, good)
    assert proc.returncode == 2 and "permission denied" in proc.stderr
    assert json.loads(proc.stdout)["files"] == 1 and f"{f}: permission denied" in proc.stderr, (proc.stdout,
                                                                                                 proc.stderr)


def test_lock_holds_pages_until_terminated(weightd, isolated_env, tmp_path: Path) -> None:
    f = big_file(tmp_path / "l.bin", 16 * MiB)
    p = subprocess.Popen([sys.executable, "-m", "weightd", "warm", "--lock", "--json", str(f)], env=isolated_env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = p.stdout.readline()
        r = json.loads(line)
        assert r["locked_bytes"] == 16 * MiB and r["lock_holder_pid"] == p.pid
        status = Path(f"/proc/{p.pid}/status").read_text()
        vmlck_kb = int(re.search(r"VmLck:\s+(\d+) kB", status).group(1))
        assert vmlck_kb * 1024 >= 16 * MiB
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        assert "locked 16777216 bytes in pid" in p.stderr.read()
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()


@pytest.mark.skipif(not shutil.which("setpriv") or not shutil.which("prlimit"), reason="needs setpriv and prlimit")
def test_lock_explains_low_memlock_limit(isolated_env, tmp_path: Path) -> None:
    f = big_file(tmp_path / "m.bin", 8 * MiB)
    cmd = ["prlimit", "--memlock=65536:65536", "setpriv", "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock",
           sys.executable, "-m", "weightd", "warm", "--lock", str(f)]
    if os.geteuid() != 0:
        cmd = ["prlimit", "--memlock=65536:65536", sys.executable, "-m", "weightd", "warm", "--lock", str(f)]
    proc = subprocess.run(cmd, env=isolated_env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert_one_line_error(proc, 2, "RLIMIT_MEMLOCK", "LimitMEMLOCK=", "--ulimit memlock")


def test_preload_warms_warm_tier_and_status_shows_residency(wd, node_env, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=2, layers=2)
    assert wd("publish", src, "--name", "org/pc", "--version", "v1").returncode == 0
    r = json.loads(wd("preload", "org/pc@v1", "--tier", "warm", "--json").stdout.splitlines()[0])
    assert r["resident_percent"] >= FULL
    r = json.loads(wd("preload", "org/pc@v1", "--tier", "hot", "--json").stdout.splitlines()[0])
    assert r["resident_percent"] == 100.0  # tmpfs
    st = json.loads(wd("status", "--json").stdout)
    tiers = st["checkpoints"][0]["tiers"]
    assert tiers["hot"]["resident_percent"] == 100.0 and "resident_bytes" in tiers["warm"]
    assert "%" in wd("status").stdout
