"""``weightd bench disk``: what a serving process feels from a tier's device, recorded as a baseline.

4 KiB random reads with O_DIRECT (the page cache would measure memory) at several queue depths, one
synchronous reader per depth slot (like fio's psync engine with numjobs = depth), reported as p50/p99
latency and IOPS; and sequential 16 MiB O_DIRECT reads (what loading a shard looks like) as
throughput. The result is stored per device under the state dir; ``weightd doctor`` compares its
short probe against it.
"""

from __future__ import annotations

import array
import json
import mmap
import multiprocessing
import os
import stat
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import BenchError

__all__ = ["BenchError", "bench_disk", "probe", "save_baseline"]

BLOCK = 4096
SEQ_BLOCK = 16 << 20
BASELINE_FILE = "disk-baseline.json"


def _device_of(path: Path) -> str:
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def _open_direct(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as exc:
        raise BenchError(f"{path}: cannot open with O_DIRECT ({exc.strerror}); tmpfs and some network "
                         "file systems do not support direct I/O") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device is never read (nor waited on)
        os.close(fd)
        raise BenchError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return fd


def make_test_file(directory: Path, size: int) -> Path:
    """A file of ``size`` bytes of incompressible data in ``directory``, on disk (fsync'd)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".weightd-bench-disk-", dir=directory)
    except OSError as exc:
        raise BenchError(f"{directory}: cannot create a test file ({exc.strerror})") from None
    try:
        chunk = random.Random(7).randbytes(1 << 20)
        done = 0
        while done < size:
            n = min(len(chunk), size - done)
            os.write(fd, chunk[:n])
            done += n
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        os.close(fd)
        os.unlink(name)
        raise BenchError(f"{directory}: cannot write a {size >> 20} MiB test file ({exc.strerror})") from None
    os.close(fd)
    return Path(name)


def _reader(path: str, blocks: int, seed: int, stop_at: float, max_reads: int | None) -> list[int]:
    """One synchronous O_DIRECT 4 KiB random reader; latencies in ns."""
    fd = _open_direct(Path(path))
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT requires
    rnd = random.Random(seed)
    out: list[int] = []
    perf, mono, pread = time.perf_counter_ns, time.monotonic, os.preadv
    try:
        while mono() < stop_at and (max_reads is None or len(out) < max_reads):
            off = rnd.randrange(blocks) * BLOCK
            t0 = perf()
            n = pread(fd, [buf], off)
            out.append(perf() - t0)
            if n != BLOCK:
                raise BenchError(f"{path}: short read at {off}")
    finally:
        buf.close()
        os.close(fd)
    return out


def _child(conn: Any, *args: Any) -> None:
    try:
        conn.send(("ok", array.array("Q", _reader(*args)).tobytes()))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        conn.send(("error", str(exc)))
    finally:
        conn.close()


def random_reads(path: Path, *, depth: int = 1, seconds: float = 2.0, max_reads: int | None = None) -> dict[str, Any]:
    """4 KiB O_DIRECT random reads, ``depth`` synchronous readers at once. Above depth 1 each reader is
    a process of its own (like fio's numjobs): threads would queue on the interpreter lock and
    measure it instead of the device."""
    size = os.path.getsize(path)
    blocks = size // BLOCK
    if blocks < 2:
        raise BenchError(f"{path}: too small for a random-read test ({size} bytes)")
    os.close(_open_direct(path))  # a clear error before any reader starts
    per = None if max_reads is None else max(1, max_reads // depth)
    t0 = time.monotonic()
    stop_at = t0 + seconds
    if depth == 1:
        allv = _reader(str(path), blocks, 0, stop_at, per)
    else:
        ctx = multiprocessing.get_context("fork")
        pipes, procs = [], []
        for i in range(depth):
            parent, child = ctx.Pipe(duplex=False)
            pr = ctx.Process(target=_child, args=(child, str(path), blocks, i, stop_at, per), daemon=True)
            pr.start()
            child.close()
            pipes.append(parent)
            procs.append(pr)
        allv, errors = [], []
        for conn in pipes:
            try:
                kind, payload = conn.recv()
            except EOFError:
                kind, payload = "error", "a reader died"
            if kind == "ok":
                allv.extend(array.array("Q", payload))
            else:
                errors.append(payload)
        for pr in procs:
            pr.join(timeout=10)
        if errors:
            raise BenchError(f"{path}: {errors[0]}")
    elapsed = time.monotonic() - t0
    allv.sort()
    if not allv:
        raise BenchError(f"{path}: no read completed")

    def pct(p: float) -> float:
        return round(allv[min(len(allv) - 1, int(p * len(allv)))] / 1000, 1)

    return {"depth": depth, "reads": len(allv), "iops": round(len(allv) / elapsed),
            "p50_us": pct(0.50), "p99_us": pct(0.99), "mean_us": round(statistics.fmean(allv) / 1000, 1)}


def sequential_read(path: Path) -> dict[str, Any]:
    size = os.path.getsize(path) // BLOCK * BLOCK
    fd = _open_direct(path)
    buf = mmap.mmap(-1, SEQ_BLOCK)
    try:
        t0 = time.perf_counter()
        off = 0
        while off < size:
            view = memoryview(buf)[:min(SEQ_BLOCK, size - off)]
            n = os.preadv(fd, [view], off)
            view.release()
            if n <= 0:
                break
            off += n
        dt = time.perf_counter() - t0
    finally:
        buf.close()
        os.close(fd)
    return {"bytes": off, "seconds": round(dt, 3), "bytes_per_s": round(off / dt) if dt else None}


def bench_disk(target: Path, *, size: int = 256 << 20, seconds: float = 2.0,
               depths: tuple[int, ...] = (1, 4, 16)) -> dict[str, Any]:
    """Benchmark the device under ``target`` (a directory: a test file is made and removed; a file:
    read only)."""
    if not target.exists():
        raise BenchError(f"{target}: no such file or directory")
    made = None
    path = target
    if target.is_dir():
        made = path = make_test_file(target, size)
    try:
        device, file_bytes = _device_of(path), os.path.getsize(path)
        rnd = {str(d): random_reads(path, depth=d, seconds=seconds) for d in depths}
        seq = sequential_read(path)
    finally:
        if made is not None:
            made.unlink(missing_ok=True)
    return {"path": str(target), "file": None if made else str(path), "device": device, "file_bytes": file_bytes,
            "randread_4k": rnd, "seqread_16m": seq,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def save_baseline(state_dir: Path, result: dict[str, Any]) -> Path:
    path = state_dir / BASELINE_FILE
    data = load_baselines(state_dir)
    data[result["device"]] = result
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path


def load_baselines(state_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((state_dir / BASELINE_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def probe(tier_path: Path, state_dir: Path, *, reads: int = 300) -> dict[str, Any] | None:
    """A short QD1 probe of the tier's device: the largest file in the tier, else a small test file
    (in the tier, or in its nearest existing parent while the tier does not exist yet)."""
    from tiering import TieringError  # (tiering is imported lazily by the CLI)
    from tiering import existing_ancestor, list_versions
    from tiering import open_tier_root
    try:
        root = open_tier_root(tier_path, create=False)  # a root weightd would refuse is not probed either
    except TieringError:
        return None
    exists = root is not None
    if not exists:
        tier_path = Path(existing_ancestor(tier_path))
    if not os.access(tier_path, os.W_OK):
        return None
    best, best_size = None, 0
    if root is not None:
        with root:
            for v in list_versions(root):  # the largest file a version holds (by its manifest)
                for f in v.manifest.files:
                    st = root.lstat(f"{v.rel}/{f.path}")
                    if f.path.endswith(".safetensors") and st is not None and stat.S_ISREG(st.st_mode) \
                            and st.st_size > best_size:
                        best, best_size = v.path / f.path, st.st_size
    made = None
    try:
        if best is None or best_size < (16 << 20):
            made = best = make_test_file(tier_path, 64 << 20)
        r = random_reads(best, depth=1, seconds=2.0, max_reads=reads)
    except BenchError:
        return None
    finally:
        if made is not None:
            made.unlink(missing_ok=True)
    base = load_baselines(state_dir).get(_device_of(tier_path))
    return {"file": str(best) if made is None else None, "device": _device_of(tier_path), "p50_us": r["p50_us"],
            "p99_us": r["p99_us"], "baseline_p50_us": base["randread_4k"]["1"]["p50_us"] if base else None}
