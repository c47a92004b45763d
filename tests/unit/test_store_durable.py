"""``Store.sync()``: pre-images are forced to disk only when some are pending.

The power-cut test (tests/mount/test_rel_powercut.py) proves that what ``sync()`` writes is
on the disk; these tests pin down *when* it writes, which is what keeps an ``fsync``
through the mount cheap: a commit (from any thread) makes the store pending, a sync or
``flush()`` clears it, and reads never make it pending.
"""

from __future__ import annotations

import threading

from rewindfs.store import PreImage, Store


def _syncs(store) -> int:
    return store.statistics()["durability"]["syncs"]


def test_sync_writes_only_when_a_commit_is_pending(store, ws):
    store.flush()
    assert store.sync() is False                 # nothing since the flush
    e = store.current_epoch(ws)
    key, n = store.put_bytes(b"old content")
    assert store.sync() is True                  # a blob put is pending
    store.record(ws, e.id, [(b"a", PreImage("file", 0o644, size=n, blob=key))])
    before = _syncs(store)
    assert store.sync() is True                  # the journal entry
    assert store.sync() is False
    list(store.journal(ws, e.id))
    store.state_at(ws, e.id, b"a")
    store.is_recorded(ws, e.id, b"a")
    assert store.sync() is False                 # reads commit nothing
    assert _syncs(store) == before + 1
    store.record(ws, e.id, [(b"b", PreImage.ABSENT)])
    store.flush()                                # a flush counts as a sync
    assert store.sync() is False


def test_a_commit_on_another_thread_is_covered(store, ws):
    e = store.current_epoch(ws)
    store.flush()
    t = threading.Thread(target=store.record, args=(ws, e.id, [(b"t", PreImage.ABSENT)]))
    t.start()
    t.join()
    assert store.sync() is True


def test_a_second_opener_shares_the_pending_state(store_path, store, ws):
    """``Store.open`` hands the same environment to a second opener in the process:
    a commit through one is made durable by a sync through the other."""
    store.flush()
    with Store.open(store_path) as other:
        other.record(ws, store.current_epoch(ws).id, [(b"x", PreImage.ABSENT)])
        assert store.sync() is True
        assert other.sync() is False
