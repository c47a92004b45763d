"""Requests → calls of the handlers (``fs.ops.RewindOperations``), replies → bytes.

The handlers keep pyfuse3's calling convention and types: ``EntryAttributes``,
``FileInfo``, ``StatvfsData`` and ``FUSEError`` are pyfuse3's own; the request context
(``Ctx``: uid, gid, pid, umask) and the setattr field set (``Fields``) are look-alikes
with the same attribute names (pyfuse3's cannot be built from Python), and so are the
attributes to set (``NewAttrs``) and the attributes handlers answer (``fs.attrs.StatAttr``,
packed straight from the stat).  A handler is an ``async def`` that never awaits; the
dispatcher calls its plain-function twin (``fs.ops._handler``'s ``sync``), or drives a
handler without one with a single ``send`` (``_run``): no trio scheduling, no coroutine
per request.

Every request gets exactly one reply, except FORGET, BATCH_FORGET and INTERRUPT
(none, by protocol).  An opcode without an entry in the table gets ``ENOSYS`` — the
kernel then stops sending most of them — never silence.  INTERRUPT needs no action:
requests are answered in order, so the one it names was answered before it was read.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time

import pyfuse3
from pyfuse3 import FUSEError

from rewindfs.overlay.fs.attrs import StatAttr
from rewindfs.overlay.fs.kernel import wire
from rewindfs.overlay.fs.kernel.backing import BackingFiles
from rewindfs.overlay.fs.kernel.uring import (OP_IN_AT, OP_IN_SIZE, PAYLOAD as _RING_PAYLOAD,
                                              PAYLOAD_SZ_AT)

log = logging.getLogger(__name__)

__all__ = ["Ctx", "DirBuffer", "Dispatcher", "Fields", "RingDispatcher", "pack_entry"]

_XATTR_CREATE, _XATTR_REPLACE = 1, 2
_NS = 1_000_000_000


class Ctx:
    """What pyfuse3's ``RequestContext`` tells a handler, and ``kill_suidgid`` (an open
    or create with ``O_TRUNC`` by a caller without ``CAP_FSETID``, HANDLE_KILLPRIV_V2)."""

    __slots__ = ("uid", "gid", "pid", "umask", "kill_suidgid")

    def __init__(self, uid, gid, pid, umask=0):
        self.uid, self.gid, self.pid, self.umask = uid, gid, pid, umask
        self.kill_suidgid = False


class Fields:
    """What pyfuse3's ``SetattrFields`` tells ``setattr``, and ``kill_suidgid`` (a
    truncate by a caller without ``CAP_FSETID``, HANDLE_KILLPRIV_V2)."""

    __slots__ = ("update_atime", "update_mtime", "update_ctime", "update_mode",
                 "update_uid", "update_gid", "update_size", "kill_suidgid")

    def __init__(self, valid: int):
        self.update_atime = bool(valid & (wire.FATTR_ATIME | wire.FATTR_ATIME_NOW))
        self.update_mtime = bool(valid & (wire.FATTR_MTIME | wire.FATTR_MTIME_NOW))
        self.update_ctime = bool(valid & wire.FATTR_CTIME)
        self.update_mode = bool(valid & wire.FATTR_MODE)
        self.update_uid = bool(valid & wire.FATTR_UID)
        self.update_gid = bool(valid & wire.FATTR_GID)
        self.update_size = bool(valid & wire.FATTR_SIZE)
        self.kill_suidgid = bool(valid & wire.FATTR_KILL_SUIDGID)


class NewAttrs:
    """What pyfuse3's ``EntryAttributes`` tells ``setattr`` (the values to set), as a
    plain object: cheaper to build than pyfuse3's field by field."""

    __slots__ = ("st_size", "st_mode", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns",
                 "st_ctime_ns")

    def __init__(self, size, mode, uid, gid, atime_ns, mtime_ns, ctime_ns):
        self.st_size, self.st_mode, self.st_uid, self.st_gid = size, mode, uid, gid
        self.st_atime_ns, self.st_mtime_ns, self.st_ctime_ns = atime_ns, mtime_ns, ctime_ns


