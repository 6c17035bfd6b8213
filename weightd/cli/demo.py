"""``weightd demo`` / ``make demo``: weightd's main job on a generated checkpoint, step by step.

Each step runs the real ``weightd`` command in a subprocess and shows it, so the demo is also a
smoke test of the installed entry point. Later capabilities (publish, preload, P2P) join the walk.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from tiering import make_checkpoint, mutate_tensor
from tiering import parse_size


_CONFIG: list[str] = []


def _run(args: list[str], expect: int | tuple[int, ...] = 0) -> subprocess.CompletedProcess[str]:
    click.secho("$ weightd " + " ".join(shlex.quote(a) for a in args), fg="cyan", bold=True)
    proc = subprocess.run([sys.executable, "-m", "weightd", *_CONFIG, *args], text=True, capture_output=True)
    if proc.stdout:
        click.echo(proc.stdout.rstrip("\n"))
    if proc.stderr:
        click.echo(proc.stderr.rstrip("\n"))
    if proc.returncode not in ((expect,) if isinstance(expect, int) else expect):
        raise click.ClickException(f"demo step failed: exit {proc.returncode}, expected {expect}")
    click.echo(f"(exit {proc.returncode})\n")
    return proc


def _demo_daemon(base: Path, config: Path) -> None:
    """Start the node daemon, preload through its socket, show status and metrics, stop it cleanly."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config.write_text(config.read_text() + f'[api]\nsocket = "{base}/weightd.sock"\n'
                      f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
                      f'[intent]\ndir = "{base}/intent.d"\nreconcile_s = 2\npoll_s = 0.5\n'
                      f'nfd_dir = "{base}/features.d"\nlabels = {{pool = "chat"}}\n')
    (base / "intent.d").mkdir(exist_ok=True)
    (base / "features.d").mkdir(exist_ok=True)
    click.secho("# 10. the node daemon: systemd runs `weightd serve`; commands now go through its socket", bold=True)
    click.secho(f"$ weightd serve &   (admin API on {base}/weightd.sock, metrics on 127.0.0.1:{port})",
                fg="cyan", bold=True)
    log = open(base / "daemon.log", "w")
    daemon = subprocess.Popen([sys.executable, "-m", "weightd", *_CONFIG, "serve"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not (base / "weightd.sock").exists():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise click.ClickException(f"the daemon did not start: {(base / 'daemon.log').read_text()}")
            time.sleep(0.1)
        click.echo()
        _run(["evict", "demo/tiny-llama@v2", "--force"])
        _run(["preload", "demo/tiny-llama@v2", "--tier", "hot"])
        _run(["status"])
        _demo_intent(base)
        click.secho(f"$ curl -s 127.0.0.1:{port}/metrics | grep ...", fg="cyan", bold=True)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(("weightd_bytes_transferred_total", "weightd_tier_used_bytes", "weightd_model_ready",
                                    "weightd_weight_loading_seconds_count", "weightd_checkpoints")):
                    click.echo(line)
        click.echo()
        click.secho("$ kill -TERM $DAEMON   (STOPPING=1, clean exit)", fg="cyan", bold=True)
        daemon.send_signal(signal.SIGTERM)
        click.echo(f"(daemon exit {daemon.wait(timeout=20)})\n")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        log.close()


def _demo_cluster(base: Path, size: int) -> None:
    """An origin and three workers on 127.0.0.1-4, each its own daemon, tiers and socket; one shared
    cold storage; a checkpoint over the (demo) P2P threshold preloaded on all workers at once."""
    import signal
    import socket

    def port(ip: str) -> int:
        with socket.socket() as s:
            s.bind((ip, 0))
            return s.getsockname()[1]

    from p2p import write_fleet
    from tiering import generate_keypair
    cold = base / "cluster-cold"
    ips = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    pki = write_fleet(base / "fleet-pki", ips, ips={ips[0]: [ips[0]]})  # (the origin's: its tracker's IP too)
    nodes: list[tuple[str, Path, subprocess.Popen[bytes], Path]] = []
    origin_ep = tracker = ""
    key = base / "signing-key"
    generate_keypair(Path(f"{key}.pem"), Path(f"{key}.pub.pem"))
    click.secho("# 11. at cluster scale: an origin and three workers on 127.0.0.1-4 (P2P threshold 16MiB here);\n"
                f"#     the origin signs what it publishes ({key}.pem), every worker requires that signature;\n"
                f"#     P2P and the tracker run over TLS with certificates from a fleet CA ({pki['ca']})",
                bold=True)
    try:
        for i, ip in enumerate(ips):
            role = "origin" if i == 0 else "worker"
            d = base / f"node-{ip}"
            d.mkdir(exist_ok=True)
            hot = Path(f"/dev/shm/weightd-demo-{os.getpid()}-{i}")
            p2p_port = port(ip)
            extra = ""
            if role == "origin":
                origin_ep, tport = f"{ip}:{p2p_port}", port(ip)
                tracker = f"https://{ip}:{tport}/announce"
                extra = f'tracker_listen = "{ip}:{tport}"\n'
            else:
                extra = f'peers = ["{origin_ep}"]\ntrackers = ["{tracker}"]\n'
            extra += f'tls = {{ ca = "{pki["ca"]}", cert = "{pki[ip]}", key = "{pki[ip + ".key"]}" }}\n'
            extra += (f'[publish]\nsigning_key = "{key}.pem"\n' if role == "origin" else
                      f'[trust]\nrequire_signature = true\npublic_keys = ["{key}.pub.pem"]\n')
            cfg = d / "weightd.toml"
            cfg.write_text(f'state_dir = "{d}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "25%"\n'
                           f'[tiers.warm]\npath = "{d}/warm"\ncapacity = "10GiB"\n[tiers.cold]\npath = "{cold}"\n'
                           f'[api]\nsocket = "{d}/weightd.sock"\n[metrics]\nlisten = "{ip}:{port(ip)}"\n'
                           f'[p2p]\nthreshold = "16MiB"\nlisten = "{ip}:{p2p_port}"\nallow = ["127.0.0.0/8"]\n'
                           f'upload_limit = "50MB"\ndownload_limit = "50MB"\n' + extra)
            log = open(d / "daemon.log", "w")
            proc = subprocess.Popen([sys.executable, "-m", "weightd", "--config", str(cfg), "serve", "--role", role],
                                    stdout=log, stderr=log)
            nodes.append((ip, cfg, proc, hot))
            deadline = time.monotonic() + 30
            while not (d / "weightd.sock").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise click.ClickException(f"{role} {ip} did not start: {(d / 'daemon.log').read_text()}")
                time.sleep(0.1)
            click.echo(f"  {role:<6} {ip}  p2p {ip}:{p2p_port}" + ("  (tracker " + tracker + ")" if i == 0 else ""))
        _cluster_publish_and_preload(base, size, nodes)
    finally:
        for _, _, proc, hot in nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, _, proc, hot in nodes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            shutil.rmtree(hot, ignore_errors=True)


def _cluster_publish_and_preload(base: Path, size: int, nodes: list) -> None:
    """Publish v1 on the origin and preload it on every worker; then v2 (three tensors changed) as a delta."""
    src = make_checkpoint(base / "cluster-src", total_bytes=max(size, 48 << 20), shards=4, seed="cluster")
    click.secho(f"$ weightd --config {nodes[0][1]} publish {src} --name demo/swarm --version v1", fg="cyan", bold=True)
    pub = subprocess.run([sys.executable, "-m", "weightd", "--config", str(nodes[0][1]), "publish", str(src),
                          "--name", "demo/swarm", "--version", "v1", "--json"], capture_output=True, text=True)
    if pub.returncode:
        raise click.ClickException(pub.stderr.strip())
    r = json.loads(pub.stdout)
    click.echo(f"published, signed by {r['signed_by']}, with torrent {r['torrent']}\n")
    _cluster_preload(nodes, "v1")
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
    _cluster_preload(nodes, "v2")
    _cluster_outsider(base, nodes)
    _cluster_tampered(base, nodes, v2)


def _cluster_outsider(base: Path, nodes: list) -> None:
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


def _cluster_tampered(base: Path, nodes: list, v2: Path) -> None:
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


def _cluster_preload(nodes: list, version: str) -> None:
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


def _flip_byte(path: Path) -> None:
    """Flip one byte in the middle of a file (twice restores it)."""
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))


