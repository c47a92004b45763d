"""Opening ``/dev/fuse`` and putting it over a directory, and taking it off again.

As root: ``mount(2)`` with ``fd=N,rootmode=…,user_id=…,group_id=…`` plus our options.
As a user: ``fusermount3`` mounts and passes the fd back over a socket
(``_FUSE_COMMFD``), the way libfuse does it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import socket
import stat
import subprocess

__all__ = ["detach", "mount_fuse"]

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

FSNAME = b"rewindfs"
FSTYPE = b"fuse.rewindfs"


def mount_fuse(mountpoint: bytes, options: list[str]) -> int:
    """Mount a new FUSE connection over *mountpoint*; returns its ``/dev/fuse`` fd
    (blocking, close-on-exec).  *options*: kernel options such as ``allow_other``,
    ``default_permissions``.  ``OSError`` if the kernel (or fusermount3) refuses."""
    if os.geteuid() == 0:
        return _mount_as_root(mountpoint, options)
    return _mount_with_fusermount(mountpoint, options)


def _mount_as_root(mountpoint: bytes, options: list[str]) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        rootmode = stat.S_IFMT(os.stat(mountpoint).st_mode)
        data = ",".join([f"fd={fd}", f"rootmode={rootmode:o}", f"user_id={os.geteuid()}",
                         f"group_id={os.getegid()}", *options]).encode()
        if _libc.mount(FSNAME, mountpoint, FSTYPE, _MS_NOSUID | _MS_NODEV, data) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount: {os.strerror(err)}", os.fsdecode(mountpoint))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mount_with_fusermount(mountpoint: bytes, options: list[str]) -> int:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        opts = ",".join([f"fsname={FSNAME.decode()}", "subtype=rewindfs", *options])
        env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
        proc = subprocess.run(["fusermount3", "-o", opts, "--", os.fsdecode(mountpoint)],
                              env=env, pass_fds=[theirs.fileno()], capture_output=True)
        if proc.returncode != 0:
            raise OSError(0, f"fusermount3: {proc.stderr.decode(errors='replace').strip()}")
        theirs.close()
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    if not fds:
        raise OSError(0, "fusermount3 passed no fd")
    os.set_inheritable(fds[0], False)
    return fds[0]


def detach(mountpoint: bytes, fd: int) -> None:
    """Lazily unmount *mountpoint* — unless the connection *fd* already ended (someone
    unmounted it: the path may now be another mount, which is not ours to remove)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    if any(ev & select.POLLERR for _, ev in p.poll(0)):
        return
    if os.geteuid() == 0:
        if _libc.umount2(mountpoint, _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (22, 2):   # EINVAL: not a mount point any more; ENOENT
                raise OSError(err, f"umount: {os.strerror(err)}", os.fsdecode(mountpoint))
        return
    subprocess.run(["fusermount3", "-u", "-z", "--", os.fsdecode(mountpoint)],
                   capture_output=True)
