"""Prometheus metrics (design §6, contract: names start with ``weightd_``).

Event metrics (loading time, bytes by source, evictions, failures) are updated by the daemon as
things happen; state metrics (tier usage, checkpoints, residency) and node pressure (raw counters from
/proc and /sys, so that Prometheus computes rates) are collected at scrape time. The registry is
passed in, so tests use their own.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import __version__
from .node.pressure import read_disks, read_nics, read_softirq_seconds, read_tcp

SOURCES = ("local_reuse", "peer", "origin", "cold")
READY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
LOAD_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


class Metrics:
    def __init__(self, registry: CollectorRegistry, status: Callable[[], dict[str, Any]],
                 p2p: Callable[[], dict[str, int]] | None = None,
                 objstore: Callable[[], Any] | None = None) -> None:
        self.registry = registry
        self._preload_metrics(registry)
        self._daemon_metrics(registry)
        self._intent_metrics(registry)
        info = Gauge("weightd_build_info", "weightd version", ["version"], registry=registry)
        info.labels(__version__).set(1)
        self.start_time = Gauge("weightd_start_time_seconds", "When the daemon started", registry=registry)
        self.start_time.set(time.time())
        registry.register(_StateCollector(status))
        self._ready_labels: dict[str, set[tuple[str, str, str]]] = {}
        registry.register(_PressureCollector())
        registry.register(_P2PCollector(p2p or (lambda: {})))
        registry.register(_ObjectStoreCollector(objstore or (lambda: None)))
        self._ready_estimates: Callable[[], list[dict[str, Any]]] = lambda: []
        registry.register(_ReadyEstimateCollector(lambda: self._ready_estimates()))

    def watch_ready_estimates(self, estimates: Callable[[], list[dict[str, Any]]]) -> None:
        """``weightd_model_ready_estimate_seconds`` reads ``estimates()`` at each scrape (the node
        service's :class:`~weightd.node.ready_estimate.ReadyEstimator`; the last service set wins)."""
        self._ready_estimates = estimates

    def _preload_metrics(self, registry: CollectorRegistry) -> None:
        """What preloads do: latency, bytes by source, evictions, failures, fallbacks, refusals."""
        self.loading = Histogram("weightd_weight_loading_seconds", "One preload that moved or promoted bytes, end "
                                 "to end (a version already in place is not counted); source: where most bytes came from",
                                 ["model", "version", "tier", "source"], buckets=LOAD_BUCKETS, registry=registry)
        self.time_to_ready = Histogram("weightd_time_to_ready_seconds", "From a preload request's arrival to its "
                                       "copy verified, placed and warm (a copy already in place included; "
                                       "exact p50/p95 of recent requests: status --json time_to_ready)",
                                       ["model", "tier"], buckets=READY_BUCKETS, registry=registry)
        self.bytes = Counter("weightd_bytes_transferred", "Bytes placed in a tier, by where they came from",
                             ["source"], registry=registry)
        for s in SOURCES:
            self.bytes.labels(s)
        self.evictions = Counter("weightd_evictions", "Checkpoints evicted", ["tier", "reason"], registry=registry)
        self.evictions_refused = Counter("weightd_evictions_refused", "Removals weightd refused because it cannot "
                                         "prove it made what it would remove (reason: foreign_root, a tier root "
                                         "without its marker holding others' files; unlisted_entries, a version "
                                         "directory holding files its manifest does not list; no_manifest)",
                                         ["tier", "reason"], registry=registry)
        self.hash_failures = Counter("weightd_hash_failures", "Content that did not match its manifest",
                                     registry=registry)
        self.preload_failures = Counter("weightd_preload_failures", "Preloads that failed", ["reason", "model"],
                                        registry=registry)
        self.last_success = Gauge("weightd_preload_last_success_timestamp_seconds", "When a preload of the model "
                                  "last succeeded (unix time; already-in-place included)", ["model"], registry=registry)
        self.fallbacks = Counter("weightd_fallbacks", "Preloads that fell back: kind=tier (hot was full, went "
                                 "to warm) or kind=source (the swarm gave up, copied from cold)",
                                 ["kind", "from", "to"], registry=registry)
        self.in_flight = Gauge("weightd_transfers_in_flight", "Preloads running", ["kind"], registry=registry)
        self.in_flight.labels("local")
        self.in_flight.labels("p2p")
        self.trust_refusals = Counter("weightd_trust_refusals", "Versions (and peers) refused by the trust "
                                      "policy, by reason (unsigned, unknown_key, bad_signature, digest_mismatch, ...)",
                                      ["reason"], registry=registry)

    def _daemon_metrics(self, registry: CollectorRegistry) -> None:
        """The daemon's own work: API requests, reloads, TCP listeners, the tracker, state recovery."""
        self.requests = Counter("weightd_api_requests", "Admin API requests", ["route", "code"], registry=registry)
        self.config_reload_failures = Counter("weightd_config_reload_failures", "SIGHUP reloads rejected",
                                              registry=registry)
        self.tcp_refused = Counter("weightd_tcp_connections_refused", "TCP connections closed at accept, before a "
                                   "byte was read: not_allowed (outside the listener's allow list), listener_full, "
                                   "address_full (over [listeners] caps)", ["listener", "reason"], registry=registry)
        self.tcp_open = Gauge("weightd_tcp_connections", "Open connections on each TCP listener", ["listener"],
                              registry=registry)
        self.tracker_peers = Gauge("weightd_tracker_peers", "Peers the origin's tracker holds, all swarms (0 "
                                   "elsewhere)", registry=registry)
        self.state_recoveries = Counter("weightd_state_recoveries", "Corrupt state databases moved aside and "
                                        "rebuilt from the tier directories", registry=registry)

    def _intent_metrics(self, registry: CollectorRegistry) -> None:
        """Fleet intent: refused files, failed fetches, prewarms, what is ready and what is served."""
        self.intent_errors = Counter("weightd_intent_errors", "Intent files refused (the previous intent kept "
                                     "running)", registry=registry)
        self.intent_failures = Counter("weightd_intent_fetch_failures", "Transfers fleet intent started that "
                                       "failed (retried after a back-off)", ["model"], registry=registry)
        self.intent_imports = Counter("weightd_intent_imports", "Checks of intent's [[import]] entries, by result: "
                                      "published (a new commit imported), up_to_date, failed", ["result"],
                                      registry=registry)
        self.intent_prewarms = Counter("weightd_intent_prewarms", "Models prewarmed because the forecaster "
                                       "expected them", ["tier"], registry=registry)
        self.model_ready = Gauge("weightd_model_ready", "A complete copy of the version is in the tier (1)",
                                 ["model", "version", "tier"], registry=registry)
        self.intent_serving = Gauge("weightd_intent_serving", "The version fleet intent has this node serve, per "
                                    "entry's model (1): during a rollout, the old one until the new one is here",
                                    ["model", "version", "tier"], registry=registry)

    def set_model_ready(self, holdings: list[dict[str, Any]]) -> None:
        """``weightd_model_ready`` and ``weightd_intent_serving`` from what the node holds now (the
        series of copies that went away vanish)."""
        for gauge, rows in ((self.model_ready, holdings), (self.intent_serving, [h for h in holdings if h["serving"]])):
            now = {(h["model"], h["version"], h["tier"]) for h in rows}
            for gone in self._ready_labels.get(gauge._name, set()) - now:
                gauge.remove(*gone)
            for labels in now:
                gauge.labels(*labels).set(1)
            self._ready_labels[gauge._name] = now


class _ReadyEstimateCollector(Collector):
    """Seconds until a server could start reading each version the node knows from its best tier
    (``weightd.node.ready_estimate``: 0 when resident; unknown estimates are left out)."""

    def __init__(self, estimates: Callable[[], list[dict[str, Any]]]) -> None:
        self.estimates = estimates

    def collect(self) -> Iterable[Any]:
        g = GaugeMetricFamily("weightd_model_ready_estimate_seconds", "Estimated seconds until a server could start "
                              "reading the version from the tier (0: resident now), from rates this node measured",
                              labels=["model", "version", "tier"])
        try:
            rows = self.estimates()
        except Exception:  # noqa: BLE001 (a scrape never fails for an estimate; the next one tries again)
            rows = []
        for e in rows:
            if e.get("seconds") is not None:
                g.add_metric([e["model"], e["version"], e["tier"]], e["seconds"])
        yield g


class _ObjectStoreCollector(Collector):
    """An object-store cold tier's requests, errors by kind and bytes (``tiering.sources.s3.client.Stats``);
    nothing when the cold tier is a path."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Any]:
        st = self.stats()
        if st is None:
            return
        with st.lock:
            requests, errors = dict(st.requests), dict(st.errors)
            read, written = st.bytes_read, st.bytes_written
        req = CounterMetricFamily("weightd_objstore_requests", "Requests to the object-store cold tier, by operation "
                                  "(get is one ranged GET)", labels=["op"])
        for op in ("get", "head", "list", "put"):
            req.add_metric([op], requests.get(op, 0))
        yield req
        err = CounterMetricFamily("weightd_objstore_errors", "Failed object-store requests, by kind (throttled: 503 "
                                  "SlowDown; short_read; access_denied; not_found; precondition: changed object; ...)",
                                  labels=["kind"])
        for kind in sorted(set(errors) | {"throttled", "short_read", "access_denied", "error"}):
            err.add_metric([kind], errors.get(kind, 0))
        yield err
        nbytes = CounterMetricFamily("weightd_objstore_bytes", "Bytes received from (read) and sent to (written) "
                                     "the object store", labels=["direction"])
        nbytes.add_metric(["read"], read)
        nbytes.add_metric(["written"], written)
        yield nbytes


class _P2PCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, int]]) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Any]:
        s = self.stats()
        yield CounterMetricFamily("weightd_p2p_upload_bytes", "Payload bytes uploaded to peers",
                                  value=s.get("upload_bytes", 0))
        yield CounterMetricFamily("weightd_p2p_download_bytes", "Payload bytes downloaded from the swarm",
                                  value=s.get("download_bytes", 0))
        yield GaugeMetricFamily("weightd_p2p_peers", "Connected peers", value=s.get("peers", 0))
        yield GaugeMetricFamily("weightd_p2p_seeding", "Versions being seeded", value=s.get("seeding", 0))
        yield CounterMetricFamily("weightd_p2p_hash_failures", "Pieces from peers that failed their SHA-256 check",
                                  value=s.get("hash_failures", 0))
        yield CounterMetricFamily("weightd_p2p_peer_bans", "Peers banned for sending corrupt data",
                                  value=s.get("peer_bans", 0))


class _StateCollector(Collector):
    """Tier usage and capacity, checkpoints per tier, page-cache residency per model."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self.status = status

    def collect(self) -> Iterable[Any]:
        st = self.status()
        used = GaugeMetricFamily("weightd_tier_used_bytes", "Bytes of complete checkpoints in the tier", labels=["tier"])
        cap = GaugeMetricFamily("weightd_tier_capacity_bytes", "The tier's budget", labels=["tier"])
        high = GaugeMetricFamily("weightd_tier_high_watermark_ratio", "Evict above this share of capacity",
                                 labels=["tier"])
        staging = GaugeMetricFamily("weightd_tier_staging_bytes", "Bytes reserved by transfers in progress",
                                    labels=["tier"])
        count = GaugeMetricFamily("weightd_checkpoints", "Complete checkpoints in the tier", labels=["tier"])
        for t, info in st["tiers"].items():
            used.add_metric([t], info["used_bytes"])
            cap.add_metric([t], info["capacity_bytes"])
            high.add_metric([t], info["high_watermark"])
            staging.add_metric([t], info["staging_bytes"])
            count.add_metric([t], info["checkpoints"])
        resident = GaugeMetricFamily("weightd_pagecache_resident_bytes", "Page-cache resident bytes of a checkpoint",
                                     labels=["model", "version", "tier"])
        size = GaugeMetricFamily("weightd_checkpoint_bytes", "Size of a checkpoint held in a tier",
                                 labels=["model", "version", "tier"])
        pinned = GaugeMetricFamily("weightd_checkpoint_pinned", "1 if the checkpoint is pinned",
                                   labels=["model", "version"])
        leases = GaugeMetricFamily("weightd_leases", "Leases held on local copies", labels=["tier"])
        in_use = GaugeMetricFamily("weightd_copies_in_use", "Local copies some process has open or mapped",
                                   labels=["tier"])
        n_leases = dict.fromkeys(st["tiers"], 0)
        n_in_use = dict.fromkeys(st["tiers"], 0)
        for c in st["checkpoints"]:
            pinned.add_metric([c["name"], c["version"]], 1 if c["pinned"] else 0)
            for t, info in c["tiers"].items():
                resident.add_metric([c["name"], c["version"], t], info["resident_bytes"])
                size.add_metric([c["name"], c["version"], t], c["bytes"])
                n_leases[t] = n_leases.get(t, 0) + len(info.get("leases", ()))
                n_in_use[t] = n_in_use.get(t, 0) + (1 if info.get("in_use") else 0)
        for t, n in n_leases.items():
            leases.add_metric([t], n)
        for t, n in n_in_use.items():
            in_use.add_metric([t], n)
        phases = GaugeMetricFamily("weightd_transfer_phase", "Preloads in flight by phase (the daemon's single "
                                   "flights)", labels=["phase"])
        ratio = GaugeMetricFamily("weightd_transfer_progress_ratio", "How far the current phase of a transfer "
                                  "in flight is (0-1)", labels=["model", "version", "tier", "phase"])
        by_phase: dict[str, int] = {}
        for row in st.get("transfers", ()):
            by_phase[row["phase"]] = by_phase.get(row["phase"], 0) + 1
            if row.get("total"):
                ratio.add_metric([row["name"], row["version"], row.get("tier") or row["requested_tier"], row["phase"]],
                                 min(1.0, row["done"] / row["total"]))
        for ph, n in by_phase.items():
            phases.add_metric([ph], n)
        yield from (used, cap, high, staging, count, resident, size, pinned, leases, in_use, phases, ratio)


class _PressureCollector(Collector):
    """Raw node counters: disk (await = read time / reads), NIC (utilisation = bytes / speed), TCP, softirq."""

    def collect(self) -> Iterable[Any]:
        reads = CounterMetricFamily("weightd_node_disk_reads_completed", "Reads completed", labels=["device"])
        read_s = CounterMetricFamily("weightd_node_disk_read_time_seconds", "Time spent reading", labels=["device"])
        read_b = CounterMetricFamily("weightd_node_disk_read_bytes", "Bytes read", labels=["device"])
        io_s = CounterMetricFamily("weightd_node_disk_io_time_seconds", "Time with I/O in flight (utilisation)",
                                   labels=["device"])
        inflight = GaugeMetricFamily("weightd_node_disk_io_in_flight", "Requests in flight", labels=["device"])
        for d in read_disks():
            reads.add_metric([d.device], d.reads)
            read_s.add_metric([d.device], d.read_ms / 1000)
            read_b.add_metric([d.device], d.sectors_read * 512)
            io_s.add_metric([d.device], d.io_ms / 1000)
            inflight.add_metric([d.device], d.in_flight)
        rx = CounterMetricFamily("weightd_node_network_receive_bytes", "Bytes received", labels=["interface"])
        tx = CounterMetricFamily("weightd_node_network_transmit_bytes", "Bytes sent", labels=["interface"])
        speed = GaugeMetricFamily("weightd_node_network_speed_bytes", "Link speed in bytes per second",
                                  labels=["interface"])
        mtu = GaugeMetricFamily("weightd_node_network_mtu_bytes", "MTU", labels=["interface"])
        for n in read_nics():
            rx.add_metric([n.interface], n.rx_bytes)
            tx.add_metric([n.interface], n.tx_bytes)
            if n.speed_bytes_per_s:
                speed.add_metric([n.interface], n.speed_bytes_per_s)
            if n.mtu:
                mtu.add_metric([n.interface], n.mtu)
        yield from (reads, read_s, read_b, io_s, inflight, rx, tx, speed, mtu)
        tcp = read_tcp()
        if tcp:
            yield CounterMetricFamily("weightd_node_tcp_out_segments", "TCP segments sent", value=tcp.get("OutSegs", 0))
            yield CounterMetricFamily("weightd_node_tcp_retransmitted_segments", "TCP segments retransmitted",
                                      value=tcp.get("RetransSegs", 0))
        soft = read_softirq_seconds()
        if soft is not None:
            yield CounterMetricFamily("weightd_node_cpu_softirq_seconds", "CPU time in softirq, all CPUs", value=soft)
            yield GaugeMetricFamily("weightd_node_cpus", "Online CPUs", value=os.cpu_count() or 1)


class NetworkGauges:
    """What [network] does (weightd/node/network.py), on the daemon's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.share = Gauge("weightd_network_share_bytes_per_second", "The link's traffic by who moves it (weightd: "
                           "its P2P and object-store bytes; others: the rest, serving), per direction (download: rx, "
                           "upload: tx)", ["direction", "who"], registry=registry)
        self.limit = Gauge("weightd_network_limit_bytes_per_second", "weightd's own rate limit, set to yield the "
                           "link to other traffic ([network]); 0: none of its own", ["direction"], registry=registry)
