"""Signed checkpoints in the OpenSSF model-signing format (PyPI ``model-signing``, v1.0 predicate).

A signature is a Sigstore bundle (JSON) holding a DSSE envelope whose payload is an in-toto statement:
one resource per file with its SHA-256 (or BLAKE3) digest, the serialization used ("files"), and a
subject whose digest is SHA-256 over the resource digests in path order. The envelope is signed with
an elliptic-curve key (P-256/384/521, ECDSA over DSSE's pre-authentication encoding), exactly as
``model_signing sign key`` does, so ``model_signing verify key`` checks a weightd checkpoint and
weightd checks one signed by that tool. It lives beside the manifest, ``.weightd/model.sig``; the
statement lists ``.weightd`` among its ignored paths, so the tool verifies the version directory as is.

Why not the ``model-signing`` library itself at run time: importing it costs ~0.9 s (it loads the
Sigstore client) on every in-process command, and it re-hashes the whole model in a pass of its own.
weightd needs only the key method's envelope (a page of ``cryptography`` calls), and takes the digests
from the read it does anyway (``hash_files(..., crypto=...)``). The tests check both directions
against the real library.

xxh3-128 (the manifest) stays the fast content id; only the digests here are a security boundary.
Sigstore (keyless) bundles and certificate chains are refused with a reason (not supported here).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import BadInput, IntegrityError

if TYPE_CHECKING:
    from .manifest import Manifest

SIGNATURE_RELPATH = ".weightd/model.sig"
TRUST_RELPATH = ".weightd/trust.json"   # in a tier copy: who signed it and that weightd checked it
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
IGNORE_PATHS = [".weightd", ".git", ".gitattributes", ".github", ".gitignore"]
MAX_BUNDLE_BYTES = 64 << 20    # a statement lists one line per file; anything larger is not a signature
_CURVES = {"secp256r1": "sha256", "secp384r1": "sha384", "secp521r1": "sha512"}


def _blake3() -> Any:
    try:
        import blake3  # type: ignore[import-not-found]
    except ImportError:
        raise BadInput("this signature uses BLAKE3; install weightd[blake3] (the 'blake3' package) to check it") from None
    return blake3.blake3()


HASHERS: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "blake3": _blake3}


class SignatureRefused(IntegrityError):
    """A version whose signature is missing, made by a key not trusted here, or not valid (exit 5).
    ``reason`` is a short label for metrics: unsigned, unknown_key, bad_signature, malformed,
    files_differ, digest_mismatch, unbound (a companion whose signature does not say which content
    of its version it was built for: one signed before weightd put that in the statement)."""

    NEXT_STEP = {
        "unsigned": "publish it signed: weightd publish --sign KEY",
        "unknown_key": "if you trust that key, add its public key to [trust] public_keys",
        "unbound": "publish the companion again, signed: weightd publish DIR --companion-of NAME@V --kind KIND "
                   "--key KEY --sign KEY.pem",
    }

    def __init__(self, ref: str, reason: str, detail: str) -> None:
        self.ref, self.reason, self.detail = ref, reason, detail
        step = self.NEXT_STEP.get(reason, "cold storage holds something other than what was signed: publish it "
                                          "again from a trusted copy")
        super().__init__(f"{ref}: refused ({detail}); {step}")


@dataclass(frozen=True, slots=True)
class SignedStatement:
    """What a valid signature says: the subject's name, every file's digest, and who signed it."""
    subject: str
    algorithm: str                   # "sha256" or "blake3" (one for the whole statement)
    digests: dict[str, str]          # relative path -> hex digest
    key_id: str                      # SHA-256 of the signer's public key (PEM), hex
    key_name: str                    # the trusted key's file name, for people
    # a companion's tie to its version ({"version", "digest", "kind", "key"}: the manifest's ``of``),
    # signed in the predicate's "companion_of" (model-signing v1.0 verifiers ignore other predicate
    # fields); None: not in the statement (a version, or a companion signed before it was covered)
    of: "dict[str, str] | None" = None

    def check_files(self, ref: str, m: "Manifest") -> None:
        """The statement must cover exactly the manifest's files (no more, no less); a partial copy's
        (``m.of``): every one of its files, each signed. A companion's ``of`` (which content of its
        version it was built for: what decides it is served with that version) must be the signed one."""
        self.check_of(ref, m)
        want = {f.path for f in m.files}
        have = set(self.digests)
        if m.of is not None and m.of.get("kind") == "partial" and "~p" in (m.version or "") and want <= have:
            return   # (a partial copy: its manifest parses only under a V~p<hex> label, see manifest_parse._read_of)
        if want != have:
            missing = sorted(want - have)[:2]
            extra = sorted(have - want)[:2]
            what = (f"not signed: {', '.join(missing)}" if missing else "") + \
                   ("; " if missing and extra else "") + (f"signed but not in the manifest: {', '.join(extra)}"
                                                           if extra else "")
            raise SignatureRefused(ref, "files_differ", f"the signature does not cover the manifest's files ({what})")

    def check_of(self, ref: str, m: "Manifest") -> None:
        """A companion's manifest ``of`` against the signed one: a cold-storage writer editing
        ``of.digest`` (outside the manifest digest) to attach it to other content is refused."""
        of = m.of if m.of is not None and m.of.get("kind") != "partial" else None
        if of is None:
            if self.of is not None:
                raise SignatureRefused(ref, "files_differ", f"the signature was made for a companion of "
                                       f"{self.of.get('version')}, not for this")
            return
        if self.of is None:
            raise SignatureRefused(ref, "unbound", "its signature does not cover which content of "
                                   f"{of.get('version')} it was built for (signed before weightd covered a "
                                   "companion's of.digest), so it could be attached to other content")
        mine = {k: of.get(k) for k in OF_SIGNED}
        if mine != {k: self.of.get(k) for k in OF_SIGNED}:
            diff = next(k for k in OF_SIGNED if mine[k] != self.of.get(k))
            raise SignatureRefused(ref, "digest_mismatch", f"its manifest says of.{diff} {str(mine[diff])[:16]}, the "
                                   f"signature {str(self.of.get(diff))[:16]}: it was re-pointed at other content "
                                   f"than {self.key_name} signed it for")

    def check_digests(self, ref: str, actual: dict[str, str], only: "set[str] | None" = None) -> None:
        """Every signed file's digest (``only``: of these files, a partial copy's; each must be signed)."""
        if only is not None and not only <= set(self.digests):
            raise SignatureRefused(ref, "files_differ", f"not signed: {', '.join(sorted(only - set(self.digests))[:2])}")
        for path, want in sorted(self.digests.items()):
            if only is not None and path not in only:
                continue
            got = actual.get(path)
            if got != want:
                raise SignatureRefused(ref, "digest_mismatch",
                                       f"{path}: {self.algorithm} {got or 'missing'} differs from the signed "
                                       f"{want[:16]}...: the bytes are not what {self.key_name} signed")

    def trust_record(self, checked_at: float) -> dict[str, Any]:
        return {"signed": True, "key_id": self.key_id, "key_name": self.key_name, "subject": self.subject,
                "algorithm": self.algorithm, "checked": True, "checked_at": checked_at}


def _pae(payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding (what is actually signed)."""
    t = PAYLOAD_TYPE.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _key_id(public_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _ec_hash(key: Any, what: str) -> Any:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    if not isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)) or key.curve.name not in _CURVES:
        raise BadInput(f"{what}: not an elliptic-curve key on P-256, P-384 or P-521 (what model-signing's key "
                       "method uses)")
    return getattr(hashes, _CURVES[key.curve.name].upper())()


