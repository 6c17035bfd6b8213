"""Build a manifest from a checkpoint directory, and verify a directory against one."""

from __future__ import annotations

import os
import random
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import ChecksumMismatch, IntegrityError
from ..safefs import Dir
from .hashing import HashJob, ProgressFn, hash_files
from .manifest import (DEFAULT_CHUNK_SIZE, FileEntry, Manifest, SafetensorsInfo,
                       built_manifest, chunk_ranges, tree_hash)
from .safetensors_header import read_header
from .tensor_table import TensorTable
from .scan import ScannedFile, scan_checkpoint


def is_safetensors(relpath: str) -> bool:
    return relpath.endswith(".safetensors")


def plan_size(files: list[ScannedFile]) -> int:
    return sum(f.size for f in files)


def build_manifest(root: "str | os.PathLike[str] | Dir", *, threads: int | None = None,
                   progress: ProgressFn | None = None, chunk_size: int = DEFAULT_CHUNK_SIZE,
                   files: list[ScannedFile] | None = None,
                   known: "Mapping[str, tuple[int, int, int, int, int, str]] | None" = None) -> Manifest:
    """Scan ``root`` and hash every file (safetensors by header + tensors, others by chunks).

    ``known``: relpath -> (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, xxh3-128) of files whose
    bytes were hashed as they were written (:func:`tiering.copy_many.copy_files`): a file that is one
    chunk and is still that very inode, of that size, modification and change time (a write sets the
    change time, and no one can set it back as utimensat sets back the modification time), takes that
    digest instead of being read back; any other is read and hashed."""
    scanned = files if files is not None else scan_checkpoint(root)
    headers = {f.relpath: read_header(f.path) for f in scanned if is_safetensors(f.relpath)}
    jobs, taken = [], {}
    for f in scanned:
        hdr = headers.get(f.relpath)
        k = known.get(f.relpath) if known is not None and hdr is None and f.size <= chunk_size else None
        if k is not None and k[:5] == (f.dev, f.ino, f.size, f.mtime_ns, f.ctime_ns):
            taken[f.relpath] = [k[5]]
            continue
        if hdr is not None:
            ranges = [(0, hdr.header_size), *zip(hdr.begins, hdr.ends)]
        else:
            ranges = chunk_ranges(f.size, chunk_size)
        jobs.append(HashJob(f.path, ranges, f.size, f.mtime_ns))
    hashed = iter(hash_files(jobs, threads=threads, progress=progress))
    digests = [taken[f.relpath] if f.relpath in taken else next(hashed) for f in scanned]

    entries, texts = [], {}
    for f, parts in zip(scanned, digests):
        hdr = headers.get(f.relpath)
        if hdr is not None:
            table, *rendered = TensorTable.built(hdr.names, hdr.dtypes, hdr.shapes, hdr.begins, hdr.ends,
                                                 bytes.fromhex("".join(parts[1:])))
            texts[f.relpath] = (table, *rendered)
            info = SafetensorsInfo(hdr.header_size, parts[0], dict(hdr.metadata), table)
            entries.append(FileEntry(f.relpath, f.size, f.mode, tree_hash(parts), (), info))
        else:
            entries.append(FileEntry(f.relpath, f.size, f.mode, tree_hash(parts), tuple(parts)))
    return built_manifest(tuple(entries), chunk_size, texts)


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    what: str                  # "missing", "unexpected file", "size", or a part label
    expected: str = ""
    actual: str = ""

    def __str__(self) -> str:
        if self.expected or self.actual:
            return f"{self.path}: {self.what}: expected {self.expected}, got {self.actual}"
        return f"{self.path}: {self.what}"


@dataclass(slots=True)
class VerifyReport:
    root: str
    digest: str
    files: int
    bytes_checked: int = 0
    problems: list[Problem] = field(default_factory=list)
    crypto_digests: dict[str, str] = field(default_factory=dict)   # with ``crypto=``: path -> hex

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if not self.problems:
            return
        p = self.problems[0]
        more = f" (and {len(self.problems) - 1} more problem(s))" if len(self.problems) > 1 else ""
        if p.expected and p.actual and p.what not in ("size",):
            err: IntegrityError = ChecksumMismatch(p.path, p.what, p.expected, p.actual)
            err.args = (str(err) + more,)
        else:
            err = IntegrityError(str(p) + more)
        err.report = self  # type: ignore[attr-defined]
        raise err


