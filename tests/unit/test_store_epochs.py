"""Epochs, turns, sessions, forks, point names, intents, changed_since."""

from __future__ import annotations

import os

import pytest

from rewindfs.store import (AmbiguousPoint, BadPath, EpochClosed, NothingToRedo, PreImage,
                            SessionConflict, Store, StoreError, UnknownPoint)
from store_fixtures import store, store_path, ws  # noqa: F401  (fixtures)


def test_first_epoch_is_idle_and_current(store, ws):
    e = store.current_epoch(ws)
    assert (e.kind, e.is_open, e.workspace) == ("idle", True, ws)
    assert store.current_epoch(ws) == e
    assert store.open_turn(ws) is None


def test_turn_lifecycle(store, ws):
    idle = store.current_epoch(ws)
    t1 = store.begin_turn(ws, "s1", 1, "fix the bug")
    assert (t1.kind, t1.session, t1.turn, t1.label) == ("turn", "s1", 1, "fix the bug")
    assert t1.id > idle.id
    assert store.epoch(idle.id).ended_ns is not None
    assert store.open_turn(ws) == t1
    assert store.begin_turn(ws, "s1", 1, "again") == t1          # idempotent
    t2 = store.begin_turn(ws, "s1", 2, "next")                   # closes t1
    assert store.epoch(t1.id).ended_ns is not None and t2.id > t1.id
    after = store.end_turn(ws)
    assert (after.kind, after.is_open) == ("idle", True)
    assert store.open_turn(ws) is None
    assert store.end_turn(ws) == after                            # no open turn: no-op
    assert [e.kind for e in store.epochs(ws)] == ["idle", "turn", "turn", "idle"]
    assert store.session_points(ws, "s1") == [(1, t1.id), (2, t2.id)]


def test_a_mount_starts_at_a_point(store, ws):
    """``begin_mount``: a new idle epoch when the open idle one recorded anything or a
    run labels its epoch; an empty idle epoch or an open turn stays as it is."""
    first = store.begin_mount(ws)
    assert (first.kind, first.label) == ("idle", "")
    assert store.begin_mount(ws) == first                       # nothing recorded
    store.record(ws, first.id, [(b"a", PreImage.ABSENT)])
    second = store.begin_mount(ws)
    assert second.id > first.id and store.epoch(first.id).ended_ns is not None
    run = store.begin_mount(ws, "run: make")                     # a run: its own epoch
    assert (run.id > second.id, run.kind, run.label) == (True, "idle", "run: make")
    turn = store.begin_turn(ws, "s1", 1, "x")
    assert store.begin_mount(ws, "run: make") == turn             # a harness ends it


def test_a_runs_first_mount_labels_the_workspaces_first_epoch(store, ws):
    assert [(e.kind, e.label) for e in [store.begin_mount(ws, "run: ls")]] == [("idle", "run: ls")]
    assert len(store.epochs(ws)) == 1


def test_epoch_ids_increase_across_workspaces(store, tmp_path):
    a = store.workspace(os.fsencode(tmp_path / "a"))
    b = store.workspace(os.fsencode(tmp_path / "b"))
    assert store.workspace(os.fsencode(tmp_path / "a")) == a != b
    assert store.workspaces() == [(a, os.fsencode(tmp_path / "a")),
                                  (b, os.fsencode(tmp_path / "b"))]
    ids = []
    for i in range(1, 4):
        ids.append(store.begin_turn(a, "s", i, "").id)
        ids.append(store.begin_turn(b, "s", i, "").id)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_counts(store, ws):
    e = store.begin_turn(ws, "s", 1, "")
    key, n = store.put_bytes(b"12345")
    store.record(ws, e.id, [(b"a", PreImage("file", 0o644, size=n, blob=key)),
                            (b"b", PreImage.ABSENT)])
    assert store.record(ws, e.id, [(b"a", PreImage.ABSENT), (b"c", PreImage.ABSENT)]).fresh \
        == [False, True]
    got = store.epoch(e.id)
    assert (got.paths, got.bytes) == (3, 5)
    assert dict(store.journal(ws, e.id))[b"a"].kind == "file"   # the first one wins


