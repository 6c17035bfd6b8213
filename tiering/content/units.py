"""Sizes and rates as operators write them: ``64GiB``, ``100MB``, ``40%``, ``4096``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
    # Kubernetes quantities (a limit copied from a manifest): Ki, Mi, Gi, Ti, Pi are binary
    "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4, "pi": 1024**5,
}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a string with a decimal (kB, MB, GB) or binary (KiB, MiB, GiB; Kubernetes'
    Ki, Mi, Gi) unit."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '64GiB' or '100MB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size like '64GiB' or '100MB', got {value!r}")
    m = _SIZE_RE.fullmatch(value)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"expected a size like '64GiB' or '100MB', got {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_fraction(value: int | float | str) -> float:
    """A fraction in [0, 1] from ``"40%"`` or ``0.4``."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            frac = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ValueError(f"expected a percentage like '40%', got {value!r}") from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        frac = float(value)
    else:
        raise ValueError(f"expected a percentage like '40%' or a fraction like 0.4, got {value!r}")
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"must be between 0% and 100%, got {value!r}")
    return frac


def format_bytes(n: float) -> str:
    """Human size with binary units: ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_rate(bytes_per_s: float) -> str:
    """Human rate with binary units, as every output prints one: ``1.5 GiB/s``, ``310.5 MiB/s``."""
    return f"{format_bytes(bytes_per_s)}/s"


def format_duration(seconds: float) -> str:
    """``42s``, ``9m58s``, ``2h05m``: whole seconds, rounded once (never ``9m60s``)."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


#: leases and timeouts: finite and at most a week (the one home of this bound: the tiers, the service,
#: the daemon's API and the CLI's options all check against it)
MAX_SECONDS = 7 * 24 * 3600


def piece_size_for(total_bytes: int) -> int:
    """The piece size of a version's torrent unless it was published with one: 4 MiB under 1 GiB, 8 MiB
    under 16 GiB, else 16 MiB (fewer pieces, a bounded piece map); an expert copy's reservation counts
    whole pieces at its ranges' edges by it too."""
    if total_bytes < (1 << 30):
        return 4 << 20
    if total_bytes < (16 << 30):
        return 8 << 20
    return 16 << 20
