"""Removing a tree by descriptor walk: never following a symlink, never opening a FIFO or device."""

from __future__ import annotations

import errno
import os


def remove_at(parent_fd: int, name: str, retries: int = 3) -> bool:
    """Delete ``name`` in ``parent_fd`` (a tree, by descriptor). A directory is only ever opened with
    O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK (so a FIFO or a device raced into its place is never opened,
    and a symlink raced into its place is unlinked itself). ``shutil.rmtree(dir_fd=)`` in 3.11 opens
    each directory with plain O_RDONLY, which would block on a FIFO: hence this walk."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:  # not a directory (a file, a symlink): the entry itself goes
            os.unlink(name, dir_fd=parent_fd)
            return True
        except FileNotFoundError:
            return False
        except IsADirectoryError:  # raced back into a directory
            if retries <= 0:
                raise
            return remove_at(parent_fd, name, retries - 1)
    try:
        with os.scandir(fd) as it:  # (fd is private to this call: no shared offset)
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for child, is_dir in entries:
            if is_dir:
                remove_at(fd, child)
                continue
            try:
                os.unlink(child, dir_fd=fd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                remove_at(fd, child)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY and retries > 0:  # something was added meanwhile: once more
            return remove_at(parent_fd, name, retries - 1)
        raise
    return True
