"""How many file descriptors each fd cache of the daemon may hold.

The daemon lives under ``RLIMIT_NOFILE`` like any process (1024 is the usual soft
limit).  At start it raises the soft limit to the hard one (``raise_soft_limit``); every
cache of fds then takes a fixed share of whatever the limit is, so together they never
hold more than about half of it and the rest stays free for what the daemon cannot
bound itself — files and directories the workspace's users hold open through the mount
(one real fd each), control connections, the store's files:

| cache | share | at most |
|---|---|---|
| the inode table's directory fds (``fs.inodes.InodeTable``, LRU) | 1/4 | 4096 |
| a restore run's directory fds (``tree.walk.DirCache``) | 1/4 | 4096 |
| a restore run's batch of files to store (``capture._ContentBatch``) | 1/16 | 256 |
| passthrough backing files kept after their last close (``fs.kernel.backing``) | 1/32 | 256 |

The inode table and a restore run can be busy at the same time (a rewind runs in a
worker thread while FUSE requests are served), hence the sum.  When fds run out anyway
(``EMFILE``/``ENFILE``), the daemon sheds its caches, refuses the one request that could
not get an fd and carries on (docs/reliability.md, "File descriptors").
"""

from __future__ import annotations

import errno
import logging
import resource

log = logging.getLogger(__name__)

__all__ = ["EXHAUSTED", "dir_cache_size", "raise_soft_limit", "share"]

EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def raise_soft_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit now in
    force (unchanged if raising is refused)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. hard above fs.nr_open
            log.info("could not raise the fd limit from %d to %d: %s", soft, hard, exc)
    return soft


def share(divisor: int, cap: int, floor: int = 8) -> int:
    """``1/divisor`` of the current soft fd limit, at least ``floor``, at most ``cap``
    (the cap wins over the floor)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return cap
    return min(cap, max(floor, soft // divisor))


def dir_cache_size() -> int:
    """Directory fds one directory cache may keep (a quarter of the limit, ≤ 4096)."""
    return share(4, 4096, 16)