def _demo_content(base: Path, size: str) -> tuple[Path, Path, Path]:
    """Steps 1-5: a checkpoint, its manifest, verify, a diff, bit rot found; returns v1, v2 and the rotten shard."""
    v1, v2 = base / "tiny-llama-v1", base / "tiny-llama-v2"
    for d in (v1, v2):
        if d.exists():
            shutil.rmtree(d)
    click.secho(f"# 1. a sample Hugging Face style checkpoint ({size}, 3 shards) in {v1}", bold=True)
    make_checkpoint(v1, total_bytes=parse_size(size), shards=3, seed="v1")
    for p in sorted(v1.rglob("*")):
        if p.is_file():
            click.echo(f"  {p.relative_to(v1)}  {p.stat().st_size} bytes")
    click.echo()
    click.secho("# 2. its manifest: every file, every tensor's byte range, xxh3-128 hashes", bold=True)
    _run(["manifest", "build", str(v1)])
    click.secho("# 3. verify the checkpoint against it", bold=True)
    _run(["verify", str(v1)])
    click.secho("# 4. version 2 fine-tunes three tensors: the diff names them and counts the bytes", bold=True)
    shutil.copytree(v1, v2, ignore=shutil.ignore_patterns(".weightd"))
    for changed in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.up_proj.weight",
                    "model.layers.3.mlp.down_proj.weight"):
        shard = next(p for p in sorted(v2.glob("*.safetensors")) if changed.encode() in p.read_bytes()[:1 << 16])
        nbytes = mutate_tensor(shard, changed, seed="v2")
        click.echo(f"changed {changed} in {shard.name} ({nbytes} bytes)")
    click.echo()
    _run(["manifest", "build", str(v2)])
    _run(["manifest", "diff", str(v1), str(v2)])
    click.secho("# 5. bit rot: one flipped byte in v1 is found and named (exit 5)", bold=True)
    victim = sorted(v1.glob("*.safetensors"))[0]
    _flip_byte(victim)
    _run(["verify", str(v1)], expect=5)

    return v1, v2, victim


