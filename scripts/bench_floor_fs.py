#!/usr/bin/env python3
"""The floor of a pyfuse3 filesystem with rewindfs's kernel-facing configuration.

Benchmark-only (scripts/bench.py targets ``floor-ours`` and ``floor-min``); never part
of a rewindfs mount.  Both modes serve SRC at MNT with exactly what the rewindfs daemon
gives the kernel — the same mount options (``overlay.fs.session.mount_options``), entry
and attribute timeouts (``overlay.fs.ops.CACHE_TIMEOUT``), ``keep_cache`` on every open,
the writeback cache (unless ``REWINDFS_WRITEBACK=0``, as for the daemon), FLUSH answered
``ENOSYS``, negative entries cached, and the same request loop (``overlay.fs.fastwait``,
one reader task) — and nothing else: no store, no capture, no control socket.

    bench_floor_fs.py ours SRC MNT   rewindfs's own RewindOperations, capture a no-op
    bench_floor_fs.py min  SRC MNT   MinimalOps below: only what the workloads need

The difference rewindfs − ours is what capture costs; ours − min is what our handlers
cost beyond the least a passthrough must do; min − bare is pyfuse3 + FUSE itself.

MinimalOps is deliberately small: paths by inode (bytes, absolute under SRC), no
lookup counting (entries are never forgotten: fine for a benchmark), hard links keep
one name.  It is not a safe filesystem (it follows symlinks in SRC's parents).
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyfuse3  # noqa: E402
import trio  # noqa: E402
from pyfuse3 import FUSEError  # noqa: E402

from rewindfs.overlay.fs import fastwait  # noqa: E402
from rewindfs.overlay.daemon import writeback_default  # noqa: E402
from rewindfs.overlay.fs.session import mount_options  # noqa: E402
from rewindfs.overlay.fs.ops import CACHE_TIMEOUT, RewindOperations  # noqa: E402


def _errno(fn):
    """OSError → FUSEError at the boundary, as rewindfs's ``_handler`` does."""
    async def wrapper(self, *args):
        try:
            return fn(self, *args)
        except OSError as exc:
            raise FUSEError(exc.errno or errno.EIO) from None
    wrapper.__name__ = fn.__name__
    return wrapper


