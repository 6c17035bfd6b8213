"""Shared fixtures: isolated environment for the real ``weightd`` subprocess, sample checkpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import pytest

from tiering.sample import make_checkpoint

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment where the embedded default config points into tmp_path (never at ~ or /etc)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEIGHTD_", "XDG_"))}
    env.update(HOME=str(home), USER=f"wdtest{os.getpid()}", PYTHONPATH=str(ROOT))
    for k in ("WEIGHTD_CONFIG",):
        monkeypatch.delenv(k, raising=False)
    return env


class Weightd:
    """Runs the real ``weightd`` entry point in a subprocess, bounded in time."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def __call__(self, *args: str, timeout: float = 120, input: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "weightd", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env={**self.env, **(env or {})}, input=input,
                              cwd=ROOT)

    def at_once(self, *argvs: Sequence[object], timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
        """Each of ``argvs`` run as ``self(*argv)`` runs it, all at the same time: for commands none of
        which depends on another's effect (each only reads, say), whose start-up then overlaps."""
        return run_at_once([[sys.executable, "-m", "weightd", *map(str, argv)] for argv in argvs], env=self.env,
                           timeout=timeout)


def run_at_once(cmds: Sequence[Sequence[str]], *, env: dict[str, str] | None = None,
                timeout: float = 120) -> list[subprocess.CompletedProcess[str]]:
    """Each of ``cmds`` started at once (from the checkout), all waited for; any still running when
    one times out is killed."""
    procs = [subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for cmd in cmds]
    try:
        done = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return done
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.fixture
def weightd(isolated_env: dict[str, str]) -> Weightd:
    return Weightd(isolated_env)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A small 3-shard HF-style checkpoint (~6 MiB)."""
    return make_checkpoint(tmp_path / "ckpt", total_bytes=6 << 20, shards=3, layers=3, seed="v1")


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> int | None:
    """SIGTERM, wait, and SIGKILL if it does not go: tests never leave a process behind."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) <= 2, err
    for n in needles:
        assert n in err, (n, err)


# -- signal dispositions ---------------------------------------------------------------------------

_WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD)


def _signal_state() -> dict[str, object]:
    """How this process treats the watched signals: Python's handlers, the kernel's view (ignored or
    caught, from /proc/self/status: a handler set from C shows there only) and this thread's blocked
    mask. A child inherits an ignored or blocked signal across exec (an ignored SIGINT: no Ctrl-C)."""
    masks = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigCgt"):
            masks[key] = int(value, 16)
    state: dict[str, object] = {}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    for sig in _WATCHED_SIGNALS:
        bit = 1 << (sig - 1)
        kernel = "ignored" if masks["SigIgn"] & bit else "caught" if masks["SigCgt"] & bit else "default"
        state[sig.name] = (signal.getsignal(sig), kernel, "blocked" if sig in blocked else "unblocked")
    return state


@pytest.fixture(autouse=True)
def _signal_dispositions_kept():
    """A test that leaves SIGINT, SIGTERM, SIGHUP, SIGPIPE or SIGCHLD handled, ignored or blocked otherwise
    than it found them fails (every later test, and every child it starts, would inherit it); the
    dispositions are put back first, so one leak is reported once."""
    before = _signal_state()
    blocked_before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = _signal_state()
    if after == before:
        return
    for sig in _WATCHED_SIGNALS:
        handler = before[sig.name][0]
        if handler is not None:   # (None: set from C, not restorable from Python)
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked_before)
    changed = {name: (before[name], after[name]) for name in before if before[name] != after[name]}
    pytest.fail(f"the test left signal dispositions changed (before, after): {changed}", pytrace=False)


# -- TCP ports --------------------------------------------------------------------------------------

import socket as _socket  # noqa: E402

_RESERVED_PORTS: list[_socket.socket] = []


def reserve_port(ip: str = "127.0.0.1") -> int:
    """A TCP port on ``ip`` that stays this test's until it ends: bound with SO_REUSEADDR and never
    listening, so the kernel hands it to no other bind(port 0) or outgoing connection (a port found free
    and closed again could be taken before the daemon binds it), while the daemon's listeners (aiohttp
    behind SO_REUSEADDR, libtorrent) bind and listen on it."""
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    s.bind((ip, 0))
    _RESERVED_PORTS.append(s)
    return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _port_reservations_released():
    yield
    while _RESERVED_PORTS:
        _RESERVED_PORTS.pop().close()


