"""Hand items from a worker thread to the trio thread, coalesced into batches.

``Handoff(token, deliver)``: ``put(item)`` may be called from any thread and never
blocks; ``deliver(items)`` runs on the trio thread with every item put since the last
delivery, in order; if it raises, that batch is logged and dropped (an exception in a
``run_sync_soon`` callback would end the trio run, i.e. the daemon).  One ``run_sync_soon`` — one wake-up of the trio thread — per burst
instead of per item: a rewind of 10,000 files queued 20,000 wake-ups (invalidations and
progress events), each a write to trio's wake-up socket and a pass of its scheduler,
competing with the rewind itself on the GIL.

Ordering contract: a ``put`` schedules a delivery unless one is scheduled and has not
yet taken its items, in which case that one takes the new item too.  ``run_sync_soon``
runs callbacks in FIFO order, so every item put before some later ``run_sync_soon``
(e.g. ``trio.to_thread`` handing back the worker's result) has been delivered by the
time that callback runs.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["Handoff"]

log = logging.getLogger(__name__)


class Handoff:
    def __init__(self, token, deliver):
        self._token, self._deliver = token, deliver
        self._lock = threading.Lock()
        self._items: list = []
        self._scheduled = False

    def put(self, item) -> None:
        with self._lock:
            self._items.append(item)
            if self._scheduled:
                return
            self._scheduled = True
        self._token.run_sync_soon(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        try:
            self._deliver(items)
        except Exception:
            # run_sync_soon turns an exception into TrioInternalError: the whole daemon
            # would end (and unmount).  Lose this batch, never the mount.
            log.exception("handing %d item(s) to the trio thread failed", len(items))
