"""NAME / VERSION patterns and safe relative paths (design §3: nothing else ever becomes a path)."""

from __future__ import annotations

import re
from typing import Any

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


LABEL_SEP = "~"   # a local object's label: VERSION~TAG (never a published version: "~" is outside VERSION)
TAG_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


def validate_label(label: str) -> str:
    """A local object's label: a VERSION, or ``VERSION~TAG[~KEY]`` for what belongs to a version but is
    not the whole of it (a partial copy ``V~p<hex>``, a companion ``V~<kind>~<key>``). The ``~`` never
    occurs in a published version, so such an object can never be taken for one."""
    if not isinstance(label, str):
        raise InvalidName("version", str(label), "expected [A-Za-z0-9._-]+")
    version, sep, rest = label.partition(LABEL_SEP)
    validate_version(version)
    if sep:
        tag, sep2, key = rest.partition(LABEL_SEP)
        if not TAG_RE.fullmatch(tag) or (sep2 and (not VERSION_RE.fullmatch(key) or set(key) == {"."})):
            raise InvalidName("version", label, "expected VERSION, VERSION~TAG or VERSION~KIND~KEY "
                              "(TAG, KIND: [a-z0-9-]; KEY: [A-Za-z0-9._-]+)")
        if len(label.encode()) > MAX_COMPONENT_LEN:   # (the version is valid: the user typed it, not the rest)
            room = MAX_COMPONENT_LEN - len((sep + rest).encode())
            raise InvalidName("version", version[:60] + "..." * (len(version) > 60),
                              f"{len(version.encode())} bytes, too long for a partial copy, expert copy or "
                              f"companion of it (named VERSION{sep}{rest[:50]}, at most {MAX_COMPONENT_LEN} "
                              f"bytes): these need a version of at most {max(room, 0)} bytes")
    return label


def split_label(label: str) -> tuple[str, str | None, str | None]:
    """``V~tag~key`` -> (V, tag, key); a plain version -> (V, None, None)."""
    version, _, rest = label.partition(LABEL_SEP)
    if not rest:
        return version, None, None
    tag, _, key = rest.partition(LABEL_SEP)
    return version, tag, key or None


def parse_ref(ref: str, *, local: bool = False) -> tuple[str, str | None]:
    """Split ``NAME[@VERSION]`` and validate both parts (``local``: VERSION may be a local object's
    label, ``V~p<hex>`` or ``V~<kind>~<key>``)."""
    name, sep, version = ref.partition("@")
    validate_name(name)
    if sep:
        (validate_label if local else validate_version)(version)
        return name, version
    return name, None


#: C0 and C1 control characters (an escape sequence in a name would reach an operator's terminal)
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
_BAD_PART_RE = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")   # an empty, '.' or '..' component


def validate_relpath(path: str, source: str = "manifest") -> str:
    """A manifest path: relative POSIX path, no '..', '.', empty parts, NUL or backslash tricks.
    (Regular expressions, not a loop over characters: a compile cache's manifest has 10,000 paths.)"""
    if not isinstance(path, str) or not path:
        raise UnsafePath(f"{source}: {path!r}", "empty path")
    if "\x00" in path:
        raise UnsafePath(f"{source}: {path!r}", "NUL byte in path")
    if path.startswith("/"):
        raise UnsafePath(f"{source}: {path!r}", "absolute path")
    if CONTROL_RE.search(path):
        raise UnsafePath(f"{source}: {path!r}", "control character in path")
    if _BAD_PART_RE.search(path):
        raise UnsafePath(f"{source}: {path!r}", "path must be relative without '.', '..' or empty parts")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"{source}: {path!r}", "file name is not valid UTF-8") from None
    return path


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str, data: Any) -> bool:
    """Whether JSON ``text``, parsed as ``data``, holds a string with a lone UTF-16 surrogate: valid
    JSON (``"\\ud800"``) that is not text, which no file name, tensor name or manifest written as UTF-8
    can hold. A pair of escapes is one character once parsed; only text with such an escape is walked."""
    if not _SURROGATE_ESCAPE.search(text):
        return False
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False
