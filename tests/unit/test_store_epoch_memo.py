"""The workspace's epochs, read again: what a UI asks on every render must cost nothing
that did not change, and must never be an answer the store no longer holds.

``Store.epochs`` (``_epoch.all_of``) answers from a memo while the workspace's token
``meta/epochs\\0<ws>`` is unchanged, reading again only the newest epoch it held and
those after it.  These tests read the same store the long way
round — every record of the ``epochs`` database, decoded — after writes from this
process, from another process, from gc, from a write that aborted, and from a store
made before the token existed.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from rewindfs.store import PreImage, Store
from rewindfs.store._errors import RewindfsError
from rewindfs.store import _epoch
from rewindfs.store import _schema as S
from store_fixtures import store, store_path, ws  # noqa: F401  (fixtures)


def _the_long_way(store: Store, ws: int) -> list:
    """Every epoch record of ``ws``, decoded from the database itself: no index, no memo."""
    with store._r() as txn:
        return [e for e in _epoch.every(txn, store._db) if e.workspace == ws]


def _turns(store: Store, ws: int, n: int, session: str = "s") -> None:
    for i in range(1, n + 1):
        store.begin_turn(ws, session, i, f"turn {i}", flush=False)
        store.end_turn(ws, flush=False)


def test_asking_again_decodes_only_what_may_have_changed(store, ws, monkeypatch):
    """A header asking twice in a row about 10,001 epochs: the second answer decodes
    at most the open epoch (before, every epoch again: ~0.2 s at 40,000); after a new
    turn, only the epoch it closed and the new ones."""
    _turns(store, ws, 5000)
    first = store.epochs(ws)
    decoded = []
    real = _epoch.decode
    monkeypatch.setattr(_epoch, "decode", lambda k, v: decoded.append(k) or real(k, v))
    assert store.epochs(ws) == first
    assert len(decoded) <= 1
    # a capture only changes the open epoch's counters: still nothing else decoded
    store.record(ws, store.current_epoch(ws).id, [(b"f", PreImage.ABSENT)])
    decoded.clear()
    again = store.epochs(ws)
    assert len(decoded) <= 1 and again[-1].paths == 1 and again[:-1] == first[:-1]
    assert again == _the_long_way(store, ws)
    # a turn begins and ends (the web UI's header asks again right after): what the
    # memo held is taken as it is, but for the epoch it held as the newest, now closed
    store.begin_turn(ws, "s", 5001, "one more", flush=False)
    store.end_turn(ws, flush=False)
    decoded.clear()
    after = store.epochs(ws)
    assert len(decoded) <= 3 and len(after) == len(first) + 2
    assert after == _the_long_way(store, ws)


def _random_step(store: Store, ws: int, rng: random.Random, turn: list[int]) -> str:
    ids = [e.id for e in store.epochs(ws)]
    pick = rng.random()
    if pick < 0.35:
        turn[0] += 1
        store.begin_turn(ws, rng.choice("ab"), turn[0], f"t{turn[0]}", force=True,
                         flush=False)
        return "turn"
    if pick < 0.5:
        store.end_turn(ws, flush=False)
        return "end"
    if pick < 0.7:
        open_id = store.current_epoch(ws).id
        store.record(ws, open_id, [(f"p{rng.randrange(50)}".encode(), PreImage.ABSENT)])
        return "capture"
    if pick < 0.82 and ids:
        store.end_turn(ws, flush=False)
        try:
            store.begin_rewind(ws, rng.choice(ids), rng.choice(["a", "b", None]))
        except RewindfsError as exc:      # a point the store refuses: nothing changed
            return f"rewind refused: {exc.code}"
        store.end_rewind(ws)
        return "rewind"
    if pick < 0.9:
        store.gc(grace_s=0, keep_epochs=rng.randrange(2, 12), drop_redo=True)
        return "gc"
    with pytest.raises(RuntimeError), store._w() as txn:
        # a write that renews the token, is read inside, then aborts
        _epoch.open_new(txn, store._db, ws, "turn", session="ghost", turn=99)
        _epoch.all_of(txn, store._db, ws)
        raise RuntimeError("abort")
    return "aborted"


@pytest.mark.parametrize("seed", range(12))
def test_every_answer_is_the_stores(store, ws, seed):
    """Turns, ends, captures, rewinds, gc and aborted writes in random order: after
    each, the answer is what the database holds, record for record."""
    rng = random.Random(seed)
    turn = [0]
    for _ in range(60):
        step = _random_step(store, ws, rng, turn)
        assert store.epochs(ws) == _the_long_way(store, ws), step


def test_an_aborted_write_leaves_no_ghost(store, ws):
    """A write transaction that opened an epoch, read the list, then aborted; the next
    write takes the same epoch id: its answer is the new epoch and the previous one's
    real end, not what the aborted write saw."""
    _turns(store, ws, 3)
    with pytest.raises(RuntimeError), store._w() as txn:
        _epoch.open_new(txn, store._db, ws, "turn", session="ghost", turn=1)
        assert _epoch.all_of(txn, store._db, ws)[-1].session == "ghost"
        raise RuntimeError("abort")
    store.begin_turn(ws, "real", 1, "after")
    got = store.epochs(ws)
    assert got == _the_long_way(store, ws)
    assert [e.session for e in got if e.session in ("ghost", "real")] == ["real"]


_OTHER_PROCESS = """
import sys
from rewindfs.store import Store
with Store.open(sys.argv[1]) as s:
    ws = int(sys.argv[2])
    for i in range(1, 4):
        s.begin_turn(ws, "other", i, "from another process")
    s.end_turn(ws)
    s.gc(grace_s=0, keep_epochs=4, drop_redo=True)
"""


def test_another_process_writing_is_seen(store, store_path, ws):
    """Another process begins turns and then gc drops all but four epochs, while this
    one holds a memo of the list: the next answer is the store's."""
    _turns(store, ws, 30)
    store.flush()
    before = store.epochs(ws)
    subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(store_path), str(ws)],
                   check=True)
    after = store.epochs(ws)
    assert after == _the_long_way(store, ws)
    assert len(after) == 4 and after != before[-4:]
    assert "other" in {e.session for e in after}


def test_a_store_from_before_the_token_is_read_and_upgraded(store_path, tmp_path):
    """A version-5 store (no token) opened by this version: read right at once, marked
    version 6 (a version-5 program, which would change epochs without renewing the
    token, must refuse it), and remembered only from its first change on."""
    root = tmp_path / "w5"
    root.mkdir()
    with Store.open(store_path) as s:
        ws = s.workspace(bytes(root))
        _turns(s, ws, 4)
        with s._w() as txn:
            txn.delete(S.epochs_token_key(ws), db=s._db["meta"])
            txn.put(b"schema", S.pack(5), db=s._db["meta"])
    with Store.open(store_path) as s:
        s._db.memo.clear()
        assert s.epochs(ws) == _the_long_way(s, ws)
        assert ("epochs", ws) not in s._db.memo      # no token: nothing to check against
        with s._r() as txn:
            assert S.unpack(txn.get(b"schema", db=s._db["meta"])) == 6
        s.begin_turn(ws, "s", 9, "after the upgrade")
        assert s.epochs(ws) == _the_long_way(s, ws)
        assert ("epochs", ws) in s._db.memo
