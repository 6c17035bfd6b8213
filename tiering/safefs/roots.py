"""Tier roots: opened once with ``O_NOFOLLOW | O_DIRECTORY`` and checked to be weightd's (owner, mode,
parents), cold storage as the operator configured it, and the check that a tree can be changed by
no one else before its path is handed to a library that follows links."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageUnavailable, UnsafePath
from .dir import Dir
from .paths import describe, split_rel, unsafe


@dataclass(frozen=True, slots=True)
class RootPolicy:
    """How a tier root must look. ``mode``: what weightd creates it with; ``group``: its group (gid)
    or None. A root that exists is accepted if it is a real directory owned by ``uid`` and not
    writable by group or others (whatever its other bits)."""
    mode: int = 0o700
    group: int | None = None
    uid: int | None = None   # default: our effective uid


def check_root_stat(path: Path, st: os.stat_result, policy: RootPolicy) -> None:
    uid = os.geteuid() if policy.uid is None else policy.uid
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(str(path), "tier root is a symlink; weightd refuses it (point the config at the real "
                                    "directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(str(path), f"tier root is not a directory ({describe(st)})")
    if st.st_uid != uid:
        raise UnsafePath(str(path), f"tier root is not weightd's ({describe(st)}; expected owner uid {uid}); "
                                    "someone else created it: remove it or configure another path")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UnsafePath(str(path), f"tier root is writable by group or others ({describe(st)}); "
                                    f"chmod go-w {path}")


def check_ancestors(path: Path) -> None:
    """Every directory above a tier root must be one that only root or weightd's user can change
    entries of (owned by one of them; writable by others only with the sticky bit, as /dev/shm and
    /tmp are), or someone could swap the root for a directory of their own (sshd's StrictModes)."""
    me = os.geteuid()
    for p in path.parents:
        try:
            st = os.stat(p)  # (following the configured path: the operator's choice)
        except FileNotFoundError:
            continue
        if others_can_change(st, (0, me)) is None:
            continue
        if st.st_uid not in (0, me):
            raise UnsafePath(str(path), f"its parent {p} belongs to uid {st.st_uid}, who could replace the tier "
                                        "root: put the tier under a directory of root or weightd's user")
        raise UnsafePath(str(path), f"its parent {p} is writable by group or others without the sticky bit "
                                    f"(mode {stat.S_IMODE(st.st_mode):04o}): anyone could replace the tier root")


def others_can_change(st: os.stat_result, uids: "tuple[int, ...] | frozenset[int]") -> str | None:
    """Why a uid not in ``uids`` could change the entries of the directory ``st`` (rename, replace or
    add one), or None when none can: it must be owned by one of ``uids`` and not writable by group or
    others, unless it has the sticky bit (``/tmp``, ``/dev/shm``: others may add names there but
    never replace one of ours)."""
    if st.st_uid not in uids:
        return f"belongs to uid {st.st_uid}"
    if stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"is writable by group or others ({describe(st)})"
    return None


MAX_SYMLINKS = 40   # as the kernel's own resolution


def resolve_unchangeable(path: "str | Path", uids: "tuple[int, ...] | frozenset[int]", what: str) -> str:
    """Resolve ``path`` as the kernel would, symlink by symlink, and refuse it (UnsafePath naming the
    directory) unless every directory the resolution passes through, from ``/`` down to the last
    component's parent (and the last component when it is a directory), is one only ``uids`` can
    change (:func:`others_can_change`); a symlink counts where it lies and where it leads, and one in
    a directory others can write (sticky, as /tmp) must itself be one of ``uids``'. Returns the
    resolved path: opened with ``O_NOFOLLOW`` it is the file checked, since no one else can swap a
    name on the way. ``what`` names the thing for the message ("intent file")."""
    todo = [c for c in str(os.path.abspath(path)).split("/") if c]
    cur, links = "/", 0
    cur_st = os.stat("/")
    _check_walked(path, cur, cur_st, uids, what)
    while todo:
        name = todo.pop(0)
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            cur_st = os.stat(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if todo:
                raise
            return nxt   # (the caller's open says it is missing)
        if stat.S_ISLNK(st.st_mode):
            # a link in a directory others may add to (sticky: /tmp) is its owner's to replace at will
            if st.st_uid not in uids and stat.S_IMODE(cur_st.st_mode) & 0o022:
                raise UnsafePath(str(path), f"{what} is reached through {nxt}, a symlink of uid {st.st_uid} in "
                                            f"{cur}, which others can write: that uid can point it elsewhere at "
                                            "any time; refused")
            links += 1
            if links > MAX_SYMLINKS:
                raise UnsafePath(str(path), f"{what}: more than {MAX_SYMLINKS} symlinks on the way")
            target = os.readlink(nxt)
            todo[:0] = [c for c in target.split("/") if c]
            if target.startswith("/"):
                cur, cur_st = "/", os.stat("/")
            continue
        if stat.S_ISDIR(st.st_mode):
            _check_walked(path, nxt, st, uids, what)
        elif todo:
            raise UnsafePath(str(path), f"{what}: {nxt} is not a directory")
        cur, cur_st = nxt, st
    return cur


def _check_walked(path: "str | Path", d: str, st: os.stat_result, uids: "tuple[int, ...] | frozenset[int]",
                  what: str) -> None:
    why = others_can_change(st, uids)
    if why is not None:
        raise UnsafePath(str(path), f"{what} is reached through {d}, which {why}: every directory on its path "
                                    "(and where its symlinks lead) must be one only root or weightd's user can "
                                    "change; refused")


def open_unchangeable_dir(path: "str | Path", uids: "tuple[int, ...] | frozenset[int]", what: str, *,
                          create: bool = False, mode: int = 0o755) -> Dir:
    """The directory ``path`` opened by descriptor from ``/``, one ``O_NOFOLLOW | O_DIRECTORY`` open per
    component: a symlink anywhere on it is refused (never followed), and so is every directory on the
    way that a uid not in ``uids`` could change (:func:`others_can_change`); the directory itself must
    be owned by one of ``uids`` and writable by no one else, sticky bit or not. With ``create``,
    missing components are made (``mode``, less the umask) once their parent passed, and opened
    without following (one raced in is refused). UnsafePath naming the component otherwise."""
    parts = [c for c in str(os.path.abspath(path)).split("/") if c]
    cur = Dir(os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), Path("/"))
    try:
        for i, name in enumerate(parts):
            here = cur.path / name
            why = others_can_change(os.fstat(cur.fd), uids)
            if why is not None:
                raise UnsafePath(str(path), f"{what}: its parent {cur.path} {why}, who could swap what is in it: "
                                            "refused")
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur.fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, mode, dir_fd=cur.fd)
                except FileExistsError:
                    pass
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur.fd)
            except OSError as exc:
                try:
                    st = os.stat(name, dir_fd=cur.fd, follow_symlinks=False)
                except OSError:
                    raise exc from None
                if stat.S_ISLNK(st.st_mode):
                    raise UnsafePath(str(path), f"{what}: {here} is a symlink (owner uid {st.st_uid}); weightd never "
                                                f"follows one there: give the real directory") from None
                raise UnsafePath(str(path), f"{what}: {here} is not a directory ({describe(st)})") from None
            nxt = Dir(fd, here)
            cur.close()
            cur = nxt
        st = os.fstat(cur.fd)
        if st.st_uid not in uids or stat.S_IMODE(st.st_mode) & 0o022:
            raise UnsafePath(str(path), f"{what}: {cur.path} is not yours alone ({describe(st)}; expected owner uid "
                                        f"{' or '.join(map(str, sorted(set(uids))))}, not writable by group or "
                                        "others): refused")
    except BaseException:
        cur.close()
        raise
    return cur


