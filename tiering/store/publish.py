"""Publish: copy a checkpoint directory (or HF cache snapshot) into cold storage, immutably.

The source is scanned (and so validated) before anything is written; the version's lock in cold
storage is waited for at most :data:`PUBLISH_LOCK_TIMEOUT_S` (cold locks can be anyone's); staging
never resumes there; the source must not change while it is copied, and staging must hold exactly
its files before the manifest is built from what was staged and committed."""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ..content.build import build_manifest, verify_checkpoint
from ..content.manifest import Manifest
from ..content.signature import HASHERS, SIGNATURE_RELPATH, TrustPolicy, load_private_key, read_unverified, sign
from ..content.names import validate_label, validate_name, validate_version
from ..content.scan import CheckFn, ScannedFile, scan_checkpoint
from ..copy import CopyJob
from ..copy_many import copy_files
from ..errors import BadInput, FileChanged, VersionConflict
from ..layout import COLD, DIR_MODE, version_rel
from ..safefs import Dir, FileRef
from ..progress import ProgressFn
from ..versions import read_version
from .reports import PublishReport
from .roots import TierRoots
from .staging import StagingArea, open_staging

log = logging.getLogger(__name__)
PUBLISH_LOCK_TIMEOUT_S = 600.0  # another publisher of the same NAME@VERSION (cold locks can be anyone's)


