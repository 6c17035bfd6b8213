"""The daemon's log lines: INFO by default, a UTC timestamp, ``key=value`` pairs in the message, and the
same as one JSON object per line with ``--log-format json`` (the pairs become fields).

A log line is as trustworthy as what went into it, and much of that came from a caller (a ref, a
holder's process name, a peer's message). So every record is made safe here, in one place, whatever
the call site passed: each argument is cut to :data:`MAX_ARG_CHARS` characters, the whole message to
:data:`MAX_MESSAGE_CHARS` and a traceback to :data:`MAX_TRACEBACK_CHARS`, and every control character
(line breaks included, and Unicode's line and paragraph separators) is shown escaped (``\\n``,
``\\x1b``, ``\\u2028``): one record is one line, and no caller can start a line of its own or make one
request cost more than a few KiB of log. A traceback's lines are indented, so its text cannot pass for
a record either. Quoted values (``ref="..."``) are single fields in the JSON format: a ``key=value``
written inside quotes is never read as a field of its own."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

MAX_ARG_CHARS = 512              # one argument of a record (a ref, a path, an error's text)
MAX_MESSAGE_CHARS = 4096         # a whole message, arguments included
MAX_TRACEBACK_CHARS = 16384      # a traceback (its head and its tail are kept)

_PAIR = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w.])([a-z_][a-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^\s,;"]+)')
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}...[{len(text) - limit} more characters]"


def clean(text: str, limit: int = MAX_ARG_CHARS) -> str:
    """``text`` as a log line may hold it: cut to ``limit`` characters (and saying how many more there
    were), control characters escaped."""
    return _CONTROL.sub(_escape, _cut(text, limit))


def _arg(a: object, quote: bool = False) -> object:
    if a is None or isinstance(a, (bool, int, float)):
        return a   # (numbers keep %d and %.3f working)
    try:
        s = a if isinstance(a, str) else str(a)
    except Exception as exc:  # noqa: BLE001 (a broken __str__ must not lose the record)
        s = f"<unprintable {type(a).__name__}: {type(exc).__name__}>"
    s = clean(s)
    if quote and (not s or any(c.isspace() or c in '"=,;' for c in s)):
        s = '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


def message(record: logging.LogRecord, *, quoted: bool = False) -> str:
    """The record's message with every argument made safe first, then the whole made safe again (an
    f-string call site passes no arguments: its text is cleaned the same way). ``quoted``: an argument
    with a space, quote, '=', ',' or ';' in it is written as one quoted value (the JSON format reads
    its fields from this form: an argument is one value, never fields of its own)."""
    args = record.args
    if args:
        if isinstance(args, dict):
            safe: object = {k: _arg(v, quoted) for k, v in args.items()}
        else:
            safe = tuple(_arg(a, quoted) for a in args)
        try:
            text = str(record.msg) % safe
        except (TypeError, ValueError):   # (a format that wanted the raw object: say what came)
            text = f"{record.msg} {safe!r}"
    else:
        text = str(record.msg)
    return clean(text, MAX_MESSAGE_CHARS)


def _traceback(text: str) -> str:
    if len(text) > MAX_TRACEBACK_CHARS:
        half = MAX_TRACEBACK_CHARS // 2
        text = f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[-half:]}"
    return "\n".join("    | " + clean(line, MAX_TRACEBACK_CHARS) for line in text.splitlines())


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {message(record)}"
        if record.exc_info:
            line += "\n" + _traceback(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    """One object per line: ts, level, logger, msg, and every ``key=value`` of the message as a field
    (numbers as numbers); a field never replaces ts/level/logger/msg."""

    def format(self, record: logging.LogRecord) -> str:
        msg = message(record)
        out: dict[str, object] = {"ts": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
                                  "msg": msg}
        for key, raw in _PAIR.findall(message(record, quoted=True) if record.args else msg):
            if not key:   # (a quoted string that is no value of a key: nothing inside it is a field)
                continue
            value: object = re.sub(r'\\(.)', r'\1', raw[1:-1]) if raw.startswith('"') else raw
            try:
                value = int(raw) if raw.lstrip("-").isdigit() else float(raw) if re.fullmatch(r"-?\d+\.\d+", raw) \
                    else value
            except ValueError:
                pass
            out.setdefault(key, value)
        if record.exc_info:
            text = self.formatException(record.exc_info)
            out["exc"] = _traceback(text) if len(text) > MAX_TRACEBACK_CHARS else text
        return json.dumps(out, default=str)


def configure_daemon_logging(fmt: str, level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
