"""The store's signature step (design §13): which versions this node will hold and serve.

- Before anything moves, :meth:`Trust.check_source` reads the published version's
  ``.weightd/model.sig`` and checks it against the trusted keys and the manifest's file list: an
  unsigned version (when signatures are required), an unknown key, a changed statement or a file set
  that differs is refused at once (exit 5), with nothing reserved or written.
- The signed SHA-256/BLAKE3 of every file is taken from the bytes placed: by a copy, in its own pass
  (the buffers it hashes for the manifest's parts and writes, ``Fill.crypto_digests``); otherwise, at
  commit, in one read of the staging area for the parts and the digests together
  (``verify_checkpoint(..., crypto=...)``). A byte that differs from what was signed aborts the commit,
  so nothing unsigned is ever renamed into a tier.
- A tier copy that passed records it: ``.weightd/model.sig`` (the bundle, so ``model_signing verify``
  works on the tier copy too) and ``.weightd/trust.json`` (key, algorithm, when it was checked);
  ``status`` and ``path`` read that record.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from ..content.build import verify_checkpoint
from ..content.manifest import Manifest
from ..content.signature import (HASHERS, MAX_BUNDLE_BYTES, SIGNATURE_RELPATH, TRUST_RELPATH, SignatureRefused,
                                 SignedStatement, TrustPolicy)
from ..errors import TieringError
from ..layout import COLD, DIR_MODE, LOCAL_TIERS, VersionDir
from ..progress import ProgressFn
from ..safefs import Dir
from ..versions import read_version
from .roots import TierRoots

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Signed:
    """A version's checked signature: what it says and the bundle as published."""
    statement: SignedStatement
    bundle: bytes


def read_trust(root: Dir | None, rel: str) -> dict[str, Any] | None:
    """The trust record of a tier copy (``None``: never signature-checked here)."""
    if root is None:
        return None
    rec = root.read_json(f"{rel}/{TRUST_RELPATH}")
    return rec if isinstance(rec, dict) and rec.get("checked") is True else None


def check_bytes(d: Dir, m: Manifest, signed: Signed, ref: str, *, threads: int | None = None,
                progress: "ProgressFn | None" = None) -> None:
    """One read of every file of ``d``: the manifest's parts (IntegrityError) and the signed digests
    (SignatureRefused, reason ``digest_mismatch``)."""
    report = verify_checkpoint(d, m, threads=threads, crypto=HASHERS[signed.statement.algorithm], progress=progress)
    report.raise_for_problems()
    check_digests(m, signed, ref, report.crypto_digests)


def check_digests(m: Manifest, signed: Signed, ref: str, digests: dict[str, str]) -> None:
    """Every file's digest (taken from its bytes: a read of the copy, or the copy's own pass) against
    the signed ones (SignatureRefused, reason ``digest_mismatch``)."""
    # a partial copy (``m.of``) holds some of the signed files: each of those must be as signed
    signed.statement.check_digests(ref, digests, only={f.path for f in m.files} if m.of is not None else None)


def write_record(d: Dir, signed: Signed, checked_at: float) -> None:
    """``.weightd/model.sig`` and ``.weightd/trust.json`` into a version (or staging) directory."""
    meta, _, sig_name = SIGNATURE_RELPATH.rpartition("/")
    with d.sub(meta, create=True, mode=DIR_MODE) as md:
        md.write_atomic(sig_name, signed.bundle, 0o644)
        md.write_atomic(TRUST_RELPATH.rpartition("/")[2],
                        json.dumps(signed.statement.trust_record(checked_at)).encode(), 0o644)


class Trust:
    def __init__(self, roots: TierRoots, policy: TrustPolicy | None, *, now: Callable[[], float]) -> None:
        self.roots, self.policy, self.now = roots, policy, now

    @property
    def required(self) -> bool:
        return self.policy is not None and self.policy.required

    def check_source(self, src: VersionDir) -> Signed | None:
        """The version's signature, checked against the keys and the manifest (None: no policy, or
        unsigned where signatures are not required). Reads no file's bytes."""
        if self.policy is None:
            return None
        bundle = self._bundle(src)
        if bundle is None:
            if self.policy.required:
                raise SignatureRefused(src.ref, "unsigned", "it is not signed (no .weightd/model.sig) and "
                                       "trust.require_signature is set")
            return None
        try:
            st = self.policy.verify(src.ref, bundle)
        except SignatureRefused as exc:
            if self.policy.required or exc.reason not in ("unknown_key",):
                raise
            log.warning("not checking the signature of %s: %s", src.ref, exc.detail)
            return None
        if "@" in st.subject and st.subject != src.ref:  # weightd signs NAME@VERSION: no replay under another
            raise SignatureRefused(src.ref, "files_differ", f"the signature was made for {st.subject}")
        try:
            st.check_files(src.ref, src.manifest)
        except SignatureRefused as exc:
            if self.policy.required or exc.reason != "unbound":
                raise
            # (a companion signed the old way, where unsigned ones load: it loads as one, unchecked)
            log.warning("loading %s as unsigned: %s", src.ref, exc.detail)
            return None
        return Signed(st, bundle)

    def _bundle(self, src: VersionDir) -> bytes | None:
        """The bundle beside the version: cold storage first (an object beside the manifest in an
        object store), else a local copy of the same content."""
        if src.store is not None:  # published in an object store: absent there means unsigned
            try:
                return src.store.read_meta(src.name, src.version, SIGNATURE_RELPATH, limit=MAX_BUNDLE_BYTES)
            except TieringError as exc:
                raise SignatureRefused(src.ref, "malformed", f"cannot read its signature: {exc}") from None
        for tier in (COLD, *LOCAL_TIERS):
            root = self.roots.dir(tier)
            v = read_version(root, src.name, src.version)
            if root is None or v is None or v.manifest.digest != src.manifest.digest:
                continue
            try:
                d = root.sub_if_exists(src.rel)
            except TieringError:
                continue
            if d is None:
                continue
            with d:
                if d.lstat(SIGNATURE_RELPATH) is None:
                    if tier == COLD:
                        return None  # published unsigned: a local copy cannot add a signature
                    continue
                try:
                    return d.read_bytes(SIGNATURE_RELPATH, limit=MAX_BUNDLE_BYTES)
                except (OSError, TieringError) as exc:
                    raise SignatureRefused(src.ref, "malformed", f"cannot read its signature: {exc}") from None
        return None

    def adopt_copy(self, root: Dir, v: VersionDir, signed: Signed | None, *, threads: int | None = None) -> None:
        """A complete copy that is already in place: if it must be signature-checked and has no record
        for this signature, check its bytes where they are and record it."""
        if signed is None:
            return
        rec = read_trust(root, v.rel)
        if rec is not None and rec.get("key_id") == signed.statement.key_id:
            return
        with root.sub(v.rel) as d:
            check_bytes(d, v.manifest, signed, v.ref, threads=threads)
            write_record(d, signed, self.now())

    def servable(self, root: Dir, v: VersionDir) -> bool:
        """With signatures required, only a copy whose record names a key still trusted is served."""
        if not self.required:
            return True
        rec = read_trust(root, v.rel)
        return rec is not None and self.policy is not None and rec.get("key_id") in self.policy.keys
