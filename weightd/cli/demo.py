"""``weightd demo`` / ``make demo``: weightd's main job on a generated checkpoint, step by step.

Each step runs the real ``weightd`` command in a subprocess and shows it, so the demo is also a
smoke test of the installed entry point. Step 11, a cluster of four daemons on this machine, is
:mod:`.demo_cluster`'s.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import click

from tiering import make_checkpoint, mutate_tensor
from tiering import parse_size

from .demo_cluster import run_cluster


_CONFIG: list[str] = []


def _run(args: list[str], expect: int | tuple[int, ...] = 0, env: dict[str, str] | None = None,
         shown_env: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``weightd ARGS`` in a subprocess (in ``env``, if given, else this one's environment; the variables
    named in ``shown_env`` shown before the command), its output shown; ClickException unless it exits
    ``expect``."""
    prefix = "".join(f"{k}={shlex.quote((env or {})[k])} " for k in shown_env)
    click.secho(f"$ {prefix}weightd " + " ".join(shlex.quote(a) for a in args), fg="cyan", bold=True)
    proc = subprocess.run([sys.executable, "-m", "weightd", *_CONFIG, *args], text=True, capture_output=True,
                          env=env)
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
    config.write_text(config.read_text() + f'[metrics]\nlisten = "127.0.0.1:{port}"\n'
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
    # (its own socket too: a daemon of this machine's at the default one must not take the commands)
    config.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "25%"\n'
                      f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "10GiB"\n'
                      f'[tiers.cold]\npath = "{base}/cold"\n[api]\nsocket = "{base}/weightd.sock"\n')
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


def _own_node(base: Path, hot: Path, tag: str, cold: str) -> None:
    """A node of its own for one step (``weightd-TAG.toml``: its state, hot and warm tiers; ``cold`` is
    the ``[tiers.cold]`` table's body), the one the next commands use."""
    cfg = base / f"weightd-{tag}.toml"
    cfg.write_text(f'state_dir = "{base}/state-{tag}"\n[tiers.hot]\npath = "{hot}-{tag}"\ncapacity = "1GiB"\n'
                   f'[tiers.warm]\npath = "{base}/warm-{tag}"\ncapacity = "2GiB"\n[tiers.cold]\n{cold}')
    _CONFIG[:] = ["--config", str(cfg)]


def _demo_hub(base: Path, hot: Path) -> None:
    """Import from a Hugging Face Hub mirror on this machine (olah, from the test extra, serving a git
    repository whose shards are git-lfs objects): publish hf://, preload, ls."""
    from importlib.util import find_spec
    if find_spec("olah") is None or not Path(sys.executable).with_name("olah-cli").exists():
        click.secho("# 11c. (skipped: a local Hugging Face Hub mirror needs olah, from pip install -e .[test])",
                    bold=True)
        return
    if shutil.which("git") is None or shutil.which("git-lfs") is None:
        click.secho("# 11c. (skipped: a local Hugging Face Hub mirror needs git and git-lfs: make tools)", bold=True)
        return
    from tiering import local_hub
    click.secho("# 11c. import from a Hugging Face Hub mirror: olah on 127.0.0.1 serving demo/tiny, a git "
                "repository whose shards are LFS objects;\n#      the revision becomes its commit SHA (the version), "
                "every file is checked against the Hub's hashes", bold=True)
    saved = list(_CONFIG)
    try:
        with local_hub(base / "hub", total_bytes=4 << 20, repo_id="demo/tiny") as hub:
            _own_node(base, hot, "hf", f'path = "{base}/cold-hf"\n')
            # (a token of the user's is not for this mirror)
            env = {**{k: v for k, v in os.environ.items() if k != "HF_TOKEN"}, **hub.env()}
            _run(["--no-daemon", "publish", "hf://demo/tiny@main"], env=env, shown_env=("HF_ENDPOINT",))
        _run(["--no-daemon", "preload", "demo/tiny", "--tier", "warm"])
        _run(["--no-daemon", "ls"])
    finally:
        _CONFIG[:] = saved
        shutil.rmtree(f"{hot}-hf", ignore_errors=True)


def _demo_registry(base: Path, hot: Path, v1: Path) -> None:
    """An OCI registry as cold storage (Debian's docker-registry on 127.0.0.1, plain HTTP): publish
    there as CNCF ModelPack artifacts, preload from it, ls."""
    if shutil.which("docker-registry") is None:
        click.secho("# 11d. (skipped: a registry as cold storage needs docker-registry: make tools)", bold=True)
        return
    from tiering import local_registry
    click.secho("# 11d. a registry as cold storage: docker-registry on 127.0.0.1 as [tiers.cold] url = \"oci://...\";"
                "\n#      NAME@VERSION is the artifact PREFIX/NAME:VERSION, one layer per file", bold=True)
    saved = list(_CONFIG)
    try:
        with local_registry(base / "registry") as host:
            _own_node(base, hot, "oci", f'url = "oci://{host}/demo"\ninsecure = true\n')
            click.secho(f"$ cat {base}/weightd-oci.toml | tail -3", fg="cyan", bold=True)
            click.echo("\n".join((base / "weightd-oci.toml").read_text().splitlines()[-3:]) + "\n")
            _run(["--no-daemon", "publish", str(v1), "--name", "demo/tiny-llama", "--version", "v1"])
            _run(["--no-daemon", "preload", "demo/tiny-llama@v1", "--tier", "warm"])
            _run(["--no-daemon", "ls"])
    finally:
        _CONFIG[:] = saved
        shutil.rmtree(f"{hot}-oci", ignore_errors=True)


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
        run_cluster(base, parse_size(size))
        _demo_object_store(base, hot, v1)
        _demo_hub(base, hot)
        _demo_registry(base, hot, v1)
        click.secho("# 12. weightd doctor: is anything on this node slowing model loading? (exit 7 = critical)",
                    bold=True)
        _run(["--no-daemon", "doctor", "--sample-s", "1"], expect=(0, 7))
        click.secho("demo complete", fg="green", bold=True)
    finally:
        _CONFIG.clear()
        shutil.rmtree(hot, ignore_errors=True)
        if own:
            shutil.rmtree(base, ignore_errors=True)
