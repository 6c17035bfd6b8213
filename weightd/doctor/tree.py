"""The decision tree of ``weightd doctor`` (see :mod:`weightd.doctor`): measurements and findings
from :class:`~weightd.doctor.inputs.Inputs`, then the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .inputs import SEVERITIES, Finding, Inputs, Tier, mount_of, tmpfs_size

AWAIT_MS, UTIL, NIC_UTIL, RETRANS = 5.0, 0.70, 0.80, 0.01


# -- the tree --------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Report:
    verdict: str
    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    @property
    def critical(self) -> bool:
        return any(f.severity == "critical" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return {"verdict": self.verdict, "critical": self.critical,
                "findings": [f.to_dict() for f in sorted(self.findings, key=lambda f: order[f.severity])],
                "measurements": self.measurements}


def diagnose(i: Inputs) -> Report:
    """The seed reports' decision tree: measurements and findings, then the verdict."""
    r = Report("healthy")
    dt = max(i.window_s, 1e-3)
    disk_bound = _disk_findings(i, r, dt)
    _probe_findings(i, r)
    busy = _network_findings(i, r, dt)
    for t in i.tiers:
        _tier_findings(i, r, t)
    _memlock_findings(i, r)
    if i.node is not None:
        _node_findings(i.node, r)
    _verdict(i, r, disk_bound, busy)
    return r


def _disk_findings(i: Inputs, r: Report, dt: float) -> list[str]:
    """Every device in the window, flagged when it holds a tier; the saturated ones are returned."""
    tier_dev: dict[str, list[str]] = {}
    for t in i.tiers:
        m = mount_of(t.path, i.mounts)
        if m is not None:
            name = i.after.devnums.get(m.devnum)  # (partitions are listed too; overlay/tmpfs are not)
            if name:
                tier_dev.setdefault(name, []).append(t.name)
    disks = {}
    for name, (reads, rms, sectors, io) in i.after.disks.items():
        b = i.before.disks.get(name)
        if b is None:
            continue
        dr, drms, dsec, dio = reads - b[0], rms - b[1], sectors - b[2], io - b[3]
        await_ms = drms / dr if dr else 0.0
        util = min(1.0, dio / (dt * 1000))
        disks[name] = {"read_await_ms": round(await_ms, 2), "util": round(util, 3),
                       "read_bytes_per_s": round(dsec * 512 / dt), "reads_per_s": round(dr / dt, 1),
                       "tiers": tier_dev.get(name, [])}
    r.measurements["disks"] = {k: v for k, v in disks.items() if v["reads_per_s"] or v["tiers"]}
    disk_bound = [n for n, d in disks.items() if d["read_await_ms"] > AWAIT_MS and d["util"] > UTIL]
    for n in disk_bound:
        d = disks[n]
        on = ", ".join(d["tiers"]) or "no tier"
        r.findings.append(Finding(
            "disk-saturated", "critical", "disk",
            f"{n} is saturated: read await {d['read_await_ms']} ms (> {AWAIT_MS}), util {d['util']:.0%} (> {UTIL:.0%}); holds {on}",
            {"device": n, **d},
            "warm checkpoints into the page cache before servers start (`weightd preload --tier warm`, "
            "`weightd warm`); put hot checkpoints in the hot tier (/dev/shm); cap warming (`[warm] bandwidth`) "
            "and other readers with blkio/io.max limits; load with direct I/O where the loader supports it; "
            "check fragmentation (`filefrag`) of the weight files"))
    return disk_bound


def _probe_findings(i: Inputs, r: Report) -> None:
    if i.probe:
        p = i.probe
        r.measurements["probe"] = p
        base = p.get("baseline_p50_us")
        if p.get("p50_us", 0) > 1000 or (base and p["p50_us"] > 4 * base):
            r.findings.append(Finding(
                "random-read-degraded", "critical" if p.get("p50_us", 0) > 1000 else "warning", "disk",
                f"4K random reads on the {p.get('tier', 'warm')} tier take {p['p50_us']:.0f} µs p50 "
                f"(baseline {base or 'none'} µs; a healthy NVMe: ~50 µs)",
                p, "the device is contended or degraded: see the disk findings; re-run `weightd bench disk` "
                   "when idle to record a baseline"))


