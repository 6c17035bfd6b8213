"""Every reason a node refuses a signed version (docs/security.md, "What a node refuses"), played through the CLI
with real keys against what a writer of cold storage can do: a file set that differs from what was
signed, signatures that are not signatures (``malformed``), and, without ``require_signature``, a version
signed by a key the node does not know, which loads with a warning while a changed statement is still
refused. The daemon counts each in ``weightd_trust_refusals_total{reason}``. (``unsigned``,
``unknown_key``, ``bad_signature``, a replay and ``digest_mismatch`` are in test_signing.py, ``unbound``
and a companion's ``digest_mismatch`` in test_companion_security.py.)"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from tiering import build_manifest
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.content.signature import PAYLOAD_TYPE, PREDICATE_TYPE, SIGNATURE_RELPATH, STATEMENT_TYPE, _pae

from .conftest import assert_one_line_error
from .test_signing import _tier_snapshot, _trust, keys  # noqa: F401  (keys: the fixture)


def _publish(wd, ckpt: Path, version: str, key: Path | None) -> None:
    r = wd("publish", str(ckpt), "--name", "org/m", "--version", version, *(("--sign", str(key)) if key else ()))
    assert r.returncode == 0, r.stderr


def _rebuild_manifest(version_dir: Path) -> None:
    """What a cold writer can do after changing the file set: a manifest that matches it again."""
    old = json.loads((version_dir / MANIFEST_RELPATH).read_text())
    m = build_manifest(version_dir).with_labels(name=old["name"], version=old["version"],
                                                published_at=old["published_at"])
    (version_dir / MANIFEST_RELPATH).write_text(m.to_json())


def _signed_bundle(key_path: Path, statement: dict) -> bytes:
    """A DSSE bundle over any statement, really signed with ``key_path`` (so the signature verifies and
    what is refused is the statement itself)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    payload = json.dumps(statement).encode()
    sig = key.sign(_pae(payload), ec.ECDSA(hashes.SHA256()))
    return json.dumps({"verificationMaterial": {"publicKey": {"hint": hashlib.sha256(pub).hexdigest()}},
                       "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": PAYLOAD_TYPE,
                                        "signatures": [{"sig": base64.b64encode(sig).decode()}]}}).encode()


def _statement_of(version_dir: Path) -> dict:
    bundle = json.loads((version_dir / SIGNATURE_RELPATH).read_text())
    return json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))


def _nothing_placed(node_env) -> None:
    for root in (node_env.hot, node_env.warm):
        assert not [e for e in _tier_snapshot(root) if e.startswith(("org", ".staging/"))], _tier_snapshot(root)


@pytest.mark.parametrize("change", ["file added", "file removed"])
def test_a_file_set_other_than_the_signed_one_is_refused(wd, node_env, ckpt: Path, keys, change: str) -> None:
    _publish(wd, ckpt, "v1", keys["fleet"])
    v = node_env.cold / "org/m/v1"
    if change == "file added":
        (v / "extra.json").write_text('{"injected": true}\n')
        needle = "not signed: extra.json"
    else:
        (v / "config.json").unlink()
        needle = "signed but not in the manifest: config.json"
    _rebuild_manifest(v)
    _trust(node_env, keys["fleet.pub"], required=False)   # (a signed version is checked even so)
    for tier in ("warm", "hot"):
        assert_one_line_error(wd("preload", "org/m@v1", "--tier", tier), 5, "org/m@v1",
                              "does not cover the manifest's files", needle)
    _nothing_placed(node_env)


