"""Where a session's own files are (``store._tree.own_files``, the daemon's ``own.state``):
what the web UI's "↻ back to this session's files" (``/rewind own``) asks.

Histories are made through the Store API the way the daemon makes them (turn marks,
rewinds and redos with their ends), on a real LMDB store: the web UI's case first —
session p ran turns 1 and 2, ↺ on turn 2 landed in fork c, c ran its own turn 2.
"""

from __future__ import annotations

import random

import pytest

from rewindfs.overlay.control.history import own_state_sync
from rewindfs.overlay.errors import BadParams


class _Host:
    def __init__(self, store, ws):
        self.store, self.ws = store, ws


def where(store, ws, session) -> dict:
    return own_state_sync(_Host(store, ws), {"sessions": [session]})["sessions"][session]


def rewind(store, ws, target, owner, kind="rewind") -> int:
    e = store.begin_rewind(ws, target, owner, kind=kind).id
    store.end_rewind(ws)
    return e


def forked(store, ws):
    """p: turns 1, 2; a rewind owned by fork c to the start of p's turn 2; c's turn 2."""
    store.begin_turn(ws, "p", 1, "one")
    p2 = store.begin_turn(ws, "p", 2, "two").id
    store.end_turn(ws)
    into_c = rewind(store, ws, p2, "c")
    return p2, into_c


def test_right_after_a_rewind_into_a_fork_the_parents_files_are_away(store, ws):
    _, into_c = forked(store, ws)
    # c ran nothing yet: the state is p's turn 1, so p holds the workspace, not its own
    assert where(store, ws, "p") == {"state": "away", "turn": 2, "left": into_c, "holder": "p",
                                     "undoes": []}
    assert where(store, ws, "c") == {"state": "none", "turn": None, "left": None, "holder": None,
                                     "undoes": []}


def test_rewind_own_and_its_redo_move_the_files_between_the_sessions(store, ws):
    _, into_c = forked(store, ws)
    store.begin_turn(ws, "c", 2, "the fork's way")
    store.begin_turn(ws, "c", 3, "and further")
    store.end_turn(ws)
    # going back to p's files takes c's two turns out of the workspace
    assert where(store, ws, "p") == {"state": "away", "turn": 2, "left": into_c, "holder": "c",
                                     "undoes": [{"session": "c", "turn": 3},
                                                {"session": "c", "turn": 2}]}
    assert where(store, ws, "c")["state"] == "here"
    back = rewind(store, ws, into_c, "p")                   # /rewind own in p
    assert where(store, ws, "p") == {"state": "here", "turn": 2, "left": None, "holder": None,
                                     "undoes": []}
    assert where(store, ws, "c") == {"state": "away", "turn": 3, "left": back, "holder": "p",
                                     "undoes": [{"session": "p", "turn": 2}]}
    redo = rewind(store, ws, back, "p", kind="redo")        # /redo in p undoes it
    assert where(store, ws, "c")["state"] == "here"
    assert where(store, ws, "p")["left"] == redo and where(store, ws, "p")["holder"] == "c"


def test_another_sessions_turns_on_top_keep_them_here(store, ws):
    store.begin_turn(ws, "p", 1, "one")
    store.begin_turn(ws, "p", 2, "two")
    store.end_turn(ws)
    store.begin_turn(ws, "q", 1, "built on p's files")
    store.end_turn(ws)
    assert where(store, ws, "p")["state"] == "here"


def test_a_rewind_within_the_session_takes_its_newest_turn_away(store, ws):
    t1 = store.begin_turn(ws, "p", 1, "one").id
    store.begin_turn(ws, "p", 2, "two")
    store.end_turn(ws)
    undo = rewind(store, ws, t1, "p")
    # the state is the root (before turn 1): turn 2's tree is at point e<undo>
    assert where(store, ws, "p") == {"state": "away", "turn": 2, "left": undo, "holder": None,
                                     "undoes": []}