def _network_findings(i: Inputs, r: Report, dt: float) -> list[str]:
    """NICs, TCP retransmits and softirqs; the saturated NICs are returned."""
    nics = {}
    net = (i.node or {}).get("network") or {}   # (the daemon's [network] state: its capacity, weightd's share)
    for name, (rx, tx) in i.after.nics.items():
        b = i.before.nics.get(name)
        if b is None:
            continue
        rate = max(rx - b[0], tx - b[1]) / dt
        speed = i.nic_speed.get(name) or (net.get("capacity_bytes_per_s") if name in net.get("interfaces", ()) else None)
        nics[name] = {"bytes_per_s": round(rate), "speed_bytes_per_s": speed,
                      "util": round(rate / speed, 3) if speed else None, "mtu": i.nic_mtu.get(name)}
    r.measurements["nics"] = nics
    busy = [n for n, d in nics.items() if d["util"] is not None and d["util"] > NIC_UTIL]
    dseg = i.after.tcp[0] - i.before.tcp[0]
    dret = i.after.tcp[1] - i.before.tcp[1]
    retrans = dret / dseg if dseg > 0 else 0.0
    r.measurements["tcp_retransmit_ratio"] = round(retrans, 4)
    r.measurements["net_softirqs_per_s"] = round((i.after.net_softirq - i.before.net_softirq) / dt)
    if net.get("download") or net.get("upload"):
        r.measurements["weightd_network"] = net
    for n in busy:
        d = nics[n]
        r.findings.append(Finding(
            "nic-saturated", "critical", "network",
            f"{n} runs at {d['util']:.0%} of its {d['speed_bytes_per_s'] * 8 / 1e9:.0f} Gbit/s (> {NIC_UTIL:.0%})"
            + _weightd_share(net, n, d["speed_bytes_per_s"]),
            {"interface": n, **d, "weightd": net or None},
            ("weightd already yields to the other traffic ([network]); the rest is others': "
             if net.get("enabled") and n in net.get("interfaces", ()) else
             "weight traffic competes with inference: let weightd yield (`[network]`, with `capacity` on virtual "
             "NICs) or set `[p2p] upload_limit`/`download_limit` below the link (e.g. 30-50% of it); ")
            + "let P2P spread the load (`[p2p] threshold`), preload before the restart"))
        if (d["mtu"] or 0) < 9000:
            r.findings.append(Finding("no-jumbo-frames", "warning", "network",
                                      f"{n} has MTU {d['mtu']}: jumbo frames (9000) cut per-packet overhead",
                                      {"interface": n, "mtu": d["mtu"]}, "set MTU 9000 end to end on the storage/P2P network"))
        if not i.rdma:
            r.findings.append(Finding("no-rdma", "info", "network", "no RDMA device (/sys/class/infiniband is empty)",
                                      {"infiniband": []}, "with RoCE/InfiniBand, GPUDirect Storage or an RDMA "
                                                          "transfer path takes weight traffic off the TCP stack"))
    if retrans > RETRANS:
        r.findings.append(Finding("tcp-retransmits", "warning", "network",
                                  f"TCP retransmits at {retrans:.1%} of segments (> {RETRANS:.0%})",
                                  {"retransmit_ratio": round(retrans, 4), "out_segs": dseg, "retrans_segs": dret},
                                  "check for congestion or a faulty link; lower the P2P rate limits"))
    return busy


def _weightd_share(net: dict[str, Any], name: str, speed: int) -> str:
    """``; weightd's own share: 12% (download 1.2 MiB/s, upload 0 B/s)`` from the daemon's ``network``
    block, when it watches ``name``; "" otherwise."""
    if name not in net.get("interfaces", ()) or not speed:
        return ""
    from tiering import format_bytes
    rates = {k: (net.get(k) or {}).get("weightd_bytes_per_s") or 0 for k in ("download", "upload")}
    share = max(rates.values()) / speed
    return (f"; weightd's own share: {share:.0%} (download {format_bytes(rates['download'])}/s, upload "
            f"{format_bytes(rates['upload'])}/s){', yielding' if net.get('yielding') else ''}")


