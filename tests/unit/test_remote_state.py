"""The store's own record of what was pushed (``Store.record_push``/``push_state``):
what ``status`` shows without asking the remote.  Pure data, no server."""

from __future__ import annotations

import pytest

from store_fixtures import store, store_path, ws  # noqa: F401  (fixtures)

from rewindfs.store._errors import UnknownRemote


def test_unpushed_epochs_count_from_the_last_push(store, ws):
    store.add_remote("origin", "s3://b/p")
    e1 = store.begin_turn(ws, "s", 1, "one").id
    store.end_turn(ws)
    state = store.push_state("origin", ws)
    assert state["pushed_epoch"] is None and state["workspace"] is None
    assert state["unpushed_epochs"] == len(store.epochs(ws))
    store.bind_remote("origin", ws, "abc123")
    store.record_push("origin", ws, e1, 42)
    state = store.push_state("origin", ws)
    assert (state["workspace"], state["pushed_epoch"], state["pushed_ns"]) == ("abc123", e1, 42)
    assert state["unpushed_epochs"] == sum(1 for e in store.epochs(ws) if e.id > e1) == 1
    assert state["head_epoch"] == store.current_epoch(ws).id


def test_forgetting_a_remote_forgets_what_was_pushed_to_it(store, ws):
    store.add_remote("origin", "s3://b/p")
    store.record_push("origin", ws, store.current_epoch(ws).id, 1)
    store.remove_remote("origin")
    with pytest.raises(UnknownRemote):
        store.push_state("origin", ws)
    with pytest.raises(UnknownRemote):
        store.record_push("origin", ws, 1, 1)
    store.add_remote("origin", "s3://b/p")          # the same name again: nothing pushed
    assert store.push_state("origin", ws)["pushed_epoch"] is None