def _run(coro):
    """The result of a handler coroutine that does not await."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a FUSE handler awaited; handlers must run to completion")


_HANDLERS = ("access", "copy_file_range", "create", "fallocate", "flush", "forget", "fsync",
             "fsyncdir", "getattr", "getxattr", "link", "listxattr", "lookup", "mkdir",
             "mknod", "open", "opendir", "read", "readdir", "readlink", "release",
             "releasedir", "removexattr", "rename", "rmdir", "setattr", "setxattr",
             "statfs", "symlink", "unlink", "write")


def _direct(ops, name: str):
    """A plain callable for handler *name* of *ops*: the handler's ``sync`` twin when
    it has one (``fs.ops._handler``), else its coroutine driven by ``_run``."""
    meth = getattr(ops, name, None)
    if meth is None:
        def missing(*args):
            raise AttributeError(f"no handler {name!r}")   # → EIO, as before
        return missing
    sync = getattr(getattr(meth, "__func__", None), "sync", None)
    if sync is not None:
        return sync.__get__(ops)
    return lambda *args: _run(meth(*args))


def _attr_fields(e):
    a_s, a_n = divmod(e.st_atime_ns, _NS)
    m_s, m_n = divmod(e.st_mtime_ns, _NS)
    c_s, c_n = divmod(e.st_ctime_ns, _NS)
    return (e.st_ino, e.st_size, e.st_blocks, a_s, m_s, c_s, a_n, m_n, c_n, e.st_mode,
            e.st_nlink, e.st_uid, e.st_gid, e.st_rdev & 0xFFFFFFFF, e.st_blksize, 0)


def _split_timeout(t: float):
    sec = int(t)
    return sec, int((t - sec) * _NS)


_TIMEOUTS: dict[float, tuple[int, int]] = {}


def _stat_fields(ino: int, st):
    """``fuse_attr`` of an ``os.stat_result`` (``st[7:10]``: whole seconds, floored)."""
    a_s, m_s, c_s = st[7], st[8], st[9]
    return (ino, st.st_size, st.st_blocks, a_s, m_s, c_s, st.st_atime_ns - a_s * _NS,
            st.st_mtime_ns - m_s * _NS, st.st_ctime_ns - c_s * _NS, st.st_mode,
            st.st_nlink, st.st_uid, st.st_gid, st.st_rdev & 0xFFFFFFFF, st.st_blksize, 0)


def _timeout(t: float) -> tuple[int, int]:
    split = _TIMEOUTS.get(t)
    if split is None:
        split = _TIMEOUTS[t] = _split_timeout(t)
    return split


def pack_entry(e) -> bytes:
    """``fuse_entry_out`` of an ``EntryAttributes`` or ``StatAttr`` (``st_ino`` 0: a
    cached miss)."""
    if type(e) is StatAttr:     # node id ours, the number stat shows the real one
        ts, tn = _timeout(e.entry_timeout)
        return wire.ENTRY_OUT.pack(e.st_ino, 0, ts, ts, tn, tn, *_stat_fields(e.shown_ino, e.st))
    es, en = _split_timeout(e.entry_timeout)
    as_, an = _split_timeout(e.attr_timeout)
    return wire.ENTRY_OUT.pack(e.st_ino, e.generation, es, as_, en, an, *_attr_fields(e))


def pack_attr(e) -> bytes:
    if type(e) is StatAttr:
        ts, tn = _timeout(e.attr_timeout)
        return wire.ATTR_OUT.pack(ts, tn, 0, *_stat_fields(e.shown_ino, e.st))
    as_, an = _split_timeout(e.attr_timeout)
    return wire.ATTR_OUT.pack(as_, an, 0, *_attr_fields(e))


class DirBuffer:
    """The token ``readdir`` hands to ``readdir_reply``: fills one reply of at most
    *size* bytes with ``fuse_dirent`` (or ``fuse_direntplus``) records."""

    __slots__ = ("parts", "room", "plus", "inos")

    def __init__(self, size: int, plus: bool):
        self.parts: list[bytes] = []
        self.room = size
        self.plus = plus
        self.inos: list[int] = []

    def add(self, name: bytes, attr, next_id: int) -> bool:
        head = 128 + 24 if self.plus else 24
        reclen = (head + len(name) + 7) & ~7
        if reclen > self.room:
            return False
        self.room -= reclen
        # d_ino: the number stat shows (``find``/``ls`` may take it from here)
        shown = attr.shown_ino if type(attr) is StatAttr else attr.st_ino
        dirent = wire.DIRENT.pack(shown, next_id, len(name), (attr.st_mode >> 12) & 0o17)
        pad = b"\0" * (reclen - head - len(name))
        if self.plus:
            self.parts.append(pack_entry(attr) + dirent + name + pad)
        else:
            self.parts.append(dirent + name + pad)
            self.inos.append(attr.st_ino)
        return True


def readdir_reply(token: DirBuffer, name: bytes, attr, next_id: int) -> bool:
    """pyfuse3's ``readdir_reply`` for this session's tokens."""
    return token.add(name, attr, next_id)


class Dispatcher:
    """Decodes each request of *session* and calls ``session.ops``."""

    def __init__(self, session):
        self.session = session
        self.ops = session.ops
        self.ops.stat_attrs = True  # attributes as StatAttr: packed from the stat here
        for name in _HANDLERS:      # bound once: no coroutine, no lookup per request
            setattr(self, "do_" + name, _direct(self.ops, name))
        self.fd = session.fd
        self.flags = session.flags
        self.table = self._route_table()
        self.no_reply = {wire.FORGET, wire.BATCH_FORGET, wire.INTERRUPT}
        self.no_opendir = bool(session.offered & wire.NO_OPENDIR_SUPPORT)
        self.listings: dict[int, int] = {}     # nodeid → fh, NO_OPENDIR listings
        self.backing = BackingFiles(self.fd) if self.flags & wire.PASSTHROUGH else None
        self.counts = [0] * 64      # requests per opcode
        self.times = [0] * 64       # ns spent per opcode (REWINDFS_FUSE_TIMES=1 only)
        self.times_on = os.environ.get("REWINDFS_FUSE_TIMES") == "1"
        if self.times_on:
            self.handle = self._handle_timed
            self._replied = 0

    def _route_table(self) -> list:
        """Opcode → this dispatcher's bound method (None: ENOSYS)."""
        table = [None] * 64
        for opcode, name in _ROUTES.items():
            table[opcode] = getattr(self, name)
        return table

    def close(self) -> None:
        if self.backing is not None:
            self.backing.close()
        for fh in self.listings.values():
            self.do_releasedir(fh)
        self.listings.clear()

    # -- the per-request path -----------------------------------------------------------

    def handle(self, n: int) -> None:
        buf = self.session._buf
        length, opcode, unique, nodeid, uid, gid, pid, extlen, _ = wire.IN_HEADER.unpack_from(buf)
        if opcode < 64:
            fn = self.table[opcode]
            self.counts[opcode] += 1
        else:
            fn = None
        if fn is None:
            if opcode not in self.no_reply:
                self.error(unique, errno.ENOSYS)
            return
        body = memoryview(buf)[40:length - extlen * 8]
        try:
            fn(unique, nodeid, Ctx(uid, gid, pid), body)
        except FUSEError as exc:
            if opcode not in self.no_reply:
                self.error(unique, exc.errno)
        except Exception:
            log.exception("FUSE request %d failed", opcode)
            if opcode not in self.no_reply:
                self.error(unique, errno.EIO)

    def _handle_timed(self, n: int) -> None:
        """``handle``, adding the time each request takes (parse, handler, reply) to
        ``times`` by opcode: a profile per opcode without a profiler's overhead."""
        t0 = time.perf_counter_ns()
        self._replied = 0
        Dispatcher.handle(self, n)
        opcode = wire.IN_HEADER.unpack_from(self.session._buf)[1]
        if opcode < 64:     # up to the reply: the reply's write may run the caller first
            self.times[opcode] += (self._replied or time.perf_counter_ns()) - t0

    def reply(self, unique: int, payload=b"") -> None:
        if self.times_on:
            self._replied = time.perf_counter_ns()
        try:
            os.writev(self.fd, [wire.OUT_HEADER.pack(16 + len(payload), 0, unique), payload])
        except OSError as exc:
            if exc.errno != errno.ENOENT:   # ENOENT: interrupted, nobody waits for it
                raise

    def error(self, unique: int, err: int) -> None:
        if self.times_on:
            self._replied = time.perf_counter_ns()
        try:
            os.write(self.fd, wire.OUT_HEADER.pack(16, -err, unique))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    # -- entries and attributes -----------------------------------------------------

    def lookup(self, unique, nodeid, ctx, body):
        self.reply(unique, pack_entry(self.do_lookup(nodeid, bytes(body[:-1]), ctx)))

    def forget(self, unique, nodeid, ctx, body):
        self._forget([(nodeid, wire.U64.unpack_from(body)[0])])

    def batch_forget(self, unique, nodeid, ctx, body):
        count = wire.U32_PAIR.unpack_from(body)[0]
        self._forget([wire.FORGET_ONE.unpack_from(body, 8 + 16 * i) for i in range(count)])

    def _forget(self, items) -> None:
        if self.backing is not None and self.backing.idle:
            for nodeid, _ in items:
                self.backing.forget(nodeid)
        self.do_forget(items)

    def getattr(self, unique, nodeid, ctx, body):
        self.reply(unique, pack_attr(self.do_getattr(nodeid, ctx)))

    def setattr(self, unique, nodeid, ctx, body):
        (valid, _, fh, size, _, atime, mtime, ctime, atimens, mtimens, ctimens, mode, _,
         uid, gid, _) = wire.SETATTR_IN.unpack_from(body)
        now = time.time_ns() if valid & (wire.FATTR_ATIME_NOW | wire.FATTR_MTIME_NOW) else 0
        attr = NewAttrs(size, mode, uid, gid,
                        now if valid & wire.FATTR_ATIME_NOW else atime * _NS + atimens,
                        now if valid & wire.FATTR_MTIME_NOW else mtime * _NS + mtimens,
                        ctime * _NS + ctimens)
        fields = Fields(valid)
        e = self.do_setattr(nodeid, attr, fields, fh if valid & wire.FATTR_FH else None,
                                  ctx)
        self.reply(unique, pack_attr(e))

    def readlink(self, unique, nodeid, ctx, body):
        self.reply(unique, self.do_readlink(nodeid, ctx))

    def statfs(self, unique, nodeid, ctx, body):
        s = self.do_statfs(ctx)
        self.reply(unique, wire.STATFS_OUT.pack(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files,
                                                s.f_ffree, s.f_bsize, s.f_namemax,
                                                s.f_frsize, 0))

    def access(self, unique, nodeid, ctx, body):
        mask = wire.U32_PAIR.unpack_from(body)[0]
        if not self.do_access(nodeid, mask, ctx):
            raise FUSEError(errno.EACCES)
        self.reply(unique)

    # -- making and removing names -----------------------------------------------------

    def mknod(self, unique, nodeid, ctx, body):
        mode, rdev, umask, _ = wire.MKNOD_IN.unpack_from(body)
        ctx.umask = umask
        name = bytes(body[16:-1])
        self.reply(unique, pack_entry(self.do_mknod(nodeid, name, mode, rdev, ctx)))

    def mkdir(self, unique, nodeid, ctx, body):
        mode, umask = wire.U32_PAIR.unpack_from(body)
        ctx.umask = umask
        name = bytes(body[8:-1])
        self.reply(unique, pack_entry(self.do_mkdir(nodeid, name, mode, ctx)))

    def symlink(self, unique, nodeid, ctx, body):
        name, target, _ = bytes(body).split(b"\0", 2)
        self.reply(unique, pack_entry(self.do_symlink(nodeid, name, target, ctx)))

    def link(self, unique, nodeid, ctx, body):
        old = wire.U64.unpack_from(body)[0]
        name = bytes(body[8:-1])
        self.reply(unique, pack_entry(self.do_link(old, nodeid, name, ctx)))

    def unlink(self, unique, nodeid, ctx, body):
        self.do_unlink(nodeid, bytes(body[:-1]), ctx)
        self.reply(unique)

    def rmdir(self, unique, nodeid, ctx, body):
        self.do_rmdir(nodeid, bytes(body[:-1]), ctx)
        self.reply(unique)

    def rename(self, unique, nodeid, ctx, body):
        newdir = wire.U64.unpack_from(body)[0]
        old, new, _ = bytes(body[8:]).split(b"\0", 2)
        self.do_rename(nodeid, old, newdir, new, 0, ctx)
        self.reply(unique)

    def rename2(self, unique, nodeid, ctx, body):
        newdir, flags, _ = wire.RENAME2_IN.unpack_from(body)
        old, new, _ = bytes(body[16:]).split(b"\0", 2)
        self.do_rename(nodeid, old, newdir, new, flags, ctx)
        self.reply(unique)

    # -- files ----------------------------------------------------------------------

    def _open_out(self, fi, nodeid: int, flags: int) -> bytes:
        """``fuse_open_out``.  Under passthrough an open of a regular file is passed
        through (docs/concurrency.md): the kernel reads and writes the real file, and
        wants all opens of an inode on the same backing id while one is (else EIO).  A
        writer's file is captured at open and again into every new epoch while it stays
        open (``ops.passthrough_writer``), since its writes never reach us.  Direct I/O
        through the daemon instead, while the inode has no backing id: a writer of a
        set-id file (a passed-through write runs with the daemon's ``CAP_FSETID`` and
        would keep the bits), an open when no backing file can be had (fds exhausted),
        and every open of an inode a direct-I/O handle holds."""
        oflags = ((wire.FOPEN_KEEP_CACHE if fi.keep_cache else 0)
                  | (wire.FOPEN_DIRECT_IO if fi.direct_io else 0)
                  | (wire.FOPEN_NONSEEKABLE if fi.nonseekable else 0))
        backing_id = 0
        if self.backing is not None:
            writing = bool(flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC)
            backing_id = self._pass_through(nodeid, fi.fh, writing)
            if backing_id:
                oflags = (oflags & ~(wire.FOPEN_KEEP_CACHE | wire.FOPEN_DIRECT_IO)
                          | wire.FOPEN_PASSTHROUGH)
            else:
                oflags = (oflags & ~wire.FOPEN_KEEP_CACHE) | wire.FOPEN_DIRECT_IO
        return wire.OPEN_OUT.pack(fi.fh, oflags, backing_id)

    def _pass_through(self, nodeid: int, fh: int, writing: bool) -> int:
        """The backing id for *fh*, or 0 for direct I/O (see ``_open_out``).  If the
        inode has a backing id that cannot serve *fh* (read-only, and *fh* writes), the
        open fails (``EBUSY``) and the handle is released — the kernel would fail it."""
        try:
            if self.backing.live(nodeid):
                found = self.backing.acquire(nodeid, fh, writing)
                if found is None:
                    raise FUSEError(errno.EBUSY)
            elif (self.backing.held_direct(nodeid) or writing and self.ops.setid_file(fh)
                  or (found := self.backing.acquire(nodeid, fh, writing)) is None):
                self.backing.add_direct(nodeid, fh)
                return 0
            if writing:
                self.ops.passthrough_writer(fh)
            return found
        except BaseException:
            self.backing.release(fh)
            self.do_release(fh)
            raise

    def open(self, unique, nodeid, ctx, body):
        flags, open_flags = wire.U32_PAIR.unpack_from(body)
        ctx.kill_suidgid = bool(open_flags & wire.OPEN_KILL_SUIDGID)
        fi = self.do_open(nodeid, flags, ctx)
        self.reply(unique, self._open_out(fi, nodeid, flags))

    def create(self, unique, nodeid, ctx, body):
        flags, mode, umask, open_flags = wire.CREATE_IN.unpack_from(body)
        ctx.umask = umask
        ctx.kill_suidgid = bool(open_flags & wire.OPEN_KILL_SUIDGID)
        name = bytes(body[16:-1])
        fi, e = self.do_create(nodeid, name, mode, flags, ctx)
        self.reply(unique, pack_entry(e) + self._open_out(fi, e.st_ino, flags))

    def read(self, unique, nodeid, ctx, body):
        fh, off, size, *_ = wire.RW_IN.unpack_from(body)
        self.reply(unique, self.do_read(fh, off, size))

    def write(self, unique, nodeid, ctx, body):
        fh, off, size, wflags, *_ = wire.RW_IN.unpack_from(body)
        if wflags & wire.WRITE_KILL_SUIDGID:
            n = self.do_write(fh, off, body[40:40 + size], True)
        else:
            n = self.do_write(fh, off, body[40:40 + size])
        self.reply(unique, wire.U32_PAIR.pack(n, 0))

    def flush(self, unique, nodeid, ctx, body):
        self.do_flush(wire.U64.unpack_from(body)[0])
        self.reply(unique)

    def release(self, unique, nodeid, ctx, body):
        fh = wire.RELEASE_IN.unpack_from(body)[0]
        if self.backing is not None:
            self.backing.release(fh)
        self.do_release(fh)
        self.reply(unique)

    def fsync(self, unique, nodeid, ctx, body):
        fh, flags, _ = wire.FSYNC_IN.unpack_from(body)
        self.do_fsync(fh, bool(flags & wire.FSYNC_FDATASYNC))
        self.reply(unique)

    def fallocate(self, unique, nodeid, ctx, body):
        fh, off, length, mode, _ = wire.FALLOCATE_IN.unpack_from(body)
        self.do_fallocate(fh, mode, off, length)
        self.reply(unique)

    def copy_file_range(self, unique, nodeid, ctx, body):
        self._copy_range(unique, body, wire.U32_PAIR, 0xFFFFFFFF)

    def copy_file_range_64(self, unique, nodeid, ctx, body):
        self._copy_range(unique, body, wire.U64, None)

    def _copy_range(self, unique, body, out, limit):
        fh_in, off_in, _, fh_out, off_out, length, flags = wire.COPY_RANGE_IN.unpack_from(body)
        if limit is not None:
            length = min(length, limit)
        n = self.do_copy_file_range(fh_in, off_in, fh_out, off_out, length, flags)
        self.reply(unique, out.pack(n, 0) if out is wire.U32_PAIR else out.pack(n))

    # -- directories --------------------------------------------------------------------

    # With NO_OPENDIR the kernel opens directories without asking (and may cache their
    # listings) once OPENDIR answered ENOSYS; READDIR and FSYNCDIR then come with fh 0
    # and the directory's inode.  The handlers want a handle: the dispatcher opens one
    # per directory being listed (``_listing``), kept while the listing goes on — a
    # READDIR at offset 0 starts a fresh one — and released when a reply comes back
    # empty, or when more than ``_LISTINGS`` directories are being listed at once.

    _LISTINGS = 32

    def opendir(self, unique, nodeid, ctx, body):
        if self.no_opendir:
            raise FUSEError(errno.ENOSYS)
        fh = self.do_opendir(nodeid, ctx)
        self.reply(unique, wire.OPEN_OUT.pack(fh, 0, 0))

    def readdir(self, unique, nodeid, ctx, body):
        self._readdir(unique, nodeid, ctx, body, False)

    def readdirplus(self, unique, nodeid, ctx, body):
        self._readdir(unique, nodeid, ctx, body, True)

    def _readdir(self, unique, nodeid, ctx, body, plus):
        fh, off, size, *_ = wire.RW_IN.unpack_from(body)
        token = DirBuffer(size, plus)
        own = fh == 0 and self.no_opendir
        if own:
            fh = self._listing(nodeid, off, ctx)
        self.do_readdir(fh, off, token)
        if token.inos:   # plain READDIR entries are no lookups: give the counts back
            self.do_forget([(ino, 1) for ino in token.inos])
        if own and not token.parts:
            self._end_listing(nodeid)
        self.reply(unique, b"".join(token.parts))

    def _listing(self, nodeid: int, off: int, ctx) -> int:
        fh = self.listings.pop(nodeid, None)
        if fh is not None and off == 0:
            self.do_releasedir(fh)
            fh = None
        if fh is None:
            fh = self.do_opendir(nodeid, ctx)
            while len(self.listings) >= self._LISTINGS:
                oldest = next(iter(self.listings))
                self.do_releasedir(self.listings.pop(oldest))
        self.listings[nodeid] = fh     # the most recent last
        return fh

    def _end_listing(self, nodeid: int) -> None:
        fh = self.listings.pop(nodeid, None)
        if fh is not None:
            self.do_releasedir(fh)

    def releasedir(self, unique, nodeid, ctx, body):
        fh = wire.RELEASE_IN.unpack_from(body)[0]
        if fh or not self.no_opendir:
            self.do_releasedir(fh)
        self.reply(unique)

    def fsyncdir(self, unique, nodeid, ctx, body):
        fh, flags, _ = wire.FSYNC_IN.unpack_from(body)
        own = fh == 0 and self.no_opendir
        if own:
            fh = self.do_opendir(nodeid, ctx)
        try:
            self.do_fsyncdir(fh, bool(flags & wire.FSYNC_FDATASYNC))
        finally:
            if own:
                self.do_releasedir(fh)
        self.reply(unique)

    # -- xattrs -------------------------------------------------------------------------

    def _sized(self, unique, size: int, data: bytes) -> None:
        """A getxattr/listxattr answer: the length if *size* is 0, else the data."""
        if size == 0:
            self.reply(unique, wire.U32_PAIR.pack(len(data), 0))
        elif len(data) > size:
            raise FUSEError(errno.ERANGE)
        else:
            self.reply(unique, data)

    def getxattr(self, unique, nodeid, ctx, body):
        size = wire.U32_PAIR.unpack_from(body)[0]
        self._sized(unique, size, self.do_getxattr(nodeid, bytes(body[8:-1]), ctx))

    def listxattr(self, unique, nodeid, ctx, body):
        size = wire.U32_PAIR.unpack_from(body)[0]
        names = self.do_listxattr(nodeid, ctx)
        self._sized(unique, size, b"".join(n + b"\0" for n in names))

    def setxattr(self, unique, nodeid, ctx, body):
        size, flags = wire.U32_PAIR.unpack_from(body)
        rest = bytes(body[8:])
        name, _, value = rest.partition(b"\0")
        value = value[:size]
        if flags & (_XATTR_CREATE | _XATTR_REPLACE):   # as pyfuse3 does it
            try:
                self.do_getxattr(nodeid, name, ctx)
                exists = True
            except FUSEError as exc:
                if exc.errno != pyfuse3.ENOATTR:
                    raise
                exists = False
            if flags & _XATTR_CREATE and exists:
                raise FUSEError(errno.EEXIST)
            if flags & _XATTR_REPLACE and not exists:
                raise FUSEError(pyfuse3.ENOATTR)
        self.do_setxattr(nodeid, name, value, ctx)
        self.reply(unique)

    def removexattr(self, unique, nodeid, ctx, body):
        self.do_removexattr(nodeid, bytes(body[:-1]), ctx)
        self.reply(unique)

    # -- the rest -------------------------------------------------------------------------

    def interrupt(self, unique, nodeid, ctx, body):
        """Nothing to do: the request it names was answered before this was read."""

    def destroy(self, unique, nodeid, ctx, body):
        self.reply(unique)

    def ioctl(self, unique, nodeid, ctx, body):
        """No ioctls: ``ENOTTY`` at once.  The kernel asks again on every ioctl (also
        after ``ENOSYS``), e.g. Python's ``isatty`` on every buffered ``open()``; only
        the cost of the answer is ours to cut."""
        self.error(unique, errno.ENOTTY)