def _tier_findings(i: Inputs, r: Report, t: Tier) -> None:
    """How one tier is mounted: overlayfs, atime, tmpfs size and memory limit, a device shared with logs."""
    m = mount_of(t.path, i.mounts)
    if m is None:
        return
    ev = {"tier": t.name, "path": t.path, "mount": m.mountpoint, "fstype": m.fstype, "options": sorted(m.options)}
    if m.fstype == "overlay":
        r.findings.append(Finding("tier-on-overlayfs", "warning", "tier",
                                  f"the {t.name} tier {t.path} is on overlayfs: every write is copied up (double writes)",
                                  ev, "mount a host path or volume (hostPath, emptyDir on a local disk) for the tier"))
    if t.name != "hot" and m.fstype not in ("tmpfs", "overlay", "nfs", "nfs4", "fuse") \
            and not {"noatime", "relatime"} & set(m.options):
        # (relatime, the kernel's default, writes an access time at most once a day per file: not worth
        # a warning; strictatime writes one on every read)
        fix = ("set noatime (or relatime) for / in fstab and let it apply at the next reboot; do not remount the "
               "root file system on a live node" if m.mountpoint == "/" else
               f"remount with noatime (`mount -o remount,noatime {m.mountpoint}`, and in fstab)")
        r.findings.append(Finding("strictatime", "warning", "tier",
                                  f"the {t.name} tier {t.path} ({m.mountpoint}) writes an access time on every read "
                                  "(neither noatime nor relatime)", ev, f"{fix}: reads then do not write"))
    if t.name == "hot" and m.fstype == "tmpfs" and t.capacity:
        size = tmpfs_size(m)
        if size is not None and size < t.capacity:
            r.findings.append(Finding("shm-smaller-than-hot", "critical", "tier",
                                      f"{m.mountpoint} is {size >> 20} MiB but the hot tier may hold {t.capacity >> 20} MiB",
                                      {**ev, "tmpfs_bytes": size, "capacity_bytes": t.capacity},
                                      "lower [tiers.hot] capacity below the tmpfs size, or enlarge it "
                                      "(`mount -o remount,size=... /dev/shm`; in Kubernetes an emptyDir medium: Memory with sizeLimit)"))
        if i.mem_limit is not None and t.capacity > i.mem_limit:
            r.findings.append(Finding("hot-beyond-memory-limit", "critical", "memory",
                                      f"the hot tier may hold {t.capacity >> 20} MiB but the cgroup memory limit is "
                                      f"{i.mem_limit >> 20} MiB, and tmpfs pages count against it (OOM kill)",
                                      {**ev, "capacity_bytes": t.capacity, "memory_limit_bytes": i.mem_limit},
                                      "lower [tiers.hot] capacity well below the memory limit, or raise the limit"))
    log_m = mount_of(i.log_dir, i.mounts)
    if log_m is not None and log_m.devnum == m.devnum and m.fstype not in ("tmpfs",) and t.name != "cold":
        r.findings.append(Finding("tier-shares-log-device", "warning", "disk",
                                  f"the {t.name} tier shares device {m.source} with the log directory {i.log_dir}",
                                  {**ev, "log_dir": i.log_dir, "device": m.devnum},
                                  "move logs (or the tier) to another device: log writes add latency to weight reads"))


NEAR_WATERMARK = 0.05   # a tier within this share of capacity below its high watermark is "near" it


def _node_findings(n: dict[str, Any], r: Report) -> None:
    """weightd itself (:mod:`weightd.doctor.node`): daemon, watermarks, recent fallbacks, cold access,
    spot checks of the local copies."""
    _daemon_findings(n.get("daemon", {}), r)
    _watermark_findings(n.get("tiers") or {}, r)
    _event_findings(n.get("recent_events") or [], r)
    _cold_findings(n.get("cold"), r)
    _copy_findings(n.get("verify") or [], r)
    if "error" in n:
        r.findings.append(Finding("node-unreadable", "warning", "weightd", n["error"], {}, "see the error"))
    if n.get("verify") is not None or n.get("cold") is not None:
        r.measurements["weightd"] = {
            "daemon": n.get("daemon", {}).get("state"),
            "cold_checked_versions": (n.get("cold") or {}).get("checked"),
            "spot_checked": [{"ref": v["ref"], "tier": v["tier"], "bytes": v.get("bytes_checked", 0),
                              "ok": not v.get("problems"), **({"skipped": v["skipped"]} if "skipped" in v else {})}
                             for v in n.get("verify") or []]}


def _daemon_findings(d: dict[str, Any], r: Report) -> None:
    if d.get("state") in ("down", "stale", "denied", "untrusted"):
        why = {"down": "there is no socket: it is not running, or uses another [api] socket",
               "stale": "a socket is there but nothing listens (it stopped or crashed)",
               "denied": d.get("reason", "this user may not connect"),
               "untrusted": d.get("reason", "the socket is served by an unexpected uid")}[d["state"]]
        r.findings.append(Finding("daemon-not-answering", "warning", "weightd",
                                  f"the node daemon does not answer on {d['socket']}: {why}", d,
                                  "systemctl start weightd (journalctl -u weightd -n 50 says why it stopped); without "
                                  "it preloads run in each caller, with no single flight, seeding or metrics"))


def _watermark_findings(tiers: dict[str, Any], r: Report) -> None:
    for t, info in tiers.items():
        cap = info.get("capacity_bytes") or 0
        if not cap:
            continue
        share, high = info["used_bytes"] / cap, info["high_watermark"]
        if share >= high - NEAR_WATERMARK:
            r.findings.append(Finding("tier-near-watermark", "warning", "tier",
                                      f"the {t} tier is {share:.0%} full, its high watermark is {high:.0%}: the next "
                                      "preload evicts (or falls back to warm, or fails with exit 6)",
                                      {"tier": t, "used_bytes": info["used_bytes"], "capacity_bytes": cap,
                                       "high_watermark": high},
                                      f"raise [tiers.{t}] capacity, unpin what is no longer served, or weightd evict "
                                      "NAME@VERSION (weightd status shows what holds each copy)"))


