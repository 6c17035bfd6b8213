"""Signed checkpoints (issue #14 part 3): every byte bound by a signed statement, checked on every node.

Real parts: the `weightd` CLI in subprocesses, real files, real keys, and the real OpenSSF
`model_signing` tool on both sides of the format."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiering import build_manifest, make_checkpoint, mutate_tensor
from tiering.content.manifest import MANIFEST_RELPATH
from tiering.content.signature import SIGNATURE_RELPATH, generate_keypair

from .conftest import assert_one_line_error, run_at_once

MiB = 1 << 20


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "keys"
    d.mkdir()
    out = {}
    for who in ("fleet", "other"):
        generate_keypair(d / f"{who}.pem", d / f"{who}.pub.pem")
        out[who], out[f"{who}.pub"] = d / f"{who}.pem", d / f"{who}.pub.pem"
    return out


def _trust(node_env, *pub: Path, required: bool = True) -> None:
    keys = ", ".join(f'"{p}"' for p in pub)
    with open(node_env.config, "a") as f:
        f.write(f"[trust]\nrequire_signature = {'true' if required else 'false'}\npublic_keys = [{keys}]\n")


def _tier_snapshot(root: Path) -> list[str]:
    """Every entry under a tier root (staging included): a refused preload must leave nothing."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.name.endswith(".lock"))


def _republish_tampered(cold_version: Path) -> None:
    """What a writer of cold storage can do: change a tensor's bytes and write a manifest that matches
    them (a valid digest: xxh3 is a content id, not a signature). The signature is left as it was."""
    from tiering import read_header
    shard = sorted(cold_version.glob("*.safetensors"))[0]
    mutate_tensor(shard, read_header(shard).tensors[0].name, seed="tampered")
    m = build_manifest(cold_version)
    old = json.loads((cold_version / MANIFEST_RELPATH).read_text())
    m = m.with_labels(name=old["name"], version=old["version"], published_at=old["published_at"])
    (cold_version / MANIFEST_RELPATH).write_text(m.to_json())


def _relabel(version_dir: Path, label: str) -> None:
    from tiering import load_manifest
    old = load_manifest(version_dir / MANIFEST_RELPATH)
    (version_dir / MANIFEST_RELPATH).write_text(old.with_labels(
        name=old.name, version=label, published_at=old.published_at, piece_size=old.piece_size).to_json())


def test_signed_publish_then_preload_everywhere(wd, node_env, ckpt: Path, keys) -> None:
    r = wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(keys["fleet"]), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signed_by"] == "fleet.pem"
    assert (node_env.cold / "org/m/v1" / SIGNATURE_RELPATH).is_file()
    _trust(node_env, keys["fleet.pub"])
    for tier in ("warm", "hot"):
        r = wd("preload", "org/m@v1", "--tier", tier, "--json")
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["signature"]["key_name"] == "fleet.pub.pem" and rep["signature"]["checked"] is True
    # (what follows only reads: at once)
    st, text, r, hot = wd.at_once(["status", "--json"], ["status"], ["verify", node_env.warm / "org/m/v1", "--json"],
                                  ["verify", node_env.hot / "org/m/v1"])
    (c,) = json.loads(st.stdout)["checkpoints"]
    for tier in ("warm", "hot"):
        assert c["tiers"][tier]["signature"]["signed_by"] == "fleet.pub.pem"
        assert c["tiers"][tier]["signature"]["checked"] is True
    row = [ln for ln in text.stdout.splitlines() if ln.startswith("org/m@v1")]
    assert row and row[0].rstrip().endswith("fleet.pub.pem"), row
    # verify re-checks the signature and every byte of the tier copy
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signature"]["checked"] is True
    assert "signed by fleet.pub.pem" in hot.stdout


