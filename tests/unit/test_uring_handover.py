"""``uring.HandOver``: the trio thread holds the ``serial`` lock whenever it runs and
lends it only while it sleeps in its I/O wait, so a queue thread's handler never runs
beside a trio task (docs/concurrency.md, "FUSE over io_uring").  No FUSE here: plain
threads stand in for the queue threads."""

from __future__ import annotations

import threading
import time

import trio

from rewindfs.overlay.fs.kernel.uring import HandOver


class Watch:
    """Who is inside: trio tasks (``trio``) and handlers (``handlers``); any overlap
    is recorded in ``overlaps``."""

    def __init__(self):
        self.trio = 0
        self.handlers = 0
        self.overlaps = 0
        self.served = 0
        self.guard = threading.Lock()

    def enter(self, who: str) -> None:
        with self.guard:
            setattr(self, who, getattr(self, who) + 1)
            if self.trio and self.handlers:
                self.overlaps += 1

    def leave(self, who: str) -> None:
        with self.guard:
            setattr(self, who, getattr(self, who) - 1)


def _queue_thread(serial, watch: Watch, stop: threading.Event) -> None:
    while not stop.is_set():
        if not serial.acquire(timeout=0.05):
            continue
        try:
            if stop.is_set():            # the test's end released it
                return
            watch.enter("handlers")
            time.sleep(0.0002)            # a handler's work, GIL released
            watch.served += 1
            watch.leave("handlers")
        finally:
            serial.release()
        time.sleep(0)


def _run(with_handover: bool, seconds: float = 0.6) -> Watch:
    serial = threading.Lock()
    watch = Watch()
    stop = threading.Event()

    async def busy(n: int) -> None:
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            watch.enter("trio")
            sum(range(2000))              # runs with the lock; GIL switches may happen
            time.sleep(0.0001)            # even a blocking call inside a task
            watch.leave("trio")
            if n % 2:
                await trio.sleep(0.001)   # an I/O wait: the lock is lent here
            else:
                await trio.lowlevel.checkpoint()

    async def worker_hop() -> None:       # a trio task waiting for a worker thread
        for _ in range(20):
            await trio.to_thread.run_sync(time.sleep, 0.005)

    async def main() -> None:
        serial.acquire()                  # the trio thread holds it whenever it runs
        threads = [threading.Thread(target=_queue_thread, args=(serial, watch, stop))
                   for _ in range(2)]
        for t in threads:
            t.start()
        handover = HandOver(serial)
        if with_handover:
            trio.lowlevel.add_instrument(handover)
        try:
            async with trio.open_nursery() as nursery:
                for n in range(4):
                    nursery.start_soon(busy, n)
                nursery.start_soon(worker_hop)
        finally:
            if with_handover:
                trio.lowlevel.remove_instrument(handover)
            stop.set()
            serial.release()
            for t in threads:
                t.join(5)

    trio.run(main)
    return watch


def test_a_handler_never_runs_beside_a_trio_task():
    watch = _run(with_handover=True)
    assert watch.overlaps == 0
    assert watch.served > 20          # handlers did run: while trio slept


def test_without_the_handover_no_handler_runs_while_trio_runs():
    watch = _run(with_handover=False)
    assert watch.overlaps == 0
    assert watch.served == 0          # the lock is never lent: the point of HandOver


def test_the_lock_is_lent_only_inside_the_io_wait():
    serial = threading.Lock()
    seen = []

    async def main() -> None:
        serial.acquire()
        trio.lowlevel.add_instrument(HandOver(serial))
        seen.append(serial.locked())            # running: held
        await trio.sleep(0.01)                  # lent inside, taken back after
        seen.append(serial.locked())
        got = []
        t = threading.Thread(target=lambda: got.append(serial.acquire(timeout=0.2)))
        t.start()
        t.join()                                # blocks trio: no I/O wait, no lending
        seen.append(got[0])
        serial.release()

    trio.run(main)
    assert seen == [True, True, False]