def verify_checkpoint(root: "str | os.PathLike[str] | Dir", manifest: Manifest, *, threads: int | None = None,
                      progress: ProgressFn | None = None, crypto: Callable[[], Any] | None = None) -> VerifyReport:
    """Re-hash ``root`` against ``manifest``. Returns every problem found, in file order. With ``crypto``
    (a hasher factory such as ``hashlib.sha256``) every file's digest is computed in the same read and
    returned in ``crypto_digests`` (for a signature check)."""
    scanned = {f.relpath: f for f in scan_checkpoint(root)}
    report = VerifyReport(str(root.path) if isinstance(root, Dir) else os.fspath(root), manifest.digest,
                          len(manifest.files))
    jobs: list[HashJob] = []
    checked: list[FileEntry] = []
    for entry in manifest.files:
        f = scanned.pop(entry.path, None)
        if f is None:
            report.problems.append(Problem(entry.path, "missing"))
            continue
        if f.size != entry.size:
            report.problems.append(Problem(entry.path, "size", f"{entry.size} bytes", f"{f.size} bytes"))
            continue
        jobs.append(HashJob(f.path, entry.spans(manifest.chunk_size), f.size, f.mtime_ns))
        checked.append(entry)
    for extra in scanned:
        report.problems.append(Problem(extra, "unexpected file (not in the manifest)"))

    whole: list[str] = []
    digests = hash_files(jobs, threads=threads, progress=progress, crypto=crypto, crypto_out=whole)
    report.crypto_digests = {e.path: d for e, d in zip(checked, whole)}
    for entry, got in zip(checked, digests):
        report.bytes_checked += entry.size
        if entry.part_digests() == got:
            continue
        for part, actual in zip(entry.parts(manifest.chunk_size), got):
            if part.xxh3_128 != actual:
                report.problems.append(Problem(entry.path, part.label, part.xxh3_128 or "", actual))
    order = {e.path: i for i, e in enumerate(manifest.files)}
    report.problems.sort(key=lambda p: order.get(p.path, len(order)))
    return report


def good_parts(root: Dir, manifest: Manifest, only: "dict[str, set[str]] | None" = None, *,
               threads: int | None = None, progress: ProgressFn | None = None) -> dict[str, set[str]]:
    """The parts (labels per file) of ``manifest`` that ``root`` holds intact: what a delta's donors
    put there, or what an interrupted transfer left, so only the rest is fetched. ``only``: check just
    these labels (else every part of every file present at its full size). Files not in the manifest,
    top-level entries no manifest file is under and ``.weightd/`` are removed (a resumed area must
    hold nothing else)."""
    wanted = {e.path: e for e in manifest.files}
    tops = {p.split("/", 1)[0] for p in wanted}
    for name, _ in root.entries():  # a directory (or .weightd/) no manifest file is in: not ours
        if name not in tops:
            root.remove(name)
    scanned = {f.relpath: f for f in scan_checkpoint(root)}
    for extra in sorted(set(scanned) - set(wanted)):
        root.unlink(extra)
    jobs: list[HashJob] = []
    checked: list[tuple[str, list[Any]]] = []
    for entry in manifest.files:
        f = scanned.get(entry.path)
        if f is None or f.size != entry.size:
            continue
        parts = [p for p in entry.parts(manifest.chunk_size) if p.length
                 and (only is None or p.label in only.get(entry.path, ()))]
        if parts:
            jobs.append(HashJob(f.path, [(p.begin, p.end) for p in parts], f.size, None))
            checked.append((entry.path, parts))
    out: dict[str, set[str]] = {}
    for (path, parts), got in zip(checked, hash_files(jobs, threads=threads, progress=progress)):
        ok = {p.label for p, actual in zip(parts, got) if p.xxh3_128 == actual}
        if ok:
            out[path] = ok
    return out


def sample_verify(root: Dir, manifest: Manifest, *, budget_bytes: int = 64 << 20, max_parts: int = 4096,
                  rng: random.Random | None = None) -> VerifyReport:
    """A spot check (``weightd doctor``): every file's presence and size, then random parts of the
    manifest (headers, tensors, chunks) re-hashed, up to ``budget_bytes`` and ``max_parts``. Cheap
    enough for any node; a copy within the budget is read whole (so its check is certain), a larger
    one is caught with a probability that grows with the damage (a truncated one always);
    ``weightd verify`` reads everything."""
    import xxhash
    rng = rng or random.Random()
    report = VerifyReport(str(root.path), manifest.digest, len(manifest.files))
    candidates: list[tuple[FileEntry, Any]] = []
    for entry in manifest.files:
        st = root.lstat(entry.path)
        if st is None or not stat.S_ISREG(st.st_mode):
            report.problems.append(Problem(entry.path, "missing"))
        elif st.st_size != entry.size:
            report.problems.append(Problem(entry.path, "size", f"{entry.size} bytes", f"{st.st_size} bytes"))
        else:
            candidates += [(entry, p) for p in entry.parts(manifest.chunk_size) if p.xxh3_128]
    rng.shuffle(candidates)
    picked, spent = [], 0
    for entry, part in candidates:
        if len(picked) >= max_parts or (picked and spent + part.length > budget_bytes):
            continue
        picked.append((entry, part))
        spent += part.length
    for entry, part in picked:
        fd = root.open_read(entry.path)
        try:
            h, off = xxhash.xxh3_128(), part.begin
            while off < part.end:
                chunk = os.pread(fd, min(8 << 20, part.end - off), off)
                if not chunk:
                    break
                h.update(chunk)
                off += len(chunk)
        finally:
            os.close(fd)
        report.bytes_checked += part.length
        if h.hexdigest() != part.xxh3_128:
            report.problems.append(Problem(entry.path, part.label, part.xxh3_128 or "", h.hexdigest()))
    return report
