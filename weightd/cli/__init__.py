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
    _more_open_files()
    return finish(entry(argv))   # (no teardown after object storage was used: see weightd.exiting)


def _more_open_files() -> None:
    """The soft limit of open files raised to the hard one (at most 65,536, the systemd unit's
    LimitNOFILE), as Go programs start: an in-process command keeps a descriptor per directory of a
    compile cache it copies, and a login shell's soft limit is often 1,024."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):   # (not allowed here: the limit stays as it was)
        pass


def __getattr__(name: str) -> Any:
    if name == "cli":
        from .full import cli
        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