class MinimalOps(pyfuse3.Operations):
    """The least a passthrough answering the workload suite must do."""

    supports_dot_lookup = False

    def __init__(self, src: bytes, writeback: bool):
        super().__init__()
        self.enable_writeback_cache = writeback
        self.paths = {pyfuse3.ROOT_INODE: src}   # inode → real absolute path
        self.root_ino = os.lstat(src).st_ino
        self.fh_ino: dict[int, int] = {}         # open fd → inode
        self.dirs: dict[int, tuple[int, bytes, list[bytes]]] = {}
        self.next_dir = 1

    # -- inodes and attributes --------------------------------------------------------

    def _ino(self, st) -> int:
        return pyfuse3.ROOT_INODE if st.st_ino == self.root_ino else st.st_ino

    def _attr(self, st) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._ino(st)
        e.entry_timeout = e.attr_timeout = CACHE_TIMEOUT
        for name in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size",
                     "st_blksize", "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns"):
            setattr(e, name, getattr(st, name))
        return e

    def _entry(self, path: bytes) -> pyfuse3.EntryAttributes:
        st = os.lstat(path)
        self.paths[self._ino(st)] = path
        return self._attr(st)

    def _child(self, parent: int, name: bytes) -> bytes:
        return self.paths[parent] + b"/" + name

    @_errno
    def lookup(self, parent, name, ctx):
        try:
            return self._entry(self._child(parent, name))
        except FileNotFoundError:
            neg = pyfuse3.EntryAttributes()
            neg.st_ino = 0
            neg.entry_timeout = CACHE_TIMEOUT
            return neg

    async def forget(self, inode_list):
        pass

    @_errno
    def getattr(self, inode, ctx):
        try:
            return self._attr(os.lstat(self.paths[inode]))
        except FileNotFoundError:
            fd = next((f for f, i in self.fh_ino.items() if i == inode), None)
            if fd is None:
                raise
            return self._attr(os.fstat(fd))

    @_errno
    def setattr(self, inode, attr, fields, fh, ctx):
        if fh not in self.fh_ino:
            fh = next((f for f, i in self.fh_ino.items() if i == inode), None)
        target = self.paths[inode] if fh is None else fh
        if fh is None and not os.path.lexists(target):
            if fields.update_size or fields.update_mode or fields.update_uid \
                    or fields.update_gid:
                raise FUSEError(errno.ENOENT)
            # The writeback cache pushing the times of a file unlinked since (as rewindfs):
            # ENOENT would surface as a writeback error in an innocent fsync/syncfs.
            attr.st_ino = inode
            attr.entry_timeout = attr.attr_timeout = CACHE_TIMEOUT
            return attr
        if fields.update_size:
            os.truncate(target, attr.st_size)
        if fields.update_mode:
            os.chmod(target, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            os.chown(target, attr.st_uid if fields.update_uid else -1,
                     attr.st_gid if fields.update_gid else -1)
        if fields.update_atime or fields.update_mtime:
            st = os.stat(target)
            os.utime(target, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                                 attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns))
        return self._attr(os.fstat(target) if isinstance(target, int) else os.lstat(target))

    @_errno
    def readlink(self, inode, ctx):
        return os.readlink(self.paths[inode])

    @_errno
    def statfs(self, ctx):
        sv = os.statvfs(self.paths[pyfuse3.ROOT_INODE])
        out = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):
            setattr(out, name, getattr(sv, name))
        return out

    # -- names ----------------------------------------------------------------------------

    @_errno
    def mkdir(self, parent, name, mode, ctx):
        path = self._child(parent, name)
        os.mkdir(path, stat.S_IMODE(mode))
        return self._entry(path)

    @_errno
    def symlink(self, parent, name, target, ctx):
        path = self._child(parent, name)
        os.symlink(target, path)
        return self._entry(path)

    @_errno
    def link(self, inode, new_parent, new_name, ctx):
        path = self._child(new_parent, new_name)
        os.link(self.paths[inode], path, follow_symlinks=False)
        return self._entry(path)

    @_errno
    def unlink(self, parent, name, ctx):
        os.unlink(self._child(parent, name))

    @_errno
    def rmdir(self, parent, name, ctx):
        os.rmdir(self._child(parent, name))

    @_errno
    def rename(self, parent_old, name_old, parent_new, name_new, flags, ctx):
        if flags:
            raise FUSEError(errno.EINVAL)
        old, new = self._child(parent_old, name_old), self._child(parent_new, name_new)
        os.rename(old, new)
        st = os.lstat(new)
        self.paths[self._ino(st)] = new
        if stat.S_ISDIR(st.st_mode):  # a moved directory moves its subtree (rare: scan)
            prefix = old + b"/"
            for ino, p in list(self.paths.items()):
                if p.startswith(prefix):
                    self.paths[ino] = new + p[len(old):]

    # -- files ----------------------------------------------------------------------------

    def _flags(self, flags: int) -> int:
        flags &= ~(os.O_CREAT | os.O_EXCL | os.O_NOCTTY)
        if self.enable_writeback_cache:  # the kernel reads pages and computes appends
            if flags & os.O_ACCMODE == os.O_WRONLY:
                flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
            flags &= ~os.O_APPEND
        return flags | os.O_CLOEXEC

    @_errno
    def open(self, inode, flags, ctx):
        fd = os.open(self.paths[inode], self._flags(flags))
        self.fh_ino[fd] = inode
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    @_errno
    def create(self, parent, name, mode, flags, ctx):
        path = self._child(parent, name)
        fd = os.open(path, self._flags(flags) | os.O_CREAT, stat.S_IMODE(mode))
        st = os.fstat(fd)
        self.paths[self._ino(st)] = path
        self.fh_ino[fd] = self._ino(st)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True), self._attr(st)

    @_errno
    def read(self, fh, off, size):
        return os.pread(fh, size, off)

    @_errno
    def write(self, fh, off, buf):
        return os.pwrite(fh, buf, off)

    async def flush(self, fh):
        raise FUSEError(errno.ENOSYS)  # as rewindfs: the kernel stops sending FLUSH

    @_errno
    def fsync(self, fh, datasync):
        (os.fdatasync if datasync else os.fsync)(fh)

    @_errno
    def release(self, fh):
        del self.fh_ino[fh]
        os.close(fh)

    # -- directories ----------------------------------------------------------------------

    @_errno
    def opendir(self, inode, ctx):
        path = self.paths[inode]
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fh, self.next_dir = self.next_dir, self.next_dir + 1
        self.dirs[fh] = (fd, path, [os.fsencode(n) for n in os.listdir(fd)])
        return fh

    @_errno
    def readdir(self, fh, start_id, token):
        fd, path, names = self.dirs[fh]
        for i in range(start_id, len(names)):
            try:
                st = os.stat(names[i], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not pyfuse3.readdir_reply(token, names[i], self._attr(st), i + 1):
                return
            self.paths[self._ino(st)] = path + b"/" + names[i]

    @_errno
    def releasedir(self, fh):
        os.close(self.dirs.pop(fh)[0])

    @_errno
    def fsyncdir(self, fh, datasync):
        os.fsync(self.dirs[fh][0])

    # -- xattrs (the kernel asks security.capability before every write) -----------------

    @_errno
    def getxattr(self, inode, name, ctx):
        try:
            return os.getxattr(self.paths[inode], name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                raise FUSEError(pyfuse3.ENOATTR) from None
            raise

    @_errno
    def listxattr(self, inode, ctx):
        return [os.fsencode(n) for n in os.listxattr(self.paths[inode], follow_symlinks=False)]

    @_errno
    def setxattr(self, inode, name, value, ctx):
        os.setxattr(self.paths[inode], name, value, 0, follow_symlinks=False)


class _NoStore:
    """Enough of a Store for RewindOperations.__init__ (which asks the current epoch)."""

    class _Epoch:
        id = 0

    def current_epoch(self, ws):
        return self._Epoch()


class OursNoCapture(RewindOperations):
    """rewindfs's handlers unchanged, except the write-ahead capture does nothing."""

    def _guard(self, items) -> None:
        pass


_HANDLERS = ("lookup", "forget", "getattr", "setattr", "readlink", "statfs", "mkdir",
             "symlink", "link", "unlink", "rmdir", "rename", "open", "create", "read",
             "write", "flush", "fsync", "release", "opendir", "readdir", "releasedir",
             "fsyncdir", "getxattr", "listxattr", "setxattr", "mknod", "removexattr",
             "access")


def count_requests(fs, dump_path: str) -> None:
    """Count every request reaching *fs* by handler; SIGUSR1 writes the counts (JSON)
    to *dump_path*.  For the request-count model in bench_roundtrip.py --count."""
    import collections
    import json
    import signal

    counts = collections.Counter()

    def wrap(name, fn):
        async def counted(*args):
            counts[name] += 1
            return await fn(*args)
        return counted

    for name in _HANDLERS:
        setattr(fs, name, wrap(name, getattr(fs, name)))

    def dump(signum, frame):
        tmp = dump_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(counts, f)
        os.rename(tmp, dump_path)

    signal.signal(signal.SIGUSR1, dump)


async def _serve() -> None:
    fastwait.install()
    await pyfuse3.main(min_tasks=1, max_tasks=1)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("ours", "min"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, src, mnt = argv[0], os.path.realpath(argv[1]), os.path.realpath(argv[2])
    writeback = writeback_default()
    if mode == "ours":
        root_fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fs = OursNoCapture(root_fd, _NoStore(), 0, writeback=writeback)
    else:
        fs = MinimalOps(os.fsencode(src), writeback)
    opts = {o for o in mount_options() if not o.startswith(("fsname=", "subtype="))}
    opts |= {f"fsname=floor-{mode}", f"subtype=floor-{mode}"}
    if os.environ.get("FLOOR_COUNT_FILE"):
        count_requests(fs, os.environ["FLOOR_COUNT_FILE"])
    os.umask(0)
    os.chdir("/")
    pyfuse3.init(fs, mnt, opts)
    try:
        trio.run(_serve)
    finally:
        pyfuse3.close(unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
