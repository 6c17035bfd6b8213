"""Intent files: what this node should hold, declared as ``[[keep]]`` entries (design §15).

A directory of ``*.toml`` files (a ConfigMap mounted in Kubernetes, ``/etc/weightd/intent.d`` on bare
metal), read in name order. Each entry::

    [[keep]]
    model = "acme/llama-70b@latest"   # NAME@VERSION, or NAME@latest (rolled forward as versions appear)
    tier = "warm"                     # hot or warm (default warm)
    pin = false                       # pin the copy (never evicted while the entry wants it)
    nodes = "pool=chat,gpu in (h100,a100)"   # a label selector over this node's labels (default: all)
    priority = 100                    # higher first (default 0)
    versions = 2                      # @latest: keep this many (the newest plus rollbacks; default 1)
    window = "02:00-05:00"            # when the transfer may run (UTC); or cron: "0 2 * * 1-5" + window_minutes
    bandwidth = "200MB"               # bytes/s cap while this entry transfers (default: none)

Selectors follow Kubernetes' label-selector syntax: ``key=value``, ``key!=value``, ``key in (a,b)``,
``key notin (a,b)``, ``key``, ``!key``, joined by commas (all must hold); an inline table
``nodes = {pool = "chat"}`` means equality on each key.

Every problem is an :class:`IntentError` naming the file, the entry (``keep #N``, counted from 1 in its
file) and the key, so one line tells the operator what to fix; the daemon keeps the intent it had.
Two entries for the same model that both select this node conflict unless their priorities differ
(the higher one wins) or they say the same thing.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Mapping

from ..errors import IntentError

MAX_FILES = 256
MAX_FILE_BYTES = 1 << 20
MAX_ENTRIES = 4096
MAX_VERSIONS = 16
KEYS = ("model", "models", "tier", "pin", "nodes", "priority", "versions", "window", "window_minutes", "bandwidth",
        "include", "exclude", "layers", "tp_rank")
MAX_SET_MODELS = 10_000
LATEST = "latest"
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_HHMM = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)")


# -- node selectors ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Requirement:
    key: str
    op: str                       # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.key)
        if self.op == "exists":
            return v is not None
        if self.op == "!exists":
            return v is None
        if self.op in ("=", "in"):
            return v is not None and v in self.values
        return v not in self.values  # != and notin: a node without the label does not have that value


@dataclass(frozen=True)
class Selector:
    text: str
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels) for r in self.requirements)

    def __str__(self) -> str:
        return self.text or "(every node)"


def _check_key(k: str) -> str:
    if not _LABEL_KEY.fullmatch(k):
        raise ValueError(f"{k!r} is not a label key (like 'pool' or 'example.com/pool')")
    return k


def _check_value(v: str) -> str:
    if not _LABEL_VALUE.fullmatch(v):
        raise ValueError(f"{v!r} is not a label value (at most 63 letters, digits, '-', '_', '.')")
    return v


_REQ = re.compile(r"\s*(!?)\s*([^\s!=,()]+)(?:\s*(==|=|!=)\s*([^\s,()]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*")


def parse_selector(v: Any) -> Selector:
    """A label selector string or an inline table of equalities (ValueError naming what is wrong)."""
    if isinstance(v, Mapping):
        reqs = []
        for k, val in v.items():
            if not isinstance(val, str):
                raise ValueError(f"label {k!r}: expected a string value")
            reqs.append(Requirement(_check_key(str(k)), "=", (_check_value(val),)))
        return Selector(",".join(f"{r.key}={r.values[0]}" for r in reqs), tuple(reqs))
    if not isinstance(v, str):
        raise ValueError("expected a label selector like 'pool=chat,gpu in (h100,a100)' or a table of labels")
    text, reqs, pos = v.strip(), [], 0
    while pos < len(text):
        m = _REQ.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read the selector at {text[pos:pos + 20]!r}")
        neg, key, eq, val, setop, values = m.groups()
        _check_key(key)
        if neg and (eq or setop):
            raise ValueError(f"'!{key}' takes no value")
        if eq:
            req = Requirement(key, "!=" if eq == "!=" else "=", (_check_value(val),))
        elif setop:
            vals = tuple(_check_value(x.strip()) for x in values.split(",") if x.strip())
            if not vals:
                raise ValueError(f"'{key} {setop} ()' lists no values")
            req = Requirement(key, setop, vals)
        else:
            req = Requirement(key, "!exists" if neg else "exists")
        reqs.append(req)
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"expected ',' between requirements at {text[pos:pos + 20]!r}")
            pos += 1
            if pos == len(text):
                raise ValueError("ends with ','")
    return Selector(text, tuple(reqs))


# -- windows ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """When a transfer may run: daily ``HH:MM-HH:MM`` (UTC; may span midnight) or a cron expression
    (UTC, via croniter) with a length in minutes."""
    text: str
    start_min: int = 0
    end_min: int = 0
    cron: str | None = None
    minutes: int = 60

    def is_open(self, t: float) -> bool:
        return self.opens_in(t) == 0.0

    def opens_in(self, t: float) -> float:
        """Seconds until the window is next open from unix time ``t`` (0: open now)."""
        now = datetime.fromtimestamp(t, timezone.utc)
        if self.cron is not None:
            from croniter import croniter
            it = croniter(self.cron, now + timedelta(seconds=1))
            last = it.get_prev(datetime)
            if now < last + timedelta(minutes=self.minutes):
                return 0.0
            return max(0.0, croniter(self.cron, now).get_next(datetime).timestamp() - t)
        minute = now.hour * 60 + now.minute + now.second / 60 + now.microsecond / 60e6
        s, e = self.start_min, self.end_min
        inside = s <= minute < e if s < e else (minute >= s or minute < e)
        if inside:
            return 0.0
        return ((s - minute) % 1440) * 60.0

    def closes_in(self, t: float) -> float:
        """Seconds until an open window closes (0 if it is closed)."""
        if not self.is_open(t):
            return 0.0
        now = datetime.fromtimestamp(t, timezone.utc)
        if self.cron is not None:
            from croniter import croniter
            last = croniter(self.cron, now + timedelta(seconds=1)).get_prev(datetime)
            return max(0.0, (last + timedelta(minutes=self.minutes) - now).total_seconds())
        minute = now.hour * 60 + now.minute + now.second / 60
        return ((self.end_min - minute) % 1440) * 60.0

    def __str__(self) -> str:
        return self.text if self.cron is None else f"{self.text} for {self.minutes} min (UTC)"


def parse_window(v: Any, minutes: Any = None) -> Window:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("expected \"HH:MM-HH:MM\" (UTC) or a cron expression like \"0 2 * * 1-5\"")
    text = v.strip()
    m = _HHMM.fullmatch(text.replace(" ", ""))
    if m is not None:
        if minutes is not None:
            raise ValueError("window_minutes goes with a cron window, not with HH:MM-HH:MM")
        h1, m1, h2, m2 = (int(x) for x in m.groups())
        s, e = h1 * 60 + m1, h2 * 60 + m2
        if s == e:
            raise ValueError(f"{text!r} is empty (start equals end); leave window out to allow any time")
        return Window(text, s, e)
    from croniter import croniter
    if len(text.split()) != 5 or not croniter.is_valid(text):
        raise ValueError(f"{text!r} is neither HH:MM-HH:MM nor a 5-field cron expression")
    n = 60 if minutes is None else minutes
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 10080:
        raise ValueError("window_minutes: expected whole minutes from 1 to 10080 (a week)")
    return Window(text, cron=text, minutes=n)


# -- entries ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeepEntry:
    file: str                     # the file's name in the intent directory
    index: int                    # 1-based, in its file
    name: str
    version: str | None           # None: @latest
    tier: str = "warm"
    pin: bool = False
    nodes: Selector = field(default_factory=lambda: Selector(""))
    priority: int = 0
    versions: int = 1
    window: Window | None = None
    bandwidth: int = 0            # bytes/s while transferring; 0 = no cap
    selection: Any = None         # a tiering.Selection: a partial copy of each version (None: every file)
    member: int | None = None     # its place in the entry's ``models`` list (a set: LoRA adapters)

    @property
    def where(self) -> str:
        return f"{self.file} keep #{self.index}" + (f" models[{self.member}]" if self.member is not None else "")

    @property
    def model(self) -> str:
        return f"{self.name}@{self.version or LATEST}"

    @property
    def holder(self) -> str:
        """The lease holder name this entry's copies carry (``weightd status`` shows it)."""
        return f"intent {self.where}"

    def settings(self) -> tuple[Any, ...]:
        """What two entries for one model must agree on (or differ in priority)."""
        return (self.tier, self.pin, self.versions, str(self.window) if self.window else None, self.bandwidth,
                self.selection.describe() if self.selection is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.where, "model": self.model, "tier": self.tier, "pin": self.pin,
                "nodes": str(self.nodes), "priority": self.priority, "versions": self.versions,
                "window": str(self.window) if self.window else None, "bandwidth": self.bandwidth,
                **({"selection": self.selection.to_dict()} if self.selection is not None else {})}


