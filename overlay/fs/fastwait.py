"""A cheaper wait for the next FUSE request than pyfuse3's.

pyfuse3's session loop calls its module-level ``_wait_fuse_readable()`` before every
request: take a ``trio.Lock``, then ``trio.lowlevel.wait_readable(fd)``, which parks the
task, re-arms epoll and goes once round trio's scheduler — even when the next request is
already waiting in ``/dev/fuse``.  Under load that costs more than most of our handlers
(see docs/benchmarks.md).  ``install(fd)`` replaces it with a version that first asks
``poll(fd, 0)``: if a request is already there it returns at once, without a
checkpoint; otherwise (idle) it falls back to pyfuse3's own wait.

Contract kept: control-socket tasks, signals, threads' results and cancellation
(shutdown) are never starved while the kernel keeps the queue full.  The same ``poll``
also watches trio's own epoll fd, and the loop looks at trio's run queue: when any
other task's I/O or a worker thread's result is ready, or a task waits to run, the
request loop passes a checkpoint at once (so a turn mark waits for one
FUSE request, not for 32 — under a heavy write load the 32 cost a mark ~100 ms), and
every ``_FAIR_EVERY``-th request passes one anyway (timers, which epoll does not see).  We run pyfuse3 with exactly one reader task
(``fs.session.serve``), so the read lock pyfuse3 takes protects nothing we skip.
Handlers themselves never await (docs/concurrency.md), so ordering is unchanged:
one request runs to completion before the next is read.
"""

from __future__ import annotations

import logging
import os
import select

import pyfuse3

log = logging.getLogger(__name__)

__all__ = ["fuse_fd", "install", "trio_internals"]

_FAIR_EVERY = 32


def fuse_fd() -> int | None:
    """The ``/dev/fuse`` fd of this process's session (pyfuse3 does not export it)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
        except OSError:
            continue
    return None


def trio_internals():
    """``(epoll fd, run queue)`` of the running trio: the epoll fd is readable when a
    task's socket or a thread's result is ready, the run queue holds tasks ready to
    run (e.g. one that passed a checkpoint).  ``(None, ())`` if this trio differs."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT
        runner = GLOBAL_RUN_CONTEXT.runner
        return runner.io_manager._epoll.fileno(), runner.runq
    except (AttributeError, ImportError):
        return None, ()


def install(fd: int | None = None) -> bool:
    """Replace pyfuse3's per-request wait (call after ``pyfuse3.init``); False if the
    fd cannot be found or pyfuse3 has no such hook (then nothing changes)."""
    orig = getattr(pyfuse3, "_wait_fuse_readable", None)
    fd = fuse_fd() if fd is None else fd
    if orig is None or fd is None:
        log.info("fast FUSE wait not installed")
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    others, runq = trio_internals()
    if others is not None:
        poller.register(others, select.POLLIN)
    poll = poller.poll
    countdown = [_FAIR_EVERY]

    async def _wait_fuse_readable():
        if countdown[0] > 0 and not runq:
            ready = poll(0)
            if len(ready) == 1 and ready[0][0] == fd:   # FUSE waits, nothing else does
                countdown[0] -= 1
                return True
        countdown[0] = _FAIR_EVERY
        return await orig()

    pyfuse3._wait_fuse_readable = _wait_fuse_readable
    return True
