"""Crash safety of a rewind: the rewinding process SIGKILLs itself after its k-th change
(``REWINDFS_FAULT_AFTER=k``, the test hook in ``overlay.rewind.land``).  Afterwards
every file is its old or its new version — never torn — ``recover`` finishes the
rewind from its intent, and a second rewind (the redo) works.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from rewindfs.overlay.rewind.engine import apply_plan, plan_redo, recover
from restorekit import History
from rewindfs.store import Store
from store_fixtures import assert_sound
from treesnap import compare, snapshot

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIG = 300 << 10     # above the store's inline limit: a blob file, several chunks

CHILD = textwrap.dedent("""
    import os, sys
    from rewindfs.store import Store
    from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind
    store_path, ws_path, point = sys.argv[1:4]
    store = Store.open(store_path)
    ws = store.workspace(os.fsencode(ws_path))
    fd = os.open(ws_path, os.O_RDONLY | os.O_DIRECTORY)
    plan = plan_rewind(fd, store, ws, point)
    result = apply_plan(fd, store, ws, plan, session=None)
    sys.exit(result.exit_code)
""")


def make_history(h: History, rng: random.Random):
    os.makedirs(h.p(b"d/sub"))
    names = [b"f%d" % i for i in range(6)] + [b"d/g%d" % i for i in range(4)]
    for n in names:
        with open(h.p(n), "wb") as f:
            f.write(rng.randbytes(rng.choice((0, 10, 4000, BIG))))
    base = snapshot(h.root)
    e1 = h.turn(1)
    for n in names:
        choice = rng.random()
        if choice < 0.5:
            h.write(n, rng.randbytes(rng.choice((7, 5000, BIG + 1))))
        elif choice < 0.7:
            h.remove(n)
        elif choice < 0.85:
            h.chmod(n, 0o600)
    h.write(b"d/sub/new", b"new file")
    h.rename(b"d/sub", b"d/moved")
    h.write(b"fresh", rng.randbytes(BIG))
    h.end_turn()
    return e1, base, snapshot(h.root)


def versions(snap) -> dict:
    tree, _links = snap
    return {p: n.data for p, n in tree.items() if n.kind == "file"}


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 7, 8])
def test_killed_rewind_is_finished_by_recover(tmp_path, seed):
    rng = random.Random(seed)
    (tmp_path / "ws").mkdir()
    store = Store.open(tmp_path / "store")
    h = History(store, tmp_path / "ws")
    try:
        e1, base, after = make_history(h, rng)
        k = seed if seed <= 3 else rng.randint(4, 24)   # a full run takes ~25 changes
        env = dict(os.environ, REWINDFS_FAULT_AFTER=str(k),
                   PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "store"),
                               h.root, f"e{e1}"], env=env, capture_output=True)
        assert proc.returncode in (-signal.SIGKILL, 0), proc.stderr.decode()

        # Mid-crash: each file is wholly its old or its new version (temps aside).
        old, new = versions(after), versions(base)
        crashed = versions(snapshot(h.root))
        for path, data in crashed.items():
            if os.path.basename(path).startswith(b".rewindfs~"):
                continue
            assert data in (old.get(path), new.get(path)), f"torn: {path!r} (k={k})"

        if proc.returncode == 0:
            assert store.get_intent(h.ws) is None
        else:
            assert store.get_intent(h.ws) is not None
        recover(h.fd, store, h.ws)
        assert store.get_intent(h.ws) is None
        assert compare(base, snapshot(h.root)) == []
        assert recover(h.fd, store, h.ws) is None

        redo = apply_plan(h.fd, store, h.ws, plan_redo(h.fd, store, h.ws), session=None)
        assert redo.failed == []
        assert compare(after, snapshot(h.root)) == []
        assert_sound(store)
    finally:
        h.close()
        store.close()
