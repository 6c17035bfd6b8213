"""The files of a request: regular files named or beneath named directories, in the order a loader
reads them (config and tokenizer first, then shards in index order), hard links once."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class FileRef:
    path: str
    size: int
    writable: bool  # mincore is reliable only for files the caller could write


@dataclass(slots=True)
class Skipped:
    path: str
    reason: str


def loader_order(directory: Path, files: list[Path]) -> list[Path]:
    """Small non-weight files first (a loader reads config and tokenizer first), then safetensors
    shards in index order, then the rest."""
    index_order: dict[str, int] = {}
    for idx in sorted(directory.glob("*.safetensors.index.json")):
        try:
            wm = json.loads(idx.read_text()).get("weight_map", {})
            for shard in dict.fromkeys(wm.values()):  # (a shard per name of ~90,000 tensors: each once)
                index_order.setdefault(str(idx.parent / shard), len(index_order))
        except (OSError, ValueError, AttributeError, TypeError, RecursionError):  # (an index written by anyone)
            continue

    def key(p: Path) -> tuple[int, int, str]:
        s = str(p)
        if p.name.endswith(".safetensors"):
            return (1, index_order.get(s, len(index_order)), s)
        if p.suffix in (".json", ".txt", ".model", ".tiktoken", ".jinja"):
            return (0, 0, s)
        return (2, 0, s)
    return sorted(files, key=key)


def collect_files(paths: Iterable[str | os.PathLike[str]], *, ordered: bool = True) -> tuple[list[FileRef], list[Skipped]]:
    """Regular files named or under the named directories (symlinks followed, hard links once), a
    directory's in the order a loader reads them unless not ``ordered`` (a count of resident bytes needs
    no order, and the order reads the shard index: 5 MB of JSON for a 90,000-tensor checkpoint)."""
    out: list[FileRef] = []
    skipped: list[Skipped] = []
    seen: set[tuple[int, int]] = set()

    def add(p: Path) -> None:
        try:
            st = p.stat()
        except FileNotFoundError:
            skipped.append(Skipped(str(p), "no such file or directory"))
            return
        except OSError as exc:
            skipped.append(Skipped(str(p), exc.strerror or str(exc)))
            return
        if stat.S_ISDIR(st.st_mode):
            try:
                children = [c for c in p.rglob("*") if ".weightd" not in c.relative_to(p).parts]
            except OSError as exc:
                skipped.append(Skipped(str(p), exc.strerror or str(exc)))
                return
            files = []
            for c in children:
                try:
                    if c.is_dir():
                        if not os.access(c, os.R_OK | os.X_OK):
                            skipped.append(Skipped(str(c), "permission denied"))
                        continue
                except OSError:
                    continue
                files.append(c)
            for c in loader_order(p, files) if ordered else files:
                add(c)
            return
        if not stat.S_ISREG(st.st_mode):
            skipped.append(Skipped(str(p), "not a regular file (FIFO, socket or device)"))
            return
        if (st.st_dev, st.st_ino) in seen:
            return
        seen.add((st.st_dev, st.st_ino))
        if not os.access(p, os.R_OK):
            skipped.append(Skipped(str(p), "permission denied"))
            return
        out.append(FileRef(str(p), st.st_size, os.access(p, os.W_OK) or st.st_uid == os.geteuid()))

    for p in paths:
        add(Path(p))
    return out, skipped
