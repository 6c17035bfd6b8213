"""Synthetic Hugging Face style checkpoints for the demo, tests and benchmarks.

Content is deterministic for a given seed and fast to make (a rotated random block stamped with a
per-megabyte tag, so every tensor and chunk hashes differently and nothing compresses). The files are
real safetensors: the reference ``safetensors`` loader opens them.
"""

from __future__ import annotations

import functools
import json
import os
import random
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import xxhash

from .content.safetensors_header import DTYPE_BITS, read_header

_BLOCK = 1 << 20


@functools.lru_cache(maxsize=1)
def _base_block() -> bytes:
    return random.Random(0x5EED).randbytes(_BLOCK)


def fill_bytes(key: str, n: int) -> bytes:
    """``n`` pseudo-random bytes determined by ``key``."""
    base = _base_block()
    shift = xxhash.xxh64_intdigest(key.encode()) % _BLOCK
    rot = base[shift:] + base[:shift]
    out = bytearray(n)
    kb = key.encode()
    for off in range(0, n, _BLOCK):
        m = min(_BLOCK, n - off)
        out[off:off + m] = rot[:m]
        tag = xxhash.xxh3_128_digest(kb + off.to_bytes(8, "little"))
        out[off:off + min(16, m)] = tag[:min(16, m)]
    return bytes(out)


@dataclass(frozen=True, slots=True)
class SampleTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = DTYPE_BITS[self.dtype]
        for d in self.shape:
            n *= d
        return n // 8


def write_safetensors(path: str | os.PathLike[str], tensors: list[SampleTensor],
                      data: Callable[[SampleTensor], bytes], metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file (header padded to 8 bytes like the reference writer).

    ``data(t)`` gives each tensor's bytes when it is written, so a shard is never held in memory whole.
    """
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    off = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for t in tensors:
            blob = data(t)
            if len(blob) != t.nbytes:
                raise ValueError(f"tensor {t.name}: {len(blob)} bytes for {t.dtype} {list(t.shape)}")
            fh.write(blob)


def model_tensors(total_bytes: int, layers: int = 4, dtype: str = "BF16") -> list[SampleTensor]:
    """A llama-like tensor list whose sizes add up to about ``total_bytes``."""
    esize = DTYPE_BITS[dtype] // 8
    vocab = 1024
    # per layer: 4 h*h attention + 3 h*(11h/4) mlp (= 12.25 h^2), plus embed/lm_head 2*vocab*h
    h = 64
    while True:
        nxt = h + 64
        if (layers * 12.25 * nxt * nxt + 2 * vocab * nxt) * esize > total_bytes:
            break
        h = nxt
    ih = (h * 11 // 4) // 64 * 64 or 64
    out = [SampleTensor("model.embed_tokens.weight", dtype, (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [SampleTensor(p + "input_layernorm.weight", dtype, (h,))]
        out += [SampleTensor(p + f"self_attn.{x}_proj.weight", dtype, (h, h)) for x in "qkvo"]
        out += [SampleTensor(p + "post_attention_layernorm.weight", dtype, (h,))]
        out += [SampleTensor(p + "mlp.gate_proj.weight", dtype, (ih, h)),
                SampleTensor(p + "mlp.up_proj.weight", dtype, (ih, h)),
                SampleTensor(p + "mlp.down_proj.weight", dtype, (h, ih))]
    out += [SampleTensor("model.norm.weight", dtype, (h,)), SampleTensor("lm_head.weight", dtype, (vocab, h))]
    return out


def make_checkpoint(root: str | os.PathLike[str], *, total_bytes: int = 64 << 20, shards: int = 2,
                    layers: int = 4, dtype: str = "BF16", seed: str = "v1") -> Path:
    """Write an HF-style checkpoint: config, tokenizer files, sharded safetensors + index, a sub-folder."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tensors = model_tensors(total_bytes, layers, dtype)
    hidden = tensors[0].shape[1]
    per_shard = sum(t.nbytes for t in tensors) / max(1, shards)
    groups: list[list[SampleTensor]] = [[] for _ in range(shards)]
    acc = 0
    for t in tensors:
        groups[min(shards - 1, int(acc // per_shard))].append(t)
        acc += t.nbytes
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups):
        fname = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(root / fname, group, lambda t: fill_bytes(f"{seed}/{t.name}", t.nbytes))
        weight_map.update({t.name: fname for t in group})
    if shards > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)}, "weight_map": weight_map}
        (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": layers, "vocab_size": 1024, "torch_dtype": "bfloat16",
              "weightd_sample_seed": seed}
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (root / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6}) + "\n")
    vocab = {f"tok{i}": i for i in range(1024)}
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": vocab}}) + "\n")
    (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}) + "\n")
    (root / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}) + "\n")
    (root / "original").mkdir(exist_ok=True)
    (root / "original" / "params.json").write_text(json.dumps({"dim": hidden, "n_layers": layers}) + "\n")
    return root


