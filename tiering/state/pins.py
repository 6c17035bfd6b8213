"""``pins.json``: where pins survive a rebuild of the database. Read without following a symlink,
bounded in size, validated; written as a unique temporary file, fsync, rename, fsync of the directory."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import stat
from pathlib import Path

from ..content.names import validate_name, validate_version
from ..errors import InvalidName
from ..safefs import Dir

log = logging.getLogger("tiering.state")
PINS_NAME = "pins.json"
PINS_MAX_BYTES = 16 << 20  # a pins.json larger than this is not ours


def read_pins_file(state_dir: Path, *, quiet: bool = False) -> list[tuple[str, str, float]] | None:
    """Pins from ``pins.json``; None if it is missing or invalid (warned about unless quiet)."""
    try:
        dfd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(PINS_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not quiet:
            log.warning("ignoring %s: %s", state_dir / PINS_NAME,
                        "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror)
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ValueError("not a regular file")
            if st.st_size > PINS_MAX_BYTES:
                raise ValueError(f"larger than {PINS_MAX_BYTES} bytes")
            return parse_pins(f.read(PINS_MAX_BYTES + 1))
    except (ValueError, OSError, InvalidName) as exc:
        if not quiet:
            log.warning("ignoring invalid %s: %s", state_dir / PINS_NAME, exc)
        return None


def write_pins_file(state_dir: Path, rows: list[tuple[str, str, float]]) -> None:
    """Rewrite ``pins.json`` with ``rows`` (name, version, created_at): temp file, fsync, rename, fsync
    the directory."""
    pins = [{"name": n, "version": v, "created_at": c} for n, v, c in rows]
    data = (json.dumps({"format": 1, "pins": pins}, indent=1) + "\n").encode()
    with Dir(os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), Path(state_dir)) as d:
        d.write_atomic(PINS_NAME, data, 0o600)


def parse_pins(raw: bytes) -> list[tuple[str, str, float]]:
    """Validate ``pins.json`` (ValueError / InvalidName if it is not what :func:`write_pins_file` writes)."""
    doc = json.loads(raw.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(doc.get("pins"), list):
        raise ValueError('expected {"format": 1, "pins": [...]}')
    out = []
    for p in doc["pins"]:
        if not isinstance(p, dict):
            raise ValueError("a pin is not an object")
        created = p.get("created_at")
        if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
            raise ValueError(f"bad created_at {created!r}")
        out.append((validate_name(p.get("name")), validate_version(p.get("version")), float(created)))
    return out
