"""weightd.intent.nfd: label keys, the feature file NFD reads, and writing it into a directory that
someone else may be able to write (real files under tmp_path; symlinks and a FIFO planted on purpose)."""

from __future__ import annotations

import calendar
import hashlib
import os
import re
import stat
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightd.errors import FeatureFileError, WeightdError
from weightd.intent import nfd

KEY = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
T0 = 1714564800.25     # 2024-05-01T12:00:00.25Z
TEXT = "weightd.io/acme.llama-70b=hot\n"


def h8(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:8]


def assert_label_name(key: str) -> None:
    assert len(key) <= 63 and KEY.fullmatch(key), key


def nfd_labels(text: str, now: float) -> dict[str, str]:
    """What NFD's local source (0.14+) makes of a feature file at ``now``: source/local/local.go,
    parseFeatureFile (trimmed lines, '#' comments, '# +expiry-time=' RFC 3339 for the lines after it)."""
    labels, expiry = {}, now
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +expiry-time="):
                expiry = calendar.timegm(time.strptime(line.split("=", 1)[1].strip(), "%Y-%m-%dT%H:%M:%SZ"))
            continue
        if expiry < now:
            continue
        k, _, v = line.partition("=")
        labels[k] = v if "=" in line else "true"
    return labels


# -- label keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, key", [
    ("acme/llama-70b", "acme.llama-70b"),
    ("acme/llama.3", "acme.llama.3"),                      # dots after the '/' are fine
    ("ACME/Llama-3-8B_Instruct", "ACME.Llama-3-8B_Instruct"),  # case kept (label names allow it)
    ("embed", "embed"),
    ("a/" + "b" * 61, "a." + "b" * 61),                      # exactly 63
])
def test_plain_keys(model: str, key: str) -> None:
    assert nfd.label_key(model) == key
    assert nfd.label_name(model) == f"weightd.io/{key}"
    assert_label_name(nfd.label_key(model))


@pytest.mark.parametrize("model, head", [
    ("acme.llama/3", "acme.llama.3"),        # a '.' before the '/': ambiguous with acme/llama.3
    ("llama-3.1", "llama-3.1"),              # no '/' but a '.': ambiguous with llama/3.1
    ("_acme/x", "acme.x"),                   # first character not alphanumeric
    ("acme/-x-", "acme.-x"),                 # last character not alphanumeric
    ("acme/x..", "acme.x"),
    ("acme/x-deadbeef", "acme.x-deadbeef"),  # looks like a hashed key itself
    ("...", "m"),                            # nothing left
    ("acme/ünï", "acme._n"),                 # not a weightd name, but still a label name
    ("a/b/c", "a.b.c"),
])
def test_changed_names_are_hashed(model: str, head: str) -> None:
    key = nfd.label_key(model)
    assert key == f"{head}-{h8(model)}"
    assert_label_name(key)


def test_long_names_are_cut_and_hashed() -> None:
    model = "acme/" + "x" * 300
    key = nfd.label_key(model)
    assert len(key) == 63
    assert key == "acme." + "x" * 49 + "-" + h8(model)
    assert nfd.label_key("a/" + "b" * 62) == "a." + "b" * 52 + "-" + h8("a/" + "b" * 62)   # 64: hashed
    assert nfd.label_key(model) == key   # deterministic


@pytest.mark.parametrize("a, b", [
    ("acme/llama.3", "acme.llama/3"),
    ("acme/llama", "acme.llama"),
    ("acme/" + "x" * 100 + "1", "acme/" + "x" * 100 + "2"),       # same cut, different hash
    ("a.b", "a/b-" + h8("a.b")),          # a plain name that spells another name's hashed key
    ("acme/x_", "acme/x-"),
])
def test_names_that_collide_after_mapping_get_different_keys(a: str, b: str) -> None:
    assert nfd.label_key(a) != nfd.label_key(b)
    assert_label_name(nfd.label_key(a))
    assert_label_name(nfd.label_key(b))


_component = st.text(alphabet="aZ09._-", min_size=1, max_size=80).filter(lambda s: set(s) != {"."})
_names = st.one_of(_component, st.tuples(_component, _component).map("/".join))


@settings(max_examples=400, deadline=None)
@given(_names, _names)
def test_every_key_is_a_label_name_and_distinct(a: str, b: str) -> None:
    ka, kb = nfd.label_key(a), nfd.label_key(b)
    assert_label_name(ka)
    assert_label_name(kb)
    if a != b:
        assert ka != kb