def test_rewind_epochs_and_the_redo_stack(store, ws):
    t1 = store.begin_turn(ws, "s1", 1, "")
    store.end_turn(ws)
    with pytest.raises(NothingToRedo):
        store.redo_target(ws, None)
    r = store.begin_rewind(ws, t1.id, "s1")
    assert (r.kind, r.target, r.session) == ("rewind", t1.id, "s1")
    idle = store.end_rewind(ws)
    assert idle.kind == "idle" and store.epoch(r.id).ended_ns is not None
    assert store.redo_target(ws, "s1") == (store.epoch(r.id), [])
    with pytest.raises(NothingToRedo):       # a rewind of s1 is not the manual owner's
        store.redo_target(ws, None)
    with pytest.raises(NothingToRedo):
        store.redo_target(ws, "other")
    d = store.begin_rewind(ws, r.id, "s1", kind="redo")
    assert (d.kind, d.target) == ("redo", r.id)
    store.end_rewind(ws)
    with pytest.raises(NothingToRedo):       # popped
        store.redo_target(ws, "s1")
    with pytest.raises(UnknownPoint):
        store.begin_rewind(ws, 999, None)
    with pytest.raises(StoreError):          # a redo names the rewind it undoes
        store.begin_rewind(ws, t1.id, None, kind="redo")


def test_resolve_point(store, ws):
    store.end_turn(ws)                         # epoch ids and turn numbers differ
    store.end_turn(ws)
    t1 = store.begin_turn(ws, "s1", 1, "")
    t2 = store.begin_turn(ws, "s1", 2, "")
    assert t1.id != 1 and t2.id != 2
    assert store.resolve_point(ws, 1) == t1.id          # a bare number is a turn …
    assert store.resolve_point(ws, "2") == t2.id        # … of the only session
    assert store.resolve_point(ws, f"e{t2.id}") == t2.id
    assert store.resolve_point(ws, f"epoch:{t1.id}") == t1.id
    assert store.resolve_point(ws, "t2") == t2.id
    assert store.resolve_point(ws, "turn:1") == t1.id
    assert store.resolve_point(ws, 2, session="s1") == t2.id
    assert store.resolve_point(ws, "1", session="s1") == t1.id
    with pytest.raises(UnknownPoint):
        store.resolve_point(ws, str(t2.id + 5))            # never an epoch
    store.end_turn(ws)
    store.begin_turn(ws, "s2", 1, "")
    for ambiguous in ("t1", "1", 1, "2"):    # several sessions: a turn needs one named
        with pytest.raises(AmbiguousPoint) as refused:
            store.resolve_point(ws, ambiguous)
        assert "s1 (turns 1–2), s2 (turn 1)" in refused.value.message
        assert refused.value.to_dict()["data"]["choices"] == [
            {"session": "s1", "turns": [1, 2]}, {"session": "s2", "turns": [1, 1]}]
    assert store.resolve_point(ws, "t1", session="s1") == t1.id


def test_a_turn_without_any_session_is_unknown_and_says_how_to_name_an_epoch(store, ws):
    store.end_turn(ws)
    with pytest.raises(UnknownPoint) as refused:
        store.resolve_point(ws, "1")
    assert not isinstance(refused.value, AmbiguousPoint)
    assert "write e1 for epoch 1" in refused.value.message


