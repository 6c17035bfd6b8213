"""Torrents made from manifests: BitTorrent v2 (SHA-256 merkle trees per file).

Why v2 and not hybrid: every piece is verified with SHA-256 either way, and v2 alone hashes about
twice as fast as hybrid here (notes/libtorrent.md); v2 also aligns every file to a piece boundary, so
a piece never straddles two files and unchanged files keep identical piece hashes across versions
(delta updates). The cost: v1-only clients (aria2, transmission 3) cannot join, which a weightd fleet
does not need.

weightd writes the torrent itself (BEP 52: SHA-256 of every 16 KiB block, a merkle tree per file padded
with zero leaves, the piece layer of every file larger than a piece), from the same read that checks
every file against the manifest, so it cannot describe other bytes; its bytes are those libtorrent's own
creator makes of the same files (tested), plus a record binding it to the manifest (``bound_to``). The
2.1.1 binding cannot be handed hashes that were taken elsewhere (no ``create_torrent.set_hash2``).

The torrent's root directory is the VERSION label, so a version directory ``<tier>/NAME/VERSION`` seeds
with ``save_path = <tier>/NAME``. Files are exactly the manifest's, in its order; ``.weightd/`` is
never part of it.

A partial copy (``<tier>/NAME/VERSION~p<hex>``, some of the version's files) uses the whole version's
torrent (the same info-hash, so the same swarm): ``Subset`` says which files and pieces it holds or
wants, ``placement`` renames the torrent's files into its directory. An expert-parallel copy's download
is the same, narrowed to the pieces covering its kept tensors' byte ranges (``subset_of(..., ranges)``).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import libtorrent as lt

from tiering import LABEL_SEP, Dir, Manifest, piece_size_for, split_label, validate_relpath, verify_checkpoint

from .errors import TorrentRejected

if TYPE_CHECKING:
    from .certs import FleetTLS

TORRENT_RELPATH = ".weightd/checkpoint.torrent"


BINDING_KEY = b"weightd"   # top level, beside the info dict: {manifest: digest, info hash: v2 info-hash}
BLOCK = 16 << 10   # BEP 52: the merkle trees' leaves are SHA-256 of 16 KiB blocks
_ZERO = bytes(32)  # the leaf beyond a file's end


def _reduce(layer: list[bytes], pad: bytes) -> bytes:
    """The merkle root over ``layer`` padded with ``pad`` up to a power of two (at least one node)."""
    width = 1
    while width < len(layer):
        width *= 2
    nodes = layer + [pad] * (width - len(layer))
    while len(nodes) > 1:
        nodes = [hashlib.sha256(nodes[i] + nodes[i + 1]).digest() for i in range(0, len(nodes), 2)]
    return nodes[0]


class _MerkleHasher:
    """One file's BEP 52 merkle tree, fed its bytes in order (``update``, as ``hashlib`` hashers are):
    SHA-256 of every 16 KiB block (the last one shorter), reduced a piece at a time to the piece layer,
    so only one piece's leaves and 32 bytes a piece are held. ``hexdigest``: the pieces root followed
    by the piece layer (empty for an empty file), both hex. Given to ``verify_checkpoint`` as its
    ``crypto`` hasher, it is fed from the very buffers the manifest's parts are hashed from."""

    def __init__(self, piece_length: int) -> None:
        self.per_piece = piece_length // BLOCK
        self.leaves: list[bytes] = []
        self.layer: list[bytes] = []
        self.tail = bytearray()   # (the buffer handed in is reused by the reader: a partial block is copied)
        self.size = 0

    def _leaf(self, block: "bytes | memoryview") -> None:
        self.leaves.append(hashlib.sha256(block).digest())
        if len(self.leaves) == self.per_piece:
            self.layer.append(_reduce(self.leaves, _ZERO))
            self.leaves = []

    def update(self, data: "bytes | memoryview") -> None:
        view = memoryview(data).cast("B")
        self.size += len(view)
        if self.tail:
            take = min(BLOCK - len(self.tail), len(view))
            self.tail += view[:take]
            view = view[take:]
            if len(self.tail) < BLOCK:
                return
            self._leaf(bytes(self.tail))
            self.tail = bytearray()
        whole = len(view) - len(view) % BLOCK
        for off in range(0, whole, BLOCK):
            self._leaf(view[off:off + BLOCK])
        self.tail += view[whole:]

    def hexdigest(self) -> str:
        if self.size == 0:
            return ""
        if self.tail:
            self.leaves.append(hashlib.sha256(self.tail).digest())
            self.tail = bytearray()
        if not self.layer:   # (one piece or less: the tree is as wide as its blocks, to a power of two)
            return _reduce(self.leaves, _ZERO).hex()
        if self.leaves:      # (the last piece's subtree padded to a whole piece)
            self.layer.append(_reduce(self.leaves + [_ZERO] * (self.per_piece - len(self.leaves)), _ZERO))
            self.leaves = []
        pad = _reduce([_ZERO] * self.per_piece, _ZERO)   # (a piece beyond the end: its zero subtree)
        return (_reduce(self.layer, pad) + b"".join(self.layer)).hex()