def _entries(file: str, index: int, raw: Any) -> list[KeepEntry]:
    """One entry, or one per model of its ``models`` list (a set, e.g. LoRA adapters: each kept alike)."""
    where = f"keep #{index}"
    if isinstance(raw, Mapping) and "models" in raw:
        models = raw["models"]
        if "model" in raw:
            raise IntentError(file, "give model or models, not both", f"{where}.models")
        if not isinstance(models, list) or not models or len(models) > MAX_SET_MODELS:
            raise IntentError(file, f"expected a list of 1 to {MAX_SET_MODELS} NAME@VERSION (or NAME@latest)",
                              f"{where}.models")
        if len(set(map(str, models))) != len(models):
            raise IntentError(file, "a model is listed twice", f"{where}.models")
        out = []
        for j, m in enumerate(models):
            e = _entry(file, index, {**{k: v for k, v in raw.items() if k != "models"}, "model": m},
                       f"{where}.models[{j}]")
            out.append(replace(e, member=j))
        return out
    return [_entry(file, index, raw)]


def _entry(file: str, index: int, raw: Any, model_key: str | None = None) -> KeepEntry:
    from tiering import InvalidName, LOCAL_TIERS, parse_ref, parse_size

    where = f"keep #{index}"
    if not isinstance(raw, Mapping):
        raise IntentError(file, "expected a table", where)
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        import difflib
        near = difflib.get_close_matches(unknown[0], KEYS, n=1)
        raise IntentError(file, "unknown key" + (f" (did you mean {near[0]}?)" if near else ""),
                          f"{where}.{unknown[0]}")
    model = raw.get("model")
    model_key = model_key or f"{where}.model"
    if model is None:
        raise IntentError(file, "missing key (NAME@VERSION or NAME@latest; or models = [...])", model_key)
    if not isinstance(model, str) or "@" not in model:
        raise IntentError(file, f"expected NAME@VERSION or NAME@latest, got {str(model)[:80]!r}", model_key)
    try:
        name, version = parse_ref(model)
    except InvalidName as exc:
        raise IntentError(file, str(exc), model_key) from None
    if version == LATEST:
        version = None
    kw: dict[str, Any] = {}
    key = "?"
    try:
        key = "tier"
        if "tier" in raw:
            if raw["tier"] not in LOCAL_TIERS:
                raise ValueError(f"expected one of {', '.join(LOCAL_TIERS)}, got {str(raw['tier'])[:40]!r}")
            kw["tier"] = raw["tier"]
        key = "pin"
        if "pin" in raw:
            if not isinstance(raw["pin"], bool):
                raise ValueError("expected true or false")
            kw["pin"] = raw["pin"]
        key = "nodes"
        if "nodes" in raw:
            kw["nodes"] = parse_selector(raw["nodes"])
        key = "priority"
        if "priority" in raw:
            p = raw["priority"]
            if isinstance(p, bool) or not isinstance(p, int) or not -1_000_000 <= p <= 1_000_000:
                raise ValueError("expected a whole number from -1000000 to 1000000 (higher first)")
            kw["priority"] = p
        key = "versions"
        if "versions" in raw:
            n = raw["versions"]
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_VERSIONS:
                raise ValueError(f"expected a whole number from 1 to {MAX_VERSIONS} (the newest plus rollbacks)")
            if version is not None and n != 1:
                raise ValueError(f"goes with NAME@latest only ({model} names one version)")
            kw["versions"] = n
        key = "window"
        if "window" in raw:
            kw["window"] = parse_window(raw["window"], raw.get("window_minutes"))
        elif "window_minutes" in raw:
            key = "window_minutes"
            raise ValueError("goes with a cron window")
        key = "bandwidth"
        if "bandwidth" in raw:
            b = raw["bandwidth"]
            if isinstance(b, bool) or isinstance(b, float) and not math.isfinite(b):
                raise ValueError("expected bytes per second like '200MB'")
            kw["bandwidth"] = parse_size(b)
            if kw["bandwidth"] < 0:
                raise ValueError("expected bytes per second like '200MB'")
        from tiering import BadInput, selection_from
        for key in ("include", "exclude", "layers", "tp_rank"):   # (each checked alone: the error names it)
            if key in raw:
                try:
                    selection_from(**{key: raw[key]})
                except BadInput as exc:
                    raise ValueError(str(exc).split(": ", 1)[-1]) from None
        if any(k in raw for k in ("include", "exclude", "layers", "tp_rank")):
            sel = selection_from(raw.get("include"), raw.get("exclude"), raw.get("layers"), raw.get("tp_rank"))
            kw["selection"] = None if sel.whole else sel
    except (ValueError, TypeError) as exc:
        raise IntentError(file, str(exc) or "bad value", f"{where}.{key}") from None
    return KeepEntry(file, index, name, version, **kw)