def make_ranked_checkpoint(root: str | os.PathLike[str], *, ranks: int = 2, parts: int = 2, layers: int = 4,
                           total_bytes: int = 16 << 20, dtype: str = "BF16", seed: str = "v1") -> Path:
    """A checkpoint laid out per tensor-parallel rank as vLLM's ``sharded_state`` loader writes it:
    ``model-rank-R-part-K.safetensors`` (each rank's slice of every tensor, split into ``parts``)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tensors = model_tensors(total_bytes // ranks, layers, dtype)
    per_part = max(1, -(-len(tensors) // parts))
    for r in range(ranks):
        for k in range(parts):
            group = tensors[k * per_part:(k + 1) * per_part]
            if group:
                write_safetensors(root / f"model-rank-{r}-part-{k}.safetensors", group,
                                  lambda t, r=r: fill_bytes(f"{seed}/rank{r}/{t.name}", t.nbytes))
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers,
                                                  "tensor_parallel_size": ranks}) + "\n")
    return root


def mutate_tensor(path: str | os.PathLike[str], name: str, seed: str = "edit") -> int:
    """Overwrite one tensor's bytes in place with new content; returns how many bytes changed."""
    hdr = read_header(path)
    t = next((t for t in hdr.tensors if t.name == name), None)
    if t is None:
        raise KeyError(f"{path}: no tensor {name!r}")
    with open(path, "r+b") as fh:
        fh.seek(t.begin)
        fh.write(fill_bytes(f"{seed}/{name}", t.nbytes))
    return t.nbytes


def edited_copy(src: Path, dst: Path, *, larger_than: int, every: int, count: int,
                seed: str = "edit") -> list[tuple[str, str, int]]:
    """A copy of checkpoint ``src`` at ``dst`` (a new version of it) with ``count`` of its tensors over
    ``larger_than`` bytes (every ``every``-th, in manifest order) given new bytes: (file, tensor, bytes)
    of each."""
    import shutil

    from .content.build import build_manifest
    shutil.copytree(src, dst)
    picked = [(f.path, t.name) for f, t in build_manifest(src).tensors() if t.nbytes > larger_than][::every][:count]
    return [(f, n, mutate_tensor(Path(dst) / f, n, seed)) for f, n in picked]


_MULTIPART_LOCK = threading.Lock()


def _serialise_multipart_uploads(S3Backend: Any) -> None:
    """moto's backend is not thread-safe: an AbortMultipartUpload racing an UploadPart of the same
    upload fails with "dictionary changed size during iteration" (a 500; S3 itself serialises them).
    Its multipart operations take one lock here (in memory only: request bodies are read before)."""
    for name in ("create_multipart_upload", "upload_part", "upload_part_copy", "abort_multipart_upload",
                 "complete_multipart_upload", "list_multipart_uploads"):
        method = getattr(S3Backend, name, None)
        if method is None or getattr(method, "_weightd_locked", False):
            continue

        def locked(self: Any, *a: Any, _method: Any = method, **k: Any) -> Any:
            with _MULTIPART_LOCK:
                return _method(self, *a, **k)
        wrapped = functools.wraps(method)(locked)
        wrapped._weightd_locked = True  # type: ignore[attr-defined]
        setattr(S3Backend, name, wrapped)