def test_tampered_tensor_with_recomputed_manifest_is_refused(wd, node_env, ckpt: Path, keys) -> None:
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(keys["fleet"])).returncode == 0
    _republish_tampered(node_env.cold / "org/m/v1")
    _trust(node_env, keys["fleet.pub"])
    before = {t: _tier_snapshot(r) for t, r in (("hot", node_env.hot), ("warm", node_env.warm))}
    for tier in ("warm", "hot"):
        r = wd("preload", "org/m@v1", "--tier", tier)
        assert_one_line_error(r, 5, "org/m@v1", "not what fleet.pub.pem signed")
    after = {t: _tier_snapshot(r) for t, r in (("hot", node_env.hot), ("warm", node_env.warm))}
    assert not any("org" in e for t in after for e in after[t]), after   # nothing published into a tier
    assert all(not [e for e in after[t] if e.startswith(".staging/")] for t in after), (before, after)
    # the same cold copy is refused by the model-signing tool too
    r = _model_signing("verify", "key", str(node_env.cold / "org/m/v1"), "--signature",
                       str(node_env.cold / "org/m/v1" / SIGNATURE_RELPATH), "--public_key", str(keys["fleet.pub"]))
    assert r.returncode != 0


def test_unsigned_unknown_key_changed_statement_and_replay_are_refused(wd, node_env, ckpt: Path, keys) -> None:
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "unsigned").returncode == 0
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "other",
              "--sign", str(keys["other"])).returncode == 0
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(keys["fleet"])).returncode == 0
    # a cold writer copies signed v1 under a new label (replay), and forges a statement for "edited"
    for label in ("replayed", "edited"):
        shutil.copytree(node_env.cold / "org/m/v1", node_env.cold / "org/m" / label)
        _relabel(node_env.cold / "org/m" / label, label)
    sig_path = node_env.cold / "org/m/edited" / SIGNATURE_RELPATH
    bundle = json.loads(sig_path.read_text())
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    payload["subject"][0]["name"] = "org/m@edited"
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    sig_path.write_text(json.dumps(bundle))
    _trust(node_env, keys["fleet.pub"])
    cases = {"unsigned": "not signed", "other": "not in trust.public_keys", "replayed": "made for org/m@v1",
             "edited": "does not verify"}
    for version, needle in cases.items():
        r = wd("preload", f"org/m@{version}", "--tier", "warm")
        assert_one_line_error(r, 5, f"org/m@{version}", needle)
    assert not (node_env.warm / "org").exists()
    assert wd("preload", "org/m@v1", "--tier", "warm").returncode == 0   # the control: the signed one loads


