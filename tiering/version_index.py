"""The versions a local tier root holds, kept per process and told of every change by the kernel
(inotify): a listing is one ``read`` of the event queue when nothing changed, and the entries an
event names are looked at again when something did, whoever changed them (this daemon, a
``weightd --no-daemon`` process, eviction, an operator's ``rm -rf``).

The tree that is watched is the root, every top-level directory (NAME or ``org/``) and every model
directory under one (``org/model``): a version appears or goes only as an entry of one of them (a
rename out of ``.staging``, into ``.trash``), so every such change queues an event before the rename
returns. A version's own contents are not watched: a version is placed whole and its manifest is
never rewritten in place (what :func:`tiering.versions.read_version` checks on every read).

What the queue cannot tell is never kept: a directory without a manifest under a model directory, or
with a ``.weightd`` directory but no manifest yet (an operator's ``cp -r`` under way), is looked at
again at every listing. A queue that overflowed, a watched root that went, a directory met twice (a
bind mount) or a watch refused (``max_user_watches``) drops the index: the next listing builds it
again, or the caller scans the tier itself (:func:`list_indexed` returns None). Only file systems
whose changes all pass through this kernel are indexed (tmpfs, ext4, xfs, btrfs, f2fs, zfs): a network
or FUSE file system changes under other kernels, and is always scanned.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ._syscalls import libc
from .errors import BadInput
from .layout import VersionDir
from .safefs import Dir

# (linux/inotify.h)
IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x4, 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_NONBLOCK, IN_CLOEXEC = 0x1000000, os.O_NONBLOCK, os.O_CLOEXEC
WATCH_MASK = IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF \
    | IN_ONLYDIR
_EVENT = struct.Struct("iIII")

# f_type of the file systems whose every change passes through this kernel (linux/magic.h)
LOCAL_FS = {0x01021994: "tmpfs", 0x858458F6: "ramfs", 0xEF53: "ext2/3/4", 0x58465342: "xfs",
            0x9123683E: "btrfs", 0xF2F52010: "f2fs", 0x2FC12FC1: "zfs"}
ROOTS_KEPT = 64          # indexed roots per process (the least recently listed one is let go)
UNUSABLE_RETRY_S = 60.0  # a root whose watch was refused is scanned for this long before trying again
META = ".weightd"        # (the first component of MANIFEST_RELPATH: a version being copied in by hand)

Classify = Callable[[Dir, str, str], Any]   # (parent, entry, NAME) -> VersionDir | NOT_OURS | DAMAGED | None
DAMAGED: Any = object()   # a manifest that does not parse (damaged, or still being written): looked at again


class Unusable(Exception):
    """This root cannot be indexed now (no inotify, a watch refused, a directory met twice)."""


class _Node:
    """A watched directory: the root (``parts`` ()), a top-level one, or a model directory."""
    __slots__ = ("parts", "wd", "ino", "parent", "versions", "nodes", "unsettled")

    def __init__(self, parts: tuple[str, ...], wd: int, ino: int, parent: "_Node | None") -> None:
        self.parts, self.wd, self.ino, self.parent = parts, wd, ino, parent
        self.versions: dict[str, VersionDir] = {}
        self.nodes: dict[str, _Node] = {}
        self.unsettled: set[str] = set()   # entries looked at again at every listing


class _Index:
    def __init__(self, key: tuple[int, int], path: Path) -> None:
        self.key, self.path = key, path
        self.root: _Node | None = None
        self.dirty: dict[_Node, set[str]] = {}
        self.unsettled: set[_Node] = set()   # the nodes with entries looked at again at every listing
        self.broken = False
        self.generation = 0
        self.snapshot: tuple[int, list[VersionDir]] | None = None


class _Watcher:
    """One inotify instance per process for every indexed root; every method under ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd = -1
        self.wds: dict[int, tuple[_Index, _Node]] = {}
        self.indexes: OrderedDict[tuple[int, int], _Index] = OrderedDict()
        self.unusable: dict[tuple[int, int], float] = {}
        self.local_fs: dict[int, bool] = {}
        self.pid = -1

    # -- the kernel's side -------------------------------------------------------------------------
    def _open(self) -> None:
        if self.fd >= 0 and self.pid == os.getpid():
            return
        self.fd, self.pid, self.wds, self.indexes = -1, os.getpid(), {}, OrderedDict()   # (after a fork: anew)
        try:
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except AttributeError:
            raise Unusable("no inotify") from None
        if fd < 0:
            raise Unusable(os.strerror(ctypes.get_errno()))
        self.fd = fd

    def _watch(self, idx: _Index, d: Dir, parts: tuple[str, ...], parent: _Node | None) -> _Node:
        wd = libc.inotify_add_watch(self.fd, f"/proc/self/fd/{d.fd}".encode(), WATCH_MASK)
        if wd < 0:
            raise Unusable(f"inotify_add_watch {d.path}: {os.strerror(ctypes.get_errno())}")
        if wd in self.wds:   # (a directory moved within the tier, its old entry not looked at yet)
            self._moved(self.wds[wd])
            wd = libc.inotify_add_watch(self.fd, f"/proc/self/fd/{d.fd}".encode(), WATCH_MASK)
            if wd < 0 or wd in self.wds:
                raise Unusable(f"inotify_add_watch {d.path}: refused, or watched twice (a bind mount?)")
        node = _Node(parts, wd, os.fstat(d.fd).st_ino, parent)
        self.wds[wd] = (idx, node)
        return node

    def _moved(self, hit: tuple[_Index, _Node]) -> None:
        """Let go of a watched directory met again elsewhere; its old entry is looked at again (a bind
        mount, met twice, makes the index unsettled and unusable)."""
        idx, node = hit
        if node.parent is None:
            raise Unusable(f"{idx.path} is met inside a tier")
        name = node.parts[-1]
        if node.parent.nodes.get(name) is node:
            del node.parent.nodes[name]
            idx.generation += 1
        self._unwatch(node)
        idx.dirty.setdefault(node.parent, set()).add(name)

    def _unwatch(self, node: _Node) -> None:
        for child in node.nodes.values():
            self._unwatch(child)
        node.nodes = {}
        if self.wds.pop(node.wd, None) is not None:
            libc.inotify_rm_watch(self.fd, node.wd)   # (fails harmlessly when the kernel dropped it)

    def _drain(self) -> None:
        """Every queued event to the index and directory it names (marked dirty)."""
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            off = 0
            while off < len(buf):
                wd, mask, _cookie, n = _EVENT.unpack_from(buf, off)
                name = os.fsdecode(buf[off + _EVENT.size:off + _EVENT.size + n].rstrip(b"\0"))
                off += _EVENT.size + n
                if mask & IN_Q_OVERFLOW:
                    for idx in self.indexes.values():
                        idx.broken = True
                    continue
                hit = self.wds.get(wd)
                if hit is None:
                    continue
                idx, node = hit
                if mask & IN_IGNORED:
                    # (the kernel dropped the watch: a directory made again where this one was may get
                    # its inode number back, and must not pass for this one, still watched)
                    del self.wds[wd]
                if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
                    if node.parent is None:
                        idx.broken = True
                    else:
                        idx.dirty.setdefault(node.parent, set()).add(node.parts[-1])
                elif name:
                    idx.dirty.setdefault(node, set()).add(name)

    # -- an index --------------------------------------------------------------------------------
    def listing(self, d: Dir, classify: Classify) -> list[VersionDir] | None:
        st = os.fstat(d.fd)
        key = (st.st_dev, st.st_ino)
        if not self._is_local(d.fd, st.st_dev) or time.monotonic() < self.unusable.get(key, 0.0):
            return None
        try:
            self._open()
            self._drain()
            idx = self.indexes.get(key)
            if idx is not None and idx.broken:
                self._drop(idx)
                idx = None
            if idx is None:
                idx = self._build(key, d, classify)
            self.indexes.move_to_end(key)
            self._settle(idx, d, classify)
        except (Unusable, BadInput, OSError):   # (a directory going while it is read, among others)
            idx = self.indexes.get(key)
            if idx is not None:
                self._drop(idx)
            self.unusable[key] = time.monotonic() + UNUSABLE_RETRY_S
            return None
        return self._snapshot(idx, d.path)

    def _build(self, key: tuple[int, int], d: Dir, classify: Classify) -> _Index:
        idx = _Index(key, d.path)
        self.indexes[key] = idx
        while len(self.indexes) > ROOTS_KEPT:
            self._drop(next(iter(self.indexes.values())))
        try:
            idx.root = self._watch(idx, d, (), None)
            self._scan(idx, idx.root, d, classify)
        except BaseException:
            self._drop(idx)
            raise
        return idx

    def _drop(self, idx: _Index) -> None:
        if idx.root is not None:
            self._unwatch(idx.root)
        self.indexes.pop(idx.key, None)

    def _scan(self, idx: _Index, node: _Node, d: Dir, classify: Classify) -> None:
        """Every entry of a directory just watched (watch first, then read: nothing falls between)."""
        for name, _st in d.entries():
            self._look(idx, node, d, name, classify)

    def _look(self, idx: _Index, node: _Node, d: Dir, name: str, classify: Classify) -> None:
        """Entry ``name`` of ``node`` (open as ``d``) as it is now: a version, a directory to watch,
        one to look at again at every listing, or nothing of ours."""
        old = node.nodes.pop(name, None)
        old_v = node.versions.pop(name, None)
        node.unsettled.discard(name)
        try:
            self._classify(idx, node, d, name, old, classify)
        finally:
            if old is not None and node.nodes.get(name) is not old:
                self._unwatch(old)
            if node.versions.get(name) is not old_v or node.nodes.get(name) is not old:
                idx.generation += 1
            if node.unsettled:
                idx.unsettled.add(node)

    def _classify(self, idx: _Index, node: _Node, d: Dir, name: str, old: _Node | None,
                  classify: Classify) -> None:
        if name.startswith("."):
            if name == META and len(node.parts) == 2:   # (a model directory becoming a version by hand?)
                idx.dirty.setdefault(node.parent, set()).add(node.parts[-1])  # type: ignore[arg-type]
            return
        try:
            st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
        except OSError:
            return
        if not stat.S_ISDIR(st.st_mode):
            return
        if not node.parts:
            self._subnode(idx, node, d, name, st, old, classify)
            return
        try:
            v = classify(d, name, "/".join(node.parts))
        except (BadInput, OSError):
            return
        if isinstance(v, VersionDir):
            node.versions[name] = v
        elif v is DAMAGED:           # (a manifest being written by hand, or damaged: at every listing)
            node.unsettled.add(name)
        elif v is not None:          # (a manifest that is not a version of this NAME: not ours)
            return
        elif len(node.parts) == 2:   # (no manifest under a model directory: not ours, or not yet)
            node.unsettled.add(name)
        else:
            self._subnode(idx, node, d, name, st, old, classify)
            try:
                os.stat(f"{name}/{META}", dir_fd=d.fd, follow_symlinks=False)
            except OSError:
                return
            node.unsettled.add(name)   # (a .weightd but no manifest: being copied in by hand?)

    def _subnode(self, idx: _Index, node: _Node, d: Dir, name: str, st: os.stat_result, old: _Node | None,
                 classify: Classify) -> None:
        if old is not None and old.ino == st.st_ino and old.wd in self.wds:
            node.nodes[name] = old   # (the same directory, still watched: nothing to read again)
            return
        try:
            sub = d.sub(name)
        except (BadInput, OSError):   # (gone, or not ours to open)
            return
        with sub:
            child = self._watch(idx, sub, (*node.parts, name), node)
            node.nodes[name] = child
            self._scan(idx, child, sub, classify)

    def _settle(self, idx: _Index, d: Dir, classify: Classify) -> None:
        """What the events named, and every unsettled entry, looked at again (until nothing is left:
        looking may find more to look at)."""
        todo = idx.dirty
        idx.dirty = {}
        for node in list(idx.unsettled):
            if node.unsettled and (node.parent is None or node.wd in self.wds):
                todo.setdefault(node, set()).update(node.unsettled)
            else:
                idx.unsettled.discard(node)
        for _ in range(100):
            if not todo:
                return
            for node, names in todo.items():
                if node.parent is not None and node.wd not in self.wds:
                    continue   # (dropped with its parent's entry)
                try:
                    nd = d.sub("/".join(node.parts)) if node.parts else None
                except (BadInput, OSError):   # (gone: look at its entry in its parent)
                    idx.dirty.setdefault(node.parent, set()).add(node.parts[-1])  # type: ignore[arg-type]
                    continue
                try:
                    for name in sorted(names):
                        self._look(idx, node, nd or d, name, classify)
                finally:
                    if nd is not None:
                        nd.close()
            todo = idx.dirty
            idx.dirty = {}
        raise Unusable(f"{d.path} does not settle")

    def _snapshot(self, idx: _Index, path: Path) -> list[VersionDir]:
        if idx.snapshot is None or idx.snapshot[0] != idx.generation:
            idx.snapshot = (idx.generation, _flatten(idx.root))
        out = idx.snapshot[1]
        if path != idx.path:   # (the same root by another path)
            out = [replace(v, path=path / v.rel) for v in out]
        return list(out)

    def _is_local(self, fd: int, dev: int) -> bool:
        local = self.local_fs.get(dev)
        if local is None:
            buf = ctypes.create_string_buffer(256)
            try:
                ok = libc.fstatfs(fd, buf) == 0
            except AttributeError:
                ok = False
            magic = int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], "little", signed=False) if ok else 0
            local = self.local_fs[dev] = (magic & 0xFFFFFFFF) in LOCAL_FS
        return local


def _flatten(root: _Node | None) -> list[VersionDir]:
    """Every version, in the order of a scan: each top-level directory's own versions, then its model
    directories' (each sorted by name)."""
    out: list[VersionDir] = []
    if root is None:
        return out
    for a in sorted(root.nodes):
        na = root.nodes[a]
        out += [na.versions[v] for v in sorted(na.versions)]
        for b in sorted(na.nodes):
            nb = na.nodes[b]
            out += [nb.versions[v] for v in sorted(nb.versions)]
    return out


_WATCHER = _Watcher()
ENABLED = True   # (tests of the scan that is used without an index turn it off)


def list_indexed(d: Dir, classify: Classify) -> list[VersionDir] | None:
    """Every complete version under the tier root ``d`` from this process's index of it, or None
    when it cannot be indexed (the caller scans). ``classify(parent, entry, NAME)``: the entry as a
    version of NAME, a sentinel for a manifest that is not one, or None when it has no manifest."""
    if not ENABLED:
        return None
    with _WATCHER.lock:
        return _WATCHER.listing(d, classify)


def indexed_roots() -> int:
    """How many roots this process keeps an index of (tests, status)."""
    with _WATCHER.lock:
        return len(_WATCHER.indexes)

