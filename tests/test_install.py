"""weightd as a platform team installs it: the wheel into a fresh virtualenv without extras, and
``make install DESTDIR=...`` run as the service's own (non-root) user; then the daemon, publish,
preload through the daemon, status, doctor and a two-node swarm, all through the installed ``weightd``
from outside the checkout. Nothing reaches a registry: the dependencies come from the wheelhouse that
``make wheelhouse`` (part of ``make test``) fetched, so a package that is imported but not declared
fails here exactly as it would for a user."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tiering.sample import make_checkpoint

from .conftest import stop_process
from .test_daemon import free_port
from .test_p2p import Node

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".venv/wheelhouse"
OWN = ("weightd", "tiering", "p2p")
MiB = 1 << 20
EXTRAS = ("pytest", "hypothesis", "moto", "boto3", "olah", "fusepy", "torch")   # (not pyyaml: huggingface-hub needs it)


def _clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH (the checkout must not be what runs), no pip config (its find-links and extra
    indexes could supply what the wheelhouse lacks), no WEIGHTD_ settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WEIGHTD_", "XDG_", "PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _wheelhouse() -> Path:
    if not any(WHEELHOUSE.glob("*.whl")):
        if os.environ.get("CI"):
            pytest.fail(f"{WHEELHOUSE} is empty: make test runs `make wheelhouse` before the suite")
        pytest.skip("no wheelhouse: run `make wheelhouse` (make test does)")
    return WHEELHOUSE


def _source_copy(dst: Path) -> Path:
    """What a user builds from: the tracked files, without the checkout's build or venv leftovers."""
    # tracked files and new ones not ignored (what the suite tests is the work tree, committed or not)
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file() and not f.startswith(("tests/", "bench/")):
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)
    return dst


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel of this tree, installed with nothing but its declared dependencies into a new venv."""
    wheels = _wheelhouse()
    tmp = tmp_path_factory.mktemp("installed")
    env = _clean_env(tmp)
    src = _source_copy(tmp / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300, env=env, cwd=tmp)
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300, env=env)
    proc = subprocess.run([str(tmp / "venv/bin/python"), "-m", "pip", "install", "-q", "--no-index",
                           "--find-links", str(tmp / "dist"), "--find-links", str(wheels), "weightd"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"tmp": tmp, "venv": tmp / "venv", "exe": tmp / "venv/bin/weightd", "env": env}


def _run(inst: dict, *args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(inst["exe"]), *args], capture_output=True, text=True, timeout=timeout,
                          env=inst["env"], cwd=cwd or inst["tmp"])


def test_every_import_of_the_shipped_packages_is_a_declared_dependency() -> None:
    """Read from the source, so it fails before any install does: every module a module of weightd,
    tiering or p2p imports is the standard library, one of the three, or a package that [project]
    dependencies declares. An import only for type checking, or inside ``try: ... except ImportError``
    (an optional extra, with a message), is allowed."""
    from importlib.metadata import packages_distributions
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()   # noqa: E731
    declared = {norm(re.split(r"[ <>=!~;\[]", d, maxsplit=1)[0]) for d in deps}
    dists = packages_distributions()

    def guarded(tree: ast.AST) -> set[int]:
        lines: set[int] = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                lines |= {c.lineno for b in n.body for c in ast.walk(b) if hasattr(c, "lineno")}
            if isinstance(n, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("x"))
                                              for h in n.handlers):
                lines |= {c.lineno for b in n.body for c in ast.walk(b) if hasattr(c, "lineno")}
        return lines

    bad = []
    for pkg in OWN:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text())
            skip = guarded(tree)
            for n in ast.walk(tree):
                if isinstance(n, ast.Import):
                    mods = [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                    mods = [n.module]
                else:
                    continue
                if n.lineno in skip:
                    continue
                for m in mods:
                    top = m.split(".")[0]
                    if top in OWN or top in sys.stdlib_module_names or top == "__future__":
                        continue
                    if not any(norm(d) in declared for d in dists.get(top, [top])):
                        bad.append(f"{f.relative_to(ROOT)}:{n.lineno}: {m}")
    assert not bad, "imported but not in [project] dependencies:\n" + "\n".join(bad)


def test_the_wheel_installs_and_every_module_imports_without_extras(installed) -> None:
    listed = subprocess.run([str(installed["venv"] / "bin/python"), "-m", "pip", "list", "--format=json"],
                            capture_output=True, text=True, timeout=120, env=installed["env"], check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "weightd" in names and "numpy" in names
    # the man pages ship in the wheel's data (PREFIX/share/man, where man looks beside PREFIX/bin)
    for page in ("share/man/man1/weightd.1", "share/man/man5/weightd.toml.5"):
        assert (installed["venv"] / page).read_text() == (ROOT / "man" / Path(page).name).read_text(), page
    assert not names & set(EXTRAS), names & set(EXTRAS)   # (nothing of the test extras came along)
    where = subprocess.run([str(installed["venv"] / "bin/python"), "-c", "import weightd, p2p.plan; "
                            "print(weightd.__file__, weightd.__version__)"], capture_output=True, text=True,
                           timeout=120, env=installed["env"], cwd=installed["tmp"], check=True)
    assert where.stdout.startswith(str(installed["venv"])), where.stdout   # the installed copy, not the checkout
    r = _run(installed, "serve", "--check=install")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"ok +modules +\d+ imported", r.stdout) and "FAIL" not in r.stdout, r.stdout
    assert _run(installed, "--version").stdout.startswith("weightd, version ")


def _config(base: Path, port: int) -> Path:
    hot = Path(f"/dev/shm/weightd-test-install-{os.getpid()}-{port}")
    cfg = base / "weightd.toml"
    cfg.write_text(f'state_dir = "{base}/state"\n[tiers.hot]\npath = "{hot}"\ncapacity = "128MiB"\n'
                   f'[tiers.warm]\npath = "{base}/warm"\ncapacity = "256MiB"\n[tiers.cold]\npath = "{base}/cold"\n'
                   f'[api]\nsocket = "{base}/state/weightd.sock"\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
    return cfg


def test_the_installed_daemon_serves_publish_preload_status_doctor(installed, tmp_path: Path) -> None:
    port = free_port()
    cfg = _config(tmp_path, port)
    w = lambda *a, **k: _run(installed, "--config", str(cfg), *a, **k)   # noqa: E731
    assert w("sample", str(tmp_path / "ckpt"), "--size", "8MiB", "--shards", "2").returncode == 0
    pub = w("--no-daemon", "publish", str(tmp_path / "ckpt"), "--name", "acme/m", "--version", "v1")
    assert pub.returncode == 0, pub.stderr
    check = w("serve", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    log = open(tmp_path / "daemon.log", "w")
    daemon = subprocess.Popen([str(installed["exe"]), "--config", str(cfg), "serve"], stdout=log,
                              stderr=subprocess.STDOUT, env=installed["env"], cwd=tmp_path)
    try:
        import time
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "daemon.log").read_text()
            time.sleep(0.2)
        pre = w("--daemon-only", "preload", "acme/m@v1", "--json")
        assert pre.returncode == 0, pre.stderr
        assert json.loads(pre.stdout)["path"].endswith("acme/m/v1")
        st = w("status", "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["answered_by"] == "daemon", st.stderr
        assert w("ls").returncode == 0 and w("path", "acme/m@v1").returncode == 0
        doc = w("doctor", "--json", "--sample-s", "0.5", "--no-probe")
        assert doc.returncode in (0, 7) and "internal error" not in doc.stderr, doc.stderr
        assert json.loads(doc.stdout)["findings"] is not None
        text = (tmp_path / "daemon.log").read_text()
        assert "Traceback" not in text and "serving role=worker" in text, text
    finally:
        stop_process(daemon)
        log.close()
        shutil.rmtree(re.search(r'path = "(/dev/shm/[^"]+)"', cfg.read_text()).group(1), ignore_errors=True)


@pytest.mark.slow
def test_a_two_node_swarm_of_installed_daemons(installed, tmp_path: Path) -> None:
    """An origin and a worker on 127.0.0.x, both the installed weightd: the worker's copy comes from the
    origin over the swarm (libtorrent and the piece plan's numpy as installed), nothing from cold."""
    cmd = [str(installed["exe"])]
    nodes = []
    try:
        origin = Node(tmp_path, "127.0.0.2", tmp_path / "cold", role="origin", env=installed["env"], cmd=cmd)
        nodes.append(origin)
        src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=2)
        pub = origin.cli("publish", str(src), "--name", "org/swarm", "--version", "v1")
        assert pub.returncode == 0, pub.stderr
        worker = Node(tmp_path, "127.0.0.3", tmp_path / "cold", origin=origin.endpoint, env=installed["env"], cmd=cmd)
        nodes.append(worker)
        r = worker.cli("--daemon-only", "preload", "org/swarm@v1", "--tier", "warm", "--json", "--timeout", "120")
        assert r.returncode == 0, r.stderr + (worker.dir / "daemon.log").read_text()[-3000:]
        rep = json.loads(r.stdout.splitlines()[0])
        assert rep["bytes_by_source"]["cold"] == 0 and rep["bytes_by_source"]["origin"] > 0, rep
        assert worker.cli("verify", str(worker.dir / "warm/org/swarm/v1")).returncode == 0
    finally:
        for n in nodes:
            n.stop()


