"""The OCI cold tier's TLS and bearer-token flows against a real registry (Debian's ``docker-registry``):
one served over TLS with a private CA (trusted through ``ca_file`` only), one whose auth is a token
service (distribution's ``auth: token``; the realm is a small token server in this test that signs
RS256 JWTs with a key the registry trusts). Never a mocked client."""

from __future__ import annotations

import base64
import datetime
import json
import shutil
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

from .conftest import assert_one_line_error, stop_process
from .test_oci import WEIGHTD, _free_port

MiB = 1 << 20
USER, PASSWORD = "bob", "t0ken-pw"

if shutil.which("docker-registry") is None:
    pytest.skip("docker-registry missing (Debian package docker-registry; scripts/install-tools.sh installs it)",
                allow_module_level=True)
x509 = pytest.importorskip("cryptography.x509")


def _key_and_cert(d: Path, name: str, *, ca: tuple | None = None, is_ca: bool = False):
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID
    import ipaddress
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_key, issuer_name = (ca[0], ca[1].subject) if ca else (key, subject)
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if not is_ca and ca is not None:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    cert = b.sign(issuer_key, hashes.SHA256())
    (d / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _serve_registry(d: Path, host: str, extra: str):
    (d / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: " + str(d / "data") +
        "\nhttp:\n  addr: " + host + "\n" + extra)
    log = open(d / "registry.log", "wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(d / "config.yml")], stdout=log, stderr=log)
    import socket
    deadline = time.monotonic() + 15
    while True:
        try:
            with socket.create_connection(("127.0.0.1", int(host.rsplit(":", 1)[1])), timeout=0.5):
                return proc, log
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                log.close()
                raise RuntimeError(f"docker-registry did not start: {(d / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.05)


def _node(node_env, url: str, extra: str = "") -> None:
    text = node_env.config.read_text().replace(f'[tiers.cold]\npath = "{node_env.cold}"\n',
                                               f'[tiers.cold]\nurl = "{url}"\n{extra}')
    assert url in text
    node_env.config.write_text(text)


def _cli(node_env, env):
    def run(*args: object, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(WEIGHTD), "--no-daemon", "--config", str(node_env.config), *map(str, args)],
                              capture_output=True, text=True, timeout=120, env={**env, **(extra_env or {})})
    return run


def _auth(tmp_path: Path, host: str, user: str, password: str) -> Path:
    p = tmp_path / "auth.json"
    p.write_text(json.dumps({"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}))
    return p


def test_tls_with_a_private_ca_only_through_ca_file(node_env, isolated_env, tmp_path: Path) -> None:
    d = tmp_path / "tls"
    d.mkdir()
    ca = _key_and_cert(d, "ca", is_ca=True)
    _key_and_cert(d, "server", ca=ca)
    host = f"127.0.0.1:{_free_port()}"
    proc, log = _serve_registry(d, host, f"  tls:\n    certificate: {d}/server.pem\n    key: {d}/server.key\n")
    try:
        _node(node_env, f"oci://{host}/tls", f'ca_file = "{d}/ca.pem"\n')
        cli = _cli(node_env, isolated_env)
        src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="tls")
        r = cli("publish", src, "--name", "acme/tls", "--version", "v1")
        assert r.returncode == 0, r.stderr
        r = cli("preload", "acme/tls@v1", "--tier", "warm", "--json")
        assert r.returncode == 0, r.stderr
        assert not verify_checkpoint(Path(json.loads(r.stdout)["path"]), build_manifest(src)).problems
        # the same registry without the CA: one line naming the fix
        node_env.config.write_text(node_env.config.read_text().replace(f'ca_file = "{d}/ca.pem"\n', ""))
        assert_one_line_error(cli("preload", "acme/tls@v1", "--tier", "hot"), 2, "TLS", "ca_file")
    finally:
        stop_process(proc)
        log.close()


class _TokenServer:
    """A token service as distribution's ``auth: token`` expects: Basic credentials in, an RS256 JWT out
    (signed with ``key``, its certificate in the header's x5c), granting what the scope asks."""

    def __init__(self, key, cert, service: str, issuer: str) -> None:
        from cryptography.hazmat.primitives import serialization
        self.key, self.service, self.issuer = key, service, issuer
        self.x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.asked: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                q = parse_qs(urlsplit(self.path).query)
                outer.asked.append(",".join(q.get("scope", [])))
                want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": outer.token(q.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"

    def token(self, scopes: list[str]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding
        access = []
        for s in scopes:
            kind, _, rest = s.partition(":")
            name, _, actions = rest.rpartition(":")   # (repository:a/b:pull,push; registry:catalog:*)
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": USER, "aud": self.service, "exp": now + 300, "nbf": now - 60,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}

        def b64(obj: dict) -> str:
            return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")
        signing = f"{b64(header)}.{b64(claims)}"
        sig = self.key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing + "." + base64.urlsafe_b64encode(sig).decode().rstrip("=")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_bearer_token_flow(node_env, isolated_env, tmp_path: Path) -> None:
    d = tmp_path / "bearer"
    d.mkdir()
    key, cert = _key_and_cert(d, "signer", is_ca=True)
    tokens = _TokenServer(key, cert, "weightd-registry", "weightd-test-issuer")
    host = f"127.0.0.1:{_free_port()}"
    try:
        token_auth = (f"auth:\n  token:\n    realm: {tokens.url}\n    service: weightd-registry\n"
                      f"    issuer: weightd-test-issuer\n    rootcertbundle: {d}/signer.pem\n")
        proc, log = _serve_registry(d, host, token_auth)
        try:
            _node(node_env, f"oci://{host}/bearer", "insecure = true\n")
            cli = _cli(node_env, {**isolated_env, "REGISTRY_AUTH_FILE": str(_auth(tmp_path, host, USER, PASSWORD))})
            src = make_checkpoint(tmp_path / "src", total_bytes=2 * MiB, shards=1, layers=2, seed="bearer")
            r = cli("publish", src, "--name", "acme/b", "--version", "v1")
            assert r.returncode == 0, (r.stderr, (d / "registry.log").read_text()[-2000:])
            assert any(s.startswith("repository:bearer/acme/b:") and set(s.rsplit(":", 1)[1].split(",")) ==
                       {"pull", "push"} for s in tokens.asked), tokens.asked
            r = cli("preload", "acme/b@v1", "--tier", "warm", "--json")
            assert r.returncode == 0, r.stderr
            assert not verify_checkpoint(Path(json.loads(r.stdout)["path"]), build_manifest(src)).problems
            ls = cli("ls")
            assert ls.returncode == 0 and "acme/b@v1" in ls.stdout, ls.stderr
            bad = _auth(tmp_path / "src", host, USER, "wrong")
            r = cli("preload", "acme/b@v1", "--tier", "hot", extra_env={"REGISTRY_AUTH_FILE": str(bad)})
            assert_one_line_error(r, 2, f"refused the credentials of user {USER}")
            assert "wrong" not in r.stderr
        finally:
            stop_process(proc)
            log.close()
    finally:
        tokens.close()