def _demo_node(base: Path, hot: Path, v1: Path, v2: Path, victim: Path) -> Path:
    """Steps 6-9: a node of its own; publish, preload through the tiers, a delta update; returns its config."""
    # a node of its own: the embedded default's layout, kept inside the demo directory
    config = base / "weightd.toml"
    config.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "25%"\n'
                      f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "10GiB"\n'
                      f'[tiers.cold]\npath = "{base}/cold"\n')
    _CONFIG[:] = ["--config", str(config)]
    click.secho(f"# 6. publish both versions to cold storage (here {base}/cold; in a fleet, the shared mount)",
                bold=True)
    _flip_byte(victim)  # undo the bit rot first
    _run(["publish", str(v1), "--name", "demo/tiny-llama", "--version", "v1"])
    _run(["publish", str(v2), "--name", "demo/tiny-llama", "--version", "v2"])
    click.secho("# 7. preload: cold -> warm (NVMe), then warm -> hot (/dev/shm); verified, atomic, leased", bold=True)
    _run(["preload", "demo/tiny-llama@v1", "--tier", "warm"])
    _run(["preload", "demo/tiny-llama@v1", "--tier", "hot", "--json"])
    click.secho("# 8. the same again moves nothing; 'path' is what a server is pointed at", bold=True)
    _run(["preload", "demo/tiny-llama@v1"])
    _run(["path", "demo/tiny-llama@v1"])
    click.secho("# 9. an update: v2 (no version = the latest) reuses every unchanged tensor of v1 already "
                "on the node; only the changed bytes are read from cold", bold=True)
    _run(["manifest", "diff", str(base / "cold/demo/tiny-llama/v1"), str(base / "cold/demo/tiny-llama/v2"),
          "--plan"])
    _run(["preload", "demo/tiny-llama", "--tier", "warm"])
    _run(["pin", "demo/tiny-llama@v1"])
    click.secho("# 9b. move only what a server reads: a pipeline stage without the original/ copy is a partial "
                "copy of its own (never served as v2); a compile cache travels with its version", bold=True)
    _run(["preload", "demo/tiny-llama@v2", "--layers", "2-3", "--exclude", "original/", "--tier", "hot"])
    cache = base / "compile-cache"
    for i in range(40):
        f = cache / f"inductor/{i % 4:02d}/k{i}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"# kernel {i}\n" * 40)
    _run(["publish", str(cache), "--companion-of", "demo/tiny-llama@v2", "--kind", "compile-cache",
          "--key", "vllm-0.8-cpu-tp1"])
    _run(["preload", "demo/tiny-llama@v2", "--tier", "warm", "--with", "compile-cache", "--key", "vllm-0.8-cpu-tp1",
          "--companion-dir", str(base / "engine-cache")])
    _run(["status"])
    return config