def parse_text(file: str, text: str) -> list[KeepEntry]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise IntentError(file, f"invalid TOML: {exc}") from None
    unknown = [k for k in data if k != "keep"]
    if unknown:
        raise IntentError(file, "unknown table (an intent file holds [[keep]] entries)", unknown[0])
    keep = data.get("keep", [])
    if not isinstance(keep, list):
        raise IntentError(file, "expected [[keep]] entries (an array of tables)", "keep")
    return [e for i, raw in enumerate(keep, 1) for e in _entries(file, i, raw)]


# -- the directory ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Intent:
    """Every entry of the directory's files, and what they were read from (to notice a change)."""
    directory: str
    entries: tuple[KeepEntry, ...]
    fingerprint: tuple[Any, ...]

    def for_node(self, labels: Mapping[str, str]) -> list[KeepEntry]:
        """The entries that select this node, one per model reference (the highest priority wins), in
        the order to reconcile them: priority first, then file and entry order. IntentError on two
        entries for one model at one priority that disagree."""
        chosen: dict[tuple[str, str | None], KeepEntry] = {}
        for e in self.entries:
            if not e.nodes.matches(labels):
                continue
            key = (e.name, e.version)
            old = chosen.get(key)
            if old is None or e.priority > old.priority:
                chosen[key] = e
            elif e.priority == old.priority and e.settings() != old.settings():
                diff = next(f"{n} ({a} vs {b})" for n, a, b in
                            zip(("tier", "pin", "versions", "window", "bandwidth"), old.settings(), e.settings())
                            if a != b)
                raise IntentError(e.file, f"conflicts with {old.where} for this node: same model ({e.model}) and "
                                  f"priority, different {diff}; give one a higher priority or a node selector "
                                  "that leaves the other out", f"keep #{e.index}")
        return sorted(chosen.values(), key=lambda e: (-e.priority, e.file, e.index))


