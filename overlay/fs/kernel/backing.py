"""Passthrough backing files: one kernel backing id per FUSE inode while it is open.

With ``FUSE_PASSTHROUGH`` negotiated, an OPEN reply may carry ``FOPEN_PASSTHROUGH`` and
a backing id (``FUSE_DEV_IOC_BACKING_OPEN`` on the ``/dev/fuse`` fd with a real file's
fd): the kernel then reads and writes that real file itself and never sends READ/WRITE
for the handle.  The kernel wants every open of an inode that has a backing file to be
passed through with that same file, so ids are per inode and refcounted by its opens;
the last RELEASE closes the id (``FUSE_DEV_IOC_BACKING_CLOSE``).

The backing file is opened read-write when it can be (as root, whoever opens), so a
writer arriving while a reader holds the inode can share the id; where it cannot (a
running executable: ``ETXTBSY``; a read-only file system) it is read-only, and a writer
of that inode meanwhile is refused with ``EBUSY``.  Opens the session serves as direct
I/O instead (``Dispatcher._open_out``) are counted here too: while one is open, no
backing id may appear for that inode.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os

from rewindfs.overlay.fs.kernel import wire
from rewindfs.overlay.tree.fdbudget import share

log = logging.getLogger(__name__)

__all__ = ["BackingFiles"]


class BackingFiles:
    """Backing ids of the inodes open now: ``acquire`` on open, ``release`` on
    RELEASE.  ``fd``: the session's ``/dev/fuse`` fd."""

    def __init__(self, fd: int):
        self.fd = fd
        self.by_inode: dict[int, list] = {}    # nodeid → [backing id, count, fd, writable]
        self.by_fh: dict[int, int] = {}        # fh → nodeid, for RELEASE
        self.idle: dict[int, None] = {}        # nodeids whose opens all ended, oldest first
        self.direct: dict[int, int] = {}       # nodeid → its open direct-I/O handles
        self.direct_fh: dict[int, int] = {}    # direct-I/O fh → nodeid, for RELEASE
        self.failed = 0
        # backing ids kept after their inode's last release, each an fd (fdbudget)
        self.idle_limit = share(32, 256, 4)

    def live(self, nodeid: int) -> bool:
        """True while an open of *nodeid* is passed through."""
        entry = self.by_inode.get(nodeid)
        return entry is not None and entry[1] > 0

    def held_direct(self, nodeid: int) -> bool:
        return nodeid in self.direct

    def add_direct(self, nodeid: int, fh: int) -> None:
        """Open *fh* of *nodeid* is served as direct I/O (no backing id)."""
        self.direct[nodeid] = self.direct.get(nodeid, 0) + 1
        self.direct_fh[fh] = nodeid

    def acquire(self, nodeid: int, fh: int, writable: bool) -> int | None:
        """The backing id for a new open *fh* of *nodeid*, or None (the backing file
        cannot serve it)."""
        entry = self.by_inode.get(nodeid)
        self.idle.pop(nodeid, None)
        if entry is None:
            entry = self._open(nodeid, fh)
            if entry is None:
                return None
        if writable and not entry[3]:
            if entry[1] == 0:
                del self.by_inode[nodeid]
                self._close(entry)
            return None
        entry[1] += 1
        self.by_fh[fh] = nodeid
        return entry[0]

    def _open(self, nodeid: int, fh: int):
        path = f"/proc/self/fd/{fh}"
        try:
            bfd, writable = self._reopen(path, os.O_RDWR), True
        except OSError:
            try:
                bfd, writable = self._reopen(path, os.O_RDONLY), False
            except OSError:
                return None
        try:
            arg = bytearray(wire.BACKING_MAP.pack(bfd, 0, 0))
            backing_id = fcntl.ioctl(self.fd, wire.DEV_IOC_BACKING_OPEN, arg, True)
        except OSError as exc:
            os.close(bfd)
            self.failed += 1
            if self.failed <= 3:
                log.warning("passthrough refused by the kernel for inode %d: %s", nodeid, exc)
            return None
        entry = [backing_id, 0, bfd, writable]
        self.by_inode[nodeid] = entry
        return entry

    def _reopen(self, path: str, mode: int) -> int:
        """*path* opened in *mode*; out of fds, the idle backing files go first."""
        try:
            return os.open(path, mode | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self.idle:
                raise
        self.shed()
        return os.open(path, mode | os.O_CLOEXEC)

    def shed(self) -> None:
        """Close every idle backing id (their fds are wanted elsewhere)."""
        while self.idle:
            self._close(self.by_inode.pop(self.idle.popitem()[0]))

    def release(self, fh: int) -> None:
        """The open *fh* ended.  An inode's id outlives its last open for a while (the
        ``idle_limit`` most recently released), so opening the same file again costs
        no new backing file; the oldest idle one is closed when more are idle."""
        nodeid = self.by_fh.pop(fh, None)
        if nodeid is None:
            self._release_direct(fh)
            return
        entry = self.by_inode[nodeid]
        entry[1] -= 1
        if entry[1] <= 0:
            self.idle[nodeid] = None
            while len(self.idle) > self.idle_limit:
                old = next(iter(self.idle))
                del self.idle[old]
                self._close(self.by_inode.pop(old))

    def _release_direct(self, fh: int) -> None:
        nodeid = self.direct_fh.pop(fh, None)
        if nodeid is not None:
            self.direct[nodeid] -= 1
            if self.direct[nodeid] <= 0:
                del self.direct[nodeid]

    def forget(self, nodeid: int) -> None:
        """The kernel forgot *nodeid*: an idle id of it goes now (the number may be
        reused for another file)."""
        if nodeid in self.idle:
            del self.idle[nodeid]
            self._close(self.by_inode.pop(nodeid))

    def _close(self, entry) -> None:
        try:
            fcntl.ioctl(self.fd, wire.DEV_IOC_BACKING_CLOSE,
                        bytearray(wire.U32_PAIR.pack(entry[0], 0)[:4]), True)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EBADF, errno.ENODEV):
                log.warning("closing backing id %d failed: %s", entry[0], exc)
        os.close(entry[2])

    def close(self) -> None:
        """Close every id (at unmount)."""
        for entry in self.by_inode.values():
            self._close(entry)
        self.by_inode.clear()
        self.by_fh.clear()
        self.idle.clear()
        self.direct.clear()
        self.direct_fh.clear()
