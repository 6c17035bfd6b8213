"""Lazy package surfaces: a package lists its public names and the module that defines each, and a
name's module is imported when the name is first used (``weightd residency`` must not import warming,
hashing or the tier roots' checks to reach ``residency``).

``surface(package, table)`` returns the package's ``__getattr__``, ``__dir__`` and ``__all__``. A
module in the table is relative to the package ("content.units"), or absolute when it starts with the
top package's name and a dot ("tiering._syscalls"); ``renamed`` maps a public name to the name it has
in its module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def surface(package: str, table: dict[str, str], renamed: dict[str, str] | None = None
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    top = package.split(".", 1)[0] + "."
    renamed = renamed or {}
    names = sorted(table)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        qualified = module if module.startswith(top) else f"{package}.{module}"
        __import__(qualified)   # (not importlib.import_module: the importlib package and warnings cost ~0.6 ms)
        value = getattr(sys.modules[qualified], renamed.get(name, name))
        setattr(sys.modules[package], name, value)   # (the next use is a plain attribute)
        return value

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
