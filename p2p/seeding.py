"""Torrents beside published versions, and what a node seeds.

- ``ensure_torrent``: a version at or above ``P2PConfig.threshold`` gets ``.weightd/checkpoint.torrent``
  in cold storage, made from the published files (only once ``check_seedable`` passed: libtorrent hashes
  by path) and checked against the manifest; with fleet TLS it carries the fleet CA.
- ``read_torrent``: that torrent, read by descriptor and checked; ``read_bound_torrent`` also says whether
  it is bound to the manifest (made by ``make_torrent`` from bytes checked against it: ``bound_to``).
- ``seed_held``: a worker seeds every complete version it holds; the origin every published one that
  passes ``check_seedable``. A partial copy (``NAME/VERSION~p<hex>``) is seeded with the whole version's
  torrent, for the files it holds (``P2PSession.seed(files=...)``), unless the node holds the whole
  version; a companion artefact (``VERSION~<kind>~<key>``) is never seeded (no torrent is made for it).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from tiering import (DIR_MODE, LOCAL_TIERS, MANIFEST_RELPATH, SIGNATURE_RELPATH, Dir, StorageUnavailable, TieringError,
                     VersionDir, check_unchangeable, is_whole, open_cold_root, scan_dir, split_label)

from .config import P2PConfig
from .errors import P2PError, TorrentRejected, map_libtorrent_errors
from .torrent import TORRENT_RELPATH, bound_to, load_torrent, make_torrent

if TYPE_CHECKING:
    import libtorrent as lt

    from tiering import LocalNode

    from .session import P2PSession

log = logging.getLogger(__name__)


def ensure_torrent(config: P2PConfig, version: VersionDir) -> Path | None:
    """Make the torrent of a published version at or above the threshold (idempotent). Written by
    descriptor beneath cold storage (publish is the one writer of cold); the version must be plain
    files (no symlink in it is ever handed to libtorrent, which would follow it)."""
    if version.size < config.threshold or not is_whole(version):   # (a companion: its own small object)
        return None
    path = version.path / TORRENT_RELPATH
    meta, _, fname = TORRENT_RELPATH.rpartition("/")
    with _open_version(version) as vdir:
        if vdir is None:
            raise P2PError(f"{version.ref}: cold storage is gone")
        if vdir.is_file(TORRENT_RELPATH):
            return path
        check_seedable(version)  # libtorrent hashes by path: nothing in it may be swapped for a link
        # (libtorrent's errors stop here: a file vanished or changed while hashed)
        # hashed from the files as they are checked against the manifest, in one read by descriptor
        with map_libtorrent_errors(f"{version.ref}: cannot make its torrent"):
            data = make_torrent(vdir, version.manifest, piece_size=config.piece_size or None,
                                root_cert=config.tls.ca_pem if config.tls is not None else None)
        load_torrent(data, version.manifest, str(path))  # what we publish must pass our own checks
        with vdir.sub(meta, create=True, mode=DIR_MODE) as mdir:
            mdir.write_atomic(fname, data, 0o644)
    return path


def read_torrent(version: VersionDir) -> "lt.torrent_info | None":
    """The torrent beside a version, read by descriptor (a symlink there reads as no torrent); in an
    object store, the object beside its manifest."""
    got = read_bound_torrent(version)
    return None if got is None else got[0]


def read_bound_torrent(version: VersionDir) -> "tuple[lt.torrent_info, bool] | None":
    """:func:`read_torrent`, and whether that torrent is bound to the version's manifest (``bound_to``:
    made by ``make_torrent`` from bytes checked against this manifest in the same read)."""
    if version.store is not None:
        where = f"{version.store.url}/{version.rel}/{TORRENT_RELPATH}"
        try:
            data = version.store.read_meta(version.name, version.version, TORRENT_RELPATH, limit=16 << 20)
        except TieringError as exc:  # (the store failing or an oversized object: no P2P, not a failed preload)
            raise TorrentRejected(where, str(exc)) from None
        if data is None:
            return None
    else:
        where = str(version.path / TORRENT_RELPATH)
        with _open_version(version) as d:
            if d is None or d.lstat(TORRENT_RELPATH) is None:
                return None
            try:
                data = d.read_bytes(TORRENT_RELPATH)
            except (OSError, TieringError) as exc:
                raise TorrentRejected(where, str(exc)) from None
    ti = load_torrent(data, version.manifest, where)
    return ti, bound_to(data, ti, version.manifest)


def is_signed(version: VersionDir) -> bool:
    """Whether a signature is published beside the version (``.weightd/model.sig``); True when that
    cannot be told (cold storage gone, the store failing): the caller then trusts nothing less."""
    try:
        if version.store is not None:
            return version.store.read_meta(version.name, version.version, SIGNATURE_RELPATH) is not None
        with _open_version(version) as d:
            return d is None or d.lstat(SIGNATURE_RELPATH) is not None
    except (OSError, TieringError):
        return True


def _cold_root_of(version: VersionDir) -> Path:
    return version.path.parents[version.name.count("/") + 1]


@contextmanager
def _open_version(version: VersionDir) -> Iterator[Dir | None]:
    """A version's directory by descriptor: its tier root by path (the configured one), then
    NAME/VERSION beneath it without following anything."""
    root = open_cold_root(_cold_root_of(version))
    if root is None:
        yield None
        return
    try:
        d = root.sub_if_exists(version.rel)
    except TieringError:
        d = None
    finally:
        root.close()
    try:
        yield d
    finally:
        if d is not None:
            d.close()


def check_seedable(version: VersionDir) -> None:
    """libtorrent reads what it seeds by path and follows links. Hand it a version in cold storage only
    if it is plain files and no one but root or weightd's user can change its directories (so no file
    can be swapped for a link to a host file after this check); else UnsafePath naming the reason."""
    root_path = _cold_root_of(version)
    root = open_cold_root(root_path)
    if root is None:
        raise TieringError(f"{root_path}: cold storage is gone")
    with root:
        check_unchangeable(root, version.rel)
        with root.sub(version.rel) as vdir:
            scan_dir(vdir)  # refuses a symlink or a special file, naming it


def ensure_object_torrent(config: P2PConfig, cold: VersionDir, local: VersionDir) -> "lt.torrent_info | None":
    """The torrent of a version in object storage: the one beside its manifest, else made here from
    ``local`` (this node's complete, verified copy in one of its own tiers: libtorrent hashes by path,
    and a tier root is weightd's alone) and put beside the manifest unless another node's arrived
    first (a conditional create: every node then uses the same one)."""
    if cold.size < config.threshold or not is_whole(cold):
        return None
    ti = read_torrent(cold)
    if ti is not None:
        return ti
    with map_libtorrent_errors(f"{cold.ref}: cannot make its torrent"):
        data = make_torrent(local.path, cold.manifest, piece_size=config.piece_size or None,
                            root_cert=config.tls.ca_pem if config.tls is not None else None)
    where = f"{cold.store.url}/{cold.rel}/{TORRENT_RELPATH}"
    load_torrent(data, cold.manifest, where)  # what we publish must pass our own checks
    if not cold.store.put_meta_if_absent(cold.name, cold.version, TORRENT_RELPATH, data):
        return read_torrent(cold)  # another origin's: everyone uses that one
    log.info("made the torrent of %s from the local copy in %s: %s", cold.ref, local.path, where)
    return load_torrent(data, cold.manifest, where)


def mirror_published(node: "LocalNode", config: P2PConfig, copy: "Callable[[VersionDir], object] | None" = None,
                     tier: str = "warm") -> int:
    """An origin whose cold tier is an object store seeds from local copies: bring the **latest**
    published version of each name, at or above the P2P threshold, into ``tier`` with ``copy`` (the
    daemon's preload, counted like any other; default: the node's). Older versions are not mirrored
    (they would evict one another in a bucket larger than the tier); a copy is skipped when it would
    not fit in the tier's free space without evicting; a name or manifest that cannot be read is
    logged and skipped. Returns how many were copied."""
    obj = node.roots.object
    if obj is None:
        return 0
    n = 0
    try:
        names = obj.names()
    except TieringError as exc:
        log.warning("origin: cannot list the bucket to keep local copies: %s", exc)
        return 0
    for name in names:
        try:   # (whole versions: a companion published after its version is not the latest)
            versions = [v for v in node.published_versions(name) if is_whole(v)]
        except TieringError as exc:
            log.warning("origin: skipping %s: %s", name, exc)
            continue
        if not versions:
            continue
        v = max(versions, key=lambda x: (x.manifest.published_at or "", x.version))
        if v.size < config.threshold or any(node.version(t, v.name, v.version) for t in LOCAL_TIERS):
            continue
        free = _free_bytes(node, tier)
        if free is not None and v.size > free:
            log.info("origin: not copying %s (%d bytes) into %s: %d bytes free, and a mirror never evicts",
                     v.ref, v.size, tier, free)
            continue
        try:
            if copy is not None:
                copy(v)
            else:
                node.preload(v.name, v.version, tier=tier, strict=True, lease_s=0)
            n += 1
        except TieringError as exc:
            log.warning("origin: cannot keep a local copy of %s to seed it: %s", v.ref, exc)
    return n


def _free_bytes(node: "LocalNode", tier: str) -> int | None:
    try:
        t = node.status()["tiers"][tier]
        return max(0, int(t["capacity_bytes"] * t.get("high_watermark", 1.0)) - int(t["used_bytes"])
                   - int(t.get("staging_bytes", 0)))
    except (KeyError, TypeError, ValueError, TieringError):
        return None


def _seed_object_origin(node: "LocalNode", session: "P2PSession", config: P2PConfig) -> int:
    """Origin, object-store cold tier: seed every published version it holds a local copy of (the
    torrent made from that copy if the store has none yet)."""
    n = 0
    for t in LOCAL_TIERS:
        for v in node.versions(t):
            if not is_whole(v):   # (an origin mirrors whole versions; a companion has no torrent)
                continue
            try:
                cold = node.published_version(v.name, v.version)
                if cold is None or cold.manifest.digest != v.manifest.digest:
                    continue
                ti = ensure_object_torrent(config, cold, v)
            except (TorrentRejected, P2PError, TieringError) as exc:
                log.warning("not seeding %s: %s", v.ref, exc)
                continue
            if ti is not None:
                n += session.seed(ti, v.path)
    return n


def seed_held(node: "LocalNode", session: "P2PSession", role: str, super_seed: bool = False) -> int:
    """Seed every complete version this node holds (workers: from its checked tier roots) or has
    published (origin: only versions that pass check_seedable; with an object-store cold tier, from
    its local copies: see :func:`mirror_published`). A worker also seeds its partial copies (see
    :func:`seed_copy`), and stops seeding those it no longer holds."""
    # super-seeding stays off: with v2-only torrents libtorrent 2.1.1 delivered nothing in it (0 bytes in 8 s)
    if role == "origin" and node.roots.object is not None:
        return _seed_object_origin(node, session, session.cfg)
    n = 0
    if role == "origin":
        try:
            published = node.published()
        except StorageUnavailable as exc:   # (readiness and status say so; seed again once it is back)
            log.warning("origin: nothing to seed from cold storage: %s", exc)
            return 0
        for v in published:
            if not is_whole(v):   # (a companion artefact: never a torrent)
                continue
            try:
                check_seedable(v)
            except TieringError as exc:
                log.warning("not seeding %s: %s", v.ref, exc)
                continue
            n += _seed_whole(session, v, v, super_seed)
        return n
    _forget_evicted(session)
    held = [v for t in LOCAL_TIERS for v in node.versions(t)]
    # whole versions first, then partial copies, the larger first (one torrent per info-hash: a partial
    # copy of a version seeded whole, or of which a larger part is seeded, adds nothing)
    held.sort(key=lambda v: (not is_whole(v), -v.size))
    for v in held:
        n += seed_copy(node, session, v)
    return n


def seed_copy(node: "LocalNode", session: "P2PSession", v: VersionDir) -> bool:
    """Seed one complete local copy: a whole version with its torrent; a partial copy with the whole
    version's torrent (the same swarm), for the files it holds, if that version is still published
    with the content it was taken from; a companion artefact, or anything without a torrent, not at
    all (False). Never raises for a torrent or a copy it cannot use: logged, False."""
    base = v.version if is_whole(v) else _partial_of(v)
    if base is None:   # (a companion artefact)
        return False
    try:
        cold = node.published_version(v.name, base)
        if is_whole(v):
            return cold is not None and _seed_whole(session, cold, v)
        if cold is None or cold.manifest.digest != (v.manifest.of or {}).get("digest"):
            return False   # (its version is gone, or was published again with other content)
        ti = read_torrent(cold)
        if ti is None:
            return False
        return session.seed(ti, v.path, files=frozenset(f.path for f in v.manifest.files))
    except (P2PError, TieringError) as exc:
        log.warning("not seeding %s: %s", v.ref, exc)
        return False


def reseed(node: "LocalNode", session: "P2PSession", name: str, label: str) -> None:
    """A copy of NAME@VERSION (or a partial copy of it, ``label``) left the node: if the seed of that
    version read from a directory that is gone, stop it and seed again from a copy still here (the
    whole version first, then the partial copy holding most), so libtorrent never reads a vanished
    directory until the next full round."""
    base = split_label(label)[0]
    try:
        cold = node.published_version(name, base)
        ti = read_torrent(cold) if cold is not None else None
    except (P2PError, TieringError) as exc:
        log.warning("seeding of %s@%s not updated: %s", name, base, exc)
        return
    if ti is None:
        return
    src = session.source_of(ti)
    if src is not None and src.is_dir():
        return   # (the seed reads from a copy that is still here)
    session.stop_seeding(ti)
    copies = [v for t in LOCAL_TIERS for v in node.versions(t)
              if v.name == name and split_label(v.version)[0] == base]
    for v in sorted(copies, key=lambda v: (not is_whole(v), -v.size)):
        if seed_copy(node, session, v):
            return


def _seed_whole(session: "P2PSession", cold: VersionDir, v: VersionDir, super_seed: bool = False) -> bool:
    """Seed the whole version ``v`` (a copy of ``cold``, the published one) with its torrent."""
    try:
        ti = read_torrent(cold)
    except TorrentRejected as exc:
        log.warning("not seeding %s: %s", v.ref, exc)
        return False
    if ti is None or cold.manifest.digest != v.manifest.digest:
        return False
    # (False: a torrent this node's TLS setting refuses, logged by seed)
    return session.seed(ti, v.path, super_seed=super_seed)


def _partial_of(v: VersionDir) -> str | None:
    """The version a partial copy (``VERSION~p<hex>``, its manifest saying ``of.kind = partial``) is
    part of; None for anything else."""
    base, tag, key = split_label(v.version)
    of = v.manifest.of or {}
    if tag is None or key is not None or not tag.startswith("p") or of.get("kind") != "partial" \
            or of.get("version") != base:
        return None
    return base


def _forget_evicted(session: "P2PSession") -> None:
    """Stop seeding the partial copies that are gone (evicted: the daemon's eviction hook looks for a
    published version under the copy's own label, and finds none)."""
    for key, d in session.partial_seeds().items():
        if not (d / MANIFEST_RELPATH).is_file():
            log.info("p2p: %s is gone, no longer seeding it", d)
            session.stop_seeding(key)
