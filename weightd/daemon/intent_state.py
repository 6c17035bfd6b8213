"""What the intent runner keeps in the state directory across restarts: the load history the
forecaster learns from (``intent-loads.json``) and the ledger of the pins intent made
(``intent-pins.json``: intent unpins only what it pinned). Each is written atomically, mode 0600; a
damaged file is said once and started afresh (history) or left alone (pins).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ..intent.forecast import Forecaster

log = logging.getLogger(__name__)
HISTORY_FILE = "intent-loads.json"
PINS_FILE = "intent-pins.json"


def load_history(path: Path) -> Forecaster:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Forecaster()
    except OSError as exc:
        log.warning("intent: load history %s not read (%s); starting a new one", path, exc.strerror)
        return Forecaster()
    try:
        return Forecaster.from_json(json.loads(raw))
    except (ValueError, RecursionError) as exc:
        log.warning("intent: load history %s is damaged (%s); starting a new one", path, exc)
        return Forecaster()


def save_history(path: Path, forecaster: Forecaster) -> None:
    write_json(path, forecaster.to_json())


def load_pins(path: Path) -> set[tuple[str, str]]:
    try:
        data = json.loads(path.read_bytes())
        return {(str(n), str(v)) for n, v in data["pins"]}
    except FileNotFoundError:
        return set()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("intent: %s is damaged (%s): pins intent made are left as they are", path, exc)
        return set()


def save_pins(path: Path, pins: set[tuple[str, str]]) -> None:
    write_json(path, {"pins": sorted(pins)})


def write_json(path: Path, doc: Any) -> None:
    """Atomically (``tiering.Dir.write_atomic``: a unique O_EXCL temporary, fsync, rename), mode 0600,
    in the state directory opened without following a symlink."""
    from tiering import Dir
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    d = Dir(fd, path.parent)
    try:
        d.write_atomic(path.name, json.dumps(doc, separators=(",", ":")).encode(), 0o600)
    finally:
        d.close()