def load_public_key(path: Path) -> tuple[str, Any]:
    """(key id, key) from a PEM public key, or a certificate whose public key is taken (BadInput
    naming the file otherwise)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"trust.public_keys: cannot read {path}: {exc.strerror}") from None
    try:
        if b"BEGIN CERTIFICATE" in data:
            key = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except ValueError:
        raise BadInput(f"trust.public_keys: {path} is not a PEM public key or certificate") from None
    _ec_hash(key, f"trust.public_keys: {path}")
    return _key_id(key), key


def load_private_key(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"signing key {path}: cannot read it: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, None)
    except (ValueError, TypeError):
        raise BadInput(f"signing key {path}: not an unencrypted PEM private key") from None
    _ec_hash(key, f"signing key {path}")
    return key


OF_SIGNED = ("version", "digest", "kind", "key")   # a companion's ``of``: what the statement binds


def sign(key_path: Path, subject: str, digests: dict[str, str], algorithm: str = "sha256",
         of: "dict[str, Any] | None" = None) -> bytes:
    """A model-signing bundle (JSON bytes) over ``digests`` (relative path -> hex), signed with the
    PEM elliptic-curve private key at ``key_path``. ``of``: a companion's tie to its version, signed
    too (a partial copy's is never published, so never signed)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    key = load_private_key(key_path)
    resources = [{"name": p, "algorithm": algorithm, "digest": digests[p]} for p in sorted(digests)]
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    statement = {"_type": STATEMENT_TYPE, "subject": [{"name": subject, "digest": {"sha256": root}}],
                 "predicateType": PREDICATE_TYPE,
                 "predicate": {"resources": resources,
                               "serialization": {"method": "files", "hash_type": algorithm,
                                                 "allow_symlinks": False, "ignore_paths": IGNORE_PATHS}}}
    if of is not None and of.get("kind") != "partial":
        statement["predicate"]["companion_of"] = {k: of[k] for k in OF_SIGNED if k in of}
    payload = json.dumps(statement, indent=2).encode()
    sig = key.sign(_pae(payload), ec.ECDSA(_ec_hash(key, str(key_path))))
    bundle = {"mediaType": BUNDLE_MEDIA_TYPE,
              "verificationMaterial": {"publicKey": {"hint": _key_id(key.public_key())}, "tlogEntries": []},
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                               "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}
    return json.dumps(bundle, indent=2).encode()


class TrustPolicy:
    """The public keys this node trusts, and whether every version must be signed by one of them."""

    def __init__(self, keys: dict[str, tuple[str, Any]], *, required: bool) -> None:
        self.keys = keys              # key id -> (file name, public key)
        self.required = required

    @classmethod
    def load(cls, paths: list[Path], *, required: bool) -> "TrustPolicy":
        keys: dict[str, tuple[str, Any]] = {}
        for p in paths:
            kid, key = load_public_key(p)
            keys[kid] = (Path(p).name, key)
        if required and not keys:
            raise BadInput("trust.require_signature: no trust.public_keys to check signatures with")
        return cls(keys, required=required)

    def verify(self, ref: str, data: bytes) -> SignedStatement:
        """Check a bundle's signature against the trusted keys and return its statement
        (SignatureRefused naming the reason otherwise). Does not look at any file's bytes."""
        payload, raw_sig, hint = _open_bundle(ref, data)
        candidates = [hint] if hint in self.keys else ([] if hint else list(self.keys))
        if not candidates:
            raise SignatureRefused(ref, "unknown_key", f"signed by key {hint[:16]}..., which is not in "
                                   "trust.public_keys")
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ec
        for kid in candidates:
            name, key = self.keys[kid]
            try:
                key.verify(raw_sig, _pae(payload), ec.ECDSA(_ec_hash(key, name)))
            except InvalidSignature:
                continue
            return _statement(ref, payload, kid, name)
        raise SignatureRefused(ref, "bad_signature", "the signature does not verify with "
                               + (f"key {self.keys[candidates[0]][0]}" if hint else "any trusted key")
                               + " (the statement or the signature was changed)")


def read_unverified(ref: str, data: bytes) -> SignedStatement:
    """A bundle's statement without checking who signed it (``publish --signature`` on a node with no
    trusted keys: the bytes are still checked against it; the workers check the signature)."""
    payload, _, hint = _open_bundle(ref, data)
    return _statement(ref, payload, hint, "unverified")


def _open_bundle(ref: str, data: bytes) -> tuple[bytes, bytes, str]:
    """(payload, signature, public key hint) of a model-signing bundle."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise SignatureRefused(ref, "malformed", f"the signature is {len(data)} bytes, more than a signature")
    try:
        bundle = json.loads(data)
    except ValueError:
        raise SignatureRefused(ref, "malformed", "the signature is not JSON") from None
    if not isinstance(bundle, dict) or "dsseEnvelope" not in bundle:
        raise SignatureRefused(ref, "malformed", "not a DSSE bundle (Sigstore message signatures and "
                               "keyless bundles are not supported here)")
    try:
        env = bundle["dsseEnvelope"]
        payload = base64.b64decode(env["payload"], validate=True)
        sigs = env["signatures"]
        hint = (bundle.get("verificationMaterial") or {}).get("publicKey", {}).get("hint", "")
        if not isinstance(hint, str):
            raise TypeError("publicKey.hint")
        if env.get("payloadType") != PAYLOAD_TYPE or not isinstance(sigs, list) or len(sigs) != 1:
            raise ValueError("payload type or signatures")
        raw_sig = base64.b64decode(sigs[0]["sig"], validate=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureRefused(ref, "malformed", f"not a model-signing bundle ({exc})") from None
    return payload, raw_sig, hint


def _statement(ref: str, payload: bytes, key_id: str, key_name: str) -> SignedStatement:
    try:
        st = json.loads(payload)
        if st.get("predicateType") != PREDICATE_TYPE:
            raise ValueError(f"predicate type {st.get('predicateType')!r}")
        subjects = st["subject"]
        if len(subjects) != 1:
            raise ValueError("more than one subject")
        ser = st["predicate"]["serialization"]
        if ser.get("method") != "files":
            raise ValueError(f"serialization {ser.get('method')!r} (weightd checks per-file signatures)")
        digests: dict[str, str] = {}
        algorithms = set()
        for r in st["predicate"]["resources"]:
            digests[str(r["name"])] = str(r["digest"]).lower()
            algorithms.add(r["algorithm"])
        root = hashlib.sha256(b"".join(bytes.fromhex(digests[p]) for p in sorted(digests))).hexdigest()
        if root != subjects[0]["digest"]["sha256"]:
            raise ValueError("the subject digest does not match the resources")
        of = st["predicate"].get("companion_of")
        if of is not None and (not isinstance(of, dict) or set(of) - set(OF_SIGNED)
                               or not all(isinstance(v, str) for v in of.values())):
            raise ValueError("companion_of: expected an object of strings (version, digest, kind, key)")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureRefused(ref, "malformed", f"signed statement not understood: {exc}") from None
    if len(algorithms) != 1 or next(iter(algorithms)) not in HASHERS:
        raise SignatureRefused(ref, "malformed", f"digest algorithm {sorted(algorithms)} (weightd checks "
                               f"{' or '.join(HASHERS)})")
    return SignedStatement(str(subjects[0]["name"]), next(iter(algorithms)), digests, key_id, key_name, of)


def generate_keypair(private_path: Path, public_path: Path) -> str:
    """A new P-256 signing key (PEM, mode 0600, never overwriting a file) and its public key; returns
    the key id."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for path, data, mode in ((private_path, pem, 0o600), (public_path, pub, 0o644)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return _key_id(key.public_key())
