"""What the node counts and remembers of each preload's outcome: the metrics (failures by reason,
fallbacks, loading latency, bytes by source, time to ready), the recent fallbacks and failures that
``status`` shows and ``doctor`` reads, and the exact recent times to ready
(:class:`~weightd.node.ready_times.ReadyTimes`). One per :class:`~weightd.node.service.NodeService`.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

from tiering import IntegrityError, NoSpace, SignatureRefused

from .ready_times import ReadyTimes, TransferRates

if TYPE_CHECKING:
    from ..metrics import Metrics
    from .requests import PreloadRequest

EVENTS_KEPT = 200          # recent fallbacks and failures kept for ``status`` and ``doctor``
EVENTS_WINDOW_S = 3600.0   # ... and shown for this long


class Outcomes:
    """The counting of one node's preloads, into its ``metrics`` (a Metrics or a Tally)."""

    def __init__(self, metrics: "Metrics") -> None:
        self.metrics = metrics
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)  # fallbacks and failures, for doctor
        self.ready_times = ReadyTimes()
        self.rates = TransferRates()   # what the ready estimate reads (weightd.node.ready_estimate)

    def failed(self, req: "PreloadRequest", exc: BaseException) -> str:
        """Count a preload that ended with ``exc``; its reason (``integrity``, ``no_space``, ``timeout``,
        ``not_found`` or ``error``)."""
        reason = ("integrity" if isinstance(exc, IntegrityError) else "no_space" if isinstance(exc, NoSpace)
                  else "timeout" if isinstance(exc, TimeoutError) else "not_found" if isinstance(exc, FileNotFoundError)
                  else "error")
        self.metrics.preload_failures.labels(reason, req.name).inc()
        self.events.append({"at": time.time(), "kind": "failure", "ref": req.ref, "from": req.tier, "to": "",
                            "reason": f"{reason}: {exc}"[:300]})
        if isinstance(exc, SignatureRefused):
            self.metrics.trust_refusals.labels(exc.reason).inc()
        elif isinstance(exc, IntegrityError):
            self.metrics.hash_failures.inc()
        return reason

    def succeeded(self, r: Any, d: dict[str, Any], seconds: float) -> None:
        """Count a preload's result ``r`` (``d``: its report) that took ``seconds``."""
        m = self.metrics
        ref = f"{r.name}@{r.version}"
        if r.tier_fallback:
            m.fallbacks.labels("tier", r.tier_fallback["from"], r.tier_fallback["to"]).inc()
            self.events.append({"at": time.time(), "kind": "tier_fallback", "ref": ref, "from": r.tier_fallback["from"],
                                "to": r.tier_fallback["to"], "reason": r.tier_fallback["reason"]})
        for f in r.source_fallbacks:
            m.fallbacks.labels("source", f.source, f.to).inc()
            self.events.append({"at": time.time(), "kind": "source_fallback", "ref": ref, "from": f.source,
                                "to": f.to, "reason": f.reason})
        by_source = d["bytes_by_source"]
        self.rates.observe(d, seconds)
        m.last_success.labels(r.name).set(time.time())
        if not d.get("already_present"):  # (a no-op must not pull the loading latency down)
            # the byte counter's source names: where most bytes came from (a promotion between local tiers
            # moves nothing from outside: local_reuse)
            source = max(by_source, key=lambda k: by_source[k]) if any(by_source.values()) else "local_reuse"
            m.loading.labels(r.name, r.version, r.tier, source).observe(seconds)
        for src, n in by_source.items():
            if n:
                m.bytes.labels(src).inc(n)

    def ready(self, name: str, tier: str, seconds: float) -> None:
        """A request for ``name`` answered with its copy in ``tier`` verified, placed and warm."""
        self.metrics.time_to_ready.labels(name, tier).observe(seconds)
        self.ready_times.observe(name, tier, seconds)

    def recent(self) -> list[dict[str, Any]]:
        """The fallbacks and failures of the last ``EVENTS_WINDOW_S``, oldest first."""
        since = time.time() - EVENTS_WINDOW_S
        return [e for e in list(self.events) if e["at"] >= since]
