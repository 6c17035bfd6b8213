"""How a weightd process ends when a native runtime could still call into Python.

obstore's async calls deliver each result from a tokio thread that takes the GIL
(pyo3-async-runtimes: ``loop.call_soon_threadsafe``). The caller can have its result, and the
process can reach the interpreter's teardown, while that thread is still inside Python on its way
out; it then takes the GIL during finalization, and the process aborts (SIGABRT, exit -6 instead of
the command's code; seen on about one CLI run in three that read object storage and then failed).
Such a process ends with :func:`os._exit` once its output is flushed and its logs are shut down:
nothing of weightd's is left to the teardown (files and the state database are closed by then, every
write already durable)."""

from __future__ import annotations

import os
import sys


def native_runtime_loaded() -> bool:
    return "obstore" in sys.modules


def leave(code: int) -> None:
    """End the process with ``code`` now, output flushed, skipping the interpreter's teardown."""
    import logging   # (here: a command that logged nothing, path or status through the daemon, need not load it)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def finish(code: int) -> int:
    """``code``, or the process ended with it here when a native runtime was loaded."""
    if native_runtime_loaded():
        leave(code)
    return code