# -- a second uid ----------------------------------------------------------------------------------

NOBODY = 65534


def _import_everything_the_cli_may() -> None:
    """Every module of weightd, tiering and p2p (and what they import), in this process: a child that
    dropped to another uid may no longer read the checkout or the interpreter's own directories (CI's
    0700 clone, a venv under /root), so it must import nothing from disk after the drop."""
    import importlib
    import pkgutil
    for top in ("weightd", "tiering", "p2p"):
        pkg = importlib.import_module(top)
        for info in pkgutil.walk_packages(pkg.__path__, f"{top}."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001 (a module the command needs and cannot import fails it in the child, loudly)
                pass
    for mod in ("rich.progress", "rich.console", "rich.table", "rich.live"):  # (imported lazily where they draw)
        importlib.import_module(mod)
    for surface in ("tiering", "tiering.safefs", "tiering.pagecache"):   # (lazy surfaces: every name's module now)
        m = importlib.import_module(surface)
        for name in getattr(m, "__all__", ()):
            getattr(m, name)
    from weightd.cli import cli
    cli.load_all()   # (every command's module: click imports a command's when it runs)


def main_as_nobody(args: list[str], env: dict[str, str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the CLI's ``main(args)`` in a forked child that dropped to uid/gid 65534 with no groups,
    everything it imports imported first (so it runs wherever CI's checkout is, readable or not).
    ``env`` is the child's whole environment (``WEIGHTD_CONFIG``, when given, is loaded here first too)."""
    import select
    import time
    _import_everything_the_cli_may()
    from weightd.cli import main
    if "WEIGHTD_CONFIG" in env:
        from weightd.config import load_config
        load_config(env["WEIGHTD_CONFIG"])
    pipes = [os.pipe(), os.pipe()]   # stdout, stderr
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            for fd, (r, w) in ((1, pipes[0]), (2, pipes[1])):
                os.close(r)
                os.dup2(w, fd)
            sys.stdout = os.fdopen(1, "w", buffering=1)  # (pytest's capture is not fd 1 or 2)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            os.environ.clear()
            os.environ.update(env)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = main(args)
        except SystemExit as exc:  # (doctor's exit 7 is a sys.exit inside the command)
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 (say it in the parent's assertion)
            os.write(2, f"child failed: {exc!r}".encode())
        finally:
            os._exit(code)
    out = {r: b"" for r, _ in pipes}
    for _, w in pipes:
        os.close(w)
    deadline = time.monotonic() + timeout
    try:
        open_ = set(out)
        while open_ and (left := deadline - time.monotonic()) > 0:
            for r in select.select(list(open_), [], [], left)[0]:
                chunk = os.read(r, 65536)
                out[r] += chunk
                if not chunk:
                    open_.discard(r)
        if open_:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"weightd {' '.join(args)} as uid {NOBODY}: no exit in {timeout} s; {out}")
    finally:
        for r in out:
            os.close(r)
    _, status = os.waitpid(pid, 0)
    stdout, stderr = (out[r].decode(errors="replace") for r, _ in pipes)
    return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(status), stdout, stderr)


# -- tiers ------------------------------------------------------------------------------------------

import shutil as _shutil  # noqa: E402
import uuid as _uuid  # noqa: E402

from tiering.layout import TierSpec  # noqa: E402
from tiering.node import LocalNode  # noqa: E402


class NodeEnv:
    """A node's directories: hot on the real /dev/shm tmpfs, warm/cold/state under tmp_path."""

    def __init__(self, tmp_path: Path, hot_capacity: str = "256MiB", warm_capacity: str = "512MiB", *,
                 cold_store: bool = True) -> None:
        """``cold_store``: cold storage is there as on a node whose shared storage is mounted (the store's
        directory with its marker, nothing published); False: the configured path does not exist."""
        self.tmp = tmp_path
        self.hot = Path(f"/dev/shm/weightd-test-{_uuid.uuid4().hex[:10]}")
        _HOTS.append(self.hot)   # (removed after the test whoever made this env: see _hot_tiers_removed)
        self.warm, self.cold, self.state = tmp_path / "warm", tmp_path / "cold", tmp_path / "state"
        self.config = tmp_path / "weightd.toml"
        self.write_config(hot_capacity, warm_capacity)
        if cold_store:
            from tiering.safefs import open_cold_store
            open_cold_store(self.cold, create=True).close()

    def write_config(self, hot_capacity: str, warm_capacity: str, hot_path: Path | None = None) -> None:
        if hot_path is not None:
            self.hot = hot_path
        self.hot_capacity, self.warm_capacity = hot_capacity, warm_capacity
        self.config.write_text(
            f'state_dir = "{self.state}"\n'
            f'[tiers.hot]\npath = "{self.hot}"\ncapacity = "{hot_capacity}"\n'
            f'[tiers.warm]\npath = "{self.warm}"\ncapacity = "{warm_capacity}"\n'
            f'[tiers.cold]\npath = "{self.cold}"\n'
            f'[api]\nsocket = "{self.state}/weightd.sock"\n'
            f'[p2p]\nlisten = "127.0.0.1:0"\n')

    def node(self, **kw) -> LocalNode:
        from tiering.content.units import parse_size

        def spec(name: str, path: Path, cap: str) -> TierSpec:
            return TierSpec(name, path, parse_size(cap))
        return LocalNode(hot=spec("hot", self.hot, self.hot_capacity), warm=spec("warm", self.warm, self.warm_capacity),
                         cold=self.cold, state_dir=self.state, **kw)

    def tier_root(self, tier: str) -> Path:
        """The tier's root as weightd makes it (0700, with its marker), for a test that plants something
        inside a tier weightd already owns."""
        from tiering.layout import TIER_MARKER
        root = self.hot if tier == "hot" else self.warm
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        (root / TIER_MARKER).touch()
        return root

    def cleanup(self) -> None:
        _shutil.rmtree(self.hot, ignore_errors=True)


_HOTS: list[Path] = []   # every NodeEnv's hot tier on the real /dev/shm, this test's


@pytest.fixture(autouse=True)
def _hot_tiers_removed():
    """A test that makes a NodeEnv itself (not through ``node_env``) left its hot tier in /dev/shm,
    two directories per CI run: every one is removed after its test, pass or fail."""
    yield
    while _HOTS:
        _shutil.rmtree(_HOTS.pop(), ignore_errors=True)


@pytest.fixture
def node_env(tmp_path: Path):
    env = NodeEnv(tmp_path)
    try:
        yield env
    finally:
        env.cleanup()


@pytest.fixture
def wd(weightd: Weightd, node_env: NodeEnv):
    """``weightd --config <node_env's config> ...``; ``wd.at_once([...], [...])`` runs several at the same
    time (``Weightd.at_once``)."""
    def run(*args: str, **kw):
        return weightd("--config", node_env.config, *args, **kw)
    run.at_once = lambda *argvs, **kw: weightd.at_once(*(["--config", node_env.config, *a] for a in argvs), **kw)
    return run


@pytest.fixture(scope="module")
def _s3_server():
    """A real S3-protocol server (moto, in this process, on 127.0.0.1), one for the module's tests."""
    pytest.importorskip("moto.server", reason="moto[server] missing (pip install -e .[test])")
    from tiering.sample import local_s3
    with local_s3(set_keys=False) as endpoint:
        yield endpoint


@pytest.fixture
def s3_endpoint(_s3_server: str, isolated_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The module's S3 server, with its keys (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY = "testing")
    in this process's environment and in ``isolated_env`` for this test only: the module's other tests
    see no AWS variables."""
    keys = dict.fromkeys(("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"), "testing")
    for k, v in keys.items():
        monkeypatch.setenv(k, v)
    isolated_env.update(keys)
    return _s3_server


@pytest.fixture
def bucket(s3_endpoint) -> str:
    import uuid

    import boto3
    name = f"weightd-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name
