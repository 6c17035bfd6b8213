"""``weightd demo``'s step 11: weightd at cluster scale on one machine. An origin and three workers on
127.0.0.1-4, each its own daemon, tiers and socket, one shared cold storage; P2P and the tracker over
TLS with certificates from a fleet CA; the origin signs what it publishes and every worker requires
the signature. A version over the (demo) P2P threshold is preloaded on all workers at once, then an
update as a delta; a node without a fleet certificate never joins the swarm, and a tampered version
is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from tiering import make_checkpoint, mutate_tensor

IPS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")   # the origin, then the three workers


def run_cluster(base: Path, size: int) -> None:
    """Start the four daemons, run the steps on them, stop them (their hot tiers removed)."""
    from p2p import write_fleet
    from tiering import generate_keypair
    pki = write_fleet(base / "fleet-pki", list(IPS), ips={IPS[0]: [IPS[0]]})  # (the origin's: its tracker's IP too)
    key = base / "signing-key"
    generate_keypair(Path(f"{key}.pem"), Path(f"{key}.pub.pem"))
    click.secho("# 11. at cluster scale: an origin and three workers on 127.0.0.1-4 (P2P threshold 16MiB here);\n"
                f"#     the origin signs what it publishes ({key}.pem), every worker requires that signature;\n"
                f"#     P2P and the tracker run over TLS with certificates from a fleet CA ({pki['ca']})",
                bold=True)
    nodes: list[tuple[str, Path, subprocess.Popen[bytes], Path]] = []
    try:
        origin_ep = tracker = ""
        for i, ip in enumerate(IPS):
            role = "origin" if i == 0 else "worker"
            p2p_port = _port(ip)
            if role == "origin":
                origin_ep, tport = f"{ip}:{p2p_port}", _port(ip)
                tracker = f"https://{ip}:{tport}/announce"
                extra = f'tracker_listen = "{ip}:{tport}"\n'
            else:
                extra = f'peers = ["{origin_ep}"]\ntrackers = ["{tracker}"]\n'
            extra += f'tls = {{ ca = "{pki["ca"]}", cert = "{pki[ip]}", key = "{pki[ip + ".key"]}" }}\n'
            extra += (f'[publish]\nsigning_key = "{key}.pem"\n' if role == "origin" else
                      f'[trust]\nrequire_signature = true\npublic_keys = ["{key}.pub.pem"]\n')
            nodes.append(_start(base, i, ip, role, p2p_port, extra))
            _wait_started(nodes[-1], role)
            click.echo(f"  {role:<6} {ip}  p2p {ip}:{p2p_port}" + ("  (tracker " + tracker + ")" if i == 0 else ""))
        _publish_and_preload(base, size, nodes)
    finally:
        _stop(nodes)


def _port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def _start(base: Path, i: int, ip: str, role: str, p2p_port: int,
           extra: str) -> tuple[str, Path, subprocess.Popen[bytes], Path]:
    """Node ``i``'s config (its tiers, socket, metrics and P2P listener; ``extra``: its [p2p] peers and TLS,
    its signing or trust), and its daemon started: (ip, config, daemon, hot tier)."""
    d, cold = base / f"node-{ip}", base / "cluster-cold"
    d.mkdir(exist_ok=True)
    hot = Path(f"/dev/shm/weightd-demo-{os.getpid()}-{i}")
    cfg = d / "weightd.toml"
    cfg.write_text(f'state_dir = "{d}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "25%"\n'
                   f'[tiers.warm]\npath = "{d}/warm"\ncapacity = "10GiB"\n[tiers.cold]\npath = "{cold}"\n'
                   f'[api]\nsocket = "{d}/weightd.sock"\n[metrics]\nlisten = "{ip}:{_port(ip)}"\n'
                   f'[p2p]\nthreshold = "16MiB"\nlisten = "{ip}:{p2p_port}"\nallow = ["127.0.0.0/8"]\n'
                   f'upload_limit = "50MB"\ndownload_limit = "50MB"\n' + extra)
    log = open(d / "daemon.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(cfg), "serve", "--role", role],
                            stdout=log, stderr=log)
    return ip, cfg, proc, hot


def _wait_started(node: tuple[str, Path, subprocess.Popen[bytes], Path], role: str) -> None:
    ip, cfg, proc, _ = node
    d = cfg.parent
    deadline = time.monotonic() + 30
    while not (d / "weightd.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise click.ClickException(f"{role} {ip} did not start: {(d / 'daemon.log').read_text()}")
        time.sleep(0.1)


def _stop(nodes: list[tuple[str, Path, subprocess.Popen[bytes], Path]]) -> None:
    for _, _, proc, hot in nodes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for _, _, proc, hot in nodes:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(hot, ignore_errors=True)


def _publish_and_preload(base: Path, size: int, nodes: list) -> None:
    """Publish v1 on the origin and preload it on every worker; then v2 (three tensors changed) as a delta."""
    src = make_checkpoint(base / "cluster-src", total_bytes=max(size, 48 << 20), shards=4, seed="cluster")
    click.secho(f"$ weightd --config {nodes[0][1]} publish {src} --name demo/swarm --version v1", fg="cyan", bold=True)
    pub = subprocess.run([sys.executable, "-m", "weightd", "--config", str(nodes[0][1]), "publish", str(src),
                          "--name", "demo/swarm", "--version", "v1", "--json"], capture_output=True, text=True)
    if pub.returncode:
        raise click.ClickException(pub.stderr.strip())
    r = json.loads(pub.stdout)
    click.echo(f"published, signed by {r['signed_by']}, with torrent {r['torrent']}\n")
    _preload_on_workers(nodes, "v1")
    # an update over P2P: every worker holds v1, v2 changes three tensors
    v2 = base / "cluster-src-v2"
    shutil.copytree(src, v2, ignore=shutil.ignore_patterns(".weightd"))
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.2.self_attn.q_proj.weight",
                 "model.layers.3.mlp.down_proj.weight"):
        shard = next(p for p in sorted(v2.glob("*.safetensors")) if name.encode() in p.read_bytes()[:1 << 16])
        mutate_tensor(shard, name, seed="cluster-v2")
    click.secho(f"$ weightd publish {v2} --name demo/swarm --version v2   (three tensors fine-tuned)", fg="cyan",
                bold=True)
    pub = subprocess.run([sys.executable, "-m", "weightd", "--config", str(nodes[0][1]), "publish", str(v2),
                          "--name", "demo/swarm", "--version", "v2", "--json"], capture_output=True, text=True)
    if pub.returncode:
        raise click.ClickException(pub.stderr.strip())
    click.echo("each worker pre-fills v2 with v1's bytes; libtorrent's check keeps them, only changed pieces move\n")
    _preload_on_workers(nodes, "v2")
    _outsider(base, nodes)
    _tampered(base, nodes, v2)


def _outsider(base: Path, nodes: list) -> None:
    """A node inside ``allow`` without a fleet certificate: the torrent needs one, so it never joins."""
    d = base / "node-outsider"
    d.mkdir(exist_ok=True)
    cfg = d / "weightd.toml"
    cfg.write_text(f'state_dir = "{d}/state"\n[tiers.hot]\npath = "/dev/shm/weightd-demo-{os.getpid()}-outsider"\n'
                   f'[tiers.warm]\npath = "{d}/warm"\n[tiers.cold]\npath = "{base / "cluster-cold"}"\n'
                   f'[p2p]\nthreshold = "16MiB"\nlisten = "127.0.0.5:0"\nallow = ["127.0.0.0/8"]\n'
                   f'peers = ["{nodes[0][0]}:1"]\nfallback_after_s = 10\n')
    click.secho("# a node inside allow = 127.0.0.0/8 but without a certificate from the fleet CA", bold=True)
    click.secho("$ weightd --no-daemon preload demo/swarm@v2 --tier warm   (on 127.0.0.5, no [p2p] tls)",
                fg="cyan", bold=True)
    try:
        p = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "--no-daemon", "preload",
                            "demo/swarm@v2", "--tier", "warm", "--json"], capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(f"/dev/shm/weightd-demo-{os.getpid()}-outsider", ignore_errors=True)
    if p.returncode:
        raise click.ClickException(p.stderr.strip())
    r = json.loads(p.stdout)
    why = r["source_fallbacks"][0]["reason"] if r["source_fallbacks"] else "?"
    if r["bytes_by_source"]["peer"] or r["bytes_by_source"]["origin"]:
        raise click.ClickException(f"a node without a fleet certificate got bytes over P2P: {r}")
    click.echo(f"  no byte over P2P ({why}); it read the version from cold storage itself\n")


def _tampered(base: Path, nodes: list, v2: Path) -> None:
    """A writer of cold storage changes a tensor and recomputes the manifest: the signature refuses it."""
    from tiering import build_manifest, load_manifest, read_header
    pub = subprocess.run([sys.executable, "-m", "weightd", "--config", str(nodes[0][1]), "publish", str(v2),
                          "--name", "demo/swarm", "--version", "v3"], capture_output=True, text=True)
    if pub.returncode:
        raise click.ClickException(pub.stderr.strip())
    cold = base / "cluster-cold" / "demo/swarm/v3"
    shard = sorted(cold.glob("*.safetensors"))[0]
    mutate_tensor(shard, read_header(shard).tensors[0].name, seed="evil")
    old = load_manifest(cold / ".weightd/manifest.json")
    m = build_manifest(cold).with_labels(name=old.name, version=old.version, published_at=old.published_at)
    (cold / ".weightd/manifest.json").write_text(m.to_json())
    (cold / ".weightd/checkpoint.torrent").unlink(missing_ok=True)
    click.secho("# the origin publishes demo/swarm@v3, signed; then a writer of cold storage changes one tensor of "
                "it and recomputes the manifest to match", bold=True)
    ip, cfg = nodes[1][0], nodes[1][1]
    click.secho(f"$ weightd preload demo/swarm@v3   (on worker {ip})", fg="cyan", bold=True)
    p = subprocess.run([sys.executable, "-m", "weightd", "--config", str(cfg), "preload", "demo/swarm@v3",
                        "--tier", "warm"], capture_output=True, text=True, timeout=120)
    click.echo(p.stderr.rstrip("\n"))
    if p.returncode != 5:
        raise click.ClickException(f"a tampered version was not refused (exit {p.returncode})")
    click.echo(f"(exit {p.returncode}: refused, nothing placed)\n")


def _preload_on_workers(nodes: list, version: str) -> None:
    from tiering import format_bytes
    click.secho(f"$ weightd preload demo/swarm@{version} --tier warm   (on the three workers at once)", fg="cyan",
                bold=True)
    t0 = time.monotonic()
    procs = [(ip, subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(cfg), "preload",
                                    f"demo/swarm@{version}", "--tier", "warm", "--json"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)) for ip, cfg, _, _ in nodes[1:]]
    totals = dict.fromkeys(("origin", "peer", "cold", "local_reuse"), 0)
    size = 0
    for ip, p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode:
            raise click.ClickException(f"worker {ip}: {err.strip()}")
        r = json.loads(out.splitlines()[0])
        size = r["bytes"]
        for k in totals:
            totals[k] += r["bytes_by_source"][k]
        b = r["bytes_by_source"]
        fb = format_bytes
        click.echo(f"  worker {ip}: {fb(r['bytes'])} verified in {r['seconds']:.1f} s: "
                   f"{fb(b['origin'])} from the origin, {fb(b['peer'])} from other workers, "
                   f"{fb(b['cold'])} from cold" + (f", {fb(b['local_reuse'])} reused locally"
                                                   if b["local_reuse"] else ""))
    moved = totals["origin"] + totals["peer"] + totals["cold"]
    fb = format_bytes
    click.echo(f"  all three in {time.monotonic() - t0:.1f} s; {fb(moved)} moved for 3 x {fb(size)} "
               f"({fb(totals['origin'])} from the origin, {fb(totals['peer'])} between workers"
               + (f", {fb(totals['local_reuse'])} reused locally" if totals["local_reuse"] else "") + ")\n")