def torrent_bytes(name: str, files: "list[tuple[str, int, bytes, bytes]]", piece_length: int, *,
                  root_cert: bytes | None = None, creator: str = "weightd", comment: str = "",
                  creation_date: int = 0, manifest_digest: str | None = None) -> bytes:
    """A BitTorrent v2-only torrent (BEP 52), bencoded, from each file's (path under ``name``, size,
    pieces root, piece layer): what ``lt.create_torrent(..., v2_only)`` and ``lt.set_piece_hashes``
    make of the same files, byte for byte. ``manifest_digest``: and the record that binds it to that
    manifest (``BINDING_KEY``, outside the info dict: the info-hash is libtorrent's)."""
    tree: dict[bytes, object] = {}
    layers: dict[bytes, bytes] = {}
    for path, size, root, layer in files:
        node = tree
        *dirs, leaf = path.encode().split(b"/")
        for part in dirs:
            node = node.setdefault(part, {})  # type: ignore[assignment]
        meta: dict[bytes, object] = {b"length": size}
        if size:
            meta[b"pieces root"] = root
        node[leaf] = {b"": meta}
        if size > piece_length:
            layers[root] = layer
    info: dict[bytes, object] = {b"file tree": tree, b"meta version": 2, b"name": name.encode(),
                                 b"piece length": piece_length}
    if root_cert:
        info[b"ssl-cert"] = root_cert
    top: dict[bytes, object] = {b"info": info, b"piece layers": layers, b"created by": creator.encode(),
                                b"creation date": creation_date}
    if comment:
        top[b"comment"] = comment.encode()
    if manifest_digest is not None:
        top[BINDING_KEY] = {b"manifest": manifest_digest.encode(),
                            b"info hash": hashlib.sha256(lt.bencode(info)).digest()}
    return lt.bencode(top)


def make_torrent(version_dir: "Path | Dir", manifest: Manifest, *, piece_size: int | None = None,
                 root_cert: bytes | None = None, threads: int | None = None,
                 creation_date: int | None = None) -> bytes:
    """The v2 torrent of the files of ``version_dir`` as listed in ``manifest``, hashed in the same read
    that checks every part of every file against the manifest (xxh3-128): a byte that differs fails it
    (IntegrityError naming the file and part), so the torrent describes exactly the manifest's bytes.
    It says so at its top level (``BINDING_KEY``: the manifest's digest and the torrent's info-hash),
    which lets a worker take libtorrent's SHA-256 piece checks as the check of an unsigned version
    (``bound_to``). With ``root_cert`` (the fleet CA, PEM) it is an SSL torrent: libtorrent then
    exchanges its pieces only over TLS with peers whose certificate that CA signed (the CA is part of
    the info dict: it changes the info-hash)."""
    plen = piece_size or piece_size_for(manifest.total_bytes)
    if plen < BLOCK or plen & (plen - 1):
        raise TorrentRejected(str(version_dir), f"piece size {plen} is not a power of two of at least 16 KiB")
    if manifest.total_bytes == 0:
        raise TorrentRejected(str(version_dir), "no bytes to share (every file is empty): no torrent")
    report = verify_checkpoint(version_dir, manifest, threads=threads, crypto=lambda: _MerkleHasher(plen))
    listed = {f.path for f in manifest.files}
    report.problems = [p for p in report.problems if p.path in listed]   # (files beside the manifest's: not ours)
    report.raise_for_problems()
    files = []
    for f in manifest.files:
        tree = bytes.fromhex(report.crypto_digests.get(f.path, ""))
        files.append((f.path, f.size, tree[:32], tree[32:]))
    name = version_dir.path.name if isinstance(version_dir, Dir) else Path(version_dir).name
    return torrent_bytes(name, files, plen, root_cert=root_cert,
                         comment=f"{manifest.name}@{manifest.version} {manifest.digest}",
                         creation_date=int(time.time()) if creation_date is None else creation_date,
                         manifest_digest=manifest.digest)


