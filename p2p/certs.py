"""Fleet TLS credentials: the CA every SSL torrent carries, and this node's certificate and key.

``load_fleet_tls(ca, cert, key)`` reads and checks the three PEM files once (config load, SIGHUP) and
returns ``FleetTLS``: the bytes handed to libtorrent (``set_root_cert`` at publish,
``set_ssl_certificate_buffer`` on every torrent), so what was checked is exactly what is used. A file
that is missing or unreadable, a certificate that is expired or not yet valid, a key that does not
match, a certificate not signed by the CA or one libtorrent would refuse for a weightd torrent (no
``*`` DNS name, see below) is ``BadCertificate(path, reason)``.

What libtorrent 2.1.1 checks in a peer's certificate (measured, docs/security.md "Private fleets"): the chain up to
the torrent's root certificate, its dates, and a subjectAltName DNS entry or the subject's CN equal
to the torrent's name or ``*``. weightd's torrent names are version labels ("v1"), the same in
every model, so fleet node certificates carry ``DNS:*``: any node of the fleet may exchange any
version; the CA is what decides who is in the fleet.

``make_ca`` / ``issue_cert`` / ``write_fleet`` make a throwaway fleet (tests, ``make demo``, a first
try); a real fleet issues from its own PKI with the same profile.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.x509.oid import NameOID

from .errors import BadCertificate

if TYPE_CHECKING:
    import libtorrent as lt

#: the DNS name fleet node certificates carry: libtorrent accepts it for every torrent name
FLEET_SAN = "*"
MAX_PEM_BYTES = 1 << 20

#: Diffie-Hellman parameters libtorrent wants with every certificate (an empty string fails the torrent with
#: "[dh params]"): RFC 7919's ffdhe2048 group (checked: equal to the RFC's formula, p and (p-1)/2 prime).
#: Used only for DHE cipher suites; TLS 1.3 and ECDHE, what two libtorrent peers negotiate, never use it.
DH_PARAMS_PEM = """-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
"""


@dataclass(frozen=True, slots=True)
class FleetTLS:
    """Checked PEM bytes: the fleet CA (its certificates only, as torrents carry it), this node's
    certificate (leaf first, then any intermediates) and its private key (unencrypted PEM)."""
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    not_after: dt.datetime
    ca_path: str = ""
    cert_path: str = ""
    key_path: str = ""

    def __repr__(self) -> str:  # never the key
        return f"FleetTLS(cert={self.cert_path!r}, ca={self.ca_path!r}, not_after={self.not_after:%Y-%m-%d})"


def present(h: "lt.torrent_handle", tls: "FleetTLS") -> None:
    """Give a torrent of a TLS session this node's certificate (``FleetTLS``): the main session's and the
    crossing session's alike (libtorrent then talks to that torrent's peers only over TLS)."""
    h.set_ssl_certificate_buffer(tls.cert_pem.decode(), tls.key_pem.decode(), DH_PARAMS_PEM)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_PEM_BYTES + 1)
    except FileNotFoundError:
        raise BadCertificate(str(path), "no such file") from None
    except IsADirectoryError:
        raise BadCertificate(str(path), "is a directory") from None
    except OSError as exc:
        raise BadCertificate(str(path), exc.strerror or str(exc)) from None
    if len(data) > MAX_PEM_BYTES:
        raise BadCertificate(str(path), "larger than 1 MiB: not a PEM file")
    return data


def _certs(path: Path, data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise BadCertificate(str(path), "no PEM certificate in it")
    return certs


def _check_dates(path: Path, cert: x509.Certificate, now: dt.datetime, what: str) -> None:
    if now < cert.not_valid_before_utc:
        raise BadCertificate(str(path), f"{what} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    if now > cert.not_valid_after_utc:
        raise BadCertificate(str(path), f"{what} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    if cert.issuer != issuer.subject:
        return False
    key = issuer.public_key()
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
                       cert.signature_hash_algorithm)  # type: ignore[arg-type]
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(cert.signature, cert.tbs_certificate_bytes,
                       ec.ECDSA(cert.signature_hash_algorithm))  # type: ignore[arg-type]
        elif isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
            key.verify(cert.signature, cert.tbs_certificate_bytes)
        else:
            return False
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _names(cert: x509.Certificate) -> list[str]:
    """The names libtorrent matches against a torrent's name: subjectAltName DNS entries and the CN."""
    try:
        dns = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    cn = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) if isinstance(a.value, str)]
    return [*dns, *cn]


