"""The few Linux calls the standard library lacks: ``renameat2``, ``utimensat`` with
``UTIME_OMIT``, ``syncfs``, ``malloc_trim``.  Each raises ``OSError`` with the kernel's errno."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

__all__ = ["RENAME_EXCHANGE", "RENAME_NOREPLACE", "RENAME_WHITEOUT", "UTIME_OMIT",
           "malloc_trim", "renameat2", "syncfs", "utimensat"]

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
RENAME_WHITEOUT = 4     # leaves a char device 0:0 (a whiteout) under the old name
UTIME_OMIT = (1 << 30) - 2
AT_SYMLINK_NOFOLLOW = 0x100

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                            ctypes.c_uint]
_libc.syncfs.argtypes = [ctypes.c_int]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc.utimensat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_Timespec),
                            ctypes.c_int]


def _check(ret: int, what: str, name=None) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)


def renameat2(old_dir: int, old: bytes, new_dir: int, new: bytes, flags: int = 0) -> None:
    """``renameat2(2)``; flags ``RENAME_NOREPLACE`` / ``RENAME_EXCHANGE`` /
    ``RENAME_WHITEOUT``."""
    if not flags:
        os.rename(old, new, src_dir_fd=old_dir, dst_dir_fd=new_dir)
        return
    _check(_libc.renameat2(old_dir, old, new_dir, new, flags), "renameat2", old)


_local = threading.local()


def _times(atime_ns: int | None, mtime_ns: int | None):
    """The two timespecs, in an array kept per thread (building one costs more than
    the call: these run once per WRITE after a writeback time push)."""
    times = getattr(_local, "times", None)
    if times is None:
        times = _local.times = (_Timespec * 2)()
    for ts, ns in ((times[0], atime_ns), (times[1], mtime_ns)):
        if ns is None:
            ts.tv_sec, ts.tv_nsec = 0, UTIME_OMIT
        else:
            ts.tv_sec, ts.tv_nsec = divmod(ns, 1_000_000_000)
    return times


def utimensat(dir_fd: int, name: bytes, atime_ns: int | None, mtime_ns: int | None) -> None:
    """Set atime/mtime of *name* (not following a symlink); ``None`` leaves one as is."""
    if atime_ns is not None and mtime_ns is not None:   # the same call, without ctypes
        os.utime(name, ns=(atime_ns, mtime_ns), dir_fd=dir_fd, follow_symlinks=False)
        return
    _check(_libc.utimensat(dir_fd, name, _times(atime_ns, mtime_ns), AT_SYMLINK_NOFOLLOW),
           "utimensat", name)


def futimens(fd: int, atime_ns: int | None, mtime_ns: int | None) -> None:
    """Set atime/mtime of the open file *fd*; ``None`` leaves one as is."""
    if atime_ns is not None and mtime_ns is not None:
        os.utime(fd, ns=(atime_ns, mtime_ns))
        return
    _check(_libc.futimens(fd, _times(atime_ns, mtime_ns)), "futimens", b"")


def malloc_trim() -> None:
    """Give the C heap's free memory back to the kernel (every malloc arena, glibc).
    A rewind or gc in a worker thread leaves tens of MB free in that thread's arena,
    which glibc would otherwise keep: the daemon's RSS crept up with each one."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def syncfs(fd: int) -> None:
    """Write back every dirty page and inode of the filesystem holding *fd*."""
    _check(_libc.syncfs(fd), "syncfs")


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """``fallocate(2)`` with its *mode* (``os.posix_fallocate`` has none)."""
    _check(_libc.fallocate(fd, mode, offset, length), "fallocate")
