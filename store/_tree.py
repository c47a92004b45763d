"""The state tree: a workspace's epochs as a tree of states (for ``rewindfs log --tree``).

Contract (issue 15): each epoch E hangs under the state it started from.  For a point P,
``anchor(P)``: Q = the epoch before P in the workspace; no Q → the root (``None``); Q a
``turn``/``idle`` → Q; Q a ``rewind``/``redo`` with target T → ``anchor(T)``.  Then
``parent(E) = anchor(E)`` for every kind.  So after "rewind to t2" the next epoch is a
sibling of t2, and the rewind epoch itself is a leaf on the branch it left (its point is
that branch's tip).  Since ``anchor(T) = parent(T)``, one pass in id order computes every
parent from earlier ones.  A target the workspace no longer has (dropped by gc, or a
damaged record) anchors at the root: the tree never invents an edge.

The newest epoch (the open one) is the current state.  A child session (``fork``
record: parent session, boundary turn) marks its first turn epoch here as a fork.

Where a session's own files are (``own_files``, for a harness's "back to this
session's files"): the state its newest turn here left.  They are *here* while that
turn is at or above the state the workspace is in now (later turns of any session
built on them), else *away*, and the point to go back to is the newest rewind or redo
that started from at or below that turn: its point is that tree, the edits made after
the turn included.

Pure data: reads only; costs one pass over the workspace's epochs and one session record
per session named.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import _epoch, _session
from ._epoch import Epoch

__all__ = ["Fork", "Node", "OwnFiles", "build", "history", "own_files", "parents"]

_STATE_KINDS = ("turn", "idle")     # an epoch of these kinds is itself a state to hang under


@dataclass(frozen=True)
class Fork:
    """The first turn of a child session: forked from ``session`` at turn ``turn``."""
    session: str
    turn: int | None


@dataclass(frozen=True)
class Node:
    epoch: Epoch
    parent: int | None          # epoch id, None = the root
    children: tuple[int, ...]   # epoch ids, ascending
    current: bool               # the newest (open) epoch: the state the workspace is in
    fork: Fork | None = None

    def as_dict(self) -> dict:
        """The node in the control protocol and ``--json`` output: the epoch's point
        fields plus ``parent``, ``children``, ``current`` and ``fork``."""
        fork = None if self.fork is None else {"session": self.fork.session,
                                               "turn": self.fork.turn}
        return {**self.epoch.as_point(), "parent": self.parent,
                "children": list(self.children), "current": self.current, "fork": fork}


def parents(epochs: list[Epoch]) -> dict[int, int | None]:
    """epoch id → parent epoch id (None: the root) by the anchor rule; ``epochs`` are
    one workspace's, in id order."""
    out: dict[int, int | None] = {}
    prev = None
    for e in epochs:
        out[e.id] = _anchor_after(prev, out)
        prev = e
    return out


def _anchor_after(q: Epoch | None, known: dict[int, int | None]) -> int | None:
    """anchor(P) for the point P that follows epoch ``q``."""
    if q is None:
        return None
    if q.kind in _STATE_KINDS:
        return q.id
    # rewind / redo: the state it restored, i.e. anchor(target) = parent(target); only a
    # target earlier than q counts (a later one would be damage: no cycle, no invention)
    target = q.target
    if isinstance(target, int) and target < q.id and target in known:
        return known[target]
    return None


def build(epochs: list[Epoch], forks: dict[str, Fork] | None = None) -> list[Node]:
    """The nodes of one workspace's ``epochs`` (id order), in id order.  ``forks``:
    session → where it was forked (its first turn epoch is marked)."""
    forks = forks or {}
    parent_of = parents(epochs)
    children: dict[int, list[int]] = {e.id: [] for e in epochs}
    for eid, parent in parent_of.items():
        if parent is not None:
            children[parent].append(eid)
    first_turn: dict[str, int] = {}
    for e in epochs:
        if e.kind == "turn" and e.session is not None:
            first_turn.setdefault(e.session, e.id)
    fork_at = {eid: forks[s] for s, eid in first_turn.items() if s in forks}
    newest = epochs[-1].id if epochs else None
    return [Node(e, parent_of[e.id], tuple(children[e.id]), e.id == newest, fork_at.get(e.id))
            for e in epochs]


def history(txn, db, ws: int) -> list[Node]:
    """The state tree of workspace ``ws`` (one read transaction), in id order."""
    epochs = _epoch.all_of(txn, db, ws)
    forks = {}
    for session in sorted({e.session for e in epochs if e.kind == "turn" and e.session}):
        record = _session._record(txn, db, session)   # (parent, boundary, created) or None
        if record is not None and record[0] is not None:
            forks[session] = Fork(record[0], record[1])
    return build(epochs, forks)


@dataclass(frozen=True)
class OwnFiles:
    """Where one session's own files are (``own_files``).  ``state``: ``none`` (no turn
    of its own here), ``here`` or ``away``; ``turn``: its newest turn here; away,
    ``left``: the newest rewind or redo that started from them (point ``e<left>`` is
    that tree; None when no point holds them any more, e.g. gc dropped it),
    ``holder``: the session whose turn the state now is under (None: no turn above it)
    and ``undoes``: the (session, turn) of every turn whose work a rewind to
    ``e<left>`` takes out of the workspace, newest first (a harness stops what they
    left running before it rewinds)."""
    state: str
    turn: int | None = None
    left: int | None = None
    holder: str | None = None
    undoes: tuple[tuple[str | None, int | None], ...] = ()

    def as_dict(self) -> dict:
        return {"state": self.state, "turn": self.turn, "left": self.left,
                "holder": self.holder,
                "undoes": [{"session": s, "turn": t} for s, t in self.undoes]}


def own_files(epochs: list[Epoch], parent_of: dict[int, int | None],
              session: str) -> OwnFiles:
    """Where ``session``'s own files are: ``epochs`` one workspace's in id order,
    ``parent_of`` their parents (``parents``).  One pass over the epochs after its
    newest turn, plus walks up from the state now."""
    own = [e for e in epochs if e.kind == "turn" and e.session == session]
    if not own:
        return OwnFiles("none")
    last = own[-1]
    below = {last.id}       # the states at or below it: a parent always precedes its child
    leaving = None          # the newest rewind or redo that started from one of them
    for e in epochs:
        if e.id > last.id and parent_of[e.id] in below:
            below.add(e.id)
            if e.kind in ("rewind", "redo"):
                leaving = e.id
    now = _anchor_after(epochs[-1], parent_of)      # the state the next point hangs under
    if now in below:
        return OwnFiles("here", turn=last.turn)
    by_id = {e.id: e for e in epochs}
    turns_now = [by_id[s] for s in _up(parent_of, now) if by_id[s].kind == "turn"]
    holder = turns_now[0].session if turns_now else None
    if leaving is None:
        return OwnFiles("away", turn=last.turn, holder=holder)
    kept = set(_up(parent_of, parent_of[leaving]))   # the state that point restores
    undoes = tuple((e.session, e.turn) for e in turns_now if e.id not in kept)
    return OwnFiles("away", turn=last.turn, left=leaving, holder=holder, undoes=undoes)


def _up(parent_of: dict[int, int | None], state: int | None):
    """``state`` and the states above it, up to the root."""
    while state is not None and state in parent_of:
        yield state
        state = parent_of[state]
