"""Placement hints as Node Feature Discovery labels: a feature file in NFD's ``features.d``, so a
scheduler's node affinity can prefer nodes that already hold a model, without weightd holding API
credentials.

What NFD does with the file (kubernetes-sigs/node-feature-discovery ``source/local/local.go`` and
``docs/usage/customization-guide.md``, "Local feature source"): nfd-worker's ``local`` source reads every
file in ``/etc/kubernetes/node-feature-discovery/features.d/`` whose name does not start with ``.``
(so our temporary file is never read half written), skips a file over 65,536 bytes, and takes one
``name[=value]`` a line (value ``true`` when absent); lines starting with ``#`` are comments, and
``# +expiry-time=<RFC 3339>`` drops the lines after it once that time has passed (checked at each
re-discovery; NFD 0.14 and later: earlier versions read comment lines as bad label names and reject
them). A name with a prefix keeps it (``weightd.io/acme.llama-70b``); only a name without one gets
``feature.node.kubernetes.io/``. nfd-master (0.13 and later) accepts every namespace except
``kubernetes.io`` and ``*.kubernetes.io``, so ``weightd.io`` needs ``-extra-label-ns=weightd.io`` only
where it is excluded by ``-deny-label-ns`` (``"*"``, say); up to 0.12, only ``feature.node.kubernetes.io``
and ``profile.node.kubernetes.io`` were allowed by default and ``-extra-label-ns=weightd.io`` is required.

Pure about policy: which version of a model the label describes, and its tier, is the caller's
choice; this module names, renders and writes.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..errors import FeatureFileError

PREFIX = "weightd.io"
HOT, WARM, READY = "hot", "warm", "ready"
READY_SUFFIX = ".ready-in"
READY_IN = ("0s", "10s", "1m", "5m", "long")   # (weightd.node.ready_estimate.BUCKETS and LONG)
VALUES = (HOT, WARM, READY)
_RANK = {READY: 1, WARM: 2, HOT: 3}
MAX_KEY_LEN = 63                  # the name part of a Kubernetes label key
MAX_FEATURE_FILE_BYTES = 65536    # NFD skips a larger feature file
_CUT_NOTE_BYTES = 128             # room kept for the comment that says ready-in labels were left out
_HASH_HEX = 8
_HEAD_LEN = MAX_KEY_LEN - 1 - _HASH_HEX
_KEY = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_HASHED_TAIL = re.compile(r"-[0-9a-f]{8}\Z")
_OUTSIDE = re.compile(r"[^A-Za-z0-9._-]")
_EDGE = "._-"
_FILENAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_EXPIRY = "# +expiry-time"


def label_key(model: str, suffix: str = "") -> str:
    """The name part of a model's label (no version): ``weightd.io/<label_key(model)>``; with
    ``suffix`` (``.ready-in``), the key it ends, formed alike with the suffix's length taken off the
    63 characters (a long name is hashed a little sooner there).

    Plain: the model name with its ``/`` turned into ``.`` (``acme/llama-70b`` -> ``acme.llama-70b``,
    case kept), when all of these hold, so that a plain key reads back to exactly one name:

    - no ``.`` before the ``/`` (in a name without ``/``: no ``.`` at all). Both ``acme/llama.3`` and
      ``acme.llama/3`` would otherwise read ``acme.llama.3``; in a plain key the first ``.`` is the ``/``;
    - a valid label name: at most 63 characters, letters, digits, ``-``, ``_``, ``.``, first and last
      characters a letter or a digit;
    - it does not end in ``-`` and 8 lowercase hex digits (the form below), nor in ``.ready-in`` (a
      model's ready-in label could otherwise be another model's tier label).

    Otherwise hashed: the name with ``/`` turned into ``.`` and any other character outside
    ``[A-Za-z0-9._-]`` into ``_``, leading and trailing ``.``, ``_``, ``-`` removed, cut to 54
    characters (then trailing ones removed again; ``m`` if nothing is left), then ``-`` and the first 8
    hex digits of the SHA-256 of the full name (UTF-8): ``llama-3.1`` -> ``llama-3.1-<8 hex>``. Two names
    share a key only if they share those 32 bits of SHA-256 (:func:`render` refuses that).
    """
    if not isinstance(model, str) or not model:
        raise ValueError(f"model name: expected a non-empty string, got {model!r:.60}")
    org, slash, rest = model.partition("/")
    plain = f"{org}.{rest}" if slash else model
    if ("." not in org and len(plain) + len(suffix) <= MAX_KEY_LEN and _KEY.fullmatch(plain)
            and not _HASHED_TAIL.search(plain) and not plain.endswith(READY_SUFFIX)):
        return plain + suffix
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
    head = _OUTSIDE.sub("_", model.replace("/", ".")).lstrip(_EDGE)[:_HEAD_LEN - len(suffix)].rstrip(_EDGE)
    return f"{head or 'm'}-{digest}{suffix}"


def label_name(model: str) -> str:
    """The full label key of a model: ``weightd.io/`` and :func:`label_key`."""
    return f"{PREFIX}/{label_key(model)}"


def ready_label_name(model: str) -> str:
    """The key of a model's ready-in label: ``weightd.io/<key>.ready-in`` (the key as
    :func:`label_key` forms it, with room for the suffix), valued ``0s``, ``10s``, ``1m``, ``5m`` or
    ``long`` (:func:`weightd.node.ready_estimate.bucket`: how soon a server could read the model here)."""
    return f"{PREFIX}/{label_key(model, READY_SUFFIX)}"


def label_value(tier: str, resident_fraction: float, *, resident_min: float = 0.9) -> str:
    """``hot``: a complete copy in the hot tier; ``warm``: in the warm tier with at least
    ``resident_min`` of it in the page cache; ``ready``: in the warm tier, read from disk on open."""
    if not 0.0 < resident_min <= 1.0:
        raise ValueError(f"resident_min: expected a fraction above 0 and at most 1, got {resident_min!r}")
    if isinstance(resident_fraction, bool) or not isinstance(resident_fraction, (int, float)) \
            or not 0.0 <= resident_fraction <= 1.0:   # (NaN fails the comparison)
        raise ValueError(f"resident_fraction: expected a fraction from 0 to 1, got {resident_fraction!r:.40}")
    if tier == HOT:
        return HOT
    if tier != WARM:
        raise ValueError(f"tier: expected {HOT!r} or {WARM!r}, got {tier!r:.40}")
    return WARM if resident_fraction >= resident_min else READY


def best_values(rows: Iterable[tuple[str, str]]) -> dict[str, str]:
    """(model, value) rows, several per model (its versions, its tiers) -> the best value per model
    (``hot`` > ``warm`` > ``ready``). Which rows to pass (the versions intent wants ready) is the
    caller's choice."""
    best: dict[str, str] = {}
    for model, value in rows:
        if value not in _RANK:
            raise ValueError(f"label value for {model!r:.80}: expected one of {', '.join(VALUES)}, got {value!r:.40}")
        if _RANK[value] > _RANK.get(best.get(model, ""), 0):
            best[model] = value
    return best


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def render(holdings: Mapping[str, str], *, expiry_s: float | None = None,
           clock: Callable[[], float] = time.time, ready_in: Mapping[str, str] | None = None) -> str:
    """The feature file: a header comment (written by weightd, when), with ``expiry_s`` an
    ``# +expiry-time=`` directive that far ahead (whole seconds, rounded up), then one
    ``weightd.io/<key>=<value>`` line per model of ``holdings`` (model -> ``hot``/``warm``/``ready``)
    and one ``weightd.io/<key>.ready-in=<bucket>`` line per model of ``ready_in`` (model -> ``0s``/
    ``10s``/``1m``/``5m``/``long``), each kind sorted by label. ValueError on an unknown value, or two
    labels that share a key.

    The tier labels come first and always fit where they did alone; the ready-in lines (about as many
    again, and longer) follow only while the file stays within NFD's 65,536 bytes: past that NFD
    would skip the whole file, tier labels too. A comment line says how many were left out."""
    now = clock()
    lines = [f"# written by weightd at {_rfc3339(now)}: the models this node holds "
             "(weightd.io/<model>=hot|warm|ready); replaced when they change, do not edit"]
    if expiry_s is not None:
        if isinstance(expiry_s, bool) or not isinstance(expiry_s, (int, float)) \
                or not math.isfinite(expiry_s) or expiry_s <= 0:
            raise ValueError(f"expiry_s: expected a positive number of seconds, got {expiry_s!r}")
        lines.append(f"{_EXPIRY}={_rfc3339(math.ceil(now + expiry_s))}")
    labels: dict[str, tuple[str, str]] = {}
    ready: dict[str, str] = {}
    for model, value in holdings.items():
        if value not in _RANK:
            raise ValueError(f"label value for {model!r:.80}: expected one of {', '.join(VALUES)}, got {value!r:.40}")
        name = label_name(model)
        if name in labels:
            raise ValueError(f"models {labels[name][0]!r} and {model!r} share the label {name}")
        labels[name] = (model, value)
    for model, value in (ready_in or {}).items():
        if value not in READY_IN:
            raise ValueError(f"ready-in value for {model!r:.80}: expected one of {', '.join(READY_IN)}, got {value!r:.40}")
        name = ready_label_name(model)
        if name in labels:
            raise ValueError(f"models {labels[name][0]!r} and {model!r} share the label {name}")
        labels[name] = (model, value)
        ready[name] = value
    lines += [f"{name}={value}" for name, (_model, value) in sorted(labels.items()) if name not in ready]
    size = sum(len(line) + 1 for line in lines)
    ready_lines = [f"{name}={value}" for name, value in sorted(ready.items())]
    room = MAX_FEATURE_FILE_BYTES - size - _CUT_NOTE_BYTES
    kept = 0
    if size + sum(len(line) + 1 for line in ready_lines) <= MAX_FEATURE_FILE_BYTES:
        kept = len(ready_lines)
    else:
        for line in ready_lines:
            if len(line) + 1 > room:
                break
            room -= len(line) + 1
            kept += 1
    lines += ready_lines[:kept]
    if kept < len(ready_lines):
        lines.append(f"# {len(ready_lines) - kept} of {len(ready_lines)} ready-in labels left out: the file would "
                     f"pass the {MAX_FEATURE_FILE_BYTES} bytes NFD reads (tier labels first)")
    return "\n".join(lines) + "\n"


