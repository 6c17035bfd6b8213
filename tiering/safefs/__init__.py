"""Every file-system operation inside a tier, on directory file descriptors, never through a symlink.

A tier is a directory that other hands can reach: ``/dev/shm`` is world-writable, cold storage is
shared, and a planted symlink anywhere under a root would otherwise turn a privileged weightd into a
tool that deletes or overwrites files of the host. So nothing in a tier is reached by a joined path
string. A :class:`Dir` is an open ``O_DIRECTORY`` descriptor; everything beneath it goes through:

- ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` when the kernel has it
  (Linux 5.6+, probed once): one call that refuses any symlink and any escape, on every component;
- otherwise a walk of ``openat(dir_fd, component, O_NOFOLLOW | O_DIRECTORY)`` per component and
  ``O_NOFOLLOW`` on the last one, which refuses the same things component by component;
- ``mkdirat`` then an ``O_NOFOLLOW`` open of what was made (a symlink raced in is refused);
- ``renameat2(RENAME_NOREPLACE)`` between directory descriptors (a commit never replaces a version),
  falling back to ``renameat`` after an ``lstat`` on file systems without it (NFS);
- ``unlinkat`` and a descriptor walk for deletion that opens directories only with ``O_DIRECTORY |
  O_NOFOLLOW | O_NONBLOCK`` (``shutil.rmtree(dir_fd=)`` opens them with plain ``O_RDONLY``, which blocks
  on a FIFO raced into place); a symlink in the way is unlinked itself, never followed;
- reads of files open ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat`` must say a regular file (a FIFO or
  a device never blocks or feeds a read), then ``O_NONBLOCK`` is cleared.

A tier root itself is opened once with ``O_NOFOLLOW | O_DIRECTORY`` and checked: owned by weightd's
user and not writable by group or others (:func:`open_tier_root`), so nobody else can plant anything
inside it at all; the descriptor walk is the second wall, for what slipped past the first.

The package, by concern: :mod:`.dir` (``Dir``, ``FileRef``), :mod:`.roots` (tier roots and what
others may change), :mod:`.remove` (the descriptor-walking removal), :mod:`.paths` (names, errnos,
regular files, modes); every syscall binding is in :mod:`tiering._syscalls`.
"""

from __future__ import annotations

from .._lazy import surface

#: public name -> the module that defines it (imported when first used: opening a user's file for
#: ``weightd warm`` does not import the tier roots' checks)
_SURFACE: dict[str, str] = {
    "openat2_available": "tiering._syscalls",
    "Dir": "dir", "FileRef": "dir", "open_source": "dir",
    "MAX_SMALL_FILE": "paths", "PinnedFile": "paths", "open_regular": "paths", "regular_or_close": "paths",
    "sanitize_mode": "paths", "describe": "paths", "split_rel": "paths", "open_for_read": "paths",
    "RootPolicy": "roots", "check_ancestors": "roots", "check_root_stat": "roots", "check_unchangeable": "roots",
    "others_can_change": "roots", "resolve_unchangeable": "roots", "open_unchangeable_dir": "roots",
    "open_cold_root": "roots", "open_cold_store": "roots", "COLD_MARKER": "roots", "unmade_parent": "roots", "open_tier_root": "roots",
}

__getattr__, __dir__, __all__ = surface(__name__, _SURFACE)
