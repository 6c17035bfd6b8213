"""Placement hints as Node Feature Discovery labels: a feature file in NFD's ``features.d`` (its
``local`` source reads every file there, one ``name=value`` per line), so a scheduler's node affinity
can prefer nodes that already hold a model, without weightd holding API credentials.

Label names: ``weightd.io/<key>`` where the key is the model name with ``/`` turned into ``.``
(``acme/llama-70b`` -> ``weightd.io/acme.llama-70b``). When that is not a valid label name (characters
outside ``[A-Za-z0-9_.-]``, a first or last character that is not alphanumeric, more than 63
characters), the key is the cleaned name cut to 54 characters, ``-``, and the first 8 hex digits of the
SHA-256 of the full model name, so two names never share a key by accident. Values: ``hot`` (a
complete copy in the hot tier), ``warm`` (in warm and resident in the page cache), ``ready`` (in warm,
read from disk on open). NFD accepts names in a namespace of its own only if allowed: run nfd-master
with ``-extra-label-ns=weightd.io`` (NFD 0.x) or leave the namespace out of ``-deny-label-ns``.

The file carries ``# +expiry-time=`` (RFC 3339): if weightd stops rewriting it, NFD drops the labels
instead of advertising copies that may be gone.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from pathlib import Path
from typing import Callable, Mapping

from ..errors import FeatureFileError

PREFIX = "weightd.io/"
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
RANK = {"hot": 3, "warm": 2, "ready": 1}


def label_key(model: str) -> str:
    plain = model.replace("/", ".")
    if _NAME.fullmatch(plain):
        return plain
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", plain).strip("-_.")[:54].rstrip("-_.")
    digest = hashlib.sha256(model.encode()).hexdigest()[:8]
    return f"{cleaned}-{digest}" if cleaned else digest


def label_name(model: str) -> str:
    return PREFIX + label_key(model)


def label_value(tier: str, resident_fraction: float, *, resident_min: float = 0.9) -> str:
    if tier == "hot":
        return "hot"
    return "warm" if resident_fraction >= resident_min else "ready"


def best_values(rows: list[tuple[str, str]]) -> dict[str, str]:
    """(model, value) rows -> the best value per model (hot > warm > ready)."""
    best: dict[str, str] = {}
    for model, value in rows:
        if RANK[value] > RANK.get(best.get(model, ""), 0):
            best[model] = value
    return best


def render(holdings: Mapping[str, str], *, expiry_s: float | None = None,
           clock: Callable[[], float] = time.time) -> str:
    """The feature file's text: a header, the expiry directive, one ``name=value`` per model, sorted."""
    now = clock()
    lines = [f"# written by weightd at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}: what this node "
             "holds (README \"Intent\")"]
    if expiry_s is not None:
        lines.append(f"# +expiry-time={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now + expiry_s))}")
    lines += [f"{label_name(m)}={v}" for m, v in sorted(holdings.items())]
    return "\n".join(lines) + "\n"


def _body(text: str) -> str:
    """The labels without the header lines whose time changes every round."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("# written by"))


def write_features(directory: Path, filename: str, text: str, *, refresh_s: float | None = None) -> bool:
    """Replace ``directory/filename`` with ``text`` atomically, by descriptor: the directory opened
    without following a symlink, a new temporary name created beside it (O_EXCL|O_NOFOLLOW), fsynced,
    renamed over the old name (a symlink planted there is replaced, never written through). False
    when the labels are unchanged and the file is younger than ``refresh_s`` (its expiry still ahead)."""
    if "/" in filename or filename in ("", ".", ".."):
        raise FeatureFileError(f"nfd feature file name {filename!r}: a plain file name")
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise FeatureFileError(f"[intent] nfd_dir {directory}: {exc.strerror}"
                               + (" (a symlink: refused)" if os.path.islink(directory) else "")) from None
    try:
        try:
            fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            try:
                st = os.fstat(fd)
                old = os.read(fd, 1 << 20).decode(errors="replace") if stat.S_ISREG(st.st_mode) else None
            finally:
                os.close(fd)
            young = refresh_s is None or time.time() - st.st_mtime < refresh_s
            if old is not None and _body(old) == _body(text) and young:
                return False
        except OSError:
            pass   # (absent, or a symlink: replaced below)
        tmp = f".{filename}.{os.getpid()}.tmp"
        try:
            os.unlink(tmp, dir_fd=dfd)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, filename, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
        return True
    except OSError as exc:
        raise FeatureFileError(f"[intent] nfd_dir {directory}/{filename}: {exc.strerror}") from None
    finally:
        os.close(dfd)
