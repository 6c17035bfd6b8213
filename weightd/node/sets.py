"""Sets of small checkpoints preloaded as one operation (LoRA adapters, design §15).

A set file lists models, one ``NAME[@VERSION]`` a line (``#`` comments, blank lines), or as TOML
``models = ["org/a@v1", ...]``. It is read by the CLI (as its caller), and the list goes to the
daemon in one request: each model is its own preload (own lock, staging, manifest check), all of
them fanned out at once over the tier's threads, and the outcome is one summary.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ..errors import InvalidRequest

MAX_SET_MODELS = 10_000
MAX_SET_FILE_BYTES = 1 << 20


def read_set_file(path: str) -> list[str]:
    """The refs a set file lists, each checked (InvalidRequest naming the file and line, exit 2)."""
    from tiering import parse_ref
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidRequest("set", f"--set {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidRequest("set", f"--set {path}: not a regular file")
        raw = os.read(fd, MAX_SET_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_SET_FILE_BYTES:
        raise InvalidRequest("set", f"--set {path}: larger than {MAX_SET_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("set", f"--set {path}: not UTF-8 text") from None
    refs: list[tuple[str, str]] = []
    if path.endswith(".toml"):
        import tomllib
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidRequest("set", f"--set {path}: not valid TOML: {exc}") from None
        models = doc.get("models")
        if set(doc) - {"models"} or not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise InvalidRequest("set", f"--set {path}: expected models = [\"NAME@VERSION\", ...] and nothing else")
        refs = [(f"models[{i}]", m.strip()) for i, m in enumerate(models)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                refs.append((f"line {n}", line))
    out: list[str] = []
    for where, ref in refs:
        try:
            parse_ref(ref)
        except ValueError as exc:
            raise InvalidRequest("set", f"--set {path}: {where}: {exc}") from None
        out.append(ref)
    check_refs(out, f"--set {path}")
    return out


def check_refs(refs: Any, where: str = "refs") -> list[str]:
    """A set's list from a caller: 1 to MAX_SET_MODELS refs, each NAME[@VERSION], none twice."""
    from tiering import parse_ref
    if not isinstance(refs, list) or not refs or len(refs) > MAX_SET_MODELS:
        raise InvalidRequest("refs", f"{where}: expected 1 to {MAX_SET_MODELS} models")
    seen: set[str] = set()
    for r in refs:
        if not isinstance(r, str):
            raise InvalidRequest("refs", f"{where}: every model must be a string NAME[@VERSION]")
        parse_ref(r)
        if r in seen:
            raise InvalidRequest("refs", f"{where}: {r} is listed twice")
        seen.add(r)
    return refs


def summarize(refs: list[str], outcomes: list[Any], seconds: float, tier: str) -> dict[str, Any]:
    """One summary of a set: each model's path or error, and the totals."""
    from ..errors import exit_code_for
    items, failed = [], []
    for ref, o in zip(refs, outcomes):
        if isinstance(o, BaseException):
            failed.append({"ref": ref, "error": str(o)[:500], "exit_code": exit_code_for(o)})
        else:
            items.append({"ref": ref, "name": o["name"], "version": o["version"], "tier": o["tier"],
                          "path": o["path"], "bytes": o["bytes"], "bytes_moved": o["bytes_moved"],
                          "already_present": o["already_present"], "seconds": o["seconds"]})
    return {"models": len(refs), "ready": len(items), "already_present": sum(1 for i in items if i["already_present"]),
            "failed": failed, "tier": tier, "bytes": sum(i["bytes"] for i in items),
            "bytes_moved": sum(i["bytes_moved"] for i in items), "seconds": round(seconds, 4), "items": items}