@pytest.mark.parametrize("bad", ["", None, 3])
def test_no_key_for_no_name(bad: object) -> None:
    with pytest.raises(ValueError, match="model name: expected a non-empty string"):
        nfd.label_key(bad)  # type: ignore[arg-type]


# -- label values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tier, resident, kw, value", [
    ("hot", 1.0, {}, "hot"), ("hot", 0.0, {}, "hot"),
    ("warm", 1.0, {}, "warm"), ("warm", 0.9, {}, "warm"), ("warm", 0.89, {}, "ready"), ("warm", 0.0, {}, "ready"),
    ("warm", 0.5, {"resident_min": 0.5}, "warm"),
])
def test_label_value(tier: str, resident: float, kw: dict, value: str) -> None:
    assert nfd.label_value(tier, resident, **kw) == value


@pytest.mark.parametrize("args, kw, message", [
    (("cold", 1.0), {}, "tier: expected 'hot' or 'warm', got 'cold'"),
    (("warm", float("nan")), {}, "resident_fraction: expected a fraction from 0 to 1, got nan"),
    (("warm", 1.5), {}, "resident_fraction: expected a fraction from 0 to 1, got 1.5"),
    (("warm", True), {}, "resident_fraction: expected a fraction from 0 to 1, got True"),
    (("warm", 0.5), {"resident_min": 0.0}, "resident_min: expected a fraction above 0"),
])
def test_label_value_refuses(args: tuple, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        nfd.label_value(*args, **kw)


def test_best_values() -> None:
    rows = [("a/x", "ready"), ("a/x", "hot"), ("a/x", "warm"), ("b/y", "ready"), ("b/y", "warm")]
    assert nfd.best_values(rows) == {"a/x": "hot", "b/y": "warm"}
    with pytest.raises(ValueError, match="expected one of hot, warm, ready, got 'cold'"):
        nfd.best_values([("a/x", "cold")])


# -- the file's text -------------------------------------------------------------------------------

HEADER = ("# written by weightd at 2024-05-01T12:00:00Z: the models this node holds "
          "(weightd.io/<model>=hot|warm|ready); replaced when they change, do not edit\n")


def test_render_exact() -> None:
    text = nfd.render({"zeta/x": "warm", "acme/llama-70b": "hot", "acme/embed": "ready"},
                      expiry_s=600, clock=lambda: T0)
    assert text == (HEADER
                    + "# +expiry-time=2024-05-01T12:10:01Z\n"   # (rounded up to the second)
                    + "weightd.io/acme.embed=ready\n"
                    + "weightd.io/acme.llama-70b=hot\n"
                    + "weightd.io/zeta.x=warm\n")
    assert nfd.render({"acme/embed": "hot"}, clock=lambda: T0) == HEADER + "weightd.io/acme.embed=hot\n"
    assert nfd.render({}, clock=lambda: T0) == HEADER


def test_rendered_labels_as_nfd_reads_them_and_expire() -> None:
    text = nfd.render({"acme/llama-70b": "hot", "llama-3.1": "warm"}, expiry_s=600, clock=lambda: T0)
    assert nfd_labels(text, T0 + 599) == {"weightd.io/acme.llama-70b": "hot",
                                          f"weightd.io/llama-3.1-{h8('llama-3.1')}": "warm"}
    assert nfd_labels(text, T0 + 602) == {}   # weightd stopped rewriting it: the labels go


@pytest.mark.parametrize("holdings, kw, message", [
    ({"acme/x": "cold"}, {}, "label value for 'acme/x': expected one of hot, warm, ready, got 'cold'"),
    ({"acme/x": "hot"}, {"expiry_s": 0}, "expiry_s: expected a positive number of seconds"),
    ({"acme/x": "hot"}, {"expiry_s": float("inf")}, "expiry_s: expected a positive number of seconds"),
])
def test_render_refuses(holdings: dict, kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        nfd.render(holdings, clock=lambda: T0, **kw)


def test_render_refuses_two_models_on_one_label(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nfd, "label_key", lambda model: "same")   # (a 32-bit hash collision, staged)
    with pytest.raises(ValueError, match="models 'a/x' and 'b/y' share the label weightd.io/same"):
        nfd.render({"a/x": "hot", "b/y": "warm"}, clock=lambda: T0)


# -- writing the file ------------------------------------------------------------------------------

@pytest.fixture
def fdir(tmp_path: Path) -> Path:
    d = tmp_path / "features.d"
    d.mkdir()
    return d


def test_write_is_atomic_by_a_dot_temporary(fdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[tuple[str, str, list[str]]] = []
    real_rename = os.rename

    def rename(src, dst, **kw):  # what NFD could list at the moment of the rename
        renamed.append((src, dst, sorted(os.listdir(fdir))))
        return real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", rename)
    old = os.umask(0o077)
    try:
        assert nfd.write_features(fdir, "weightd", TEXT) is True
    finally:
        os.umask(old)
    [(src, dst, listed)] = renamed
    assert dst == "weightd" and src.startswith(".weightd.") and listed == [src]   # NFD skips dot files
    assert (fdir / "weightd").read_text() == TEXT
    assert stat.S_IMODE((fdir / "weightd").stat().st_mode) == 0o644
    assert os.listdir(fdir) == ["weightd"]        # no temporary left


def test_unchanged_content_is_not_rewritten(fdir: Path) -> None:
    first = nfd.render({"acme/x": "hot"}, clock=lambda: T0)
    assert nfd.write_features(fdir, "weightd", first) is True
    path = fdir / "weightd"
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    before = path.stat()
    assert nfd.write_features(fdir, "weightd", first) is False
    later = nfd.render({"acme/x": "hot"}, clock=lambda: T0 + 3600)   # only the header's time differs
    assert nfd.write_features(fdir, "weightd", later) is False
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert path.read_text() == first             # the file keeps the time it was written
    assert nfd.write_features(fdir, "weightd", nfd.render({"acme/x": "warm"}, clock=lambda: T0)) is True
    assert path.stat().st_ino != before.st_ino   # replaced, not rewritten in place
    assert "weightd.io/acme.x=warm" in path.read_text()


def test_expiry_is_refreshed_after_refresh_s(fdir: Path) -> None:
    path = fdir / "weightd"

    def text(t: float) -> str:
        return nfd.render({"acme/x": "hot"}, expiry_s=600, clock=lambda: t)

    assert nfd.write_features(fdir, "weightd", text(T0)) is True
    os.utime(path, (T0, T0))
    # without refresh_s a new expiry time is a change
    assert nfd.write_features(fdir, "weightd", text(T0 + 10), clock=lambda: T0 + 10) is True
    os.utime(path, (T0, T0))
    assert nfd.write_features(fdir, "weightd", text(T0 + 20), refresh_s=300, clock=lambda: T0 + 20) is False
    assert "+expiry-time=2024-05-01T12:10:11Z" in path.read_text()   # (kept: T0 + 10 + 600, rounded up)
    assert nfd.write_features(fdir, "weightd", text(T0 + 301), refresh_s=300, clock=lambda: T0 + 301) is True
    assert "+expiry-time=2024-05-01T12:15:02Z" in path.read_text()
    os.utime(path, (T0 + 9999, T0 + 9999))        # an mtime in the future (the clock went back): rewrite
    assert nfd.write_features(fdir, "weightd", text(T0 + 400), refresh_s=300, clock=lambda: T0 + 400) is True


@pytest.mark.parametrize("same_content", [False, True])
def test_planted_symlink_at_the_name_is_replaced_not_followed(fdir: Path, tmp_path: Path,
                                                              same_content: bool) -> None:
    victim = tmp_path / "victim"
    precious = TEXT if same_content else "precious\n"   # (even if it already says the same)
    victim.write_text(precious)
    os.utime(victim, ns=(1_000_000_000, 1_000_000_000))
    (fdir / "weightd").symlink_to(victim)
    assert nfd.write_features(fdir, "weightd", TEXT) is True
    assert not (fdir / "weightd").is_symlink()
    assert (fdir / "weightd").read_text() == TEXT
    assert victim.read_text() == precious and victim.stat().st_mtime_ns == 1_000_000_000


def test_planted_fifo_at_the_name_is_replaced_without_blocking(fdir: Path) -> None:
    os.mkfifo(fdir / "weightd")
    assert nfd.write_features(fdir, "weightd", TEXT) is True
    assert (fdir / "weightd").read_text() == TEXT


@pytest.mark.parametrize("trailing_slash", [False, True])
def test_symlinked_directory_is_refused(tmp_path: Path, trailing_slash: bool) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "features.d"
    link.symlink_to(real, target_is_directory=True)
    where = str(link) + "/" if trailing_slash else link
    with pytest.raises(FeatureFileError, match=r"features\.d is a symlink: refused .*\[intent\] nfd_dir") as exc:
        nfd.write_features(where, "weightd", TEXT)  # type: ignore[arg-type]
    assert isinstance(exc.value, WeightdError)
    assert os.listdir(real) == []


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(FeatureFileError, match=r"features\.d: No such file or directory; create it"):
        nfd.write_features(tmp_path / "features.d", "weightd", TEXT)


def test_directory_at_the_name_is_an_error_and_leaves_nothing(fdir: Path) -> None:
    (fdir / "weightd").mkdir()
    with pytest.raises(FeatureFileError, match=r"features\.d/weightd: Is a directory"):
        nfd.write_features(fdir, "weightd", TEXT)
    assert os.listdir(fdir) == ["weightd"]


@pytest.mark.parametrize("name", ["", ".weightd", "a/b", "..", "x\n"])
def test_bad_file_names(fdir: Path, name: str) -> None:
    with pytest.raises(FeatureFileError, match="expected a plain file name"):
        nfd.write_features(fdir, name, TEXT)
    assert os.listdir(fdir) == []


def test_larger_than_nfd_reads(fdir: Path) -> None:
    text = "".join(f"weightd.io/m{i}=hot\n" for i in range(5000))
    with pytest.raises(FeatureFileError, match="NFD skips a file over 65536"):
        nfd.write_features(fdir, "weightd", text)
    assert os.listdir(fdir) == []


# -- ready-in labels (issue 37: how soon a server could read the model here) ------------------------

@settings(max_examples=400, deadline=None)
@given(_names, _names)
def test_ready_in_keys_are_label_names_and_never_another_label(a: str, b: str) -> None:
    ra, rb = nfd.label_key(a, nfd.READY_SUFFIX), nfd.label_key(b, nfd.READY_SUFFIX)
    assert_label_name(ra)
    assert ra.endswith(".ready-in")
    assert ra != nfd.label_key(b) and rb != nfd.label_key(a)   # (never a model's tier label, its own included)
    if a != b:
        assert ra != rb


def test_a_name_ending_like_a_ready_in_key_is_hashed() -> None:
    assert nfd.label_key("acme/llama.ready-in").startswith("acme.llama.ready-in-")
    assert nfd.label_key("acme/llama", nfd.READY_SUFFIX) == "acme.llama.ready-in"
    long = "acme/" + "x" * 55   # (plain as a tier key, 60 characters; hashed with the suffix)
    assert nfd.label_key(long) == "acme." + "x" * 55
    assert len(nfd.label_key(long, nfd.READY_SUFFIX)) == 63


def test_render_ready_in_labels() -> None:
    text = nfd.render({"acme/llama-70b": "hot"}, expiry_s=600, clock=lambda: T0,
                      ready_in={"acme/llama-70b": "0s", "acme/embed": "5m", "llama-3.1": "long"})
    assert nfd_labels(text, T0 + 1) == {"weightd.io/acme.llama-70b": "hot",
                                        "weightd.io/acme.llama-70b.ready-in": "0s",
                                        "weightd.io/acme.embed.ready-in": "5m",
                                        f"weightd.io/llama-3.1-{h8('llama-3.1')}.ready-in": "long"}
    for line in text.splitlines():
        if not line.startswith("#"):
            name, _, value = line.partition("=")
            assert_label_name(name.partition("/")[2])
            assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", value)


def test_render_refuses_a_bad_ready_in_value() -> None:
    with pytest.raises(ValueError, match=re.escape("ready-in value for 'acme/x': expected one of 0s, 10s, 1m, 5m, "
                                                   "long, got '2h'")):
        nfd.render({}, clock=lambda: T0, ready_in={"acme/x": "2h"})


def test_ready_in_labels_only_while_they_fit(fdir: Path) -> None:
    """900 models: their tier labels fit NFD's 65,536 bytes, with their ready-in lines they would not
    (and NFD would then skip the file, tier labels too): every tier label is written, ready-in labels
    while they fit, and a comment says how many were left out."""
    models = {f"acme/model-number-{i:04d}": "hot" for i in range(900)}
    text = nfd.render(models, expiry_s=600, clock=lambda: T0, ready_in={m: "long" for m in models})
    assert len(text.encode()) <= nfd.MAX_FEATURE_FILE_BYTES
    labels = nfd_labels(text, T0 + 1)
    assert {nfd.label_name(m) for m in models} <= set(labels)
    ready = [k for k in labels if k.endswith(nfd.READY_SUFFIX)]
    assert 0 < len(ready) < 900
    assert re.search(rf"^# {900 - len(ready)} of 900 ready-in labels left out", text, re.M)
    assert nfd.write_features(fdir, "weightd", text)
    assert nfd_labels((fdir / "weightd").read_text(), T0 + 1) == labels
    few = nfd.render(dict(list(models.items())[:10]), clock=lambda: T0, ready_in={m: "0s" for m in list(models)[:10]})
    assert "left out" not in few and len(nfd_labels(few, T0)) == 20
