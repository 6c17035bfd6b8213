"""What two adjacent weightd versions promise each other (docs/install.md "Upgrades, rollbacks and versions that may be mixed").

Every JSON body one weightd sends another (a worker's report and rollout-slot requests to the origin,
the CLI's requests to its node daemon) carries ``"v"``, the message revision within the route's major
version (the ``/v1/`` of its path), and ``"weightd"``, the sender's version. Within a major version
messages only grow: a receiver ignores keys it does not know, still checks the type and value of every
key it knows (a bad one is refused, 400, one line naming it), and reads a body without ``"v"`` as the
oldest revision, 1. A change a receiver could not safely ignore gets a new route (``/v2/...``), never
a new meaning for an old key.

Light on purpose: the CLI's client imports it on every start.
"""

from __future__ import annotations

import re
from typing import Any

from . import __version__

MESSAGE_VERSION = 1        # the revision this weightd sends (it reads every revision of /v1/)
MAX_MESSAGE_VERSION = (1 << 31) - 1
_SENDER = r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}"   # a PEP 440 version, local part included (compiled when used)


def stamped(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as this weightd sends it: with its message revision and its own version."""
    return {"v": MESSAGE_VERSION, "weightd": __version__, **body}


def check_envelope(body: dict[str, Any]) -> tuple[int, str | None]:
    """The message revision (1 when absent: the oldest) and the sender's weightd version (None when
    absent) of a received JSON object; ValueError, one line naming the key, when either is malformed.
    A revision above :data:`MESSAGE_VERSION` is accepted: what it adds, this version ignores."""
    v = body.get("v", 1)
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_MESSAGE_VERSION:
        raise ValueError(f"'v': expected the message version, an integer from 1, got {_show(v)}")
    sender = body.get("weightd")
    if sender is not None and (not isinstance(sender, str) or not re.fullmatch(_SENDER, sender)):
        raise ValueError(f"'weightd': expected the sender's weightd version (like '0.1.0'), got {_show(sender)}")
    return v, sender


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."
