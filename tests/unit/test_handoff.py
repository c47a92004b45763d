"""The worker → trio hand-off of the daemon (invalidations, progress events): bursts
are coalesced into one delivery, nothing is lost or reordered, and everything put
before a worker returns is delivered before ``to_thread.run_sync`` returns."""

from __future__ import annotations

import threading

import trio

from rewindfs.overlay.control.handoff import Handoff
from rewindfs.overlay.control.rewind_methods import _run_streaming


async def test_a_burst_is_one_delivery_in_order():
    got = []
    handoff = Handoff(trio.lowlevel.current_trio_token(), got.append)
    all_put = threading.Event()

    def worker():
        for i in range(100):
            handoff.put(i)
        all_put.set()

    t = threading.Thread(target=worker)
    t.start()
    all_put.wait()      # blocks the trio thread: no delivery can run during the burst
    t.join()
    await trio.to_thread.run_sync(lambda: None)   # FIFO: the delivery ran before this
    assert got == [list(range(100))]


async def test_everything_put_by_a_worker_is_delivered_when_it_returns():
    got = []
    handoff = Handoff(trio.lowlevel.current_trio_token(), got.append)

    def worker():
        for i in range(20_000):
            handoff.put(i)

    await trio.to_thread.run_sync(worker)
    assert all(got) and [i for batch in got for i in batch] == list(range(20_000))


async def test_streamed_events_all_reach_the_client_in_order_before_the_result():
    sent = []

    async def emit(*events):
        sent.extend(events)

    def fn(ctx, params, send):
        for i in range(5000):
            send({"type": "rewind.written", "n": i})
        send({"type": "rewind.done"})
        return {"done": True}

    result = await _run_streaming(fn, None, {}, emit)
    assert result == {"done": True}
    assert sent == [{"type": "rewind.written", "n": i} for i in range(5000)] + [
        {"type": "rewind.done"}]
