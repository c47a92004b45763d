"""The CLI as a person's shell runs it, no mount (issue 14, "the daemon outlives its
clients"): read-only commands never finish an interrupted rewind, and a closed stdout
(``rewindfs --json log | head -2``) ends a command quietly with 141, as git does.

Every command runs as a real subprocess of the installed ``rewindfs`` script; the
interrupted rewind is a real one, killed by the restore engine's fault hook
(``REWINDFS_FAULT_AFTER``) after its 5th change.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from restorekit import History
from rewindfs.store import Store
from treesnap import compare, snapshot

REWINDFS = str(Path(sys.executable).with_name("rewindfs"))
N = 40


def rewindfs(store, *args, cwd, env=None, stdout=subprocess.PIPE):
    return subprocess.run([REWINDFS, "--store", os.fspath(store), *map(os.fspath, args)],
                          cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120, env=dict(os.environ, **(env or {})))


@pytest.fixture
def ws(tmp_path):
    """f00..f39 ("v0"), turn 1 of s1 rewrites them all ("v1") and adds new/…; 200 more
    turns each add a file, so ``log`` has many lines."""
    root, store = tmp_path / "ws", tmp_path / "store"
    root.mkdir()
    with Store.open(store) as s:
        h = History(s, root)
        for i in range(N):
            h.write(b"f%02d" % i, b"v0 %d\n" % i)
        h.turn(1)
        for i in range(N):
            h.write(b"f%02d" % i, b"v1 %d\n" % i + b"x" * 4096)
        h.mkdir(b"new")
        h.write(b"new/a", b"a")
        for t in range(2, 200):
            h.turn(t)
            h.write(b"t%03d" % t, b"turn %d\n" % t)
        h.end_turn()
        h.close()
    return root, store


def _intent(store, root) -> bool:
    with Store.open(store, create=False) as s:
        ws, _ = s.workspace_containing(os.fsencode(os.path.realpath(root)))
        return s.get_intent(ws) is not None


def test_read_only_commands_never_finish_an_interrupted_rewind(ws):
    root, store = ws
    res = rewindfs(store, "rewind", "t1", cwd=root, env={"REWINDFS_FAULT_AFTER": "5"})
    assert res.returncode == -9, res.stderr         # killed half-way: an intent is left
    assert _intent(store, root)
    half = snapshot(root)
    for args in (["log"], ["status"], ["diff", "t1"], ["show", "t1", "f00"],
                 ["rewind", "t1", "--dry-run"], ["--json", "log"], ["--json", "status"]):
        res = rewindfs(store, *args, cwd=root)
        assert res.returncode == 0, (args, res.stderr)
        assert compare(half, snapshot(root)) == [], args    # not one byte written
        assert _intent(store, root), args
        said = res.stderr + res.stdout
        assert "interrupted rewind is pending" in said, (args, said)
    assert rewindfs(store, "show", "t1", "f00", cwd=root).stdout == "v0 0\n"


def test_rewind_says_it_finishes_an_interrupted_rewind_first(ws):
    root, store = ws
    before = snapshot(root)
    res = rewindfs(store, "rewind", "t1", cwd=root, env={"REWINDFS_FAULT_AFTER": "5"})
    assert res.returncode == -9, res.stderr
    res = rewindfs(store, "redo", cwd=root)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines()[0] == "warning: finishing an interrupted rewind first"
    assert not _intent(store, root)
    assert compare(before, snapshot(root)) == []       # finished to t1, then redone


def _closed_pipe():
    """A pipe whose reader is already gone: the first write to it fails (EPIPE), as
    ``| head -2`` does once head has its two lines."""
    r, w = os.pipe()
    os.close(r)
    return w


@pytest.mark.parametrize("args", [["--json", "log"], ["log"], ["show", "t1", "f05"],
                                  ["--json", "show", "t1", "f05"], ["diff", "t1"],
                                  ["--json", "diff", "t1"], ["status"]],
                         ids=" ".join)
def test_a_closed_stdout_exits_141_quietly(ws, args):
    root, store = ws
    w = _closed_pipe()
    try:
        res = rewindfs(store, *args, cwd=root, stdout=w)
    finally:
        os.close(w)
    assert (res.returncode, res.stderr) == (141, ""), res.stderr



def test_ctrl_c_in_a_terminal_mid_offline_rewind_finishes_it_first(tmp_path):
    """No daemon: the rewind lands in the CLI's own process.  Ctrl-C (a real one, on a
    pty) while it is paused after its 500th change is deferred: the rewind finishes,
    the last line says so, exit 130, no intent left, the tree is the point's."""
    from ptykit import Terminal
    root, store = tmp_path / "ws", tmp_path / "store"
    root.mkdir()
    n = 2000
    with Store.open(store) as s:
        h = History(s, root)
        for i in range(n):
            h.write(b"f%04d" % i, b"v0 %d\n" % i)
        target = snapshot(root)
        h.turn(1)
        for i in range(n):
            h.write(b"f%04d" % i, b"v1 %d\n" % i)
        h.end_turn()
        h.close()
    pause = tmp_path / "pause"
    term = Terminal([REWINDFS, "--store", str(store), "rewind", "t1"], cwd=root,
                    env={"REWINDFS_PAUSE_AFTER": "500", "REWINDFS_PAUSE_FILE": str(pause)})
    with term:
        term.wait_for_file(pause)
        term.wait_for("rewinding to")
        term.ctrl_c()
        term.wait_for("finishing the rewind first")
        pause.unlink()
        status = term.wait()
    assert status == 130, term.text()[-3000:]
    assert "was finished first" in term.last_line(), term.lines()[-5:]
    assert not _intent(store, root)
    assert compare(target, snapshot(root)) == []


def test_ctrl_c_while_redo_finishes_an_interrupted_rewind_starts_nothing_new(ws):
    """``redo`` first finishes a rewind killed half-way; Ctrl-C (on a pty) during that
    is deferred until it is finished, and then the redo itself does not start."""
    from ptykit import Terminal
    root, store = ws
    res = rewindfs(store, "rewind", "t1", cwd=root, env={"REWINDFS_FAULT_AFTER": "5"})
    assert res.returncode == -9, res.stderr
    pause = root.parent / "pause"
    term = Terminal([REWINDFS, "--store", str(store), "redo"], cwd=root,
                    env={"REWINDFS_PAUSE_AFTER": "3", "REWINDFS_PAUSE_FILE": str(pause)})
    with term:
        status = term.ctrl_c_in_pause(pause, "finishing the redo first")
    assert status == 130, term.text()[-3000:]
    assert "this redo did not start" in term.last_line(), term.lines()[-5:]
    assert not _intent(store, root)
    # the rewind to t1, finished: turn 1's state and nothing newer
    assert sorted(os.listdir(root)) == [f"f{i:02d}" for i in range(N)]
    assert all((root / f"f{i:02d}").read_bytes() == b"v0 %d\n" % i for i in range(N))