def _demo_object_store(base: Path, hot: Path, v1: Path) -> None:
    """Cold storage in a local S3 server (moto, from the test extra): publish there, preload from it."""
    try:
        import moto.server  # noqa: F401 (the test extra)
    except ImportError:
        click.secho("# 11b. (skipped: an S3 cold tier needs moto[server], from pip install -e .[test])", bold=True)
        return
    from tiering import local_s3
    click.secho("# 11b. cold storage in object storage: a local S3 server (moto) as [tiers.cold] url", bold=True)
    saved = list(_CONFIG)
    try:
        with local_s3("weightd-demo", key="demo") as endpoint:
            cfg = base / "weightd-s3.toml"
            cfg.write_text(f'state_dir = "{base}/state-s3"\n[tiers.hot]\npath = "{hot}-s3"\ncapacity = "1GiB"\n'
                           f'[tiers.warm]\npath = "{base}/warm-s3"\ncapacity = "2GiB"\n[tiers.cold]\n'
                           f'url = "s3://weightd-demo/models"\nendpoint = "{endpoint}"\nregion = "us-east-1"\n')
            _CONFIG[:] = ["--config", str(cfg)]
            _run(["--no-daemon", "publish", str(v1), "--name", "acme/llama-s3", "--version", "v1"])
            _run(["--no-daemon", "preload", "acme/llama-s3", "--tier", "warm"])
            _run(["--no-daemon", "ls"])
    finally:
        _CONFIG[:] = saved
        shutil.rmtree(f"{hot}-s3", ignore_errors=True)


def _demo_intent(base: Path) -> None:
    """Declare what the node should hold; the daemon converges and says so (intent status, NFD labels)."""
    import json
    import time
    click.secho("# 10b. fleet intent: an intent file (a ConfigMap in Kubernetes) declares what nodes labelled "
                "pool=chat keep;\n#      the daemon converges on its own, and publishes what it holds for schedulers",
                bold=True)
    text = ('[[keep]]\nmodel = "demo/tiny-llama@v1"\ntier = "warm"\npin = true\nnodes = "pool=chat"\n\n'
            '[[keep]]\nmodel = "demo/tiny-llama@latest"\ntier = "hot"\nnodes = "pool=chat"\npriority = 10\n')
    (base / "intent.d" / "chat.toml").write_text(text)
    click.secho(f"$ cat {base}/intent.d/chat.toml", fg="cyan", bold=True)
    click.echo(text)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p = subprocess.run([sys.executable, "-m", "weightd", *_CONFIG, "intent", "status", "--json"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode == 0 and (rows := json.loads(p.stdout)["entries"]) and all(r["state"] == "ready" for r in rows):
            break
        time.sleep(0.5)
    _run(["intent", "status"])
    click.secho(f"$ cat {base}/features.d/weightd   (Node Feature Discovery turns these into node labels)",
                fg="cyan", bold=True)
    try:
        click.echo((base / "features.d" / "weightd").read_text())
    except OSError as exc:
        click.echo(f"(not written: {exc})\n")


def run_demo(workdir: str | None, size: str = "64MiB") -> None:
    own = workdir is None
    base = Path(workdir or tempfile.mkdtemp(prefix="weightd-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    hot = Path(f"/dev/shm/weightd-demo-{os.getpid()}")
    try:
        v1, v2, victim = _demo_content(base, size)
        config = _demo_node(base, hot, v1, v2, victim)
        _demo_daemon(base, config)
        _demo_cluster(base, parse_size(size))
        _demo_object_store(base, hot, v1)
        click.secho("# 12. weightd doctor: is anything on this node slowing model loading? (exit 7 = critical)",
                    bold=True)
        _run(["--no-daemon", "doctor", "--sample-s", "1"], expect=(0, 7))
        click.secho("demo complete", fg="green", bold=True)
    finally:
        _CONFIG.clear()
        shutil.rmtree(hot, ignore_errors=True)
        if own:
            shutil.rmtree(base, ignore_errors=True)
