"""Progress on stderr, only when stderr is a terminal (design §5: long work shows progress)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


QUIET = False  # weightd -q: no progress bars


def set_quiet() -> None:
    """``weightd -q``: no progress bars, no warnings on stderr."""
    global QUIET
    QUIET = True


def quiet() -> bool:
    return QUIET


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


def describe(snap: dict[str, Any]) -> str:
    """One line for a transfer snapshot (:meth:`tiering.progress.Progress.snapshot`, from this process
    or streamed by the daemon): ``acme/llama@v1 → hot  copy from cold``, with the back-off state
    while warming yields to serving."""
    from tiering import format_bytes
    head = str(snap.get("label") or "?") + (f" → {snap['tier']}" if snap.get("tier") else "")
    phase = str(snap.get("phase") or "")
    what = {"copy": f"copy from {snap.get('source') or '?'}", "wait": f"waiting {snap.get('detail') or ''}".strip(),
            "resolve": snap.get("detail") or "resolving"}.get(phase, phase)
    throttle = snap.get("throttle")
    if phase == "warm" and isinstance(throttle, dict) and throttle.get("cap_bytes_per_s"):
        what += f" (yielding to serving: capped at {format_bytes(throttle['cap_bytes_per_s'])}/s)"
    note = network_note(snap.get("network"))
    if note:
        what += f" ({note})"
    if snap.get("waiters", 0) > 1:
        what += f" [{snap['waiters']} waiting]"
    return f"{head}  {what}"


def network_note(net: Any) -> str:
    """``yielding to serving traffic: 3.1 GiB/s of 12.5``: weightd's own limit (the lower of its two
    directions) of the link's capacity, while ``[network]`` holds weightd back (status's ``network``
    block); "" otherwise."""
    if not isinstance(net, dict) or not net.get("yielding"):
        return ""
    from tiering import format_bytes
    limits = [d.get("limit_bytes_per_s") for d in (net.get("download"), net.get("upload")) if isinstance(d, dict)]
    limit = min((x for x in limits if isinstance(x, (int, float))), default=None)
    cap = net.get("capacity_bytes_per_s") or 0
    if limit is None or not cap:
        return ""
    mine, of = format_bytes(limit).split(" "), format_bytes(cap).split(" ")
    capacity = of[0] if mine[1] == of[1] else " ".join(of)
    return f"yielding to serving traffic: {' '.join(mine)}/s of {capacity}"


def figures(snap: dict[str, Any]) -> str:
    """``1.2 GiB / 4.0 GiB  310.5 MiB/s  ETA 9s``: one set of units (binary), the phase's own rate
    and ETA ("-" while nothing moves: never a guess)."""
    from tiering import format_bytes
    done, total = int(snap.get("done") or 0), int(snap.get("total") or 0)
    amount = f"{format_bytes(done)} / {format_bytes(total)}" if total else (format_bytes(done) if done else "")
    rate = f"{format_bytes(snap['rate'])}/s" if snap.get("rate") else "-"
    eta = snap.get("eta_s")
    eta_text = "-" if eta is None else f"{eta:.0f}s" if eta < 120 else f"{eta / 60:.0f}m"
    return f"{amount}  {rate}  ETA {eta_text}" if amount else f"{snap.get('phase_s', 0):.0f}s"


PLAIN_EVERY_S = 10.0  # not a terminal (an init container's log): a plain line this often


class TransferBar:
    """Draws a transfer's snapshots as one bar on stderr (a terminal, not with -q): the same bar
    whether the snapshots come from this process or from the daemon's progress stream. When stderr
    is not a terminal (``kubectl logs`` of an init container), a plain line every PLAIN_EVERY_S
    instead, so minutes of a 100 GB preload are not a silent log."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.enabled = (sys.stderr.isatty() and not QUIET) if enabled is None else enabled
        self.plain = enabled is None and not QUIET and not self.enabled
        self._progress: Any = None
        self._task: Any = None
        self._started = time.monotonic()
        self._last_line = self._started

    def __enter__(self) -> "TransferBar":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[figures]}"),
                                      console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=None, figures="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    def update(self, snap: dict[str, Any]) -> None:
        if self._progress is None:
            now = time.monotonic()
            if self.plain and now - self._last_line >= PLAIN_EVERY_S:
                self._last_line = now
                print(f"weightd: {describe(snap)}  {figures(snap)}", file=sys.stderr, flush=True)
            return
        total = int(snap.get("total") or 0)
        self._progress.update(self._task, description=describe(snap), total=total or None,
                              completed=min(int(snap.get("done") or 0), total) if total else 0, figures=figures(snap))


@contextmanager
def follow(progress: Any, *, enabled: bool | None = None, every_s: float = 0.2) -> Iterator[None]:
    """While the block runs, draw ``progress`` (a :class:`tiering.progress.Progress` filled by this
    process) every ``every_s`` seconds."""
    import threading
    bar = TransferBar(enabled=enabled)
    if not bar.enabled and not bar.plain:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            bar.update(progress.snapshot())

    with bar:
        t = threading.Thread(target=loop, name="weightd-progress", daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join(timeout=2)
