"""Fleet TLS (issue #14): only peers holding a certificate from the fleet CA exchange bytes.

Real libtorrent sessions and real ``weightd serve`` daemons on 127.0.0.x, loopback only; every wait is
bounded. The attacks: a libtorrent session with no certificate, one with a certificate from another CA,
and one offering the same files as a torrent without the CA, all pointed at fleet seeds; a weightd node
without ``tls`` and one from another fleet, both inside ``allow``. Each must get no byte over P2P; each
stock session must be seen to reach the TLS handshake and be refused there (its own alerts, and the
seed's), so that no byte cannot mean it never connected.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from p2p import (BadCertificate, P2PConfig, P2PSession, TorrentRejected, fleet_mismatch, issue_cert, load_fleet_tls,
                 load_torrent, make_ca, make_torrent, write_fleet)
from tiering import build_manifest, verify_checkpoint
from tiering.sample import make_checkpoint

from . import test_p2p
from .test_p2p import Node, free_port, started

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
NOW = dt.datetime.now(dt.timezone.utc)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, Path]:
    """A fleet CA, certificates for 127.0.0.2..8 (the origin's with its IP, for its HTTPS tracker), a
    certificate from another CA and expired / not-yet-valid ones from the fleet CA."""
    d = tmp_path / "pki"
    names = [f"127.0.0.{i}" for i in range(2, 9)]
    f = write_fleet(d, names, ips={"127.0.0.2": ["127.0.0.2"]})
    ca, ca_key = f["ca"].read_bytes(), f["ca.key"].read_bytes()
    other_ca, other_key = make_ca("another fleet")
    f["other-ca"] = _write(d / "other-ca.pem", other_ca)
    c, k = issue_cert(other_ca, other_key, "intruder")
    f["intruder"], f["intruder.key"] = _write(d / "intruder.pem", c), _write(d / "intruder.key", k)
    c, k = issue_cert(ca, ca_key, "old", not_before=NOW - dt.timedelta(days=30), not_after=NOW - dt.timedelta(days=1))
    f["expired"], f["expired.key"] = _write(d / "expired.pem", c), _write(d / "expired.key", k)
    c, k = issue_cert(ca, ca_key, "early", not_before=NOW + dt.timedelta(days=1))
    f["future"], f["future.key"] = _write(d / "future.pem", c), _write(d / "future.key", k)
    c, k = issue_cert(ca, ca_key, "named", dns=("node7.example",))
    f["no-star"], f["no-star.key"] = _write(d / "no-star.pem", c), _write(d / "no-star.key", k)
    return f


def tls_line(ca: Path, cert: Path, key: Path) -> str:
    return f'tls = {{ ca = "{ca}", cert = "{cert}", key = "{key}" }}\n'


# -- certificates ---------------------------------------------------------------------------------------
def test_fleet_files_are_checked(fleet: dict[str, Path], tmp_path: Path) -> None:
    ca = fleet["ca"]
    ok = load_fleet_tls(ca, fleet["127.0.0.3"], fleet["127.0.0.3.key"])
    assert ok.ca_pem.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE" not in ok.ca_pem
    assert "PRIVATE" not in repr(ok)
    bad = {
        (ca, tmp_path / "nope.pem", fleet["127.0.0.3.key"]): "nope.pem: no such file",
        (ca, fleet["expired"], fleet["expired.key"]): "expired.pem: the certificate expired on",
        (ca, fleet["future"], fleet["future.key"]): "future.pem: the certificate is not valid before",
        (ca, fleet["127.0.0.3"], fleet["127.0.0.4.key"]): "127.0.0.4.key: does not match the certificate",
        (ca, fleet["intruder"], fleet["intruder.key"]): "intruder.pem: not signed by the fleet CA",
        (ca, fleet["no-star"], fleet["no-star.key"]): "no-star.pem: has no subjectAltName DNS:*",
        (fleet["127.0.0.3.key"], fleet["127.0.0.3"], fleet["127.0.0.3.key"]): "127.0.0.3.key: no PEM certificate",
        (ca, fleet["127.0.0.3"], ca): "ca.pem: not a PEM private key",
    }
    for args, message in bad.items():
        with pytest.raises(BadCertificate, match=re.escape(message)):
            load_fleet_tls(*args)
    unreadable = tmp_path / "unreadable.key"
    unreadable.write_bytes(fleet["127.0.0.3.key"].read_bytes())
    unreadable.chmod(0)
    try:
        if not _can_read(unreadable):
            with pytest.raises(BadCertificate, match="unreadable.key: Permission denied"):
                load_fleet_tls(ca, fleet["127.0.0.3"], unreadable)
    finally:
        unreadable.chmod(0o600)


def _can_read(p: Path) -> bool:
    try:
        p.read_bytes()
        return True
    except OSError:
        return False


def test_the_readme_openssl_recipe_makes_a_fleet(tmp_path: Path) -> None:
    """The certificate commands docs/security.md gives, run as written: weightd accepts what they make, and
    the same node certificate without ``DNS:*`` is refused with the reason."""
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (scripts/install-tools.sh installs it)")
    readme = (ROOT / "docs" / "security.md").read_text()
    block = readme[readme.index("# a fleet CA, and per node a certificate"):]
    block = block[:block.index("```")]
    for san, ok in (("DNS:*,IP:10.0.0.17", True), ("DNS:gpu-node-17", False)):
        d = tmp_path / san.replace("*", "star").replace(":", "_").replace(",", "_")
        d.mkdir()
        r = subprocess.run(["bash", "-euc", block.replace("DNS:*,IP:10.0.0.17", san)], cwd=d, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        if ok:
            assert load_fleet_tls(d / "ca.pem", d / "node.pem", d / "node.key").not_after > NOW
        else:
            with pytest.raises(BadCertificate, match=r"has no subjectAltName DNS:\*"):
                load_fleet_tls(d / "ca.pem", d / "node.pem", d / "node.key")


def test_bad_certificate_in_config_is_one_line_exit_2(fleet: dict[str, Path], tmp_path: Path, weightd) -> None:
    for cert in ("expired", "intruder"):
        cfg = tmp_path / f"{cert}.toml"
        cfg.write_text(f'state_dir = "{tmp_path}/state"\n[api]\nsocket = "{tmp_path}/s.sock"\n[p2p]\n'
                       + tls_line(fleet["ca"], fleet[cert], fleet[f"{cert}.key"]))
        for args in (("serve",), ("status",)):
            r = weightd("--config", cfg, *args, timeout=60)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and f"{fleet[cert]}" in lines[0] and "p2p.tls" in lines[0], r.stderr
            assert "Traceback" not in r.stderr
    cfg = tmp_path / "plain-tracker.toml"  # announces in the clear would hand out the swarm's addresses
    cfg.write_text(f'state_dir = "{tmp_path}/state"\n[api]\nsocket = "{tmp_path}/s.sock"\n[p2p]\n'
                   'trackers = ["http://127.0.0.2:1/announce"]\n'
                   + tls_line(fleet["ca"], fleet["127.0.0.3"], fleet["127.0.0.3.key"]))
    r = weightd("--config", cfg, "status", timeout=60)
    assert r.returncode == 2 and "https://" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- sessions -------------------------------------------------------------------------------------------
def test_torrent_carries_the_fleet_ca(fleet: dict[str, Path], tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=4 * MiB, shards=1, layers=2)
    m = build_manifest(ckpt)
    tls = load_fleet_tls(fleet["ca"], fleet["127.0.0.2"], fleet["127.0.0.2.key"])
    plain, ssl_t = load_torrent(make_torrent(ckpt, m), m), load_torrent(make_torrent(ckpt, m, root_cert=tls.ca_pem), m)
    assert plain.info_hashes().v2 != ssl_t.info_hashes().v2 and ssl_t.ssl_cert() and not plain.ssl_cert()
    assert fleet_mismatch(ssl_t, tls) is None and fleet_mismatch(plain, None) is None
    assert "carries no fleet CA" in fleet_mismatch(plain, tls)
    assert "this node has no [p2p] tls" in fleet_mismatch(ssl_t, None)
    other = load_torrent(make_torrent(ckpt, m, root_cert=fleet["other-ca"].read_bytes()), m)
    assert "different CA" in fleet_mismatch(other, tls)
    s = P2PSession(P2PConfig(listen="127.0.0.2:0", tls=tls))
    try:
        assert not s.seed(plain, ckpt)  # a TLS node seeds nothing outside the fleet
        with pytest.raises(TorrentRejected, match="carries no fleet CA"):
            s.download(plain, tmp_path / "dl" / "v1", stall_s=2)
    finally:
        s.close()


class Attacker:
    """A stock libtorrent session on ``ip`` with ``ti`` added (and ``cert`` presented, if any), dialling
    ``target``, as an attacker inside ``allow`` would run it. Its own alerts say how each connection it
    made ended: ``refusals`` holds the reason of every one the target closed (a TLS alert, or the end
    of the stream for one that spoke plain BitTorrent to a TLS port)."""

    def __init__(self, ip: str, ti: "lt.torrent_info", save: Path, target: tuple[str, int],  # noqa: F821
                 cert: tuple[Path, Path] | None = None) -> None:
        import libtorrent as lt

        from p2p.certs import DH_PARAMS_PEM
        self.ip, self.target, self.connects, self.refusals = ip, target, 0, []
        listen = f"{ip}:{free_port(ip)},{ip}:{free_port(ip)}s"
        self.ses = lt.session({"listen_interfaces": listen, "outgoing_interfaces": ip, "enable_dht": False,
                               "enable_lsd": False, "enable_upnp": False, "enable_natpmp": False,
                               "enable_incoming_utp": False, "enable_outgoing_utp": False,
                               "alert_mask": lt.alert_category.error | lt.alert_category.peer
                               | lt.alert_category.connect})
        atp = lt.add_torrent_params()
        atp.ti, atp.save_path = ti, str(save)
        atp.flags = atp.flags & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
        self.h = self.ses.add_torrent(atp)
        if cert is not None:
            self.h.set_ssl_certificate_buffer(cert[0].read_text(), cert[1].read_text(), DH_PARAMS_PEM)
        self.got = 0

    def step(self) -> None:
        """Dial the target again, read what happened since, and the payload bytes it has."""
        import libtorrent as lt
        self.h.connect_peer(self.target)
        for a in self.ses.pop_alerts():
            if isinstance(a, lt.peer_alert) and tuple(a.endpoint) == self.target:
                if isinstance(a, lt.peer_connect_alert):
                    self.connects += 1
                elif isinstance(a, (lt.peer_disconnected_alert, lt.peer_error_alert)):
                    self.refusals.append(a.error.message())
        st = self.h.status()
        self.got = max(self.got, st.total_payload_download, st.total_done)

    def settled(self) -> bool:
        """It dialled, and every connection it made has been closed."""
        return self.connects >= 1 and len(self.refusals) >= self.connects


def attack(attackers: list[Attacker], seconds: float = 3.0, settle_s: float = 30.0) -> None:
    """Every attacker dials its target every half second, all at once, for ``seconds``, and then until
    each has dialled and seen each of its connections closed (at most ``settle_s`` more)."""
    start = time.monotonic()
    while True:
        for a in attackers:
            a.step()
        now = time.monotonic()
        if now > start + seconds and all(a.settled() for a in attackers):
            return
        assert now < start + seconds + settle_s, [(a.ip, a.connects, a.refusals) for a in attackers]
        time.sleep(0.5)


def assert_refused(a: Attacker, reason: str) -> None:
    """``a`` reached its target, whose TLS refused every connection (``reason``: the TLS alert or
    stream end the attacker saw), and got no payload byte."""
    assert a.got == 0 and a.connects >= 1, (a.ip, a.got, a.connects)
    assert a.refusals and all(re.search(reason, r) for r in a.refusals), (a.ip, a.refusals)


def test_only_fleet_certificates_get_pieces(fleet: dict[str, Path], tmp_path: Path) -> None:
    """A fleet seed; a fleet leecher gets everything; a stock session without a certificate, one with a
    certificate from another CA, and one offering the same files without the CA each reach the seed,
    whose TLS handshake refuses each of their connections (seen on both sides), and get nothing."""
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=8 * MiB, shards=2, layers=2)
    m = build_manifest(ckpt)
    tls = {ip: load_fleet_tls(fleet["ca"], fleet[ip], fleet[f"{ip}.key"]) for ip in ("127.0.0.2", "127.0.0.3")}
    ti = load_torrent(make_torrent(ckpt, m, root_cert=tls["127.0.0.2"].ca_pem), m)
    seed = P2PSession(P2PConfig(listen="127.0.0.2:0", tls=tls["127.0.0.2"]))
    good = P2PSession(P2PConfig(listen="127.0.0.3:0", tls=tls["127.0.0.3"]))
    failed_handshakes: list[str] = []   # the seed's side: the peer of every refused TLS handshake
    seed.subscribe(lambda ev: failed_handshakes.append(ev.endpoint.rsplit(":", 1)[0])
                   if ev.kind == "peer_error_alert" and ev.operation == "ssl_handshake" else None)
    try:
        assert seed.seed(ti, ckpt)
        target = ("127.0.0.2", seed.port)
        plain = load_torrent(make_torrent(ckpt, m), m)                                    # the files, no CA
        no_cert, other_ca, no_ca = attackers = [
            Attacker("127.0.0.4", ti, tmp_path / "a0", target),                           # no certificate
            Attacker("127.0.0.5", ti, tmp_path / "a1", target, cert=(fleet["intruder"], fleet["intruder.key"])),
            Attacker("127.0.0.6", plain, tmp_path / "a2", target)]
        attack(attackers)
        assert_refused(no_cert, "certificate required")
        assert_refused(other_ca, "unknown ca")
        assert_refused(no_ca, "End of file")   # (plain BitTorrent to a TLS port: the seed hangs up)
        deadline = time.monotonic() + 10
        while any(failed_handshakes.count(a.ip) < a.connects for a in attackers):
            assert time.monotonic() < deadline, (failed_handshakes, [(a.ip, a.connects) for a in attackers])
            time.sleep(0.1)
        assert seed.stats()["upload_bytes"] == 0
        r = good.download(ti, tmp_path / "dl" / "v1", peers=(f"127.0.0.2:{seed.port}",), stall_s=20, timeout_s=60)
        assert verify_checkpoint(tmp_path / "dl" / "v1", m).ok and sum(r.bytes_by_peer.values()) >= m.total_bytes
        assert "127.0.0.3" not in failed_handshakes
    finally:
        for s in (seed, good):
            s.close()


# -- daemons --------------------------------------------------------------------------------------------
@pytest.fixture
def tls_cluster(tmp_path: Path, isolated_env, fleet):
    """``start(ip, cert=..., **Node kwargs)``: a weightd daemon with fleet TLS (``cert=None``: without);
    the origin's tracker is HTTPS and every TLS worker announces there."""
    nodes: list[Node] = []
    origin_tracker: list[str] = []

    def start(ip: str, *, cert: str | None = "fleet", ca: str = "ca", role: str = "worker",
              origin: str | None = None, p2p_extra: str = "", **kw) -> Node:
        name = ip if cert == "fleet" else cert
        extra = p2p_extra + (tls_line(fleet[ca], fleet[name], fleet[f"{name}.key"]) if cert else "")
        if role == "worker" and cert and origin_tracker:
            extra += f'trackers = ["{origin_tracker[0]}"]\n'
        n = Node(tmp_path, ip, tmp_path / "cold", env=isolated_env, role=role, origin=origin, p2p_extra=extra, **kw)
        if role == "origin":  # (test_p2p's Node would hand workers an http:// tracker URL)
            origin_tracker.append(f"https://{ip}:{test_p2p.tracker_of.pop(n.endpoint)}/announce")
        nodes.append(n)
        return n
    try:
        yield start
    finally:
        for n in nodes:
            n.stop()


def metric(node: Node, name: str) -> float:
    listen = re.search(r'\[metrics\]\nlisten = "([^"]+)"', node.config.read_text()).group(1)
    with urllib.request.urlopen(f"http://{listen}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def preload_json(node: Node, ref: str, *extra: str, timeout: float = 150) -> dict:
    proc = node.cli("preload", ref, "--tier", "warm", "--json", *extra, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[0])


@pytest.mark.slow
def test_tls_fleet_and_the_nodes_outside_it(tls_cluster, fleet, tmp_path: Path) -> None:
    """An origin and three workers with fleet TLS all finish from the swarm, verified; a node without a
    certificate, one from another fleet (both inside ``allow``) and a stock libtorrent session with the
    real torrent get no byte over P2P, and the two nodes end in the documented copy from cold."""
    origin = tls_cluster("127.0.0.2", role="origin", limit="20MB")
    src = make_checkpoint(tmp_path / "src", total_bytes=24 * MiB, shards=3, layers=3)
    pub = origin.cli("publish", str(src), "--name", "org/tls", "--version", "v1", "--json")
    assert pub.returncode == 0, pub.stderr
    torrent = (tmp_path / "cold/org/tls/v1/.weightd/checkpoint.torrent").read_bytes()
    m = build_manifest(src)
    ti = load_torrent(torrent, m)
    assert ti.ssl_cert() and fleet_mismatch(ti, load_fleet_tls(fleet["ca"], fleet["127.0.0.2"],
                                                               fleet["127.0.0.2.key"])) is None
    # (15 s of silence before falling back to cold: TLS handshakes of four daemons on a loaded 2-core CI
    # machine took longer than the default test setting of 4 s once)
    workers = started([tls_cluster(f"127.0.0.{i}", origin=origin.endpoint, limit="20MB", fallback_s=15, wait=False)
                       for i in (3, 4, 5)])
    procs = [w.popen("preload", "org/tls@v1", "--tier", "warm", "--json", "--timeout", "120") for w in workers]
    try:
        for w, p in zip(workers, procs):
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err
            r = json.loads(out.splitlines()[0])
            by = r["bytes_by_source"]
            assert by["cold"] == 0 and by["origin"] + by["peer"] >= r["bytes"] and r["source_fallbacks"] == [], \
                (by, r["source_fallbacks"])
            # the plan read the member list over HTTPS, with this node's certificate
            assert r["swarm"]["members_max"] >= 2, r["swarm"]
            assert w.cli("verify", str(w.dir / "warm/org/tls/v1")).returncode == 0
    finally:  # (a failure must not leave pipes for the next test's unraisable-warning check)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)
    time.sleep(1.5)  # (libtorrent's counters tick once a second: the swarm's last blocks first)
    up0 = sum(metric(n, "weightd_p2p_upload_bytes_total") for n in (origin, *workers))

    # inside `allow`, no certificate: the torrent needs one, so P2P is not tried; copied from cold;
    # another fleet's node: a certificate, but the torrent's CA is not its CA
    plain, stranger = started([tls_cluster("127.0.0.6", cert=None, origin=origin.endpoint, wait=False),
                               tls_cluster("127.0.0.7", cert="intruder", ca="other-ca", origin=origin.endpoint,
                                           wait=False)])
    for node, why in ((plain, "this node has no [p2p] tls"), (stranger, "different CA")):
        r = preload_json(node, "org/tls@v1")
        by = r["bytes_by_source"]
        assert by["cold"] == r["bytes"] and by["origin"] == by["peer"] == 0, r
        assert [(f["from"], f["to"]) for f in r["source_fallbacks"]] == [("p2p", "cold")], r
        assert why in r["source_fallbacks"][0]["reason"], r
        assert metric(node, "weightd_p2p_download_bytes_total") == 0
        assert node.cli("verify", str(node.dir / "warm/org/tls/v1")).returncode == 0
    # stock libtorrent sessions with the real torrent, dialling the origin and a worker at once, without a
    # certificate and (the origin) with one from another CA: each reaches the node, whose TLS handshake
    # refuses each of their connections (the daemons count them), and gets nothing
    refusals = "weightd_trust_refusals_total{reason=\"peer_certificate\"}"
    before = {n.ip: metric(n, refusals) for n in (origin, workers[0])}
    attackers = [Attacker("127.0.0.8", ti, tmp_path / "raw0", (origin.ip, origin.port)),
                 Attacker("127.0.0.9", ti, tmp_path / "raw1", (workers[0].ip, workers[0].port)),
                 Attacker("127.0.0.10", ti, tmp_path / "raw-other", (origin.ip, origin.port),
                          cert=(fleet["intruder"], fleet["intruder.key"]))]
    attack(attackers)
    for a, reason in zip(attackers, ("certificate required", "certificate required", "unknown ca")):
        assert_refused(a, reason)
    for n in (origin, workers[0]):
        dialled = sum(a.connects for a in attackers if a.target[0] == n.ip)
        deadline = time.monotonic() + 10
        while metric(n, refusals) - before[n.ip] < dialled:
            assert time.monotonic() < deadline, (n.ip, metric(n, refusals), before[n.ip], dialled)
            time.sleep(0.2)
    time.sleep(1.5)  # (libtorrent's counters tick once a second)
    assert sum(metric(n, "weightd_p2p_upload_bytes_total") for n in (origin, *workers)) == up0
    # the workers announced over HTTPS with their certificates
    assert metric(origin, "weightd_tracker_peers") >= 3


def server_cert_serial(ip: str, port: int, info_hash_v2: str, client: tuple[Path, Path], ca: Path) -> int:
    """The serial of the certificate a libtorrent SSL port presents for a torrent (SNI: the first 40
    hex digits of its v2 info-hash, as libtorrent sends it), dialled with a fleet client certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(ca))
    ctx.load_cert_chain(str(client[0]), str(client[1]))
    with socket.create_connection((ip, port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=info_hash_v2[:40]) as s:
            der = s.getpeercert(binary_form=True)
    from cryptography import x509
    return x509.load_der_x509_certificate(der).serial_number


@pytest.mark.slow
def test_certificate_rotation_on_sighup(tls_cluster, fleet, tmp_path: Path) -> None:
    origin = tls_cluster("127.0.0.2", role="origin", limit="20MB")
    src = make_checkpoint(tmp_path / "src", total_bytes=16 * MiB, shards=2, layers=2)
    assert origin.cli("publish", str(src), "--name", "org/rot", "--version", "v1").returncode == 0
    ti = load_torrent((tmp_path / "cold/org/rot/v1/.weightd/checkpoint.torrent").read_bytes(), build_manifest(src))
    ih = str(ti.info_hashes().v2)
    client = (fleet["127.0.0.8"], fleet["127.0.0.8.key"])
    from cryptography import x509

    def serial(p: Path) -> int:
        return x509.load_pem_x509_certificate(p.read_bytes()).serial_number
    assert server_cert_serial(origin.ip, origin.port, ih, client, fleet["ca"]) == serial(fleet["127.0.0.2"])

    # a new certificate for the origin; its config now names it; SIGHUP
    c, k = issue_cert(fleet["ca"].read_bytes(), fleet["ca.key"].read_bytes(), "127.0.0.2 (rotated)",
                      ips=("127.0.0.2",))
    new_cert, new_key = _write(tmp_path / "pki/rotated.pem", c), _write(tmp_path / "pki/rotated.key", k)
    text = origin.config.read_text()
    origin.config.write_text(text.replace(str(fleet["127.0.0.2"]), str(new_cert))
                             .replace(str(fleet["127.0.0.2.key"]), str(new_key)))
    origin.proc.send_signal(signal.SIGHUP)
    log = origin.dir / "daemon.log"
    deadline = time.monotonic() + 20
    while f"presenting {new_cert}" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert server_cert_serial(origin.ip, origin.port, ih, client, fleet["ca"]) == serial(new_cert)

    # a bad new certificate (expired) is refused; the rotated one stays
    good_config = origin.config.read_text()
    origin.config.write_text(good_config.replace(str(new_cert), str(fleet["expired"]))
                             .replace(str(new_key), str(fleet["expired.key"])))
    origin.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while "config reload failed" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    assert f"{fleet['expired']}: the certificate expired" in log.read_text()
    assert server_cert_serial(origin.ip, origin.port, ih, client, fleet["ca"]) == serial(new_cert)
    origin.config.write_text(good_config)

    # a worker joining after the rotation completes from the rotated seed
    w = tls_cluster("127.0.0.3", origin=origin.endpoint, limit="20MB")
    r = preload_json(w, "org/rot@v1")
    assert r["bytes_by_source"]["cold"] == 0 and r["bytes_by_source"]["origin"] >= r["bytes"], r
    assert r["source_fallbacks"] == [], r


def test_tls_node_never_uses_a_torrent_without_the_fleet_ca(fleet, tmp_path: Path, weightd) -> None:
    """Torrents in cold made without ``tls`` or by another fleet: a TLS node copies from cold and says why
    (in-process preload: no daemon, no origin needed to see the refusal)."""
    cold = tmp_path / "cold"

    def config(name: str, tls: str) -> Path:
        p = tmp_path / f"{name}.toml"
        p.write_text(f'state_dir = "{tmp_path}/{name}-state"\n[api]\nsocket = "{tmp_path}/{name}.sock"\n'
                     f'[tiers.hot]\npath = "/dev/shm/weightd-test-tls-{name}-{tmp_path.name}"\n'
                     f'[tiers.warm]\npath = "{tmp_path}/{name}-warm"\n[tiers.cold]\npath = "{cold}"\n'
                     f'[p2p]\nthreshold = "1MiB"\nlisten = "127.0.0.3:{free_port("127.0.0.3")}"\n'
                     f'peers = ["127.0.0.2:{free_port("127.0.0.2")}"]\nfallback_after_s = 30\n' + tls)
        return p
    plain = config("plain", "")
    other = config("other", tls_line(fleet["other-ca"], fleet["intruder"], fleet["intruder.key"]))
    node = config("node", tls_line(fleet["ca"], fleet["127.0.0.3"], fleet["127.0.0.3.key"]))
    try:
        for cfg, version in ((plain, "v1"), (other, "v2")):  # (another seed: different contents)
            src = make_checkpoint(tmp_path / f"src-{version}", total_bytes=4 * MiB, shards=1, layers=2, seed=version)
            r = weightd("--config", cfg, "--no-daemon", "publish", src, "--name", "org/x", "--version", version)
            assert r.returncode == 0, r.stderr
        for version, why in (("v1", "carries no fleet CA"), ("v2", "different CA")):
            t0 = time.monotonic()
            r = weightd("--config", node, "--no-daemon", "preload", f"org/x@{version}", "--tier", "warm", "--json")
            assert r.returncode == 0, r.stderr
            rep = json.loads(r.stdout)
            by = rep["bytes_by_source"]  # (v2 may reuse a part of v1 held in warm: a header, equal tensors)
            assert by.get("peer", 0) == by.get("origin", 0) == 0 and by["cold"] > 0, rep
            assert by["cold"] + by.get("local_reuse", 0) == rep["bytes"], rep
            assert [(f["from"], f["to"]) for f in rep["source_fallbacks"]] == [("p2p", "cold")], rep
            assert why in rep["source_fallbacks"][0]["reason"] and why in r.stderr, (rep, r.stderr)
            assert time.monotonic() - t0 < 25  # refused up front, not after fallback_after_s of silence
    finally:
        import shutil
        for name in ("plain", "other", "node"):
            shutil.rmtree(f"/dev/shm/weightd-test-tls-{name}-{tmp_path.name}", ignore_errors=True)


def test_without_tls_nothing_changes(tmp_path: Path) -> None:
    """No ``tls``: torrents carry no CA, the session listens on a plain port, as before."""
    ckpt = make_checkpoint(tmp_path / "v1", total_bytes=4 * MiB, shards=1, layers=2)
    m = build_manifest(ckpt)
    ti = load_torrent(make_torrent(ckpt, m), m)
    assert not ti.ssl_cert()
    s = P2PSession(P2PConfig(listen="127.0.0.2:0"))
    try:
        assert s.ses.listen_port() == s.port and s.ses.ssl_listen_port() == 0
        assert s.seed(ti, ckpt)
    finally:
        s.close()
    assert subprocess.run([sys.executable, "-c", "import weightd.config, p2p, sys; "
                           "weightd.config.load_config(None, env={'HOME': '/tmp', 'USER': 'x'}); "
                           "assert 'cryptography' not in sys.modules, 'cryptography'"],
                          cwd=ROOT, capture_output=True, text=True).returncode == 0