def _make_install(tmp: Path, env: dict[str, str], dest: Path, **make: str) -> subprocess.CompletedProcess[str]:
    src = _source_copy(tmp / "src-make")
    args = [f"{k}={v}" for k, v in {"DESTDIR": str(dest), "PIP_FLAGS": f"--no-index --find-links {_wheelhouse()}",
                                    **make}.items()]
    return subprocess.run(["make", "-s", "install", *args], cwd=src, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``make install DESTDIR=...`` of this tree, once for the module's tests (they only read the staged
    tree): the DESTDIR and make's outcome. An earlier install had left a venv on this test's interpreter
    there (a pyenv under /root, in CI): the install must rebuild it."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    tmp = tmp_path_factory.mktemp("staged")
    dest = tmp / "stage"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest / "opt/weightd")], check=True, timeout=120)
    return dest, _make_install(tmp, _clean_env(tmp), dest)


def test_make_install_destdir_stages_a_relocated_install(staged) -> None:
    """Everything lands under DESTDIR and names only the final places; the unit's ExecStartPre checks
    the install; the venv (left by an earlier install on another interpreter) runs from a system
    interpreter."""
    dest, proc = staged
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ok +modules", proc.stdout), proc.stdout
    unit = (dest / "usr/lib/systemd/system/weightd.service").read_text()
    assert "ExecStart=/usr/bin/weightd --config /etc/weightd/weightd.toml serve" in unit
    assert "ExecStartPre=/usr/bin/weightd --config /etc/weightd/weightd.toml serve --check=install" in unit
    assert os.readlink(dest / "usr/bin/weightd") == "/opt/weightd/bin/weightd"
    for f in [*(dest / "opt/weightd/bin").iterdir(), dest / "opt/weightd/pyvenv.cfg", *dest.rglob("*.service")]:
        if f.is_file() and not f.is_symlink():
            assert str(dest) not in f.read_text(errors="replace"), f
    cfg = (dest / "opt/weightd/pyvenv.cfg").read_text()
    home = re.search(r"^home = (.+)$", cfg, re.M).group(1)
    assert not home.startswith(("/root", "/home")), cfg   # (a system Python: User=weightd can run it)
    assert (dest / "etc/weightd/weightd.toml").is_file() and (dest / "usr/lib/sysusers.d/weightd.conf").is_file()


