"""Landing primitives of the restore engine: put one path into its target state.

Everything here works on a directory fd and a single name inside it (from
``tree.walk.open_parent``), never on a path string, so nothing is followed out of the
workspace.  Contracts:

- A file, symlink or special file (fifo, socket, device) lands **atomically**: it is built under a unique temp name in
  the same directory (content, xattrs, owner, mode, mtime, then ``fsync``) and only then
  ``rename``d over the name.  A crash leaves either the old or the new version plus, at
  worst, a stale temp file named ``.rewindfs~<epoch>~<hex>`` (``sweep_temps`` removes
  those; the recovery does).
- A directory in the way of a file is removed with ``rmdir`` only: a directory holding
  anything is never emptied here (DESIGN invariant 3) — ``NotEmpty`` names it.
- Owner changes are attempted; ``EPERM`` is ignored (owner "where permitted").
- ``fault_step()`` is called after every change that reaches the disk.  It implements
  the test hook ``REWINDFS_FAULT_AFTER=k``: the process SIGKILLs itself right after the
  k-th change (k ≥ 1) — used by the crash tests, inert when the variable is unset.
  A second test hook, ``REWINDFS_PAUSE_AFTER=k`` with ``REWINDFS_PAUSE_FILE=path``,
  pauses the landing once per process right after its k-th change: it creates
  ``path`` and waits (at most 120 s) until the test removes it — the race tests use it
  to act through the mount in the middle of a rewind (tests/mount/test_rel_rewind_race.py).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import signal
import stat
import time

from rewindfs.store._preimage import SPECIALS

from rewindfs.overlay.errors import KindChanged, NotEmpty
from rewindfs.overlay.tree.meta import (MANAGED_XATTR, OPEN_META, TMP_PREFIX, kind_of, lstat_at,
                                        proc_path, remember_hint, same_node)

log = logging.getLogger(__name__)


# -- fault injection (tests only) --------------------------------------------------

class _Fault:
    """Counts changes; SIGKILLs the process after the k-th one (``REWINDFS_FAULT_AFTER``)
    or pauses once after the k-th one (``REWINDFS_PAUSE_AFTER``, ``REWINDFS_PAUSE_FILE``)."""

    _PAUSE_MAX_S = 120.0

    def __init__(self):
        self.left = None
        self.pause_left = None
        self.paused = False

    def arm(self) -> None:
        raw = os.environ.get("REWINDFS_FAULT_AFTER")
        self.left = int(raw) if raw else None
        raw = os.environ.get("REWINDFS_PAUSE_AFTER")
        self.pause_left = int(raw) if raw and not self.paused else None

    def step(self) -> None:
        if self.pause_left is not None:
            self.pause_left -= 1
            if self.pause_left <= 0:
                self.pause_left, self.paused = None, True
                self._pause(os.environ["REWINDFS_PAUSE_FILE"])
        if self.left is None:
            return
        self.left -= 1
        if self.left <= 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def _pause(self, path: str) -> None:
        with open(path, "x"):
            pass
        deadline = time.monotonic() + self._PAUSE_MAX_S
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)


FAULT = _Fault()
fault_step = FAULT.step


# -- applying metadata --------------------------------------------------------------

def _set_xattrs_fd(fd: int, img, *, fresh: bool = False) -> None:
    # A file we just created (O_EXCL) has no user./trusted. names to remove.
    wanted = dict(img.xattrs)
    for n in () if fresh else os.listxattr(fd):
        nb = os.fsencode(n)
        if nb.startswith(MANAGED_XATTR) and nb not in wanted:
            os.removexattr(fd, nb)
    for n, v in img.xattrs:
        os.setxattr(fd, n, v)


def _chown_fd(fd: int, img) -> None:
    try:
        os.fchown(fd, img.uid, img.gid)
    except PermissionError:
        log.debug("owner %d:%d not permitted; kept", img.uid, img.gid)


def set_meta_fd(fd: int, img, *, fresh: bool = False) -> None:
    """Owner, mode, xattrs, mtime on an open fd — in that order (chown clears set-id
    bits, and every other change would bump the mtime again).  ``fresh``: the file was
    just created by us, so it carries no managed xattrs to remove."""
    _chown_fd(fd, img)
    os.fchmod(fd, img.mode)
    _set_xattrs_fd(fd, img, fresh=fresh)
    os.utime(fd, ns=(img.mtime_ns, img.mtime_ns))


def set_meta_at(dir_fd: int, name: bytes, img, path: bytes) -> None:
    """Metadata of an existing entry, opened without following (a special file only
    ``O_PATH``: opening a device or a fifo may act on it; a symlink not at all).  ``KindChanged``
    if the entry is no longer of ``img``'s kind (or a device of another number)."""
    if img.kind in SPECIALS:
        _set_special_meta(dir_fd, name, img, path)
    elif img.kind == "symlink":     # a hard link of a symlink landed by ``land_link``
        if kind_of(lstat_at(dir_fd, name)) != "symlink":
            raise KindChanged(path=path)
        _set_symlink_meta(dir_fd, name, img)
    else:
        fd = os.open(name, OPEN_META, dir_fd=dir_fd)
        try:
            if kind_of(os.fstat(fd)) != img.kind:
                raise KindChanged(path=path)
            set_meta_fd(fd, img)
        finally:
            os.close(fd)
    fault_step()


