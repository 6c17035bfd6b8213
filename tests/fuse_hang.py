"""A real hung file server for tests: a FUSE passthrough of SOURCE at MOUNTPOINT whose reads of
files whose path contains HANG never return (until the file system is unmounted), as a read from a
hung NFS server does. Everything else (metadata, other files) answers normally.

    python tests/fuse_hang.py SOURCE MOUNTPOINT HANG [RATE]

RATE (bytes per second, for all readers together): every other read is slowed to it, as a busy file
server is.

Needs fusepy and libfuse2 (scripts/install-tools.sh installs them) and the right to mount (root).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-untyped]


class HangingPassthrough(Operations):
    def __init__(self, source: str, hang: str, rate: float = 0.0) -> None:
        self.source, self.hang, self.rate = source, hang, rate
        self.link = threading.Lock()  # one "link" the reads share
        self.forever = threading.Event()   # never set: a read of a hung file waits on it

    def _p(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._p(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        return {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime",
                                            "st_mtime", "st_ctime")}

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._p(path))]

    def readlink(self, path):
        return os.readlink(self._p(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise FuseOSError(errno.EROFS)
        return os.open(self._p(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        if self.hang in path:
            self.forever.wait()
        data = os.pread(fh, size, offset)
        if self.rate > 0:
            with self.link:
                time.sleep(len(data) / self.rate)
        return data

    def release(self, path, fh):
        os.close(fh)

    def statfs(self, path):
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                            "f_files", "f_flag", "f_frsize", "f_namemax")}


if __name__ == "__main__":
    src, mnt, hang = sys.argv[1:4]
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    FUSE(HangingPassthrough(src, hang, rate), mnt, foreground=True, ro=True, allow_other=True, nothreads=False,
         direct_io=True)
