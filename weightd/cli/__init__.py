"""The ``weightd`` command line (design §5).

:func:`main` is the entry point: :mod:`.fast` answers the commands that must start in vmtouch time
without importing click; everything else, and anything the fast parser does not fully recognise, is
the click CLI in :mod:`.full` (commands by group: :mod:`.tiers`, :mod:`.content`, :mod:`.intent`,
:mod:`.pagecache`, :mod:`.diagnose`, :mod:`.system`; how results are shown: :mod:`.output`).
Importing this package imports neither.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> int:
    from ..exiting import finish
    from .fast import main as entry
    return finish(entry(argv))   # (no teardown after object storage was used: see weightd.exiting)


def __getattr__(name: str) -> Any:
    if name == "cli":
        from .full import cli
        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