_ROUTES = {
    wire.LOOKUP: "lookup", wire.FORGET: "forget", wire.BATCH_FORGET: "batch_forget",
    wire.GETATTR: "getattr", wire.SETATTR: "setattr", wire.READLINK: "readlink",
    wire.STATFS: "statfs", wire.ACCESS: "access", wire.MKNOD: "mknod", wire.MKDIR: "mkdir",
    wire.SYMLINK: "symlink", wire.LINK: "link", wire.UNLINK: "unlink", wire.RMDIR: "rmdir",
    wire.RENAME: "rename", wire.RENAME2: "rename2", wire.OPEN: "open", wire.CREATE: "create",
    wire.READ: "read", wire.WRITE: "write", wire.FLUSH: "flush", wire.RELEASE: "release",
    wire.FSYNC: "fsync", wire.OPENDIR: "opendir", wire.READDIR: "readdir",
    wire.READDIRPLUS: "readdirplus", wire.RELEASEDIR: "releasedir",
    wire.FSYNCDIR: "fsyncdir", wire.GETXATTR: "getxattr", wire.LISTXATTR: "listxattr",
    wire.SETXATTR: "setxattr", wire.REMOVEXATTR: "removexattr",
    wire.FALLOCATE: "fallocate", wire.COPY_FILE_RANGE: "copy_file_range",
    wire.COPY_FILE_RANGE_64: "copy_file_range_64",
    wire.INTERRUPT: "interrupt", wire.DESTROY: "destroy", wire.IOCTL: "ioctl",
}


