"""A turn that edits ``.rewindignore`` cannot take its own changes out of the history.

Found from outside: an agent's turn wrote ``.rewindignore`` with ``*.txt`` and
``data/``, then deleted ``a.txt`` and ``data/``.  The new rules took effect at once, so
neither deletion was captured, and the rewind of that turn said it restored one path
(``.rewindignore``, removed) while ``a.txt`` and ``data/`` stayed gone: lost, with no
way back.  Now a rule takes effect for capture at the next turn boundary (a path is
exempt only where the rules the epoch began with *and* the rules now both ignore it),
and a rewind restores what either the rules now or the rules of the point it goes back
to track.  Real daemon, real CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys

from mountkit import cli, mounted
from treesnap import compare, snapshot


def _turn(ws, store, n: int, act) -> None:
    assert cli("turn", "begin", "--session", "s", "--turn", str(n), "-C", ws,
               store=store).returncode == 0
    act()
    assert cli("turn", "end", "-C", ws, store=store).returncode == 0


def test_a_rule_added_in_a_turn_does_not_hide_what_the_turn_deletes(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "a.txt").write_text("precious\n")
    (ws / "data").mkdir()
    (ws / "data" / "d1").write_text("d1\n")
    (ws / "keep.md").write_text("kept\n")
    with mounted(ws, store) as m:
        before = snapshot(m.ws)

        def agent():
            (m.ws / ".rewindignore").write_text("*.txt\ndata/\n")
            (m.ws / "a.txt").unlink()
            (m.ws / "data" / "d1").unlink()
            (m.ws / "data").rmdir()
            (m.ws / "keep.md").write_text("changed\n")
        _turn(ws, store, 1, agent)
        after = snapshot(m.ws)

        res = cli("rewind", "t1", "--session", "s", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert compare(before, snapshot(m.ws)) == []        # a.txt and data/ are back
        res = cli("redo", "--session", "s", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert compare(after, snapshot(m.ws)) == []

        # From the next turn on, the rule is in force: what it ignores is not captured,
        # and a rewind leaves it alone (DESIGN invariant 7, unchanged).
        (m.ws / "b.txt").write_text("ignored from turn 2\n")
        _turn(ws, store, 2, lambda: (m.ws / "b.txt").write_text("changed in turn 2\n"))
        res = cli("rewind", "t2", "--session", "s", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert (m.ws / "b.txt").read_text() == "changed in turn 2\n"
        assert (m.ws / ".rewindignore").read_text() == "*.txt\ndata/\n"


def _answered(m, argv) -> None:
    """Run *argv* against the mount *m*; it must end, with status 0, within a minute."""
    proc = subprocess.Popen(argv)
    try:
        assert proc.wait(timeout=60) == 0
    except subprocess.TimeoutExpired:
        # the process waits in the kernel for the daemon's answer, where no signal
        # reaches it: only the daemon's death lets it go
        m.proc.kill()
        proc.wait()
        raise AssertionError(f"{argv[-1][:60]}: the daemon never answered") from None


def test_a_rule_that_backtracks_forever_does_not_hang_the_mount(tmp_path):
    """An agent (or a prompt it read) writes ``a*a*…*b`` into ``.rewindignore``.  The
    rules were matched with Python's backtracking ``re``, where such a pattern against
    a long name that almost matches takes exponential time: one create of a 200-byte
    name hung the daemon's only thread, so every process in the workspace and every
    turn mark hung with it.  Matching is now linear (RE2).  Names that are not UTF-8,
    in rules and in the tree, still match byte for byte, as in git."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / ".rewindignore").write_bytes(b"a*" * 12 + b"b\n\xff*.bin\n")
    with mounted(ws, store) as m:
        def agent():
            write = "import sys, os; open(os.fsencode(sys.argv[1]), 'wb').write(b'x')"
            for name in ["a" * 200 + "c", "a" * 30 + "b", os.fsdecode(b"\xffdata.bin"),
                         os.fsdecode(b"\xfeother.bin")]:
                _answered(m, [sys.executable, "-c", write, str(m.ws / name)])

        _turn(m.ws, m.store, 1, agent)
        res = cli("rewind", "t1", "-C", m.ws, store=m.store)
        assert res.returncode == 0, res.stderr
        left = sorted(os.listdir(os.fsencode(m.ws)))
        # the two names the rules match were ignored (kept); the others were rewound
        assert left == sorted([b".rewindignore", b"a" * 30 + b"b", b"\xffdata.bin"]), left


def test_a_fifo_named_rewindignore_does_not_hang_the_mount(tmp_path):
    """``mkfifo .rewindignore`` (an agent's or a prank): the daemon reloads the rules
    when that name is created, and opened the FIFO to read them — which waits for a
    writer that never comes.  The mkfifo, and then every process in the workspace,
    hung for good (the daemon in ``wait_for_partner``); a mount over a directory holding
    such a FIFO never came up.  A ``.rewindignore`` that is not a regular file is no
    rules, as a directory of that name already was."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with mounted(ws, store) as m:
        _answered(m, ["mkfifo", str(m.ws / ".rewindignore")])
        _turn(m.ws, m.store, 1, lambda: _answered(m, ["touch", str(m.ws / "a.log")]))
        assert cli("rewind", "t1", "-C", m.ws, store=m.store).returncode == 0
        assert sorted(os.listdir(m.ws)) == [".rewindignore"]       # a.log was captured
    res = cli("mount", ws, store=store, timeout=60)                 # over the FIFO
    assert res.returncode == 0, res.stderr
    assert cli("unmount", ws, store=store).returncode == 0
