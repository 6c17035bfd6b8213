"""A companion artefact into the directory its engine reads (``preload --with KIND --key K --companion-dir DIR``).

Run by the CLI as its caller, never by the daemon: the daemon places the companion, verified, in a
tier; the caller's own process copies it to a directory the caller names, with the caller's rights
(a privileged daemon never writes where a caller points it). Each file is written to a temporary
name beside its target and renamed, so an engine starting meanwhile never reads half a file; what is
already there with the same size and content is left alone; other files in DIR are not touched
(a compile cache is shared by every model the engine compiles).
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from typing import Any

from .errors import InvalidRequest

META = ".weightd"


def install(src: str, dest: str) -> dict[str, Any]:
    """Copy the tree at ``src`` (a tier copy) into ``dest``; returns {dir, files, copied, unchanged}."""
    dest = os.path.abspath(os.path.expanduser(dest))
    try:
        os.makedirs(dest, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest("companion_dir", f"--companion-dir {dest}: {exc.strerror}") from None
    files = copied = unchanged = 0
    for top, dirs, names in os.walk(src):
        rel = os.path.relpath(top, src)
        if rel == META or rel.startswith(META + os.sep):
            continue
        dirs[:] = [d for d in dirs if not (rel == "." and d == META)]
        out = dest if rel == "." else os.path.join(dest, rel)
        os.makedirs(out, exist_ok=True)
        for n in names:
            s, d = os.path.join(top, n), os.path.join(out, n)
            st = os.lstat(s)
            if not stat.S_ISREG(st.st_mode):
                continue
            files += 1
            try:
                dt = os.lstat(d)
            except FileNotFoundError:
                dt = None
            if dt is not None and stat.S_ISREG(dt.st_mode) and dt.st_size == st.st_size and _same(s, d):
                unchanged += 1
                continue
            tmp = os.path.join(out, f".{n}.{uuid.uuid4().hex[:8]}.weightd-tmp")
            try:
                shutil.copyfile(s, tmp)
                os.chmod(tmp, stat.S_IMODE(st.st_mode) | 0o600)
                os.replace(tmp, d)
            except OSError as exc:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise InvalidRequest("companion_dir", f"--companion-dir {dest}: {d}: {exc.strerror}") from None
            copied += 1
    return {"dir": dest, "files": files, "copied": copied, "unchanged": unchanged}


def _same(a: str, b: str, block: int = 1 << 20) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(block), fb.read(block)
            if x != y:
                return False
            if not x:
                return True