def same_ca(torrent_root_pem: str, tls: FleetTLS) -> bool:
    """Whether a torrent's root certificate (``torrent_info.ssl_cert()``) is one of the fleet CA's."""
    try:
        theirs = {c.public_bytes(serialization.Encoding.DER)
                  for c in x509.load_pem_x509_certificates(torrent_root_pem.encode())}
    except ValueError:
        return False
    ours = {c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(tls.ca_pem)}
    return bool(theirs) and theirs <= ours


def load_fleet_tls(ca: Path, cert: Path, key: Path, *, now: dt.datetime | None = None) -> FleetTLS:
    """Read and check the fleet CA, this node's certificate and its key (see the module docstring)."""
    now = now or _utcnow()
    ca_pem, cert_pem, key_pem = _read(ca), _read(cert), _read(key)
    cas = _certs(ca, ca_pem)
    for c in cas:
        _check_dates(ca, c, now, "the CA certificate")
    chain = _certs(cert, cert_pem)
    leaf = chain[0]
    _check_dates(cert, leaf, now, "the certificate")
    for c in chain[1:]:
        _check_dates(cert, c, now, "an intermediate certificate")
    # leaf -> intermediates in the file -> one of the CA's certificates
    node, pool = leaf, list(chain[1:])
    for _ in range(len(chain)):
        if any(_signed_by(node, c) for c in cas):
            break
        nxt = next((c for c in pool if _signed_by(node, c)), None)
        if nxt is None:
            raise BadCertificate(str(cert), f"not signed by the fleet CA in {ca} (issuer: {leaf.issuer.rfc4514_string()})")
        pool.remove(nxt)
        node = nxt
    else:
        raise BadCertificate(str(cert), f"not signed by the fleet CA in {ca}")
    if FLEET_SAN not in _names(leaf):
        raise BadCertificate(str(cert), f"has no subjectAltName DNS:{FLEET_SAN} (libtorrent accepts a peer for a "
                             f"torrent only if a DNS name or the CN is the torrent's name or '*'); names: "
                             f"{', '.join(_names(leaf)) or 'none'}")
    try:
        pkey = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise BadCertificate(str(key), "the key is encrypted (a passphrase-less PEM key is needed)") from None
    except (ValueError, Exception) as exc:  # noqa: BLE001 (cryptography raises several types for garbage)
        raise BadCertificate(str(key), f"not a PEM private key ({type(exc).__name__})") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if pkey.public_key().public_bytes(serialization.Encoding.PEM, pub) != \
            leaf.public_key().public_bytes(serialization.Encoding.PEM, pub):
        raise BadCertificate(str(key), f"does not match the certificate in {cert}")
    # the CA as torrents carry it (set_root_cert): the certificates alone, re-encoded (no comments, no key)
    root = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in cas)
    return FleetTLS(root, cert_pem, key_pem, leaf.not_valid_after_utc, str(ca), str(cert), str(key))


# -- a throwaway fleet (tests, make demo) ---------------------------------------------------------------
def _pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())


def make_ca(name: str = "weightd fleet CA", *, days: int = 3650) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _utcnow()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue_cert(ca_cert_pem: bytes, ca_key_pem: bytes, node: str, *, dns: Iterable[str] = (FLEET_SAN,),
               ips: Iterable[str] = (), not_before: dt.datetime | None = None,
               not_after: dt.datetime | None = None, days: int = 365) -> tuple[bytes, bytes]:
    """A node certificate signed by the CA: (certificate PEM, key PEM). CN = ``node``; SAN = ``dns``
    (``*`` by default, what libtorrent needs) plus ``ips`` (for an HTTPS tracker's server certificate)."""
    import ipaddress
    ca = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _utcnow()
    nb = not_before or now - dt.timedelta(hours=1)
    na = not_after or now + dt.timedelta(days=days)
    san = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
               .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(nb).not_valid_after(na)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                     x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), critical=False))  # type: ignore[arg-type]
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def write_fleet(directory: Path, nodes: Iterable[str], *, ips: dict[str, list[str]] | None = None) -> dict[str, Path]:
    """A throwaway fleet in ``directory``: ``ca.pem``/``ca.key`` and ``NODE.pem``/``NODE.key`` for each
    node (keys 0600). Returns the paths by name (``ca``, ``ca.key``, ``NODE``, ``NODE.key``)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key = make_ca()
    _write(directory / "ca.pem", ca_pem, 0o644)
    _write(directory / "ca.key", ca_key, 0o600)
    out = {"ca": directory / "ca.pem", "ca.key": directory / "ca.key"}
    for node in nodes:
        cert, key = issue_cert(ca_pem, ca_key, node, ips=(ips or {}).get(node, ()))
        _write(directory / f"{node}.pem", cert, 0o644)
        _write(directory / f"{node}.key", key, 0o600)
        out[node], out[f"{node}.key"] = directory / f"{node}.pem", directory / f"{node}.key"
    return out
