"""NAME / VERSION patterns and safe relative paths (design §3: nothing else ever becomes a path)."""

from __future__ import annotations

import re

from ..errors import InvalidName, UnsafePath

_COMPONENT = r"[A-Za-z0-9._-]+"
NAME_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})?")
VERSION_RE = re.compile(_COMPONENT)
MAX_COMPONENT_LEN = 255


def _check_component(kind: str, value: str, part: str) -> None:
    if part in (".", "..") or set(part) == {"."}:
        raise InvalidName(kind, value, "'.' and '..' are not names")
    if len(part.encode()) > MAX_COMPONENT_LEN:
        raise InvalidName(kind, value, f"longer than {MAX_COMPONENT_LEN} bytes")


def validate_name(name: str) -> str:
    """Return ``name`` if it is ``[A-Za-z0-9._-]+`` with at most one ``/``; raise InvalidName."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidName("name", str(name), "expected [A-Za-z0-9._-]+ with at most one '/' (org/model)")
    for part in name.split("/"):
        _check_component("name", name, part)
    return name


def validate_version(version: str) -> str:
    if not isinstance(version, str) or not VERSION_RE.fullmatch(version):
        raise InvalidName("version", str(version), "expected [A-Za-z0-9._-]+")
    _check_component("version", version, version)
    return version


def parse_ref(ref: str) -> tuple[str, str | None]:
    """Split ``NAME[@VERSION]`` and validate both parts."""
    name, sep, version = ref.partition("@")
    validate_name(name)
    if sep:
        validate_version(version)
        return name, version
    return name, None


def validate_relpath(path: str, source: str = "manifest") -> str:
    """A manifest path: relative POSIX path, no '..', '.', empty parts, NUL or backslash tricks."""
    if not isinstance(path, str) or not path:
        raise UnsafePath(f"{source}: {path!r}", "empty path")
    if "\x00" in path:
        raise UnsafePath(f"{source}: {path!r}", "NUL byte in path")
    if path.startswith("/"):
        raise UnsafePath(f"{source}: {path!r}", "absolute path")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in path):  # (an escape sequence in a name would
        raise UnsafePath(f"{source}: {path!r}", "control character in path")  # reach an operator's terminal)
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath(f"{source}: {path!r}", "path must be relative without '.', '..' or empty parts")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"{source}: {path!r}", "file name is not valid UTF-8") from None
    return path