class Publisher:
    def __init__(self, roots: TierRoots, *, now: Callable[[], float], monotonic: Callable[[], float],
                 copy_threads: int, trust: TrustPolicy | None = None) -> None:
        self.roots, self.now, self.monotonic, self.copy_threads = roots, now, monotonic, copy_threads
        self.trust = trust

    def publish(self, src: Path, name: str, version: str, *, progress: ProgressFn | None = None,
                sign_key: Path | None = None, signature: bytes | None = None,
                check: "CheckFn | None" = None, of: dict[str, Any] | None = None) -> PublishReport:
        """``check(path, st)``: asked of every directory and file the scan pins (the daemon refuses
        what its caller could not read), so what is authorised is what is read. ``of``: a companion
        artefact's tie to its version (VERSION is then its label ``V~<kind>~<key>``)."""
        validate_name(name)
        (validate_label if of is not None else validate_version)(version)
        t0 = self.monotonic()
        files = scan_checkpoint(src, check=check)  # validates the source before anything is written
        if not files:  # (nothing to serve, nothing to verify: almost surely the wrong directory)
            raise BadInput(f"{src}: no files to publish (an empty directory, or only .weightd/?)")
        ref = f"{name}@{version}"
        rel = version_rel(name, version)
        if self.roots.object is not None:
            return self._publish_object(src, files, name, version, progress, sign_key, signature, t0, of)
        cold = self.roots.must(COLD)
        lock = self.roots.lock(COLD, name, version)
        lock.acquire(PUBLISH_LOCK_TIMEOUT_S)  # a lock held on a shared mount forever must not wedge us
        with lock:
            existing = read_version(cold, name, version)
            if existing is not None:
                m = build_manifest(src, files=files)
                if m.digest != existing.manifest.digest:
                    raise VersionConflict(ref, existing.manifest.digest, m.digest)
                return PublishReport(name, version, str(existing.path), m.digest, m.total_bytes, True,
                                     self.monotonic() - t0)
            if cold.lstat(rel) is not None:  # a directory without a valid manifest: not ours to overwrite
                raise VersionConflict(ref, "unknown (no valid manifest)", "-")
            total = sum(f.size for f in files)
            # (our lock: whatever a crashed publish, or anyone else, left under this id goes)
            if sign_key is not None:
                load_private_key(sign_key)  # a bad key fails before anything is copied
            with open_staging(cold, name, version, total, resume=False, now=self.now) as staging:
                digest, nbytes, signed_by = self._stage(cold, staging, src, files, name, version, progress,
                                                        sign_key, signature, of)
            log.info("published name=%s version=%s digest=%s bytes=%d signed_by=%s", name, version, digest, nbytes,
                     signed_by or "-")
            return PublishReport(name, version, str(cold.path / rel), digest, nbytes, False, self.monotonic() - t0,
                                 signed_by)

    def _publish_object(self, src: Path, files: list[ScannedFile], name: str, version: str,
                        progress: ProgressFn | None, sign_key: Path | None, signature: bytes | None,
                        t0: float, of: dict[str, Any] | None = None) -> PublishReport:
        """Object storage: the manifest is built from the source (one read), the files uploaded, the
        source checked unchanged, and the manifest written last (see tiering.sources.s3.publish)."""
        obj = self.roots.object
        assert obj is not None
        ref = f"{name}@{version}"
        if sign_key is not None:
            load_private_key(sign_key)  # a bad key fails before anything is uploaded
        m = build_manifest(src, files=files).with_labels(
            name=name, version=version, published_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            of=of)

        def unchanged() -> None:  # the source must not have changed while it was hashed and uploaded
            for f in files:
                st = os.stat(f.path)
                if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
                    raise FileChanged(str(f.path), "changed while it was being published; try again")
        # (ObjectCold.publish reads the existing manifest once: same content is a no-op, other is a
        # conflict; each file is opened once, as scanned (PinnedFile), and hashed again as it is sent)
        crypto, signed, who = self._object_signing(ref, m, sign_key, signature)
        uploaded = obj.publish(src, m, [(f.relpath, f.path) for f in files], progress=progress,
                               before_manifest=unchanged, crypto=crypto, signed=signed)
        if uploaded:
            log.info("published name=%s version=%s digest=%s bytes=%d to=%s", name, version, m.digest,
                     m.total_bytes, obj.url)
        where = obj.where(name, version) if hasattr(obj, "where") else f"{obj.url.rstrip('/')}/{name}/{version}"
        return PublishReport(name, version, where, m.digest, m.total_bytes,
                             not uploaded, self.monotonic() - t0, who)

    def _object_signing(self, ref: str, m: Manifest, sign_key: Path | None, signature: bytes | None
                        ) -> tuple[Callable[[], Any] | None, Callable[[dict[str, str]], dict[str, bytes]] | None,
                                   str | None]:
        """For an object store: the digest to take of every byte as it is sent, and what puts the
        bundle beside the manifest once they are all sent (a new signature over exactly those
        digests, or an attached one checked against them: a mismatch aborts the publish)."""
        if sign_key is None and signature is None:
            return None, None, None
        if signature is not None:
            st = self.trust.verify(ref, signature) if self.trust is not None and self.trust.keys \
                else read_unverified(ref, signature)
            st.check_files(ref, m)  # before a byte is sent
            who = st.key_name if st.key_name != "unverified" else f"key {st.key_id[:16]}"

            def attached(digests: dict[str, str]) -> dict[str, bytes]:
                st.check_digests(ref, digests)
                return {SIGNATURE_RELPATH: signature}
            return HASHERS[st.algorithm], attached, who
        assert sign_key is not None
        key = sign_key

        def new(digests: dict[str, str]) -> dict[str, bytes]:
            return {SIGNATURE_RELPATH: sign(key, ref, digests, "sha256", of=m.of)}
        return HASHERS["sha256"], new, key.name

    def _stage(self, cold: Dir, staging: StagingArea, src: Path, files: list[ScannedFile], name: str,
               version: str, progress: ProgressFn | None, sign_key: Path | None,
               signature: bytes | None, of: dict[str, Any] | None = None) -> tuple[str, int, str | None]:
        """Copy, check nothing changed or was added, build the manifest from staging and commit."""
        jobs = [CopyJob(f.path, FileRef(staging.dir, f.relpath), f.size, f.mode) for f in files]
        hashed: dict = {}   # (many small files: each hashed from the bytes written, not read back below)
        copy_files(jobs, threads=self.copy_threads, preallocate=False, progress=progress, hashed=hashed)
        for f in files:  # the source must not have changed while it was copied
            st = os.stat(f.path)
            if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
                raise FileChanged(str(f.path), "changed while it was being published; try again")
        staged = scan_checkpoint(staging.dir)
        if sorted(f.relpath for f in staged) != sorted(f.relpath for f in files):
            extra = sorted({f.relpath for f in staged} - {f.relpath for f in files})[:3]
            raise FileChanged(str(staging.path), f"staging holds files that are not in {src}: "
                                                 f"{', '.join(extra)} (another writer?)")
        m = build_manifest(staging.dir, files=staged, known=hashed)
        m = m.with_labels(name=name, version=version,
                          published_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"), of=of)
        signed_by = self._sign(staging, m, f"{name}@{version}", sign_key, signature)
        staging.commit(cold, name, version, m, verified=True)  # (the manifest was just built from it)
        return m.digest, m.total_bytes, signed_by

    def _sign(self, staging: StagingArea, m: Manifest, ref: str, sign_key: Path | None,
              signature: bytes | None) -> str | None:
        """Sign the staged bytes (``sign_key``), or check that an attached bundle covers exactly them;
        the bundle goes beside the manifest. Returns who signed (a key file name or key id)."""
        if sign_key is None and signature is None:
            return None
        if signature is not None:
            st = self.trust.verify(ref, signature) if self.trust is not None and self.trust.keys \
                else read_unverified(ref, signature)
            algorithm = st.algorithm
        else:
            algorithm = "sha256"
        report = verify_checkpoint(staging.dir, m, crypto=HASHERS[algorithm])
        report.raise_for_problems()
        if signature is not None:
            st.check_files(ref, m)
            st.check_digests(ref, report.crypto_digests)
            bundle, who = signature, st.key_name if st.key_name != "unverified" else f"key {st.key_id[:16]}"
        else:
            assert sign_key is not None
            bundle, who = sign(sign_key, ref, report.crypto_digests, algorithm, of=m.of), sign_key.name
        meta, _, fname = SIGNATURE_RELPATH.rpartition("/")
        with staging.dir.sub(meta, create=True, mode=DIR_MODE) as d:
            d.write_atomic(fname, bundle, 0o644)
        return who
