"""The libfuse session: pyfuse3's (libfuse 3.14 underneath).

``mount`` (``pyfuse3.init``: open ``/dev/fuse``, mount, hand it the handlers),
``serve`` (its request loop, with our cheaper wait for the next request:
``fastwait``) and ``close`` (``pyfuse3.close``).  It runs wherever pyfuse3 builds; the
kernel-direct session (``fs.kernel``) is the faster one.
"""

from __future__ import annotations

import logging
import os
import time

import pyfuse3
import trio

from rewindfs.overlay.fs import fastwait

log = logging.getLogger(__name__)

__all__ = ["LibfuseSession", "mount_options"]

_BACKOFF_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)


def mount_options() -> set[str]:
    opts = set(pyfuse3.default_options) | {"fsname=rewindfs", "subtype=rewindfs"}
    if os.geteuid() == 0:
        opts.add("allow_other")  # the workspace's owner may not be root
    return opts


class LibfuseSession:
    """pyfuse3's one session per process, behind the interface ``fs.session`` uses."""

    name = "libfuse"
    flags = 0

    @staticmethod
    def readdir_reply(token, name: bytes, attr, next_id: int) -> bool:
        """``pyfuse3.readdir_reply``, looked up at each call (tests replace it)."""
        return pyfuse3.readdir_reply(token, name, attr, next_id)

    def __init__(self, ops, mountpoint: bytes):
        self.ops = ops
        self.mountpoint = mountpoint

    def request_counts(self) -> dict[str, int]:
        """Not known: libfuse does not count."""
        return {}

    def request_times(self) -> dict[str, int]:
        """Not known either."""
        return {}

    def start(self) -> None:
        pyfuse3.init(self.ops, os.fsdecode(self.mountpoint), mount_options())

    def close(self) -> None:
        pyfuse3.close(unmount=True)

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        pyfuse3.invalidate_inode(ino, attr_only=attr_only)

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        pyfuse3.invalidate_entry(parent, name)

    async def serve(self, ended) -> None:
        """pyfuse3's request loop until the kernel ends the session.  An exception
        escaping it (a bug: handlers map their failures to errnos) is logged and the
        loop restarted after a pause; the request it came from goes unanswered, the
        mount stays."""
        if os.environ.get("REWINDFS_SLOWLOOP") is None:
            fastwait.install()
        failures, last = 0, 0.0
        try:
            while True:
                try:
                    # One reader task: handlers never await, so more would only add overhead.
                    await pyfuse3.main(min_tasks=1, max_tasks=1)
                    return
                except Exception:
                    now = time.monotonic()
                    failures = failures + 1 if now - last < 60 else 1
                    last = now
                    delay = _BACKOFF_S[min(failures - 1, len(_BACKOFF_S) - 1)]
                    log.exception("the FUSE request loop failed; restarting it in %.2f s",
                                  delay)
                    await trio.sleep(delay)
        finally:
            ended()  # the kernel ended the session (external unmount) or we did
