"""Torrents made from manifests: BitTorrent v2 (SHA-256 merkle trees per file).

Why v2 and not hybrid: every piece is verified with SHA-256 either way, and v2 alone hashes about
twice as fast as hybrid here (notes/libtorrent.md); v2 also aligns every file to a piece boundary, so
a piece never straddles two files and unchanged files keep identical piece hashes across versions
(delta updates). The cost: v1-only clients (aria2, transmission 3) cannot join, which a weightd fleet
does not need.

The torrent's root directory is the VERSION label, so a version directory ``<tier>/NAME/VERSION`` seeds
with ``save_path = <tier>/NAME``. Files are exactly the manifest's, in its order; ``.weightd/`` is
never part of it.

A partial copy (``<tier>/NAME/VERSION~p<hex>``, some of the version's files) uses the whole version's
torrent (the same info-hash, so the same swarm): ``Subset`` says which files and pieces it holds or
wants, ``placement`` renames the torrent's files into its directory.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import libtorrent as lt

from tiering import LABEL_SEP, Manifest, split_label, validate_relpath

from .errors import TorrentRejected

if TYPE_CHECKING:
    from .certs import FleetTLS

MiB = 1 << 20
TORRENT_RELPATH = ".weightd/checkpoint.torrent"


def piece_size_for(total_bytes: int) -> int:
    """4 MiB under 1 GiB, 8 MiB under 16 GiB, else 16 MiB (fewer pieces, bounded piece-map size)."""
    if total_bytes < (1 << 30):
        return 4 * MiB
    if total_bytes < (16 << 30):
        return 8 * MiB
    return 16 * MiB


def make_torrent(version_dir: Path, manifest: Manifest, *, piece_size: int | None = None,
                 root_cert: bytes | None = None) -> bytes:
    """Hash the files of ``version_dir`` (as listed in ``manifest``) into a v2 torrent. With ``root_cert``
    (the fleet CA, PEM) it is an SSL torrent: libtorrent then exchanges its pieces only over TLS with
    peers whose certificate that CA signed (the CA is part of the info dict: it changes the info-hash)."""
    name = version_dir.name
    entries = [lt.create_file_entry(f"{name}/{f.path}", f.size) for f in manifest.files]
    ct = lt.create_torrent(entries, piece_size or piece_size_for(manifest.total_bytes), lt.create_torrent.v2_only)
    if root_cert:
        ct.set_root_cert(root_cert.decode("ascii"))
    ct.set_creator("weightd")
    ct.set_comment(f"{manifest.name}@{manifest.version} {manifest.digest}")
    lt.set_piece_hashes(ct, str(version_dir.parent))
    return lt.bencode(ct.generate())


def _is_pad(fs: lt.file_storage, i: int) -> bool:
    return bool(int(fs.file_flags(i)) & int(lt.file_storage.flag_pad_file))


def _real_files(ti: lt.torrent_info) -> Iterator[tuple[int, str, int]]:
    """(index, path relative to the checkpoint, size) of every real (non-pad) file."""
    fs = ti.layout()
    for i in range(fs.num_files()):
        if _is_pad(fs, i):
            continue
        path = fs.file_path(i).replace(os.sep, "/")
        yield i, (path.split("/", 1)[1] if "/" in path else path), fs.file_size(i)


def files_of(ti: lt.torrent_info) -> list[tuple[str, int]]:
    """(path relative to the checkpoint, size) of every real (non-pad) file."""
    return [(path, size) for _, path, size in _real_files(ti)]


def load_torrent(data: bytes, manifest: Manifest, source: str = "torrent") -> lt.torrent_info:
    """Parse and check a torrent against the manifest: v2, same files and sizes, no path escapes."""
    try:
        ti = lt.torrent_info(lt.bdecode(data) if isinstance(data, (bytes, bytearray)) else data)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise TorrentRejected(source, f"not a valid torrent ({exc})") from None
    if not ti.info_hashes().has_v2():
        raise TorrentRejected(source, "not a BitTorrent v2 torrent (SHA-256 pieces are required)")
    fs = ti.layout()
    for i in range(fs.num_files()):
        raw = fs.file_path(i).replace(os.sep, "/")
        if raw.startswith("/") or any(part in ("", ".", "..") for part in raw.split("/")):
            raise TorrentRejected(source, f"file path {raw!r} escapes the checkpoint")
        flags = int(fs.file_flags(i))
        if flags & ~int(lt.file_storage.flag_pad_file) & ~int(getattr(lt.file_storage, "flag_hidden", 0)):
            # BEP 47 symlinks (libtorrent would create them on download) or executables: a checkpoint
            # is plain files
            raise TorrentRejected(source, f"file {raw!r} has attributes a checkpoint never has (flags {flags:#x})")
    files = files_of(ti)
    for path, _ in files:
        validate_relpath(path, source)
    expected = [(f.path, f.size) for f in manifest.files]
    if sorted(files) != sorted(expected):
        extra = sorted(set(files) - set(expected))[:1] or sorted(set(expected) - set(files))[:1]
        raise TorrentRejected(source, f"files do not match the manifest (first difference: {extra[0] if extra else '?'})")
    return ti


def fleet_mismatch(ti: lt.torrent_info, tls: "FleetTLS | None") -> str | None:
    """Why this node must not use ``ti`` for P2P under its TLS setting, or None if it may: with fleet
    TLS the torrent must carry the fleet CA (else it would be exchanged in the clear, with anyone inside
    ``allow``); without, it must carry none (libtorrent would accept no plain connection for it)."""
    root = ti.ssl_cert()
    if tls is None:
        return "the torrent is for a TLS fleet (it carries a CA) and this node has no [p2p] tls" if root else None
    if not root:
        return "the torrent carries no fleet CA (made without [p2p] tls): its peers would not be authenticated"
    from .certs import same_ca
    if not same_ca(root, tls):
        return f"the torrent carries a different CA than the fleet CA in {tls.ca_path or '[p2p] tls'}"
    return None


def save_path_for(ti: lt.torrent_info, data_dir: Path) -> Path:
    """Where libtorrent must be pointed so that the files land in (or are read from) ``data_dir``."""
    fs = ti.layout()
    multi = any("/" in fs.file_path(i) for i in range(fs.num_files()) if not _is_pad(fs, i))
    if multi and ti.name() != data_dir.name:
        raise TorrentRejected(str(data_dir), f"torrent root {ti.name()!r} does not match {data_dir.name!r}")
    return data_dir.parent if multi else data_dir


@dataclass(frozen=True, slots=True)
class Subset:
    """The files of a torrent that a partial copy holds or wants, as libtorrent takes them."""
    files: frozenset[str]
    priorities: list[int]     # per file of the layout: 4 for these files, 0 for the others and the pads
    pieces: list[bool]        # per piece: one of these files' pieces
    bytes: int                # these files' bytes

    @property
    def num_pieces(self) -> int:
        return sum(self.pieces)

    @property
    def tag(self) -> str:
        """The same for every node wanting exactly these files (the tracker's member lists group
        downloading workers by it: a piece plan is shared by workers that want the same pieces)."""
        return "p" + hashlib.blake2b("\n".join(sorted(self.files)).encode(), digest_size=8).hexdigest()


def subset_of(ti: lt.torrent_info, files: "frozenset[str] | set[str]") -> Subset:
    """Which files and pieces of ``ti`` are ``files`` (paths relative to the checkpoint). Only for a
    torrent whose every file starts at a piece boundary (v2: weightd's all do, padded), so that no
    piece of these files carries a byte of another: TorrentRejected otherwise, or for a path the
    torrent does not have."""
    fs, plen = ti.layout(), ti.piece_length()
    prio = [0] * fs.num_files()
    pieces = [False] * ti.num_pieces()
    found: set[str] = set()
    nbytes = 0
    for i, path, size in _real_files(ti):
        off = fs.file_offset(i)
        if size and off % plen:
            raise TorrentRejected(ti.name(), f"file {path!r} does not start at a piece boundary (offset {off}): "
                                  "a partial copy could not be fetched or seeded by itself")
        if path not in files:
            continue
        found.add(path)
        prio[i] = 4
        nbytes += size
        for p in range(off // plen, (off + size + plen - 1) // plen):
            pieces[p] = True
    missing = sorted(set(files) - found)
    if missing:
        raise TorrentRejected(ti.name(), f"no file {missing[0]!r} in the torrent (a partial copy names "
                              f"{len(missing)} file(s) the version does not have)")
    return Subset(frozenset(files), prio, pieces, nbytes)


def placement(ti: lt.torrent_info, data_dir: Path) -> tuple[Path, dict[int, str]]:
    """``save_path`` and the files to rename so that libtorrent reads (or writes) the torrent's files
    in ``data_dir``: a version directory is named as the torrent's root (``save_path_for``); a partial
    copy's, ``VERSION~p<hex>``, is not, and every file is renamed into it."""
    base, tag, _ = split_label(data_dir.name)
    if LABEL_SEP not in data_dir.name or tag is None or base != ti.name():
        return save_path_for(ti, data_dir), {}
    return data_dir.parent, {i: f"{data_dir.name}/{path}" for i, path, _ in _real_files(ti)}