def fingerprint(directory: Path) -> tuple[Any, ...]:
    """What changes when a file is added, removed or rewritten (a ConfigMap update swaps ``..data``)."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return ("missing",)
    except OSError as exc:
        return ("unreadable", exc.errno)
    out: list[Any] = []
    for n in names:
        if n.endswith(".toml") and not n.startswith("."):
            try:
                st = os.stat(directory / n)
                out.append((n, st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((n, None))
    return tuple(out)


def _check_owner(path: Path, st: os.stat_result, trusted_uids: tuple[int, ...]) -> None:
    """Intent decides what a privileged daemon fetches and pins: its files must not be writable by
    anyone but root or the daemon's user (sshd's StrictModes, for the same reason)."""
    if st.st_uid not in trusted_uids:
        raise IntentError(str(path), f"owned by uid {st.st_uid}, not by root or the daemon's user: refused "
                          "(chown it)")
    if st.st_mode & stat.S_IWOTH:
        raise IntentError(str(path), "writable by every user: refused (chmod o-w)")
    if st.st_mode & stat.S_IWGRP and st.st_gid != 0:
        raise IntentError(str(path), f"writable by group {st.st_gid}: refused (chmod g-w, or chgrp root)")


def _resolve(path: Path, trusted_uids: tuple[int, ...], what: str) -> str:
    """``path`` resolved, symlink by symlink, refusing it (IntentError) unless every directory on the
    way, and wherever a symlink leads, is one only root or the daemon's user can change: a file that
    passes :func:`_check_owner` in a directory another uid owns could be swapped for another the
    moment after it is read (a ConfigMap's ``..data`` links are root's, and pass)."""
    from tiering import UnsafePath, resolve_unchangeable
    try:
        return resolve_unchangeable(path, frozenset(trusted_uids) | {0}, what)
    except UnsafePath as exc:
        raise IntentError(str(path), exc.reason) from None
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise IntentError(str(path), f"cannot read: {exc.strerror}") from None


def _open_resolved(path: Path, trusted: tuple[int, ...], what: str) -> int:
    """``path`` resolved (:func:`_resolve`) and opened ``O_NOFOLLOW`` at the path checked. A component
    that vanishes on the way (a ConfigMap's ``..data`` swapped between a readlink and the next lstat,
    the old directory removed) is resolved once more from the start; FileNotFoundError if it is
    missing again."""
    def once() -> int:
        return os.open(_resolve(path, trusted, what), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        return once()
    except FileNotFoundError:
        return once()


def load_intent(directory: Path, *, trusted_uids: tuple[int, ...] | None = None) -> Intent:
    """Read every ``*.toml`` in ``directory`` (name order; hidden files and ConfigMap internals
    skipped). A missing directory is an empty intent; anything wrong is an IntentError."""
    trusted = trusted_uids if trusted_uids is not None else tuple({0, os.geteuid()})
    fp = fingerprint(directory)
    if fp == ("missing",):
        return Intent(str(directory), (), fp)
    try:
        dst = os.stat(directory)
    except OSError as exc:
        raise IntentError(str(directory), f"cannot read: {exc.strerror}") from None
    if not stat.S_ISDIR(dst.st_mode):
        raise IntentError(str(directory), "not a directory")
    _check_owner(directory, dst, trusted)
    try:
        _resolve(directory, trusted, "the intent directory")
    except FileNotFoundError:
        raise IntentError(str(directory), "missing: a directory on its path went away while it was read") from None
    files = [n for n, *_ in fp if isinstance(n, str)]
    if len(files) > MAX_FILES:
        raise IntentError(str(directory), f"{len(files)} intent files; at most {MAX_FILES}")
    entries: list[KeepEntry] = []
    for n in files:
        path = directory / n
        try:   # (a ConfigMap's files are links: followed here)
            fd = _open_resolved(path, trusted, "this intent file")
        except FileNotFoundError:
            raise IntentError(n, f"missing: {path} or a directory its links lead through is gone (a ConfigMap "
                                 "update under way? it is read again at the next poll)") from None
        except OSError as exc:
            raise IntentError(n, f"cannot open: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IntentError(n, "not a regular file")
            _check_owner(path, st, trusted)
            if st.st_size > MAX_FILE_BYTES:
                raise IntentError(n, f"{st.st_size} bytes; an intent file is at most {MAX_FILE_BYTES}")
            raw = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            raise IntentError(n, "not UTF-8 text") from None
        entries.extend(parse_text(n, text))
        if len(entries) > MAX_ENTRIES:
            raise IntentError(n, f"more than {MAX_ENTRIES} entries in {directory}")
    return Intent(str(directory), tuple(entries), fp)


MAX_LABELS_BYTES = 64 << 10


def read_labels(path: Path | None, fixed: Mapping[str, str], *,
                trusted_uids: tuple[int, ...] | None = None) -> dict[str, str]:
    """This node's labels: ``[intent] labels`` from the config, overlaid by ``key=value`` lines of
    ``labels_file`` if set (a file an init container or the provisioner writes). Labels choose the
    entries a node runs, so the file gets the intent files' checks (a regular file, owned by root or
    the daemon's user, not writable by others, at most 64 KiB). IntentError names a bad line."""
    labels = dict(fixed)
    if path is None:
        return labels
    trusted = trusted_uids if trusted_uids is not None else tuple({0, os.geteuid()})
    try:
        fd = _open_resolved(path, trusted, "the node labels file")
    except FileNotFoundError:
        if not os.path.lexists(path):
            return labels   # (no labels file: only when the configured path itself is absent)
        raise IntentError(str(path), "node labels: missing: a file or directory its links lead to is gone (a "
                                     "ConfigMap update under way? it is read again at the next poll)") from None
    except OSError as exc:
        raise IntentError(str(path), f"cannot read node labels: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IntentError(str(path), "node labels: not a regular file")
        _check_owner(path, st, trusted)
        raw = os.read(fd, MAX_LABELS_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_LABELS_BYTES:
        raise IntentError(str(path), f"node labels: larger than {MAX_LABELS_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise IntentError(str(path), "node labels: not UTF-8 text") from None
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, sep, v = line.partition("=")
        try:
            if not sep:
                raise ValueError("expected key=value")
            labels[_check_key(k.strip())] = _check_value(v.strip())
        except ValueError as exc:
            raise IntentError(str(path), str(exc), f"line {i}") from None
    return labels