def open_tier_root(path: Path, policy: RootPolicy = RootPolicy(), *, create: bool) -> Dir | None:
    """Open (and with ``create``, make) a hot or warm tier root and check it and its parents.

    Returns None when it does not exist and ``create`` is false (nothing is made for a query)."""
    check_ancestors(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        _make_root(path, policy)
        st = os.lstat(path)
    check_root_stat(path, st, policy)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise unsafe(str(path), exc) from None
    d = Dir(fd, path)
    try:
        check_root_stat(path, os.fstat(fd), policy)  # the same directory we looked at, not a swapped one
    except BaseException:
        d.close()
        raise
    return d


def unmade_parent(path: Path) -> StorageUnavailable | None:
    """Why the tier root ``path`` cannot be made, if its parent directory is missing outside the user's
    home: /mnt/nvme0/weightd with /mnt/nvme0 absent is a device or volume that is not mounted, and
    making the parents would put the tier on the root file system. (None: it can be made.)"""
    top = None
    p = path.parent
    while not p.exists():
        top, p = p, p.parent
    if top is None or _under_home(path.parent):
        return None
    return StorageUnavailable(str(path), f"cannot make the tier: {top} does not exist (is it mounted?); weightd "
                                         "makes a tier's root, never its parents outside your home directory")


def _make_root(path: Path, policy: RootPolicy) -> None:
    parent = path.parent
    refused = unmade_parent(path)
    if refused is not None:
        raise refused
    missing = []
    p = parent
    while not p.exists():
        missing.append(p)
        p = p.parent
    for m in reversed(missing):  # parents of a root are ordinary directories (0755), made durable
        try:
            os.mkdir(m, 0o755)
        except FileExistsError:
            pass
        _fsync_path(m.parent)
    try:
        os.mkdir(path, policy.mode)
    except FileExistsError:
        return  # made by someone else meanwhile: the caller checks whose it is
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if policy.group is not None:
            os.fchown(fd, -1, policy.group)
        os.fchmod(fd, policy.mode)  # the umask does not decide a tier's mode
    finally:
        os.close(fd)
    _fsync_path(parent)


def open_cold_root(path: Path, *, create: bool = False) -> Dir | None:
    """Cold storage: the configured path is the operator's (it may be a mount reached through a
    symlink); everything beneath it is opened by descriptor without following anything. Never made
    except for ``publish`` (``create``). None when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if not create:
            return None
        os.makedirs(path, exist_ok=True)
        _fsync_path(path.parent)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except NotADirectoryError:
        raise UnsafePath(str(path), "cold tier is not a directory") from None
    return Dir(fd, path)


COLD_MARKER = ".weightd-cold"   # in a cold store's root: "this is weightd's store", written by publish
_MARKER_TEXT = b"weightd cold store v1\n"


def open_cold_store(path: Path, *, create: bool = False) -> Dir:
    """The node's configured cold store (a path). Unlike :func:`open_cold_root`, what is not there as
    configured is an error, never an empty catalog: a missing directory, one this uid cannot open,
    or an empty directory without the store's marker (an NFS mount point with nothing mounted) is
    :class:`StorageUnavailable` naming the path and asking whether it is mounted. ``create``
    (``publish``) makes the root if missing and writes the marker; a store published to before the
    marker existed (non-empty, no marker) is accepted as it is."""
    hint = "is it mounted? (a new store is made by the first weightd publish)"
    made = create and not os.path.lexists(path)
    if made and (refused := unmade_parent(path)) is not None:   # (its mount is missing: not on the root fs)
        raise StorageUnavailable(str(path), f"cold storage {refused.reason}")
    try:
        d = open_cold_root(path, create=create)
    except PermissionError:
        raise StorageUnavailable(str(path), f"cold storage cannot be opened by uid {os.geteuid()}: permission "
                                            "denied (mount or export it readable to weightd's user)") from None
    except FileNotFoundError:   # a parent vanished between the checks (an automount going away)
        d = None
    if d is None:
        raise StorageUnavailable(str(path), f"cold storage does not exist: {hint}")
    try:
        if d.is_file(COLD_MARKER):
            return d
        try:
            empty = not os.listdir(d.fd)
        except PermissionError:
            raise StorageUnavailable(str(path), f"cold storage cannot be listed by uid {os.geteuid()}: "
                                                "permission denied (mount or export it readable to weightd's user)"
                                     ) from None
        if create and (made or not empty):   # made here, or a store written before the marker existed
            _write_marker(d)
        elif empty:
            # an empty directory weightd did not make: a mount point with nothing mounted, even for publish
            # (which would otherwise make it a store on the wrong file system, for good)
            raise StorageUnavailable(str(path), f"cold storage is an empty directory with no weightd store in it "
                                                f"(no {COLD_MARKER}): is it mounted? (if it is a new, empty store, "
                                                f"mark it once: touch {path}/{COLD_MARKER})")
    except BaseException:
        d.close()
        raise
    return d


def _write_marker(d: Dir) -> None:
    """The store's marker, made atomically (a temporary name, then a link that fails if it exists)."""
    tmp = f"{COLD_MARKER}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=d.fd)
    try:
        os.write(fd, _MARKER_TEXT)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, COLD_MARKER, src_dir_fd=d.fd, dst_dir_fd=d.fd)
    except FileExistsError:
        pass   # another publisher made it meanwhile
    finally:
        os.unlink(tmp, dir_fd=d.fd)
    os.fsync(d.fd)


def _under_home(path: Path) -> bool:
    home = os.environ.get("HOME")
    return bool(home) and home != "/" and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(home))


def _fsync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_unchangeable(root: Dir, rel: str) -> None:
    """``rel`` beneath ``root``, every directory on the way and every directory inside it, must be
    one whose entries only root or weightd's user can change (owner 0 or us, not writable by group or
    others). Code that must hand a path to a library that follows links (libtorrent) calls this
    first: nobody else can then swap a file for a link between the check and the library's open."""
    me = os.geteuid()

    def check(d: Dir) -> None:
        st = os.fstat(d.fd)
        if st.st_uid not in (0, me) or stat.S_IMODE(st.st_mode) & 0o022:
            raise UnsafePath(str(d.path), f"can be changed by others ({describe(st)}): weightd hands libtorrent "
                                          "only directories that root or its own user alone can change")

    def inside(d: Dir) -> None:
        check(d)
        for name in d.subdirs():
            with d.sub(name) as sub:
                inside(sub)

    parts = split_rel(rel)
    for i in range(1, len(parts)):
        with root.sub("/".join(parts[:i])) as d:
            check(d)
    with root.sub(rel) as d:
        inside(d)
