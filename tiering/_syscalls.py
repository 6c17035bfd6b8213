"""Every ctypes binding and kernel probe of the data plane, in one place.

libc is loaded once, here. Optional kernel features are probed once each, on first use, and have a
fallback where they are called (tensorizer's ``_syscalls.py`` does the same):

- ``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` (5.6+; else safefs walks with
  ``O_NOFOLLOW``), ``renameat2(2)`` with ``RENAME_NOREPLACE`` (else a check under the lock);
- ``sync_file_range(2)`` to start write-back during a copy (else nothing);
- ``cachestat(2)`` (6.5+; else ``mincore(2)``), ``madvise(MADV_POPULATE_READ)`` (5.14+; else
  ``mmap(MAP_POPULATE)``), ``mmap``/``munmap``/``mincore``/``mlock`` themselves;
- file leases usable for mapping (``/proc/sys/fs/leases-enable`` and ``lease-break-time``);
- ``CAP_IPC_LOCK`` and ``RLIMIT_MEMLOCK``; the read counters of ``/proc/diskstats``.

Functions return plain values or raise ``OSError`` (``PageCacheError`` for the page-cache ones); the
modules that call them decide what a missing feature means.

``WEIGHTD_DISABLE_SYSCALLS`` (comma-separated: ``openat2``, ``renameat2``) makes this process behave as
on a kernel or file system without them, so the fallbacks run on any machine (the tests force them
this way, in-process through :data:`DISABLED`, in subprocesses through the environment).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import resource

from .errors import PageCacheError

PAGE = mmap.PAGESIZE
MADV_POPULATE_READ = 22
SYS_CACHESTAT = 451         # same number on x86_64 and arm64 (new syscalls share numbers)
CAP_IPC_LOCK = 14
_SYS_OPENAT2 = 437          # the same number on every architecture (a "new" syscall, 5.6+)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RENAME_NOREPLACE = 1
_SYNC_FILE_RANGE_WAIT_BEFORE = 1
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4



def _load_libc() -> ctypes.CDLL:
    """glibc by its soname (already mapped: no search), else the process's own symbols (musl links
    libc into every program); ``ctypes.util.find_library`` runs ldconfig, ~10 ms of every start."""
    for name in ("libc.so.6", None):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.syscall  # noqa: B018  (a libc it is)
            return lib
        except (OSError, AttributeError):
            continue
    from ctypes.util import find_library
    return ctypes.CDLL(find_library("c") or "libc.so.6", use_errno=True)


libc = _load_libc()
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value

_renameat2 = getattr(libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int
_sync_file_range = getattr(libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

_fallocate = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    _fallocate.restype = ctypes.c_int

_features: dict[str, bool] = {}   # probe name -> result, each probed once
DISABLED: frozenset[str] = frozenset(
    n.strip() for n in os.environ.get("WEIGHTD_DISABLE_SYSCALLS", "").split(",") if n.strip())


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64), ("nr_writeback", ctypes.c_uint64),
                ("nr_evicted", ctypes.c_uint64), ("nr_recently_evicted", ctypes.c_uint64)]


# -- paths beneath a directory descriptor ---------------------------------------------------------------

def openat2(dirfd: int, rel: str, flags: int, mode: int) -> int:
    """``openat2`` beneath ``dirfd``, never through a symlink or a magic link; raises OSError."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                   _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(rel)),
                      ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), rel)
    return int(fd)


def openat2_available() -> bool:
    """Probed once: does this kernel (and seccomp policy) let us call openat2?"""
    if "openat2" in DISABLED:
        return False
    if "openat2" not in _features:
        top = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.close(openat2(top, ".", os.O_RDONLY | os.O_DIRECTORY, 0))
            _features["openat2"] = True
        except OSError:  # ENOSYS, a seccomp EPERM, anything: only a call that worked counts
            _features["openat2"] = False
        finally:
            os.close(top)
    return _features["openat2"]


def renameat2_noreplace(src_fd: int, name: str, dst_fd: int, dst_name: str) -> int | None:
    """``renameat2(RENAME_NOREPLACE)``: 0, the errno it failed with, or None without renameat2 in libc."""
    if _renameat2 is None or "renameat2" in DISABLED:
        return None
    if _renameat2(src_fd, os.fsencode(name), dst_fd, os.fsencode(dst_name), _RENAME_NOREPLACE) == 0:
        return 0
    return ctypes.get_errno()


def fallocate(fd: int, size: int) -> bool:
    """``fallocate(2)`` of [0, size): False where the file system cannot (EOPNOTSUPP: NFSv3, many
    FUSE mounts), ENOSPC raised. Never glibc's ``posix_fallocate`` emulation, which writes a zero
    into every block and so races with writers of the same file."""
    if _fallocate is None:
        return False
    if _fallocate(fd, 0, 0, size) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def start_writeback(fd: int, off: int, n: int) -> None:
    """``sync_file_range(SYNC_FILE_RANGE_WRITE)`` where libc has it (a hint: errors are ignored)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, off, n, _SYNC_FILE_RANGE_WRITE)


def wait_writeback(fd: int, off: int, n: int) -> None:
    """``sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)``: the range's pages written back and clean
    (reclaimable) when it returns. Not durability (no metadata, no device cache flush: ``fsync`` is);
    a hint where libc lacks it (errors are ignored)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, off, n, _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER)