def _event_findings(events: list[dict[str, Any]], r: Report) -> None:
    fallbacks = [e for e in events if e["kind"] in ("tier_fallback", "source_fallback")]
    failures = [e for e in events if e["kind"] == "failure"]
    if fallbacks:
        kinds = sorted({f"{e['from']}->{e['to']}" for e in fallbacks})
        r.findings.append(Finding("recent-fallbacks", "warning", "weightd",
                                  f"{len(fallbacks)} preload(s) fell back in the last hour ({', '.join(kinds)}); the "
                                  f"last: {fallbacks[-1]['ref']}: {fallbacks[-1]['reason']}"[:400],
                                  {"count": len(fallbacks), "kinds": kinds},
                                  "hot->warm: the hot tier is too small for the set being served; p2p->cold: check "
                                  "weightd_p2p_peers and the [p2p] peers/trackers (and fleet TLS) on both ends"))
    if failures:
        r.findings.append(Finding("recent-failures", "warning", "weightd",
                                  f"{len(failures)} preload(s) failed in the last hour; the last: "
                                  f"{failures[-1]['ref']}: {failures[-1]['reason']}"[:400],
                                  {"count": len(failures)}, "journalctl -u weightd | grep 'preload failed' shows each "
                                  "one with its reason"))


def _cold_findings(cold: dict[str, Any] | None, r: Report) -> None:
    if cold and cold.get("unavailable"):
        r.findings.append(Finding("cold-unavailable", "critical", "tier",
                                  f"cold storage {cold['path']} is not there for {cold['by']}: {cold['unavailable']}",
                                  {"path": cold["path"], "uid": cold["uid"]},
                                  f"mount cold storage at {cold['path']} (systemd: RequiresMountsFor= in a drop-in "
                                  "for weightd.service; Kubernetes: the cold volume of the DaemonSet), then check "
                                  "it with: weightd serve --check"))
    elif cold and cold.get("problems"):
        first = cold["problems"][0]
        r.findings.append(Finding("cold-unreadable", "critical", "tier",
                                  f"{cold['by']} (uid {cold['uid']}) cannot read cold storage: {first['where']}: "
                                  f"{first['reason']}" + (f" (and {len(cold['problems']) - 1} more)"
                                                          if len(cold["problems"]) > 1 else ""),
                                  {"uid": cold["uid"], "checked_versions": cold["checked"],
                                   "problems": len(cold["problems"])},
                                  "make cold storage readable by the daemon's user (chmod -R a+rX, group ownership, "
                                  "or the NFS export's uid mapping)"))


def _copy_findings(verified: list[dict[str, Any]], r: Report) -> None:
    for row in verified:
        if row.get("problems"):
            r.findings.append(Finding("copy-damaged", "critical", "tier",
                                      f"{row['ref']} in {row['tier']} does not match its manifest: {row['problems'][0]}",
                                      {"ref": row["ref"], "tier": row["tier"], "problems": len(row["problems"])},
                                      f"weightd evict {row['ref']} --tier {row['tier']} --force, then preload it again "
                                      "(weightd verify PATH reads every byte)"))


def _memlock_findings(i: Inputs, r: Report) -> None:
    if i.lock_wanted:
        if i.memlock is not None and i.memlock < i.lock_wanted:
            r.findings.append(Finding("memlock-too-low", "warning", "memory",
                                      f"RLIMIT_MEMLOCK is {i.memlock >> 20} MiB, but locking needs {i.lock_wanted >> 20} MiB: "
                                      "`--lock` will lock only part of the checkpoint",
                                      {"memlock_bytes": i.memlock, "wanted_bytes": i.lock_wanted},
                                      "raise LimitMEMLOCK= in weightd.service (or ulimit -l), or do not lock"))


def _verdict(i: Inputs, r: Report, disk_bound: list[str], busy: list[str]) -> None:
    if disk_bound:
        r.verdict = "disk"
    elif busy:
        r.verdict = "network"
    elif i.symptom:
        r.verdict = "gpu"
        r.findings.append(Finding(
            "neither-disk-nor-network", "warning", "gpu",
            f"loads are reported slow ({i.symptom}) but neither the disk nor the NIC is saturated",
            {"disks": r.measurements["disks"], "nics": r.measurements["nics"]},
            "look at the GPU side (outside weightd): host-to-device copies and CUDA stream contention with "
            "Nsight Systems, pinned memory, the loader's own parallelism"))