def test_fork_inherits_points_up_to_the_boundary(store, ws):
    t = [store.begin_turn(ws, "parent", i, "").id for i in (1, 2, 3, 4)]
    store.fork_session("child", "parent", 2)
    store.fork_session("child", "parent", 2)                # idempotent
    with pytest.raises(SessionConflict):
        store.fork_session("child", "parent", 3)
    with pytest.raises(SessionConflict):
        store.fork_session("parent", "child", 1)            # no cycles
    assert store.session_points(ws, "child") == [(1, t[0]), (2, t[1])]
    store.end_turn(ws)
    c3 = store.begin_turn(ws, "child", 3, "").id
    assert store.session_points(ws, "child") == [(1, t[0]), (2, t[1]), (3, c3)]
    store.fork_session("grandchild", "child", 3)
    assert store.session_points(ws, "grandchild") == [(1, t[0]), (2, t[1]), (3, c3)]
    assert store.resolve_point(ws, 2, session="grandchild") == t[1]
    with pytest.raises(UnknownPoint):
        store.resolve_point(ws, 4, session="child")


def test_intents(store, ws, tmp_path):
    assert store.get_intent(ws) is None
    intent = {"epoch": 7, "target": 3, "paths": [b"a", b"\xff"], "session": "s"}
    store.put_intent(ws, intent)
    other = store.workspace(os.fsencode(tmp_path / "other"))
    assert store.get_intent(other) is None
    assert store.get_intent(ws) == intent
    store.clear_intent(ws)
    assert store.get_intent(ws) is None


def test_changed_since_reports_the_newest_epoch(store, ws):
    t1 = store.begin_turn(ws, "s", 1, "")
    store.record(ws, t1.id, [(b"a", PreImage.ABSENT), (b"d/x", PreImage.ABSENT)])
    idle = store.end_turn(ws)
    store.record(ws, idle.id, [(b"a", PreImage.ABSENT), (b"b", PreImage.ABSENT)])
    got = {p: e.id for p, e in store.changed_since(ws, t1.id)}
    assert got == {b"a": idle.id, b"b": idle.id, b"d/x": t1.id}
    assert {p: e.id for p, e in store.changed_since(ws, t1.id, [b"d"])} == {b"d/x": t1.id}
    assert {p for p, _ in store.changed_since(ws, idle.id)} == {b"a", b"b"}


def test_state_at_uses_the_earliest_epoch_at_or_after(store, ws):
    img = [PreImage("dir", 0o700 + i) for i in range(3)]
    e = []
    for i in range(3):
        e.append(store.begin_turn(ws, "s", i + 1, "").id)
        store.record(ws, e[i], [(b"p", img[i])])
    last = store.end_turn(ws).id
    assert [store.state_at(ws, x, b"p") for x in e] == img
    assert store.state_at(ws, last, b"p") is None
    assert store.state_at(ws, e[0], b"q") is None


def test_plan_order(store, ws):
    t = store.begin_turn(ws, "s", 1, "").id
    k, n = store.put_bytes(b"x")
    f = PreImage("file", 0o644, size=n, blob=k, link_group=b"g")
    store.record(ws, t, [
        (b"gone/deeper", PreImage.ABSENT), (b"gone", PreImage.ABSENT),
        (b"d", PreImage("dir", 0o755)), (b"d/e", PreImage("dir", 0o755)),
        (b"d/e/f", f), (b"z", f), (b"d/l", PreImage("symlink", target=b"../z")),
        (b"d/p", PreImage("fifo", 0o600)),
    ])
    plan = store.plan(ws, t)
    assert [(a.op, a.path) for a in plan] == [
        ("delete", b"gone/deeper"), ("delete", b"gone"),
        ("mkdir", b"d"), ("write", b"z"), ("mkdir", b"d/e"), ("symlink", b"d/l"),
        ("mknod", b"d/p"), ("write", b"d/e/f"),
        ("meta", b"d/e"), ("meta", b"d"),
    ]
    assert plan.target == t and plan.paths == {a.path for a in plan}
    assert plan.counts()["delete"] == 2


def test_reopen_sees_everything(store_path, tmp_path):
    with Store.open(store_path) as s:
        ws = s.workspace(os.fsencode(tmp_path / "w"))
        t = s.begin_turn(ws, "s", 1, "label")
        s.record(ws, t.id, [(b"a", PreImage.ABSENT)])
    with Store.open(store_path) as s:
        assert s.workspace(os.fsencode(tmp_path / "w")) == ws
        assert s.open_turn(ws) == s.epoch(t.id)
        assert s.is_recorded(ws, t.id, b"a")
        assert s.fsck().ok