def test_one_request_answers_for_several_sessions(store, ws):
    forked(store, ws)
    got = own_state_sync(_Host(store, ws), {"sessions": ["p", "c", "nobody"]})["sessions"]
    assert [got[s]["state"] for s in ("p", "c", "nobody")] == ["away", "none", "none"]


@pytest.mark.parametrize("params", [
    {}, {"sessions": "p"}, {"sessions": []}, {"sessions": [""]}, {"sessions": [5]},
    {"sessions": ["p", None]}, {"sessions": ["\ud800"]}, {"sessions": ["s"] * 257},
])
def test_bad_params_are_refused(store, ws, params):
    forked(store, ws)
    with pytest.raises(BadParams) as exc:
        own_state_sync(_Host(store, ws), params)
    assert exc.value.code == "bad-params" and "sessions" in exc.value.message


def _random_history(store, ws, rng, numbers):
    """Turns of three sessions (numbered on from ``numbers``), turn ends, rewinds to any
    earlier point and redos of any rewind, as the daemon would file them (a rewind
    opens its epoch and ends it)."""
    for _ in range(rng.randint(5, 40)):
        epochs = store.epochs(ws)
        roll = rng.random()
        if roll < 0.55 or not epochs:
            s = rng.choice("pqc")
            numbers[s] += 1
            store.begin_turn(ws, s, numbers[s], "t", force=True)
            if rng.random() < 0.5:
                store.end_turn(ws)
        elif roll < 0.85:
            store.end_turn(ws) if store.open_turn(ws) else None
            rewind(store, ws, rng.choice(epochs).id, rng.choice("pqc"))
        else:
            rewinds = [e for e in epochs if e.kind == "rewind"]
            if rewinds:
                store.end_turn(ws) if store.open_turn(ws) else None
                rewind(store, ws, rng.choice(rewinds).id, rng.choice("pqc"), kind="redo")


@pytest.mark.parametrize("seed", range(40))
def test_a_rewind_to_the_point_named_puts_the_files_back_and_undoes_what_it_names(
        store, tmp_path, seed):
    """Whatever the history: when a session's files are away at point e<left>, a
    rewind there makes them here, and the turns it took out of the workspace are
    exactly ``undoes`` (the turns above the state before and not above the state
    after, as the history tree draws them)."""
    rng = random.Random(seed)
    root = tmp_path / f"ws{seed}"
    root.mkdir()
    ws = store.workspace(bytes(root))
    numbers = {"p": 0, "q": 0, "c": 0}
    for _ in range(20):             # until some session's files are away at a point
        _random_history(store, ws, rng, numbers)
        away = [s for s in "pqc" if where(store, ws, s)["left"] is not None]
        if away:
            break
    assert away, f"seed {seed}: no history with files away"
    for s in away[:1]:
        before = where(store, ws, s)
        above_before = _turns_above_now(store, ws)
        if store.open_turn(ws):
            store.end_turn(ws)
        rewind(store, ws, before["left"], s)
        assert where(store, ws, s)["state"] == "here", (seed, s, before)
        above_after = _turns_above_now(store, ws)
        gone = [t for t in above_before if t not in above_after]
        assert [(u["session"], u["turn"]) for u in before["undoes"]] == gone, (seed, s)


def _turns_above_now(store, ws) -> list:
    """(session, turn) of the turns on the path from the state now up to the root,
    newest first, read off the history tree's nodes (``history``)."""
    nodes = {n["epoch"]: n for n in (node.as_dict() for node in store.history(ws))}
    newest = max(nodes)
    cur = nodes[newest]
    if cur["kind"] in ("turn", "idle"):
        state = newest
    else:                                    # an open rewind: the state its target found
        state = nodes[cur["target"]]["parent"] if cur["target"] in nodes else None
    out = []
    while state is not None:
        n = nodes[state]
        if n["kind"] == "turn":
            out.append((n["session"], n["turn"]))
        state = n["parent"]
    return out
