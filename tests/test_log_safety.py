"""What a caller puts in a request reaches the daemon's log only escaped and cut (weightd.logs): played
against a real daemon, reading its real log file. A ref carrying a line break cannot plant a forged
``route=evict ... uid=0`` line, and twenty requests with a 1 MB ref add a few KiB to the log, not
20 MB. The one mechanism (the daemon's formatters) holds for every call site, whatever it passes."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from weightd.logs import JsonFormatter, TextFormatter

from .test_daemon import daemon, publish  # noqa: F401 (daemon: a fixture)
from .test_trust_api import call, in_child

MiB = 1 << 20
FORGED = "2030-01-01T00:00:00.000Z INFO weightd.daemon.routes: request route=evict pid=1 uid=0 ref=org/d@v1"
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()


def test_a_ref_cannot_forge_a_log_line_and_a_huge_ref_costs_little(daemon, wd, tmp_path: Path
                                                                                   ) -> None:  # noqa: F811
    publish(wd, tmp_path, size=2 * MiB)
    sock, log = daemon.socket_path, daemon.log_path

    # a ref with a line break and a whole forged record after it
    status, doc = call(sock, "POST", "preload", {"ref": f"org/d@v1\n{FORGED}", "tier": "warm"})
    assert status == 400, doc
    text = lines(log)
    assert not [ln for ln in text if ln.startswith("2030-01-01") or ln.startswith("route=evict")], text
    assert not [ln for ln in text if "route=evict" in ln and "uid=0" in ln], text
    # every line of the log is a record of its own (its time stamp first) or an indented traceback line
    assert all(STAMP.match(ln) or ln.startswith("    | ") for ln in text), [ln for ln in text if not STAMP.match(ln)]
    # what was refused is still said: the invalid ref by its length, the process name escaped
    assert any("route=preload " in ln and "ref=<invalid, " in ln for ln in text), text

    # twenty requests with a 1 MB ref: a few KiB of log, not 20 MB
    before = log.stat().st_size
    for _ in range(20):
        status, _doc = call(sock, "POST", "preload", {"ref": "a" * 1_000_000, "tier": "warm"})
        assert status == 400
    call(sock, "GET", "health")
    grown = log.stat().st_size - before
    assert grown < 20 * 1024, grown


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("weightd.test", logging.INFO, __file__, 1, msg, args, None)


def test_every_record_is_one_line_of_bounded_length_whatever_the_call_site_passed() -> None:
    text, js = TextFormatter(), JsonFormatter()
    hostile = f"org/d@v1\n{FORGED}\r\x1b[2J\u2028"
    for r in (record("hold released name=%s holder=%s", hostile, "pid 1 uid 0"),   # an argument
              record(f"client went away ref={hostile}"),                            # an f-string
              record("peer said %s", RuntimeError(hostile)),                        # any object's str()
              record("dict %(who)s", {"who": hostile})):
        out = text.format(r)
        assert "\n" not in out and "\r" not in out and "\x1b" not in out and "\u2028" not in out, out
        assert "\\n2030-01-01" in out, out
        doc = json.loads(js.format(r))
        assert "\n" not in doc["msg"]
        if r.args:   # (an argument is one value: nothing in it becomes a field of its own)
            assert doc.get("route") is None and doc.get("uid") is None, doc
    # a huge argument, or a huge f-string, is cut (saying how much was left out)
    out = text.format(record("request ref=%s tier=%s", "a" * 1_000_000, "hot"))
    assert len(out) < 1200 and "more characters]" in out and out.endswith("tier=hot"), out[-80:]
    assert len(text.format(record("x" * 1_000_000))) < 5000
    # in the JSON form, a key=value inside a quoted value is no field of its own
    doc = json.loads(js.format(record('request route=%s note="a uid=0 route=evict" uid=%d', "preload", 65534)))
    assert (doc["route"], doc["uid"], doc["note"]) == ("preload", 65534, "a uid=0 route=evict"), doc