_PAYLOAD_SZ = struct.Struct("<I")


class RingDispatcher(Dispatcher):
    """One io_uring queue's view of *base* (``uring``): the same handlers and state
    (open listings, backing ids, request counts — shared, so used only under the
    session's ``serial`` lock), but a request comes from a ring entry and its reply goes
    back into that entry, committed by the queue's thread after ``serve`` returns."""

    def __init__(self, base: Dispatcher):
        self.__dict__.update(base.__dict__)
        self.__dict__.pop("handle", None)          # the timed variant reads _buf
        self.times_on = False
        self.table = self._route_table()     # bound to this view: its reply and error
        self.mem = None
        self.unique = 0
        self.answered = False

    def serve(self, ent) -> int:
        """Run the request in ring entry *ent* and leave its reply there; returns the
        request's unique (the commit id)."""
        mem = ent.mem
        self.mem, self.room = mem, ent.room
        length, opcode, unique, nodeid, uid, gid, pid, extlen, _ = wire.IN_HEADER.unpack_from(mem)
        self.unique, self.answered = unique, False
        psz = _PAYLOAD_SZ.unpack_from(mem, PAYLOAD_SZ_AT)[0]
        fixed = length - 40 - psz
        fn = self.table[opcode] if opcode < 64 else None
        if opcode < 64:
            self.counts[opcode] += 1
        if fn is None or not 0 <= fixed <= OP_IN_SIZE:
            self.error(unique, errno.ENOSYS if fn is None else errno.EIO)
            return unique
        start = _RING_PAYLOAD - fixed
        if fixed:
            mem[start:_RING_PAYLOAD] = mem[OP_IN_AT:OP_IN_AT + fixed]
        body = ent.view[start:_RING_PAYLOAD + psz - extlen * 8]
        try:
            fn(unique, nodeid, Ctx(uid, gid, pid), body)
        except FUSEError as exc:
            self.error(unique, exc.errno)
        except Exception:
            log.exception("FUSE request %d failed", opcode)
            self.error(unique, errno.EIO)
        finally:
            del body
        if not self.answered:
            self.error(unique, errno.EIO)
        return unique

    def reply(self, unique: int, payload=b"") -> None:
        mem = self.mem
        n = len(payload)
        if n > self.room:
            raise FUSEError(errno.EIO)
        mem[_RING_PAYLOAD:_RING_PAYLOAD + n] = payload
        wire.OUT_HEADER.pack_into(mem, 0, 16 + n, 0, unique)
        _PAYLOAD_SZ.pack_into(mem, PAYLOAD_SZ_AT, n)
        self.answered = True

    def error(self, unique: int, err: int) -> None:
        wire.OUT_HEADER.pack_into(self.mem, 0, 16, -err, unique)
        _PAYLOAD_SZ.pack_into(self.mem, PAYLOAD_SZ_AT, 0)
        self.answered = True