def test_two_opens_in_one_process_share_the_environment(store_path, tmp_path):
    a = Store.open(store_path)
    b = Store.open(store_path)
    try:
        ws = a.workspace(os.fsencode(tmp_path / "w"))
        e = a.begin_turn(ws, "s", 1, "")
        a.close()
        assert b.open_turn(ws) == e        # b still works after a closed
    finally:
        b.close()


def test_a_mark_commits_its_epoch_and_the_records_given_with_it_together(store, ws):
    """A turn mark's new epoch and the pre-images of the files writers hold open (the
    daemon's ``writer_images``) are one transaction: never the epoch without them."""
    first = store.begin_turn(ws, "s", 1, "one")
    key, n = store.put_bytes(b"at the mark")
    held = [(b"log", PreImage("file", 0o644, size=n, blob=key))]
    second = store.begin_turn(ws, "s", 2, "two", records=held)
    assert [p for p, _ in store.journal(ws, second.id)] == [b"log"]
    assert store.state_at(ws, second.id, b"log") == held[0][1]
    with pytest.raises(BadPath):                       # a record that cannot be made:
        store.begin_turn(ws, "s", 3, "three", records=[(b"../escape", PreImage.ABSENT)])
    assert store.current_epoch(ws).id == second.id     # no epoch without it
    idle = store.end_turn(ws, "s", records=held)
    assert [p for p, _ in store.journal(ws, idle.id)] == [b"log"]
    assert store.end_turn(ws, "s", records=held).id == idle.id   # no turn: nothing
    assert first.id < second.id < idle.id


def test_record_returns_the_generation_of_its_commit(store, ws):
    """The filesystem trusts what it captured without reading its epoch again while the
    store's generation is the one of its own last record (``_follow_store``): that
    number must be the commit's, and a refused record has none."""
    e = store.begin_turn(ws, "s", 1, "t").id
    before = store.generation()
    done = store.record(ws, e, [(b"a", PreImage.ABSENT), (b"a", PreImage.ABSENT)])
    assert done.generation == store.generation() > before
    assert done.fresh == [True, False]
    again = store.record(ws, e, [(b"a", PreImage.ABSENT)])
    assert again.fresh == [False]
    assert store.generation() == done.generation   # nothing new: LMDB committed nothing,
    assert again.generation is None                # and the number is not ours
    store.begin_turn(ws, "s", 2, "t")                       # closes e
    with pytest.raises(EpochClosed):
        store.record(ws, e, [(b"c", PreImage.ABSENT)])


def test_an_epoch_record_damaged_after_it_was_read_is_still_named(store, ws):
    """Reading an epoch keeps its decoded record for the next read of the same bytes;
    other bytes — a record damaged on disk since — are checked again (invariant 15)."""
    from rewindfs.store import IndexCorrupt
    from rewindfs.store import _schema as S
    e = store.begin_turn(ws, "s", 1, "t").id
    store.record(ws, e, [(b"a", PreImage.ABSENT)])
    assert store.current_epoch(ws).paths == 1               # read, and kept
    with store._w() as txn:
        good = txn.get(S.u64(e), db=store._db["epochs"])
        bad = bytearray(good)
        bad[3] ^= 0x40
        txn.put(S.u64(e), bytes(bad), db=store._db["epochs"])
    with pytest.raises(IndexCorrupt):
        store.current_epoch(ws)
    with pytest.raises(IndexCorrupt):
        store.record(ws, e, [(b"b", PreImage.ABSENT)])
    with store._w() as txn:                                 # repaired: read as before
        txn.put(S.u64(e), good, db=store._db["epochs"])
    assert store.current_epoch(ws).paths == 1