def _set_special_meta(dir_fd: int, name: bytes, img, path: bytes) -> None:
    # An O_PATH fd pins the inode without opening it; /proc/self/fd/N names that inode
    # for the calls that take no such fd (as set_meta_fd: owner, mode, xattrs, mtime).
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if not same_node(img, os.fstat(fd)):
            raise KindChanged(path=path)
        inode = b"/proc/self/fd/%d" % fd
        try:
            os.chown(inode, img.uid, img.gid)
        except PermissionError:
            log.debug("owner %d:%d not permitted; kept", img.uid, img.gid)
        os.chmod(inode, img.mode)
        wanted = dict(img.xattrs)
        for n in os.listxattr(inode):
            nb = os.fsencode(n)
            if nb.startswith(MANAGED_XATTR) and nb not in wanted:
                os.removexattr(inode, nb)
        for n, v in img.xattrs:
            os.setxattr(inode, n, v)
        os.utime(inode, ns=(img.mtime_ns, img.mtime_ns))
    finally:
        os.close(fd)


def _set_symlink_meta(dir_fd: int, name: bytes, img) -> None:
    try:
        os.chown(name, img.uid, img.gid, dir_fd=dir_fd, follow_symlinks=False)
    except PermissionError:
        pass
    path = proc_path(dir_fd, name)
    for n, v in img.xattrs:
        try:
            os.setxattr(path, n, v, follow_symlinks=False)
        except OSError as exc:  # user.* is not allowed on symlinks by Linux
            if exc.errno not in (errno.EPERM, errno.ENOTSUP):
                raise
    os.utime(name, ns=(img.mtime_ns, img.mtime_ns), dir_fd=dir_fd, follow_symlinks=False)


# -- landing ------------------------------------------------------------------------

def temp_name(epoch_id: int) -> bytes:
    return TMP_PREFIX + b"%d~%s" % (epoch_id, secrets.token_hex(8).encode())


