"""Model test of the restore engine without a mount: random real-syscall changes over
several turns (captured write-ahead by ``restorekit.History`` as a correct filesystem
would, including every name of a multiply-linked inode), then rewinds to every point
and redos — each must give the tree snapshotted at that point, link counts included.
"""

from __future__ import annotations

import os
import random

import pytest

from rewindfs.overlay.rewind.engine import apply_plan, plan_redo, plan_rewind
from restorekit import History
from rewind_agent import Agent
from rewindfs.store import Store
from store_fixtures import assert_sound
from treesnap import compare, snapshot


def rewind(h, to):
    res = apply_plan(h.fd, h.store, h.ws, plan_rewind(h.fd, h.store, h.ws, to), session=None)
    assert res.failed == [], res.failed


@pytest.mark.parametrize("seed", range(int(os.environ.get("RESTORE_SEEDS", "8"))))
def test_random_history_every_point_and_redo(tmp_path, seed):
    rng = random.Random(seed)
    (tmp_path / "ws").mkdir()
    store = Store.open(tmp_path / "store")
    h = History(store, tmp_path / "ws")
    try:
        agent = Agent(os.fsdecode(h.root), rng, links=True, guard=h.guard)
        for _ in range(20):
            agent.step()
        points, snaps = [], []
        for turn in range(1, 7):
            snaps.append(snapshot(h.root))
            points.append(h.turn(turn))
            for _ in range(rng.randrange(10, 30)):
                agent.step()
        h.end_turn()
        state = snapshot(h.root)
        order = list(range(len(points)))
        rng.shuffle(order)
        for i in order:
            rewind(h, f"e{points[i]}")
            diffs = compare(snaps[i], snapshot(h.root))
            assert diffs == [], f"rewind to turn {i + 1}:\n" + "\n".join(diffs[:20])
            res = apply_plan(h.fd, store, h.ws, plan_redo(h.fd, store, h.ws), session=None)
            assert res.failed == []
            diffs = compare(state, snapshot(h.root))
            assert diffs == [], f"redo after turn {i + 1}:\n" + "\n".join(diffs[:20])
            rewind(h, f"e{points[i]}")
            state = snaps[i]
        assert_sound(store)
    finally:
        h.close()
        store.close()
