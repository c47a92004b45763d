"""Kernel cache notifications, delivered off the trio thread.

An entry invalidation (``session.invalidate_entry``) blocks until a related request finishes and
``invalidate_inode`` can block on dirty pages, so calling either from the trio thread
(which serves those requests) could deadlock.  ``Notifier`` queues them for one daemon
thread, in order; ``settled()`` is a barrier that waits for everything queued before it.
"""

from __future__ import annotations

import errno
import logging
import queue
import threading

import trio

from rewindfs.overlay.fs import session

log = logging.getLogger(__name__)

__all__ = ["Notifier"]

_QUIET = (errno.ENOENT, errno.ENOTCONN, errno.EBADF)


class Notifier:
    """Non-blocking ``inode``/``entry`` invalidations; the thread starts on first use."""

    def __init__(self):
        self._q: queue.SimpleQueue | None = None

    def _put(self, item) -> None:
        if self._q is None:
            self._q = queue.SimpleQueue()
            threading.Thread(target=_loop, args=(self._q,), daemon=True,
                             name="rewindfs-invalidate").start()
        self._q.put(item)

    def inode(self, ino: int, *, attr_only: bool = False) -> None:
        self._put(("inode", ino, attr_only))

    def entry(self, parent_ino: int, name: bytes) -> None:
        self._put(("entry", parent_ino, name))

    async def settled(self) -> None:
        """Return once every notification queued so far has been delivered."""
        if self._q is None:
            return
        done = threading.Event()
        self._q.put(("barrier", done))
        await trio.to_thread.run_sync(done.wait)

    def close(self) -> None:
        if self._q is not None:
            self._q.put(None)


def _loop(q: queue.SimpleQueue) -> None:
    while True:
        item = q.get()
        if item is None:
            return
        kind = item[0]
        try:
            if kind == "barrier":
                item[1].set()
            elif kind == "inode":
                session.invalidate_inode(item[1], attr_only=item[2])
            else:
                session.invalidate_entry(item[1], item[2])
        except OSError as exc:
            if exc.errno not in _QUIET:
                log.warning("cache invalidation %r failed: %s", item[:2], exc)
        except Exception:
            log.exception("cache invalidation %r failed", item[:2])
