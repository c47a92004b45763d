"""The one seam between the kernel's FUSE session and the handlers.

Today the session is pyfuse3's: ``mount`` (``pyfuse3.init``: open ``/dev/fuse``, mount,
hand it the handlers), ``serve`` (its request loop, with our cheaper wait for the next
request: ``fastwait``) and ``unmount`` (``pyfuse3.close``).  The daemon uses only these
three, so a second session layer (one that talks to ``/dev/fuse`` itself) replaces
this module, not the daemon or the handlers.
"""

from __future__ import annotations

import logging
import os
import time

import pyfuse3
import trio

from rewindfs.overlay.fs import fastwait

log = logging.getLogger(__name__)

__all__ = ["mount", "mount_options", "serve", "unmount"]

_BACKOFF_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)


def mount_options() -> set[str]:
    opts = set(pyfuse3.default_options) | {"fsname=rewindfs", "subtype=rewindfs"}
    if os.geteuid() == 0:
        opts.add("allow_other")  # the workspace's owner may not be root
    return opts


def mount(ops, mountpoint: bytes) -> None:
    """Mount *ops* (``fs.ops.RewindOperations``) over *mountpoint*; ``RuntimeError`` if
    the kernel refuses."""
    pyfuse3.init(ops, os.fsdecode(mountpoint), mount_options())


def unmount() -> None:
    """End the session and remove the mount."""
    pyfuse3.close(unmount=True)


async def serve(ended) -> None:
    """pyfuse3's request loop until the kernel ends the session.  An exception escaping
    it (a bug: handlers map their failures to errnos) is logged and the loop restarted
    after a pause; the request it came from goes unanswered, the mount stays."""
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
                log.exception("the FUSE request loop failed; restarting it in %.2f s", delay)
                await trio.sleep(delay)
    finally:
        ended()  # the kernel ended the session (external unmount) or we did