@contextmanager
def local_s3(*buckets: str, key: str = "local", set_keys: bool = True) -> Iterator[str]:
    """A real S3-protocol server on 127.0.0.1 for demos, benchmarks and tests (moto, from the test
    extra; ImportError without it), holding ``buckets``; yields its endpoint. With ``set_keys``, the AWS
    key variables are set to ``key`` for the duration (subprocesses inherit them) and put back after;
    without, the caller gives each client its keys (moto takes any)."""
    import logging

    try:
        import boto3
        from moto.s3.models import S3Backend
        from moto.server import ThreadedMotoServer
    except ImportError as exc:   # (an optional extra: the shipped package never needs it)
        raise ImportError(f"a local S3 server needs the test extra (pip install 'weightd[test]'): {exc}") from exc
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # (the server's request log)
    _serialise_multipart_uploads(S3Backend)
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    old = {k: os.environ.get(k) for k in names}
    if set_keys:
        os.environ.update(dict.fromkeys(names, key))
    try:
        host, port = srv.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                          aws_secret_access_key=key)
        for b in buckets:
            s3.create_bucket(Bucket=b)
        yield endpoint
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- a Hugging Face Hub on loopback ----------------------------------------------------------------
def git(repo: Path, *args: str) -> str:
    """``git`` in ``repo`` with a throw-away identity and no system or user config."""
    import subprocess
    env = {**os.environ, "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo, env=env,
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()


class LocalHub:
    """A Hugging Face Hub-protocol server on 127.0.0.1: olah (a self-hosted mirror) in offline mode over
    ``root/mirrors/models/<repo_id>`` (``org/repo`` unless told), a git repository of a sample checkpoint
    whose safetensors shards are git-lfs objects, plus a small JSON file. Needs ``olah-cli`` beside this
    interpreter (the test extra) and git with git-lfs (``scripts/install-tools.sh``)."""

    def __init__(self, root: Path, total_bytes: int = 4 << 20, shards: int = 2, repo_id: str = "org/repo") -> None:
        import socket
        import subprocess
        import sys
        self.root, self.repo_id = root, repo_id
        self.repo = root / "mirrors" / "models" / repo_id
        make_checkpoint(self.repo, total_bytes=total_bytes, shards=shards, layers=2, seed="hub1")
        (self.repo / "notes[v1].json").write_text('{"glob": "a name that is a pattern too"}\n')
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "lfs", "install", "--local")
        git(self.repo, "lfs", "track", "*.safetensors")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", "first")
        git(self.repo, "tag", "v1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        (root / "olah.toml").write_text(
            f'[basic]\nhost = "127.0.0.1"\nport = {self.port}\nrepos-path = "{root / "repos"}"\n'
            f'mirrors-path = ["{root / "mirrors"}"]\n[accessibility]\noffline = true\n')
        self.log = open(root / "olah.out", "wb")
        # (olah writes logs/ into its working directory: root)
        self.proc = subprocess.Popen([str(Path(sys.executable).with_name("olah-cli")), "-c", str(root / "olah.toml")],
                                     cwd=root, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def commit(self) -> str:
        return git(self.repo, "rev-parse", "HEAD")

    def wait_ready(self, timeout_s: float = 60) -> None:
        import time
        import urllib.error
        import urllib.request
        url = f"{self.endpoint}/api/models/{self.repo_id}/revision/main"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"olah exited: {(self.root / 'olah.out').read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"olah not ready in {timeout_s} s: {(self.root / 'olah.out').read_text(errors='replace')}")

    def env(self, **extra: str) -> dict[str, str]:
        """What a client of this Hub needs in its environment (endpoint, a private HF_HOME)."""
        return {"HF_ENDPOINT": self.endpoint, "HF_HOME": str(self.root / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
                **extra}

    def stop(self) -> None:
        import signal
        import subprocess
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


@contextmanager
def local_hub(root: Path, total_bytes: int = 4 << 20, shards: int = 2, repo_id: str = "org/repo") -> Iterator[LocalHub]:
    """A :class:`LocalHub` serving under ``root``, ready, stopped on exit."""
    root.mkdir(parents=True, exist_ok=True)
    hub = LocalHub(root, total_bytes, shards, repo_id)
    try:
        hub.wait_ready()
        yield hub
    finally:
        hub.stop()


# -- an OCI registry on loopback -------------------------------------------------------------------
@contextmanager
def local_registry(root: Path, *, htpasswd: Path | None = None, start_timeout_s: float = 15) -> Iterator[str]:
    """Debian's ``docker-registry`` (distribution 2.8) on 127.0.0.1 for demos, benchmarks and tests:
    filesystem storage under ``root/data``, plain HTTP (a client needs ``insecure = true``), htpasswd
    basic auth when ``htpasswd`` is given; yields ``HOST:PORT`` once it accepts connections (RuntimeError
    with its log's end if it does not within ``start_timeout_s``), stopped on exit (SIGTERM, then
    SIGKILL). FileNotFoundError when ``docker-registry`` is not installed (``scripts/install-tools.sh``)."""
    import shutil
    import signal
    import socket
    import subprocess
    import time
    exe = shutil.which("docker-registry")
    if exe is None:
        raise FileNotFoundError("docker-registry is not installed (Debian package docker-registry; make tools)")
    root.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    host = f"127.0.0.1:{port}"
    auth = f"auth:\n  htpasswd:\n    realm: weightd\n    path: {htpasswd}\n" if htpasswd is not None else ""
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n{auth}")
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen([exe, "serve", str(root / "config.yml")], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + start_timeout_s
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"docker-registry did not start: "
                                           f"{(root / 'registry.log').read_text(errors='replace')[-2000:]}") from None
                    time.sleep(0.05)
            yield host
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(15)
