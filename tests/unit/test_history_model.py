"""Issue 15: a model-based test of history semantics (hypothesis state machine).

Random sequences of turns (two sessions, the second a fork of the first), edits between
turns, rewinds (by turn — with and without a session — and by epoch, owned by a session
or by the manual owner), redos and forced redos run against the real store and the real
restore engine on a real directory (captured as the filesystem would, ``restorekit``).
A model written from the rules in docs/history.md, not from the code, predicts after
every step:

- the tree (every point is the tree as it stood when that epoch began);
- which rewind ``redo`` undoes (a stack per owner, last in first out) and that an empty
  stack is ``nothing-to-redo``;
- that a redo is refused as ``redo-stale`` exactly when something changed the tree after
  the rewind — other than a rewind and its redo both made after it — and the tree is not
  back as the rewind left it, and then changes nothing;
- that a bare turn number means the only session's turn, and is ``ambiguous-point`` with
  two sessions.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from restorekit import History
from rewindfs.overlay.rewind.engine import apply_plan, plan_redo, plan_rewind
from rewindfs.store import AmbiguousPoint, NothingToRedo, RedoStale, Store

NAMES = (b"a", b"b", b"c")
OWNERS = (None, "s1", "s2")


class Entry:
    """A rewind on the model's redo stack, and what happened after it."""

    def __init__(self, epoch: int, left: dict):
        self.epoch = epoch
        self.left = left            # the tree as the rewind left it
        self.changes: list = []     # ("write", epoch) | ("rewind", id) | ("redo", id)

    def stale(self) -> bool:
        """Something after this rewind changed the tree, other than a rewind and its
        redo that both came after it."""
        seen = set(self.changes)
        for kind, x in self.changes:
            if kind == "write":
                return True
            if kind == "rewind" and ("redo", x) not in seen:
                return True
            if kind == "redo" and ("rewind", x) not in seen:
                return True
        return False


class HistoryMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="rewindfs-model-")
        os.mkdir(os.path.join(self.tmp, "ws"))
        self.store = Store.open(os.path.join(self.tmp, "store"))
        self.h = History(self.store, os.path.join(self.tmp, "ws"))
        self.tree: dict[bytes, bytes] = {}
        self.counter = 0
        self.points = {self.store.current_epoch(self.h.ws).id: {}}  # epoch → tree at start
        self.turns: dict[str, dict[int, int]] = {}       # session → turn → epoch (own)
        self.fork_at: int | None = None                   # s2's boundary in s1
        self.stacks: dict = {o: [] for o in OWNERS}

    def teardown(self):
        self.h.close()
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the model's own bookkeeping ------------------------------------------------------
    def _opened(self, epoch_id: int) -> None:
        self.points[epoch_id] = dict(self.tree)

    def _changed(self, what, at: int) -> None:
        """``what`` changed the tree in epoch ``at``: every rewind before it sees it."""
        for stack in self.stacks.values():
            for entry in stack:
                if entry.epoch < at:
                    entry.changes.append(what)

    def _write(self, name: bytes) -> None:
        self.counter += 1
        data = b"v%d" % self.counter
        self.h.write(name, data)
        self.tree[name] = data
        now = self.store.current_epoch(self.h.ws).id
        self._changed(("write", now), now)

    def _delete(self, name: bytes) -> None:
        self.h.remove(name)
        del self.tree[name]
        now = self.store.current_epoch(self.h.ws).id
        self._changed(("write", now), now)

    def _session_points(self, session: str) -> dict[int, int]:
        own = dict(self.turns.get(session, {}))
        if session == "s2" and self.fork_at is not None:
            inherited = {t: e for t, e in self.turns.get("s1", {}).items() if t <= self.fork_at}
            own = {**inherited, **own}
        return own

    def _land(self, plan, owner, expected: dict, kind: str) -> None:
        before = dict(self.tree)
        result = apply_plan(self.h.fd, self.store, self.h.ws, plan, session=owner)
        assert result.failed == []
        self.points[result.epoch] = before
        self.tree = dict(expected)
        self._opened(self.store.current_epoch(self.h.ws).id)
        rewound = self.store.epoch(result.epoch)
        assert rewound.kind == kind and rewound.session == owner
        return rewound

    # -- rules ------------------------------------------------------------------------------
    @rule(session=st.sampled_from(("s1", "s2")), edits=st.lists(
        st.tuples(st.sampled_from(NAMES), st.booleans()), max_size=3))
    def a_turn(self, session, edits):
        if session == "s2" and self.fork_at is None:
            s1_turns = sorted(self.turns.get("s1", {}))
            self.fork_at = s1_turns[-1] if s1_turns else 0
            self.store.fork_session("s2", "s1", self.fork_at)
        n = max(self._session_points(session), default=0) + 1
        e = self.store.begin_turn(self.h.ws, session, n, f"{session} turn {n}")
        self._opened(e.id)
        self.turns.setdefault(session, {})[n] = e.id
        for name, delete in edits:
            if delete and name in self.tree:
                self._delete(name)
            else:
                self._write(name)
        self._opened(self.store.end_turn(self.h.ws).id)

    @rule(name=st.sampled_from(NAMES))
    def an_edit_between_turns(self, name):
        self._write(name)

    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def rewind_to_an_epoch(self, data, owner):
        target = data.draw(st.sampled_from(sorted(self.points)))
        plan = plan_rewind(self.h.fd, self.store, self.h.ws, f"e{target}")
        self._rewind(plan, owner, self.points[target])

    @rule(data=st.data(), owner=st.sampled_from(OWNERS), named=st.booleans())
    def rewind_to_a_turn(self, data, owner, named):
        sessions = [s for s in ("s1", "s2") if self._session_points(s)]
        if not sessions:
            return
        session = data.draw(st.sampled_from(sessions))
        turn = data.draw(st.sampled_from(sorted(self._session_points(session))))
        own = [s for s in ("s1", "s2") if self.turns.get(s)]
        if not named and len(own) > 1:          # a bare number, two sessions: refused
            before = self.store.current_epoch(self.h.ws).id
            with pytest.raises(AmbiguousPoint):
                plan_rewind(self.h.fd, self.store, self.h.ws, str(turn))
            assert self.store.current_epoch(self.h.ws).id == before
            return
        if not named:
            session = own[0]
            turn = data.draw(st.sampled_from(sorted(self._session_points(session))))
        plan = plan_rewind(self.h.fd, self.store, self.h.ws, str(turn),
                           session=session if named else None)
        epoch = self._session_points(session)[turn]
        assert plan.target == epoch
        self._rewind(plan, owner, self.points[epoch])

    def _rewind(self, plan, owner, expected):
        rewound = self._land(plan, owner, expected, "rewind")
        if rewound.paths:
            self._changed(("rewind", rewound.id), rewound.id)
        self.stacks[owner].append(Entry(rewound.id, dict(self.tree)))

    @rule(owner=st.sampled_from(OWNERS), force=st.booleans())
    def redo(self, owner, force):
        stack = self.stacks[owner]
        before = self.store.current_epoch(self.h.ws).id
        if not stack:
            with pytest.raises(NothingToRedo):
                plan_redo(self.h.fd, self.store, self.h.ws, session=owner, force=force)
            return
        top = stack[-1]
        if top.stale() and self.tree != top.left and not force:
            with pytest.raises(RedoStale) as refused:
                plan_redo(self.h.fd, self.store, self.h.ws, session=owner)
            assert refused.value.details["rewind"] == top.epoch
            assert self.store.current_epoch(self.h.ws).id == before
            return
        plan = plan_redo(self.h.fd, self.store, self.h.ws, session=owner, force=force)
        assert plan.undid == top.epoch
        redone = self._land(plan, owner, self.points[top.epoch], "redo")
        assert redone.target == top.epoch
        stack.pop()
        if redone.paths:
            self._changed(("redo", top.epoch), redone.id)

    # -- after every step ------------------------------------------------------------------
    @invariant()
    def the_tree_is_the_models(self):
        real = {}
        for name in NAMES:
            try:
                with open(self.h.p(name), "rb") as f:
                    real[name] = f.read()
            except FileNotFoundError:
                pass
        assert real == self.tree

    @invariant()
    def the_stacks_are_the_models(self):
        got = self.store.redo_stacks(self.h.ws)
        for owner in OWNERS:
            assert [e.id for e in got.get(owner, [])] == [e.epoch for e in self.stacks[owner]]


HistoryMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_history_model = HistoryMachine.TestCase