# -- page cache -----------------------------------------------------------------------------------------

def cachestat(fd: int, off: int, length: int) -> int | None:
    """Pages of [off, off+length) in the page cache (length 0: to the end), or None without cachestat."""
    rng, cs = _CachestatRange(off, length), _Cachestat()
    rc = libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(rng), ctypes.byref(cs), 0)
    if rc != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM):
            return None
        raise PageCacheError(err, os.strerror(err))
    return int(cs.nr_cache)


def has_cachestat() -> bool:
    if "cachestat" not in _features:
        fd = os.open("/proc/self/exe", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _features["cachestat"] = cachestat(fd, 0, 0) is not None
        finally:
            os.close(fd)
    return _features["cachestat"]


def map_readonly(fd: int, length: int, offset: int, flags: int = mmap.MAP_SHARED) -> int:
    """The address of a read-only mapping Python never touches (so a truncated file is never a SIGBUS)."""
    addr = libc.mmap(None, length, mmap.PROT_READ, flags, fd, offset)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise PageCacheError(err, f"mmap: {os.strerror(err)}")
    return int(addr)


def unmap(addr: int, length: int) -> None:
    libc.munmap(addr, length)


def mincore(fd: int, off: int, length: int) -> int:
    """Resident pages of [off, off+length) by mincore over a temporary read-only mapping."""
    start = off - off % PAGE
    span = off + length - start
    addr = map_readonly(fd, span, start)
    try:
        pages = (span + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(addr, span, vec) != 0:
            err = ctypes.get_errno()
            raise PageCacheError(err, f"mincore: {os.strerror(err)}")
        return sum(b & 1 for b in bytes(vec))
    finally:
        libc.munmap(addr, span)


def populate_read_supported(fd: int) -> bool:
    """Probed once (on a page of ``fd``): does ``madvise`` know ``MADV_POPULATE_READ``?"""
    if "populate_read" not in _features:
        addr = map_readonly(fd, PAGE, 0)
        try:
            ok = libc.madvise(addr, PAGE, MADV_POPULATE_READ) == 0 or ctypes.get_errno() != errno.EINVAL
        finally:
            libc.munmap(addr, PAGE)
        _features["populate_read"] = ok
    return _features["populate_read"]


def populate(fd: int, off: int, length: int) -> None:
    """Fault [off, off+length) into the page cache without touching mapped memory from Python."""
    if populate_read_supported(fd):
        addr = map_readonly(fd, length, off)
        try:
            if libc.madvise(addr, length, MADV_POPULATE_READ) != 0:
                err = ctypes.get_errno()
                if err == errno.EFAULT:  # the file is shorter than the mapping: truncated under us
                    raise PageCacheError(err, "file truncated while being warmed")
                raise PageCacheError(err, f"madvise: {os.strerror(err)}")
        finally:
            libc.munmap(addr, length)
    else:
        addr = map_readonly(fd, length, off, mmap.MAP_SHARED | mmap.MAP_POPULATE)
        libc.munmap(addr, length)


def mlock(addr: int, length: int) -> int:
    """0, or the errno ``mlock`` failed with."""
    return 0 if libc.mlock(addr, length) == 0 else ctypes.get_errno()


def memlock_limit() -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes (None = unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def has_cap_ipc_lock() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


# -- leases, devices ------------------------------------------------------------------------------------

def leases_usable(min_break_s: int) -> bool:
    """Probed once: leases enabled and a lease break leaves at least ``min_break_s`` to finish."""
    if "leases" not in _features:
        try:
            with open("/proc/sys/fs/leases-enable") as fh:
                enabled = fh.read().strip() == "1"
            with open("/proc/sys/fs/lease-break-time") as fh:
                _features["leases"] = enabled and int(fh.read().strip()) >= min_break_s
        except (OSError, ValueError):
            _features["leases"] = False
    return _features["leases"]


def block_device(path: str) -> tuple[int, int] | None:
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    return None if major == 0 else (major, minor)  # tmpfs, overlay, NFS: no block device


def read_diskstats(path: str = "/proc/diskstats") -> dict[tuple[int, int], tuple[int, int, int]]:
    """(major, minor) -> (reads completed, milliseconds spent reading, sectors read)."""
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                f = line.split()
                if len(f) >= 7:
                    out[(int(f[0]), int(f[1]))] = (int(f[3]), int(f[6]), int(f[5]))
    except OSError:
        pass
    return out


TMPFS_MAGIC = 0x01021994


def is_tmpfs(fd: int) -> bool:
    """Whether ``fd`` is on tmpfs (``fstatfs``'s f_type, the first field of struct statfs on Linux).
    There, preallocating a file zero-fills its pages only for the copy to write them again."""
    buf = ctypes.create_string_buffer(256)
    try:
        if libc.fstatfs(fd, buf) != 0:
            return False
    except AttributeError:
        return False
    return int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], "little", signed=True) == TMPFS_MAGIC


def syncfs(fd: int) -> None:
    """Flush every dirty page of ``fd``'s file system (``syncfs``): the durability of thousands of
    small files at once; raises OSError."""
    try:
        fn = libc.syncfs
    except AttributeError:
        os.sync()
        return
    if fn(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
