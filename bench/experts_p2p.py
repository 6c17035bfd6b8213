#!/usr/bin/env python3
"""An expert-parallel copy over the swarm (issue 40): what rank R of N moves and takes against the whole
version, both from an origin on loopback.

    .venv/bin/python bench/experts_p2p.py [--rounds 5] [--piece 4] [--cap 50] [--experts 64] [--dir DIR]

A sample MoE (tiering/sample_moe.py: 6 layers of ``--experts`` routed experts, 8 shards) is published
into a path cold tier; an origin P2P session on 127.0.0.2 seeds it (``--piece`` MiB pieces, upload
capped at ``--cap`` MB/s, 0: none). Each round, in alternating order, a fresh worker node on 127.0.0.3
(its own tiers and P2P session, the origin as its only peer) preloads into warm either the whole version
or rank 0 of 8's copy (``--experts 0/8``). Reported per contender: seconds (median, min-max), the bytes
that came over the swarm (the report's bytes by source), libtorrent's payload count, the bytes placed;
ratios whole / rank of bytes and of time (``speedup``: per-round spread). Nothing may come from cold.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _rounds import machine_state, report, speedup  # noqa: E402

MiB = 1 << 20


def _node(base: Path, cold: Path, **kw):
    from tiering import LocalNode
    from tiering.layout import TierSpec
    return LocalNode(hot=TierSpec("hot", base / "hot", 4 << 30), warm=TierSpec("warm", base / "warm", 8 << 30),
                     cold=cold, state_dir=base / "state", **kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--piece", type=int, default=4, help="piece size, MiB")
    ap.add_argument("--cap", type=int, default=50, help="the origin's upload cap, MB/s (0: none)")
    ap.add_argument("--experts", type=int, default=64, help="routed experts a layer")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    from p2p import P2PConfig, P2PFetcher, P2PSession, ensure_torrent, read_torrent
    from tiering import selection_from
    from tiering.safefs import open_cold_store
    from tiering.sample_moe import make_moe_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="weightd-bench-experts-p2p-", dir=args.dir))
    before = machine_state()
    try:
        cold = tmp / "cold"
        open_cold_store(cold, create=True).close()
        pub = _node(tmp / "origin", cold)
        src = make_moe_checkpoint(tmp / "moe", layers=6, experts=args.experts, shards=8, d=512)
        pub.publish(src, "bench/moe", "v1")
        version = pub.published_version("bench/moe", "v1")

        def cfg(ip: str, **kw) -> P2PConfig:
            return P2PConfig(listen=f"{ip}:0", threshold=MiB, piece_size=args.piece * MiB, fallback_after_s=30, **kw)
        ensure_torrent(cfg("127.0.0.2"), version)
        from weightd.config.p2p import P2PSettings   # (as the daemon's origin: [p2p] origin_request_queue)
        queue = P2PSettings.model_fields["origin_request_queue"].default
        origin = P2PSession(cfg("127.0.0.2", upload_limit=args.cap * 1_000_000, request_queue=queue))
        origin.seed(read_torrent(version), version.path)
        times: dict[str, list[float]] = {"whole": [], "rank": []}
        moved: dict[str, tuple[int, int, int]] = {}
        try:
            for i in range(args.rounds):
                for what in (("rank", "whole") if i % 2 else ("whole", "rank")):
                    base = tmp / f"w{i}-{what}"
                    c = cfg("127.0.0.3", peers=(f"127.0.0.2:{origin.port}",))
                    s = P2PSession(c)
                    n = _node(base, cold, fetchers=[P2PFetcher(c, s)])
                    try:
                        sel = selection_from(experts="0/8") if what == "rank" else None
                        t0 = time.monotonic()
                        r = n.preload("bench/moe", "v1", tier="warm", selection=sel, timeout_s=600)
                        times[what].append(time.monotonic() - t0)
                        by = r.bytes_by_source
                        if r.source_fallbacks or by.get("cold", 0):
                            raise SystemExit(f"{what}: not from the swarm: {r.source_fallbacks} {by}")
                        moved[what] = (by.get("origin", 0) + by.get("peer", 0), s.stats()["download_bytes"], r.bytes)
                    finally:
                        n.close()
                        s.close()
                        shutil.rmtree(base, ignore_errors=True)
                    print(f"round {i + 1}/{args.rounds} {what}: {times[what][-1]:.3f}", file=sys.stderr)
        finally:
            origin.close()
            pub.close()
        per = {what: {"swarm_bytes": b, "libtorrent_payload_bytes": lt_bytes, "placed_bytes": placed}
               for what, (b, lt_bytes, placed) in moved.items()}
        out = report("experts_p2p", times, [speedup(times, "rank", "whole")], rounds=args.rounds, max_spread=0.5,
                     machine=(before, machine_state()), version_bytes=version.manifest.total_bytes,
                     piece_bytes=args.piece * MiB, origin_cap_bytes_per_s=args.cap * 1_000_000, bytes=per,
                     bytes_whole_over_rank=round(moved["whole"][0] / moved["rank"][0], 2))
        print(json.dumps(out, indent=1))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
