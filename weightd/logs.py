"""The daemon's log lines: INFO by default, a UTC timestamp, ``key=value`` pairs in the message, and the
same as one JSON object per line with ``--log-format json`` (the pairs become fields)."""

from __future__ import annotations

import json
import logging
import re
import sys
import time

_PAIR = re.compile(r'(?<![\w.])([a-z_][a-z0-9_]*)=("[^"]*"|[^\s,;]+)')


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One object per line: ts, level, logger, msg, and every ``key=value`` of the message as a field
    (numbers as numbers); a field never replaces ts/level/logger/msg."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        out: dict[str, object] = {"ts": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
                                  "msg": msg}
        for key, raw in _PAIR.findall(msg):
            value: object = raw.strip('"')
            try:
                value = int(raw) if raw.lstrip("-").isdigit() else float(raw) if re.fullmatch(r"-?\d+\.\d+", raw) \
                    else value
            except ValueError:
                pass
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
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
