"""Imports point weightd -> p2p -> tiering, never back (design §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"tiering": {"p2p", "weightd"}, "p2p": {"weightd"}}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package: str) -> None:
    offenders = []
    for py in sorted((ROOT / package).rglob("*.py")):
        bad = imported_packages(py) & FORBIDDEN[package]
        if bad:
            offenders.append(f"{py.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, offenders


def test_daemon_never_imports_torch() -> None:
    for package in ("weightd", "tiering", "p2p"):
        for py in (ROOT / package).rglob("*.py"):
            assert "torch" not in imported_packages(py), py


def test_public_surface_exports_exist() -> None:
    import tiering
    for name in tiering.__all__:
        assert hasattr(tiering, name), name