def bound_to(data: bytes, ti: lt.torrent_info, manifest: Manifest) -> bool:
    """Whether the torrent ``data`` (parsed as ``ti``) says it was made by ``make_torrent`` from bytes
    checked against ``manifest`` in the same read: its record names this manifest's digest and this
    torrent's own info-hash (a torrent made by any other tool, for another manifest, or whose info dict
    was replaced under a kept record, is not)."""
    try:
        rec = lt.bdecode(data).get(BINDING_KEY)
    except (RuntimeError, TypeError, ValueError, AttributeError):
        return False
    if not isinstance(rec, dict):
        return False
    return rec.get(b"manifest") == manifest.digest.encode() and \
        rec.get(b"info hash") == ti.info_hashes().v2.to_bytes()


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
    """The files of a torrent that a partial copy holds or wants, as libtorrent takes them; for an
    expert-parallel copy (``ranged``), only the pieces covering some byte ranges of those files."""
    files: frozenset[str]
    priorities: list[int]     # per file of the layout: 4 for these files, 0 for the others and the pads
    pieces: list[bool]        # per piece: one of these files' pieces (ranged: one covering a wanted range)
    bytes: int                # these files' bytes (ranged: the bytes of those pieces, what moves)
    ranged: bool = False      # pieces, not whole files: libtorrent is given ``piece_priorities``

    @property
    def num_pieces(self) -> int:
        return sum(self.pieces)

    @property
    def piece_priorities(self) -> list[int]:
        return [4 if w else 0 for w in self.pieces]

    @property
    def tag(self) -> str:
        """The same for every node wanting exactly these files (the tracker's member lists group
        downloading workers by it: a piece plan is shared by workers that want the same pieces); a
        ranged subset's is its pieces' (the same rank of the same split wants the same ones)."""
        what = "\n".join(sorted(self.files))
        if self.ranged:
            what += "\n" + "".join("1" if w else "0" for w in self.pieces)
        return "p" + hashlib.blake2b(what.encode(), digest_size=8).hexdigest()


def subset_of(ti: lt.torrent_info, files: "frozenset[str] | set[str]",
              ranges: "Mapping[str, Sequence[tuple[int, int]]] | None" = None) -> Subset:
    """Which files and pieces of ``ti`` are ``files`` (paths relative to the checkpoint). Only for a
    torrent whose every file starts at a piece boundary (v2: weightd's all do, padded), so that no
    piece of these files carries a byte of another: TorrentRejected otherwise, or for a path the
    torrent does not have.

    ``ranges``: of the files named there, only the pieces covering these ``[begin, end)`` byte ranges
    (an expert-parallel copy's kept tensors; a file of ``files`` not named there: all its pieces). A
    piece is whole, so a range's edges bring up to a piece each of their neighbours' bytes; a range
    outside its file is TorrentRejected."""
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
        spans = ranges.get(path) if ranges is not None else None
        if spans is None:
            spans = [(0, size)]
        for b, e in spans:
            if not 0 <= b <= e <= size:
                raise TorrentRejected(ti.name(), f"bytes {b}-{e} of {path!r} lie outside the file ({size} bytes)")
            if b == e:
                continue
            for p in range((off + b) // plen, (off + e + plen - 1) // plen):
                if not pieces[p]:
                    pieces[p] = True
                    nbytes += min(plen, off + size - p * plen)
    missing = sorted(set(files) - found)
    if missing:
        raise TorrentRejected(ti.name(), f"no file {missing[0]!r} in the torrent (a partial copy names "
                              f"{len(missing)} file(s) the version does not have)")
    return Subset(frozenset(files), prio, pieces, nbytes, ranges is not None)


def placement(ti: lt.torrent_info, data_dir: Path) -> tuple[Path, dict[int, str]]:
    """``save_path`` and the files to rename so that libtorrent reads (or writes) the torrent's files
    in ``data_dir``: a version directory is named as the torrent's root (``save_path_for``); a partial
    copy's, ``VERSION~p<hex>``, is not, and every file is renamed into it."""
    base, tag, _ = split_label(data_dir.name)
    if LABEL_SEP not in data_dir.name or tag is None or base != ti.name():
        return save_path_for(ti, data_dir), {}
    return data_dir.parent, {i: f"{data_dir.name}/{path}" for i, path, _ in _real_files(ti)}
