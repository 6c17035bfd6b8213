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


# -- import circles ------------------------------------------------------------------------------------
PACKAGES = ("weightd", "tiering", "p2p")


def module_files() -> dict[str, Path]:
    """Every module of weightd, tiering and p2p by dotted name (a package by its own name)."""
    out = {}
    for package in PACKAGES:
        for py in (ROOT / package).rglob("*.py"):
            parts = list(py.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = py
    return out


def _surface(py: Path) -> dict[str, str]:
    for node in ast.parse(py.read_text(), str(py)).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_SURFACE":
            return ast.literal_eval(node.value)
    return {}


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The modules ``module`` imports, from every import statement it holds: at module level, under
    ``if TYPE_CHECKING`` (annotations are a dependency too) and inside functions (an import moved into
    a function does not end a circle). ``from PKG import NAME`` depends on PKG and on PKG.NAME when that
    is a module, or on the module the package's lazy surface (``_SURFACE``) names for NAME."""
    py = modules[module]
    here = module.split(".") if py.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(py.read_text(), str(py))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                out.add(name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            if base not in modules:
                continue
            out.add(base)   # (its ``__init__`` runs, and NAME is looked up in it)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    out.add(sub)
                    continue
                target = _surface(modules[base]).get(alias.name) if modules[base].name == "__init__.py" else None
                if target is not None:
                    top = base.split(".")[0] + "."
                    target = target if target.startswith(top) else f"{base}.{target}"
                out.add(target if target in modules else base)
    return out & set(modules) - {module, ""}


def import_circles(modules: dict[str, Path]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = {m: imports_of(m, modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles() -> None:
    """No module of weightd, tiering or p2p reaches itself through imports, annotation-only or
    function-level ones included: a reader can hold each module with what it imports, below it."""
    circles = import_circles(module_files())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_sees_annotation_and_function_imports(tmp_path: Path) -> None:
    """The check itself: a circle closed only by an ``if TYPE_CHECKING`` import, one closed only by an
    import inside a function, and a package whose ``__init__`` imports a module that imports from the
    package (``from . import x``) are all found; a package's lazy surface is followed."""
    pkg = tmp_path / "tiering"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('_SURFACE: dict[str, str] = {"B": "b"}\n')
    (pkg / "a.py").write_text("from tiering import B\n")
    (pkg / "b.py").write_text("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .a import A\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("def f():\n    from . import d\n")
    (pkg / "sub" / "d.py").write_text("from ..sub.c import f\n")
    (pkg / "e.py").write_text("import tiering.a\n")
    modules = {}
    for py in pkg.rglob("*.py"):
        parts = list(py.relative_to(tmp_path).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = py
    assert import_circles(modules) == [["tiering.a", "tiering.b"], ["tiering.sub.c", "tiering.sub.d"]]
    (pkg / "sub" / "d.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("def main():\n    from .c import f\n")
    assert import_circles(modules) == [["tiering.a", "tiering.b"], ["tiering.sub", "tiering.sub.c"]]


MODULE_LINES, FUNCTION_LINES = 400, 60
# Each exception with its reason: a reader is better served by the whole than by pieces.
LONG_MODULES: dict[str, str] = {}
LONG_FUNCTIONS: dict[str, str] = {}


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines of every module of weightd, tiering and p2p, and of every function in them (``def`` to its
    last line, nested functions counted in their parent too), keyed ``path`` and ``path:qualname``."""
    modules, functions = {}, {}
    for package in ("weightd", "tiering", "p2p"):
        for py in sorted((ROOT / package).rglob("*.py")):
            rel = str(py.relative_to(ROOT))
            text = py.read_text()
            modules[rel] = text.count("\n") + (not text.endswith("\n"))

            def walk(node: ast.AST, prefix: str) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        name = f"{prefix}{child.name}"
                        if not isinstance(child, ast.ClassDef):
                            functions[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
                        walk(child, name + ".")
                    else:
                        walk(child, prefix)
            walk(ast.parse(text, rel), "")
    return modules, functions


def test_modules_and_functions_stay_small() -> None:
    """No module over 400 lines and no function over 60 (issue #33), but for the listed exceptions, each
    with its reason; an exception that no longer needs its place is removed from the list."""
    modules, functions = sizes()
    long_modules = {m: n for m, n in modules.items() if n > MODULE_LINES}
    long_functions = {f: n for f, n in functions.items() if n > FUNCTION_LINES}
    assert set(long_modules) <= set(LONG_MODULES), sorted(set(long_modules) - set(LONG_MODULES))
    assert set(long_functions) <= set(LONG_FUNCTIONS), sorted(set(long_functions) - set(LONG_FUNCTIONS))
    stale = (set(LONG_MODULES) - set(long_modules)) | (set(LONG_FUNCTIONS) - set(long_functions))
    assert not stale, f"listed as long but no longer are: {sorted(stale)}"