def test_copy_placed_before_signatures_were_required(wd, node_env, ckpt: Path, keys) -> None:
    """A tier copy made while signatures were not checked is checked in place before it is served."""
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(keys["fleet"])).returncode == 0
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "v2").returncode == 0
    for v in ("v1", "v2"):
        assert wd("preload", f"org/m@{v}", "--tier", "warm").returncode == 0
    assert not (node_env.warm / "org/m/v1/.weightd/trust.json").exists()
    _trust(node_env, keys["fleet.pub"])
    # path serves neither: their signatures were never checked on this node
    assert [r.returncode for r in wd.at_once(*(["path", f"org/m@{v}"] for v in ("v1", "v2")))] == [3, 3]
    r = wd("preload", "org/m@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["already_present"] is True
    assert (node_env.warm / "org/m/v1/.weightd/trust.json").is_file()
    assert wd("path", "org/m@v1").returncode == 0
    assert_one_line_error(wd("preload", "org/m@v2", "--tier", "warm"), 5, "org/m@v2", "not signed")


def test_not_required_checks_what_is_signed(wd, node_env, ckpt: Path, keys) -> None:
    """Without require_signature: unsigned loads; a signed version whose bytes differ is still refused."""
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "plain").returncode == 0
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(keys["fleet"])).returncode == 0
    _republish_tampered(node_env.cold / "org/m/v1")
    _trust(node_env, keys["fleet.pub"], required=False)
    r = wd("preload", "org/m@plain", "--tier", "warm", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["signature"] is None
    assert_one_line_error(wd("preload", "org/m@v1", "--tier", "warm"), 5, "org/m@v1", "fleet.pub.pem signed")


def _model_signing(*args: str) -> subprocess.CompletedProcess[str]:
    return _model_signing_at_once(args)[0]


def _model_signing_at_once(*argvs: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """The OpenSSF tool, once for each of ``argvs``, all running at the same time."""
    tool = Path(sys.executable).parent / "model_signing"
    return run_at_once([[str(tool), *argv] for argv in argvs])


def test_model_signing_tool_signs_what_weightd_checks(wd, node_env, tmp_path: Path, keys) -> None:
    src = make_checkpoint(tmp_path / "src", total_bytes=8 * MiB, shards=2, layers=2)
    sig = tmp_path / "model.sig"
    r = _model_signing("sign", "key", str(src), "--private_key", str(keys["fleet"]), "--signature", str(sig))
    assert r.returncode == 0, r.stderr
    r = wd("publish", str(src), "--name", "org/ext", "--version", "v1", "--signature", str(sig), "--json")
    assert r.returncode == 0, r.stderr
    _trust(node_env, keys["fleet.pub"])
    r = wd("preload", "org/ext@v1", "--tier", "warm", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signature"]["checked"] is True
    # a signature over other bytes is refused at publish, before anything lands in cold storage
    other = make_checkpoint(tmp_path / "other", total_bytes=8 * MiB, shards=2, layers=2, seed="o")
    r = wd("publish", str(other), "--name", "org/ext", "--version", "v2", "--signature", str(sig))
    assert_one_line_error(r, 5, "org/ext@v2")
    assert not (node_env.cold / "org/ext/v2").exists()


def test_weightd_signature_verifies_with_model_signing_tool(wd, node_env, ckpt: Path, keys) -> None:
    assert wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(keys["fleet"])).returncode == 0
    _trust(node_env, keys["fleet.pub"])
    assert wd("preload", "org/m@v1", "--tier", "warm").returncode == 0
    cold, warm = node_env.cold / "org/m/v1", node_env.warm / "org/m/v1"
    def verify(d: Path, pub: Path) -> tuple[str, ...]:
        return "verify", "key", str(d), "--signature", str(d / SIGNATURE_RELPATH), "--public_key", str(pub)
    *ours, theirs = _model_signing_at_once(verify(cold, keys["fleet.pub"]), verify(warm, keys["fleet.pub"]),
                                           verify(cold, keys["other.pub"]))
    for r in ours:
        assert r.returncode == 0, r.stdout + r.stderr
    assert theirs.returncode != 0


def test_bad_keys_are_one_line_errors(wd, node_env, ckpt: Path, keys, tmp_path: Path) -> None:
    not_a_key = tmp_path / "nokey.pem"
    not_a_key.write_text("hello\n")
    r = wd("publish", str(ckpt), "--name", "org/m", "--version", "v1", "--sign", str(not_a_key))
    assert_one_line_error(r, 2, "nokey.pem")
    assert not (node_env.cold / "org/m/v1").exists()
    _trust(node_env, not_a_key)
    assert_one_line_error(wd("status"), 2, "trust.public_keys", "nokey.pem")
    node_env.write_config(node_env.hot_capacity, node_env.warm_capacity)
    with open(node_env.config, "a") as f:
        f.write("[trust]\nrequire_signature = true\n")
    assert_one_line_error(wd("status"), 2, "trust", "public_keys")


def test_through_the_daemon_refusals_are_counted(node_env, isolated_env, wd, ckpt: Path, keys, tmp_path: Path) -> None:
    """The daemon signs at publish (the caller's key file, read only because the caller could), refuses a
    tampered version with exit 5, counts it in weightd_trust_refusals_total{reason}, and keeps serving."""
    from .test_daemon import DaemonProc
    _trust(node_env, keys["fleet.pub"])
    d = DaemonProc(node_env, isolated_env, tmp_path)
    try:
        r = wd("--daemon-only", "publish", str(ckpt), "--name", "org/m", "--version", "v1",
               "--sign", str(keys["fleet"]), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["signed_by"] == "fleet.pem"
        assert wd("--daemon-only", "publish", str(ckpt), "--name", "org/m", "--version", "v2").returncode == 0
        _republish_tampered(node_env.cold / "org/m/v1")
        assert_one_line_error(wd("--daemon-only", "preload", "org/m@v1", "--tier", "warm"), 5, "org/m@v1",
                              "not what fleet.pub.pem signed")
        assert_one_line_error(wd("--daemon-only", "preload", "org/m@v2", "--tier", "warm"), 5, "org/m@v2",
                              "not signed")
        text = d.metrics()
        assert 'weightd_trust_refusals_total{reason="digest_mismatch"} 1.0' in text, text
        assert 'weightd_trust_refusals_total{reason="unsigned"} 1.0' in text
        assert not (node_env.warm / "org").exists()
        assert wd("--daemon-only", "status", "--json").returncode == 0   # still serving
    finally:
        d.stop()
