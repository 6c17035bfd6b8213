"""Progress on stderr, only when stderr is a terminal (design §5: long work shows progress)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


QUIET = False  # weightd -q: no progress bars


@contextmanager
def progress_bar(label: str, total_bytes: int, *, enabled: bool | None = None) -> Iterator[Callable[[int], None] | None]:
    """Yield a thread-safe ``advance(nbytes)`` callback, or None when progress is not shown."""
    if enabled is None:
        enabled = sys.stderr.isatty() and not QUIET
    if not enabled or total_bytes <= 0:
        yield None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                  transient=True) as progress:
        task = progress.add_task(label, total=total_bytes)
        yield lambda n: progress.advance(task, n)
