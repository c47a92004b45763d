"""The one seam between the kernel's FUSE session and the handlers.

Two session layers serve the same handlers (``fs.ops.RewindOperations``):

- ``kernel``  our own (``fs.kernel``): reads and writes ``/dev/fuse`` itself and asks
              the kernel for what libfuse 3.14 cannot (docs/benchmarks.md);
- ``libfuse`` pyfuse3's (``fs.libfuse``), which runs wherever pyfuse3 builds.

``choose(name)`` picks one (``None``: ``REWINDFS_SESSION``, else ``default()``).  The
daemon uses ``mount``/``serve``/``unmount``; the handlers use ``readdir_reply``; the
notifier uses ``invalidate_inode``/``invalidate_entry``.  One session per process.
"""

from __future__ import annotations

import os

from rewindfs.overlay.fs.kernel.dispatch import readdir_reply as _kernel_readdir_reply
from rewindfs.overlay.fs.kernel.session import KernelSession
from rewindfs.overlay.fs import SESSIONS
from rewindfs.overlay.fs.libfuse import LibfuseSession, mount_options

__all__ = ["SESSIONS", "active", "choose", "default", "invalidate_entry", "invalidate_inode",
           "mount", "readdir_reply", "serve", "settle", "unmount"]

_active = None


def default() -> str:
    """``kernel``: it asks the kernel for what it offers (INIT negotiation falls back
    flag by flag on an older kernel; passthrough where offered and with CAP_SYS_ADMIN,
    else the writeback cache) and mounts with ``mount(2)`` as root or through ``fusermount3`` as
    a user — both paths under test (tests/mount/test_user_mount.py for the user's).
    ``libfuse`` stays selectable for where our session cannot run."""
    return "kernel"


def choose(name: str | None = None) -> str:
    """The session layer to use: *name*, else ``REWINDFS_SESSION``, else ``default()``;
    ``ValueError`` for an unknown name."""
    name = name or os.environ.get("REWINDFS_SESSION") or default()
    if name not in SESSIONS:
        raise ValueError(f"unknown FUSE session {name!r} (one of: {', '.join(SESSIONS)})")
    return name


def passthrough_wanted() -> bool:
    """Ask for kernel passthrough instead of the writeback cache, unless
    ``REWINDFS_PASSTHROUGH=0``.  The kernel session gets it as root on a kernel that
    offers it (≥ 6.9); otherwise the writeback cache stays (docs/benchmarks.md: the
    faster of the two here, since writers are passed through as well)."""
    return os.environ.get("REWINDFS_PASSTHROUGH", "1") != "0"


def active():
    """The running session (``name``, ``flags``), or None."""
    return _active


def mount(ops, mountpoint: bytes, kind: str | None = None) -> None:
    """Mount *ops* over *mountpoint* with the session layer *kind* (``choose``);
    ``RuntimeError`` if the kernel refuses."""
    global _active, readdir_reply
    kind = choose(kind)
    if kind == "kernel":
        options = sorted(mount_options() - {"fsname=rewindfs", "subtype=rewindfs"})
        sess = KernelSession(ops, mountpoint, options, passthrough=passthrough_wanted())
        readdir_reply = _kernel_readdir_reply
    else:
        sess = LibfuseSession(ops, mountpoint)
        readdir_reply = LibfuseSession.readdir_reply
    try:
        sess.start()
    except OSError as exc:
        raise RuntimeError(str(exc)) from None
    _active = sess


def unmount() -> None:
    """End the session and remove the mount."""
    global _active
    sess, _active = _active, None
    if sess is not None:
        sess.close()


async def settle() -> None:
    """Wait until the requests the kernel already handed out are answered: a no-op
    except over io_uring, whose per-CPU queues are not one FIFO (``KernelSession.settle``)."""
    sess = _active
    if sess is not None and hasattr(sess, "settle"):
        await sess.settle()


async def serve(ended) -> None:
    """The request loop until the kernel ends the session; then ``ended()``."""
    await _active.serve(ended)


def invalidate_inode(ino: int, attr_only: bool = False) -> None:
    """May block (call off the trio thread: ``fs.notify``)."""
    sess = _active
    if sess is None:
        raise OSError(107, "no FUSE session")   # ENOTCONN
    sess.invalidate_inode(ino, attr_only)


def invalidate_entry(parent: int, name: bytes) -> None:
    sess = _active
    if sess is None:
        raise OSError(107, "no FUSE session")
    sess.invalidate_entry(parent, name)


readdir_reply = LibfuseSession.readdir_reply   # replaced by ``mount``