def _significant(data: bytes, *, ignore_expiry: bool) -> list[str]:
    """What NFD acts on: label lines and ``# +`` directives (plain comments, such as the header's time,
    are left out); with ``ignore_expiry``, an expiry directive counts without its time."""
    out = []
    for raw in data.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line.startswith("#"):
            if not line.startswith("# +"):
                continue
            if ignore_expiry and line.startswith(_EXPIRY):
                line = _EXPIRY
        if line:
            out.append(line)
    return out


def _read_current(dfd: int, filename: str) -> tuple[bytes, float] | None:
    """The regular file at ``filename`` (content, mtime) if there is one we can read, never following
    a symlink or blocking on a FIFO; None otherwise (it will be replaced)."""
    try:
        fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FEATURE_FILE_BYTES:
            return None
        data = os.read(fd, MAX_FEATURE_FILE_BYTES + 1)
        return (data, st.st_mtime) if len(data) <= MAX_FEATURE_FILE_BYTES else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_dir(directory: Path) -> int:
    where = os.fspath(directory)
    where = where.rstrip("/") or "/"    # (a trailing '/' would make the kernel follow a symlink)
    try:
        return os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(where):
            raise FeatureFileError(f"NFD features directory {where} is a symlink: refused (someone could have "
                                   "planted it); point [intent] nfd_dir at the real directory") from None
        raise FeatureFileError(f"NFD features directory {where}: {exc.strerror}; create it, or fix "
                               "[intent] nfd_dir") from None


