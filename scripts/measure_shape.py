"""Module and function sizes of weightd/, tiering/, p2p/ (issue 13's measures): .venv/bin/python scripts/measure_shape.py ."""
import ast, sys, pathlib
root = pathlib.Path(sys.argv[1])
mods, funcs = [], []
for pkg in ("weightd", "tiering", "p2p"):
    for f in sorted((root / pkg).rglob("*.py")):
        n = len(f.read_text().splitlines())
        if n > 400: mods.append((n, str(f.relative_to(root))))
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ln = node.end_lineno - node.lineno + 1
                if ln > 60: funcs.append((ln, f"{f.relative_to(root)}:{node.name}"))
print("modules > 400 lines:", len(mods), sorted(mods, reverse=True))
print("functions > 60 lines:", len(funcs), sorted(funcs, reverse=True))
