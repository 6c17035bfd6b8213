"""One table maps every error type to an exit code and the operator's next step (weightd/errors.py),
and every control-plane error class lives there."""

from __future__ import annotations

import ast
from pathlib import Path

import p2p
import tiering
from weightd import errors
from weightd.errors import DaemonError, PathsSkipped, exit_code_for, hint_for

ROOT = Path(__file__).resolve().parent.parent


def _bare(cls: type) -> BaseException:
    return cls.__new__(cls)  # an instance without running __init__ (the table looks at types only)


def test_the_table_agrees_with_each_packages_own_codes() -> None:
    for pkg in (tiering, p2p):
        for name in pkg.__all__:
            cls = getattr(pkg, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                assert exit_code_for(_bare(cls)) == cls.exit_code, name


def test_control_plane_codes_and_hints() -> None:
    assert exit_code_for(errors.ConfigError("f", "bad")) == 2 and "config show" in hint_for(errors.ConfigError("f", "x"))
    assert exit_code_for(errors.DaemonUnavailable("x")) == 1 and "systemctl" in hint_for(errors.DaemonUnavailable("x"))
    assert exit_code_for(DaemonError("gone", 3, "do this")) == 3 and hint_for(DaemonError("gone", 3, "do this")) == "do this"
    assert exit_code_for(PathsSkipped(2, missing=True, unreadable=True)) == 3
    assert exit_code_for(PathsSkipped(1, missing=False, unreadable=True)) == 2
    assert exit_code_for(PathsSkipped(1, missing=False, unreadable=False)) == 1
    assert exit_code_for(TimeoutError()) == 4 and exit_code_for(FileNotFoundError()) == 3
    assert exit_code_for(OSError(28, "No space left on device")) == 6
    assert exit_code_for(RuntimeError("what")) == 1
    # the same message in another type maps by the type, never by the words
    assert exit_code_for(errors.WeightdError("no such file or directory")) == 1


def test_every_control_plane_error_class_is_in_errors_py() -> None:
    names = {n for n in dir(errors) if isinstance(getattr(errors, n), type)
             and issubclass(getattr(errors, n), BaseException)} | {"Exception", "BaseException"}
    offenders = []
    for py in sorted((ROOT / "weightd").rglob("*.py")):
        if py.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & names or any(b.endswith(("Error", "Exception")) for b in bases):
                    offenders.append(f"{py.relative_to(ROOT)}: {node.name}")
    assert not offenders, offenders
