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
    import p2p
    import tiering
    for pkg in (tiering, p2p):
        for name in pkg.__all__:
            assert getattr(pkg, name) is not None, name


def deep_imports(path: Path, package: str) -> list[str]:
    """``from PACKAGE.module import ...`` / ``import PACKAGE.module`` (past its public surface)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.startswith(package + "."):
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith(package + ".")]
    return out


@pytest.mark.parametrize("importer,package", [("weightd", "tiering"), ("p2p", "tiering"), ("weightd", "p2p")])
def test_packages_import_each_other_only_through_their_surface(importer: str, package: str) -> None:
    offenders = [f"{py.relative_to(ROOT)} imports {m}" for py in sorted((ROOT / importer).rglob("*.py"))
                 for m in deep_imports(py, package)]
    assert not offenders, offenders


def test_the_surface_is_lazy() -> None:
    """``import tiering`` for a size parser must not load the tier code or the page-cache engine."""
    import subprocess
    import sys
    code = ("import sys, tiering; tiering.parse_size('1GiB'); "
            "print(sorted(m for m in sys.modules if m.startswith('tiering.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert "tiering.node" not in out and "tiering.pagecache" not in out, out