def _unlink_quiet(dir_fd: int, name: bytes) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _clear_dir_in_way(dir_fd: int, name: bytes, path: bytes) -> None:
    st = lstat_at(dir_fd, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise NotEmpty(path=path) from None
            raise
        fault_step()


def _rename_in(dir_fd: int, tmp: bytes, name: bytes, path: bytes) -> None:
    _clear_dir_in_way(dir_fd, name, path)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    fault_step()


def land_file(dir_fd: int, name: bytes, img, store, epoch_id: int, path: bytes) -> None:
    """Write blob ``img.blob`` with its metadata under a temp name, fsync, rename."""
    tmp = stage_file(dir_fd, img, store, epoch_id, sync=True)
    land_staged(dir_fd, tmp, name, path)


def stage_file(dir_fd: int, img, store, epoch_id: int, *, sync: bool) -> bytes:
    """Write blob ``img.blob`` with its metadata under a new temp name in ``dir_fd`` and
    return that name.  Without ``sync`` the data is not yet durable: the caller must
    make it so (one ``syncfs`` for a whole batch is far cheaper than an ``fsync`` per
    file) before ``land_staged`` renames it into place, or a crash could leave a torn
    file under the real name."""
    tmp = temp_name(epoch_id)
    # read-write: the store's kernel copy verifies the blob by reading the copy back
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        try:
            store.copy_blob_to_fd(img.blob, fd)
            set_meta_fd(fd, img, fresh=True)
            remember_hint(os.fstat(fd), img.blob)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        fault_step()
    except BaseException:
        _unlink_quiet(dir_fd, tmp)
        raise
    return tmp


def land_staged(dir_fd: int, tmp: bytes, name: bytes, path: bytes) -> None:
    """Rename a durable staged temp file over ``name`` (atomic: old or new, never torn)."""
    try:
        _rename_in(dir_fd, tmp, name, path)
    except BaseException:
        _unlink_quiet(dir_fd, tmp)
        raise


def land_staged_over(dir_fd: int, tmp: bytes, name: bytes, path: bytes) -> bool:
    """``land_staged`` for the common case, one syscall: rename first, and only if a
    directory is in the way (``EISDIR``) remove it (if empty) and rename again.  Returns
    True when a directory was removed."""
    try:
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except IsADirectoryError:
            _rename_in(dir_fd, tmp, name, path)
            return True
    except BaseException:
        _unlink_quiet(dir_fd, tmp)
        raise
    fault_step()
    return False


def land_link(dir_fd: int, name: bytes, src_dir_fd: int, src_name: bytes, epoch_id: int,
              path: bytes) -> None:
    """Make ``name`` another hard link of ``src_name`` (temp link, then rename).  A no-op
    if it already is one (rename between two links of one inode does nothing, which
    would leave the temp name behind)."""
    src = os.stat(src_name, dir_fd=src_dir_fd, follow_symlinks=False)
    cur = lstat_at(dir_fd, name)
    if cur is not None and (cur.st_dev, cur.st_ino) == (src.st_dev, src.st_ino):
        return
    tmp = temp_name(epoch_id)
    os.link(src_name, tmp, src_dir_fd=src_dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    try:
        fault_step()
        _rename_in(dir_fd, tmp, name, path)
    except BaseException:
        _unlink_quiet(dir_fd, tmp)
        raise


def land_symlink(dir_fd: int, name: bytes, img, epoch_id: int, path: bytes) -> None:
    tmp = temp_name(epoch_id)
    os.symlink(img.target, tmp, dir_fd=dir_fd)
    try:
        _set_symlink_meta(dir_fd, tmp, img)
        fault_step()
        _rename_in(dir_fd, tmp, name, path)
    except BaseException:
        _unlink_quiet(dir_fd, tmp)
        raise


_NODE_TYPE = {"fifo": stat.S_IFIFO, "socket": stat.S_IFSOCK, "chardev": stat.S_IFCHR,
              "blockdev": stat.S_IFBLK}


def land_special(dir_fd: int, name: bytes, img, epoch_id: int, path: bytes) -> None:
    """A fifo, socket or device node (``img.rdev``) made by ``mknod`` under a temp name
    (mode 0600 until its metadata is set; never opened), then renamed over ``name``."""
    tmp = temp_name(epoch_id)
    os.mknod(tmp, _NODE_TYPE[img.kind] | 0o600, img.rdev, dir_fd=dir_fd)
    try:
        set_meta_at(dir_fd, tmp, img, path)
        _rename_in(dir_fd, tmp, name, path)
    except BaseException:
        _unlink_quiet(dir_fd, tmp)
        raise


def land_dir(dir_fd: int, name: bytes, path: bytes) -> None:
    """Create directory ``name``; a non-directory in the way is unlinked first (it was
    captured by the caller).  Metadata comes later, from the plan's ``meta`` action."""
    st = lstat_at(dir_fd, name)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return
    if st is not None:
        os.unlink(name, dir_fd=dir_fd)
        fault_step()
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    fault_step()


def delete_at(dir_fd: int, name: bytes, path: bytes) -> None:
    """Remove ``name``: ``rmdir`` for a directory (only if empty), else ``unlink``."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        _clear_dir_in_way(dir_fd, name, path)
        return
    os.unlink(name, dir_fd=dir_fd)
    fault_step()


def sweep_temps(dir_fd: int) -> int:
    """Remove stale ``.rewindfs~…`` temp entries (files, symlinks, special files) in one
    directory; return how many.  Only our own temp names are touched."""
    n = 0
    for entry in os.scandir(dir_fd):
        name = os.fsencode(entry.name)
        if name.startswith(TMP_PREFIX) and not entry.is_dir(follow_symlinks=False):
            _unlink_quiet(dir_fd, name)
            n += 1
    return n