def _malformed(v: Path, key: Path, how: str) -> str:
    """Replace v's signature as ``how`` says; returns what the refusal must say."""
    sig = v / SIGNATURE_RELPATH
    good = json.loads(sig.read_text())
    st = _statement_of(v)
    if how == "not JSON":
        sig.write_bytes(b"\x00garbage")
        return "not JSON"
    if how == "not DSSE":   # a Sigstore message signature, which weightd does not take
        sig.write_text(json.dumps({"messageSignature": {"signature": "AAAA"}}))
        return "not a DSSE bundle"
    if how == "payload type":
        good["dsseEnvelope"]["payloadType"] = "text/plain"
        sig.write_text(json.dumps(good))
        return "not a model-signing bundle"
    if how == "two signatures":
        good["dsseEnvelope"]["signatures"] *= 2
        sig.write_text(json.dumps(good))
        return "not a model-signing bundle"
    if how == "signature not base64":
        good["dsseEnvelope"]["signatures"][0]["sig"] = "***"
        sig.write_text(json.dumps(good))
        return "not a model-signing bundle"
    if how == "too large":
        with open(sig, "wb") as f:
            f.truncate((64 << 20) + 1)   # (sparse: no 64 MiB written)
        return "cannot read its signature"   # read with a limit, never whole
    # a statement really signed by the trusted key, which weightd cannot check as a weightd signature
    if how == "predicate type":
        st["predicateType"] = "https://example.com/other"
        need = "signed statement not understood"
    elif how == "subject digest":
        st["subject"][0]["digest"]["sha256"] = "0" * 64
        need = "the subject digest does not match the resources"
    elif how == "digest algorithm":
        for r in st["predicate"]["resources"]:
            r["algorithm"] = "md5"
        need = "digest algorithm ['md5']"
    else:
        raise AssertionError(how)
    assert st["_type"] == STATEMENT_TYPE and (st["predicateType"] == PREDICATE_TYPE or how == "predicate type")
    sig.write_bytes(_signed_bundle(key, st))
    return need


MALFORMED = ["not JSON", "not DSSE", "payload type", "two signatures", "signature not base64", "too large",
             "predicate type", "subject digest", "digest algorithm"]


@pytest.mark.parametrize("how", MALFORMED)
def test_a_malformed_signature_is_refused(wd, node_env, ckpt: Path, keys, how: str) -> None:
    _publish(wd, ckpt, "v1", keys["fleet"])
    need = _malformed(node_env.cold / "org/m/v1", keys["fleet"], how)
    _trust(node_env, keys["fleet.pub"])
    assert_one_line_error(wd("preload", "org/m@v1", "--tier", "warm"), 5, "org/m@v1", need)
    _nothing_placed(node_env)


def test_unknown_key_loads_with_a_warning_without_require_signature(wd, node_env, ckpt: Path, keys) -> None:
    """A key this node does not list is not a reason to refuse where signatures are optional: the
    version loads unchecked, with a warning that says so; a statement changed under a key it does list is
    still refused."""
    _publish(wd, ckpt, "other", keys["other"])
    _publish(wd, ckpt, "v1", keys["fleet"])
    st = _statement_of(node_env.cold / "org/m/v1")
    st["predicate"]["resources"][0]["digest"] = "0" * 64   # edited after signing, signature left as it was
    bundle = json.loads((node_env.cold / "org/m/v1" / SIGNATURE_RELPATH).read_text())
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    (node_env.cold / "org/m/v1" / SIGNATURE_RELPATH).write_text(json.dumps(bundle))
    _trust(node_env, keys["fleet.pub"], required=False)
    r = wd("preload", "org/m@other", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signature"] is None
    warning = [ln for ln in r.stderr.splitlines() if "org/m@other" in ln]
    assert warning and "not checking the signature" in warning[0] and "not in trust.public_keys" in warning[0], r.stderr
    assert wd("path", "org/m@other").returncode == 0
    assert wd("verify", node_env.warm / "org/m/other").returncode == 0
    assert_one_line_error(wd("preload", "org/m@v1", "--tier", "warm"), 5, "org/m@v1", "does not verify")
    assert not (node_env.warm / "org/m/v1").exists()


def test_the_daemon_counts_each_refusal_by_reason(node_env, isolated_env, wd, ckpt: Path, keys, tmp_path: Path) -> None:
    from .test_daemon import DaemonProc
    _publish(wd, ckpt, "files", keys["fleet"])
    (node_env.cold / "org/m/files/extra.json").write_text("{}\n")
    _rebuild_manifest(node_env.cold / "org/m/files")
    _publish(wd, ckpt, "junk", keys["fleet"])
    _malformed(node_env.cold / "org/m/junk", keys["fleet"], "not JSON")
    _publish(wd, ckpt, "other", keys["other"])
    _trust(node_env, keys["fleet.pub"])
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        for version, needle in (("files", "not signed: extra.json"), ("junk", "not JSON"),
                                ("other", "not in trust.public_keys")):
            assert_one_line_error(wd("--daemon-only", "preload", f"org/m@{version}", "--tier", "warm"), 5,
                                  f"org/m@{version}", needle)
        text = d.metrics()
        for reason in ("files_differ", "malformed", "unknown_key"):
            assert f'weightd_trust_refusals_total{{reason="{reason}"}} 1.0' in text, (reason, text)
        assert wd("--daemon-only", "status", "--json").returncode == 0
    finally:
        d.stop()
    _nothing_placed(node_env)