def write_features(directory: Path, filename: str, text: str, *, refresh_s: float | None = None,
                   clock: Callable[[], float] = time.time) -> bool:
    """Replace ``directory/filename`` with ``text`` as a whole, in a directory that someone else may
    be able to write (a hostPath): the directory opened without following a symlink (a symlinked
    directory is refused), a new dot-named temporary created beside the file (``O_EXCL|O_NOFOLLOW``,
    mode 0644; NFD skips dot files), written, fsynced, renamed over ``filename`` by descriptor, and the
    directory fsynced. Whatever is at ``filename`` is replaced, never written through: a symlink
    there is replaced by the file, its target untouched.

    False, and nothing written, when the file already says the same: the same label lines and ``# +``
    directives (plain comments, such as the header's time, do not count). With ``refresh_s``, the
    expiry directive's time does not count either, but a file older than ``refresh_s`` (by its mtime
    against ``clock``) is rewritten anyway, so its expiry moves on before it passes.
    FeatureFileError (a WeightdError) naming the path if it cannot be written."""
    if not isinstance(filename, str) or not _FILENAME.fullmatch(filename):
        raise FeatureFileError(f"NFD feature file name {filename!r:.80}: expected a plain file name "
                               "(letters, digits, '.', '_', '-'; not starting with '.', which NFD skips)")
    data = text.encode("utf-8")
    if len(data) > MAX_FEATURE_FILE_BYTES:
        raise FeatureFileError(f"NFD feature file {Path(directory) / filename}: {len(data)} bytes, and NFD skips "
                               f"a file over {MAX_FEATURE_FILE_BYTES}: label fewer models")
    dfd = _open_dir(directory)
    try:
        if _unchanged(dfd, filename, data, refresh_s, clock):
            return False
        _replace(dfd, directory, filename, data)
        return True
    finally:
        os.close(dfd)


def _unchanged(dfd: int, filename: str, data: bytes, refresh_s: float | None, clock: Callable[[], float]) -> bool:
    """The file there already says ``data`` (its significant lines) and, with ``refresh_s``, is not due
    for a rewrite yet."""
    current = _read_current(dfd, filename)
    if current is None:
        return False
    old, mtime = current
    fresh = refresh_s is None or 0.0 <= clock() - mtime < refresh_s
    return fresh and _significant(old, ignore_expiry=refresh_s is not None) == \
        _significant(data, ignore_expiry=refresh_s is not None)


def _replace(dfd: int, directory: Path, filename: str, data: bytes) -> None:
    """``data`` replaces ``filename`` in ``dfd`` (``directory``, for messages) as a whole
    (:meth:`tiering.safefs.Dir.write_atomic`: a temporary, fsync, rename, fsync of the directory)."""
    from tiering import Dir, TieringError
    d = Dir(os.dup(dfd), Path(directory))
    try:
        d.write_atomic(filename, data, 0o644)
    except (OSError, TieringError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise FeatureFileError(f"NFD feature file {Path(directory) / filename}: {why}; weightd must be able to "
                               f"write {directory}, and {filename} must not be a directory") from None
    finally:
        d.close()