def test_make_install_refuses_an_interpreter_the_service_user_cannot_run(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    py = private / "python3"
    py.symlink_to(sys.executable)
    probe = subprocess.run([str(py), "-c", "import os, sys; print(os.path.realpath(sys.executable))"],
                           capture_output=True, text=True, timeout=60)
    real = Path(probe.stdout.strip())
    if all(os.stat(p).st_mode & 0o001 for p in [real, *real.parents]):
        pytest.skip(f"this test's interpreter ({real}) is reachable by everyone: nothing to refuse")
    proc = _make_install(tmp_path, _clean_env(tmp_path), tmp_path / "stage", INSTALL_PY=str(py))
    assert proc.returncode != 0
    assert "cannot be run by the service's user" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "stage/opt/weightd").exists()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
                    reason="needs root, unshare and setpriv (a mount namespace, a second uid)")
def test_the_staged_install_runs_as_an_unprivileged_user_where_it_will_live(staged) -> None:
    """The staged tree bind-mounted at /opt/weightd in a private mount namespace (as a package would
    place it), then run as uid 65534 as the unit's User= would: the check, a publish and a preload."""
    dest, proc = staged
    assert proc.returncode == 0, proc.stdout + proc.stderr
    work = Path(f"/tmp/weightd-test-uid-{os.getpid()}")
    work.mkdir(mode=0o755)
    try:
        os.chown(work, 65534, 65534)
        ckpt = make_checkpoint(work / "ckpt", total_bytes=4 * MiB, shards=1, layers=2)
        subprocess.run(["chown", "-R", "65534:65534", str(work)], check=True, timeout=60)
        cfg = _config(work, free_port())
        os.chown(cfg, 65534, 65534)
        w = f"/opt/weightd/bin/weightd --config {cfg}"   # (where /usr/bin/weightd points)
        script = (f"mount -t tmpfs tmpfs /opt && mkdir /opt/weightd && mount --bind {dest}/opt/weightd /opt/weightd "
                  f"&& exec setpriv --reuid 65534 --regid 65534 --clear-groups env HOME={work} sh -c '"
                  f"cd {work} && {w} serve --check=install && {w} --no-daemon publish {ckpt} --name acme/m --version v1 "
                  f"&& {w} serve --check && {w} --no-daemon preload acme/m@v1 --tier warm "
                  f"&& {w} --no-daemon status --json'")
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                           capture_output=True, text=True, timeout=300, env=_clean_env(work))
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads(r.stdout[r.stdout.index("{"):])
        assert [c["name"] for c in st["checkpoints"]] == ["acme/m"]
        assert (work / "warm/acme/m/v1").stat().st_uid == 65534
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for hot in Path("/dev/shm").glob(f"weightd-test-install-{os.getpid()}-*"):
            shutil.rmtree(hot, ignore_errors=True)


def test_the_dockerfiles_build_stage_as_written(tmp_path: Path) -> None:
    """No container engine (nor the base image) can be had here, so the build stage's steps are run as
    the Dockerfile writes them: its COPY lines lay out a context, its RUN line runs in it, with two
    substitutions, said here: the image's /usr/local/bin/python3 is this machine's system Python, and
    /opt/weightd a directory of the test; pip takes the wheelhouse instead of the registry."""
    text = (ROOT / "deploy/docker/Dockerfile").read_text()
    build = text[text.index(" AS build"):text.index("\nFROM ", text.index(" AS build"))]
    ctx = tmp_path / "src"
    ctx.mkdir()
    tree = _source_copy(tmp_path / "tree")
    runs = []
    for ln in build.splitlines():
        if ln.startswith("COPY "):
            *srcs, dst = ln.split()[1:]
            for s in srcs:
                if (tree / s).is_dir():
                    shutil.copytree(tree / s, ctx / dst.rstrip("/"), dirs_exist_ok=True)
                else:
                    target = ctx / dst / Path(s).name if dst.endswith("/") else ctx / dst
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(tree / s, target)
        elif ln.startswith("RUN "):
            runs.append(ln[4:])
    assert len(runs) == 1 and (ctx / "scripts/install-venv.sh").is_file() and (ctx / "LICENSE").is_file()
    system_py = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if Path(p).exists()), None)
    if system_py is None:
        pytest.skip("no system Python 3 in /usr/bin or /usr/local/bin")
    prefix = tmp_path / "opt-weightd"
    cmd = (runs[0].replace("/usr/local/bin/python3", system_py).replace("/opt/weightd", str(prefix))
           .replace("PIP_FLAGS=--no-cache-dir", f"PIP_FLAGS='--no-cache-dir --no-index --find-links {_wheelhouse()}'"))
    proc = subprocess.run(["sh", "-c", cmd], cwd=ctx, capture_output=True, text=True, timeout=600,
                          env=_clean_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ok +modules +\d+ imported", proc.stdout), proc.stdout
    # the runtime stage runs the entrypoint from that venv
    v = subprocess.run([str(prefix / "bin/weightd"), "--version"], capture_output=True, text=True, timeout=60,
                       env=_clean_env(tmp_path), cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.startswith("weightd, version"), v.stderr
