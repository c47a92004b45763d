"""Issue 15, the scenarios a new user met, through the real CLI on a real mount.

- ``rewindfs rewind 1`` with no ``--session`` meant *epoch* 1 and rewound at once; now
  a bare number is a turn: of the only session (the reply names it), and refused with
  the sessions listed when there are several (nothing changed, exit 3).
- ``redo`` toggled: a second redo undid the first.  Now it is a stack: the second redo
  says ``nothing-to-redo`` (exit 2) and changes nothing.
- ``redo --session s1`` undid an older rewind of s1 instead of the CLI rewind just made
  (that one belonged to nobody).  Now a rewind without a session belongs to the manual
  owner, and ``redo`` without a session undoes it.
- A redo that would discard changes made after the rewind is refused as ``redo-stale``,
  naming them; ``--force`` discards them (they stay a point).
"""

from __future__ import annotations

import json

import pytest

from mountkit import cli, mounted

pytestmark = pytest.mark.mount


def turn(m, session, n, label, writes):
    m.call("turn.begin", session=session, turn=n, label=label)
    for name, data in writes.items():
        (m.ws / name).write_text(data)
    m.call("turn.end", session=session)


def files(ws):
    return {p.name: p.read_text() for p in sorted(ws.iterdir()) if p.is_file()}


def run(m, *args):
    return cli(*args, "-C", m.ws, store=m.store)


def errors(res):
    return [json.loads(line) for line in res.stdout.splitlines()
            if json.loads(line).get("type") == "error"]


@pytest.fixture
def m(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with mounted(ws, tmp_path / "store") as mount:
        yield mount


def test_a_bare_number_is_the_only_sessions_turn_never_an_epoch(m):
    turn(m, "s1", 1, "make a parser", {"a": "1"})
    turn(m, "s1", 2, "make it per-tenant", {"a": "2", "b": "2"})
    turn(m, "s1", 3, "break it", {"a": "3"})
    res = run(m, "rewind", "2")
    assert res.returncode == 0, res.stderr
    assert files(m.ws) == {"a": "1"}               # the start of turn 2, not epoch 2
    assert "turn 2 of s1" in res.stdout and "make it per-tenant" in res.stdout, res.stdout


def test_a_bare_number_with_several_sessions_is_refused_and_changes_nothing(m):
    turn(m, "s1", 1, "one", {"a": "1"})
    turn(m, "s1", 2, "two", {"a": "2"})
    turn(m, "s2", 1, "other", {"b": "1"})
    before = files(m.ws)
    res = run(m, "rewind", "1")
    assert res.returncode == 3, res.stdout + res.stderr
    assert "1 is a turn of which session? s1 (turns 1–2), s2 (turn 1)" in res.stderr
    assert "--session" in res.stderr and "write e1 for epoch 1" in res.stderr
    assert files(m.ws) == before
    res = run(m, "--json", "rewind", "t2")
    (err,) = errors(res)
    assert err["code"] == "ambiguous-point" and res.returncode == 3
    assert err["data"]["choices"] == [{"session": "s1", "turns": [1, 2]},
                                      {"session": "s2", "turns": [1, 1]}]
    assert files(m.ws) == before


def test_redo_is_a_stack_never_a_toggle(m):
    turn(m, "s1", 1, "one", {"a": "1"})
    turn(m, "s1", 2, "two", {"a": "2"})
    turn(m, "s1", 3, "three", {"a": "3"})
    assert run(m, "rewind", "3").returncode == 0
    assert run(m, "rewind", "2").returncode == 0
    assert files(m.ws) == {"a": "1"}
    res = run(m, "redo")                   # undoes the newest rewind: back at t3's start
    assert res.returncode == 0, res.stderr
    assert files(m.ws) == {"a": "2"}
    res = run(m, "redo")                   # then the one below it: the end of turn 3
    assert res.returncode == 0, res.stderr
    assert files(m.ws) == {"a": "3"}
    res = run(m, "redo")                   # none left: refused, nothing changes
    assert res.returncode == 2 and "nothing to redo" in res.stderr.lower(), res.stderr
    assert files(m.ws) == {"a": "3"}
    res = run(m, "--json", "redo")
    assert [e["code"] for e in errors(res)] == ["nothing-to-redo"]


def test_redo_without_a_session_undoes_the_manual_rewind_not_a_sessions(m):
    turn(m, "s1", 1, "one", {"a": "1"})
    turn(m, "s1", 2, "two", {"a": "2"})
    turn(m, "s1", 3, "three", {"a": "3"})
    assert run(m, "rewind", "t3", "--session", "s1").returncode == 0   # owned by s1
    assert m.call("redo", session="s1")["undid"] is not None            # and undone
    assert files(m.ws) == {"a": "3"}
    assert run(m, "rewind", "t3", "--undo-for", "s1").returncode == 0  # s1's again
    assert files(m.ws) == {"a": "2"}
    assert run(m, "rewind", "t2").returncode == 0                        # manual
    assert files(m.ws) == {"a": "1"}
    res = run(m, "--json", "redo")
    assert res.returncode == 0, res.stderr
    done = [json.loads(line) for line in res.stdout.splitlines()][-1]
    assert files(m.ws) == {"a": "2"}          # the manual rewind was undone, not s1's
    assert done["owner"] is None and done["point"] == f"e{done['undid']}"
    res = run(m, "redo")                      # the manual owner has nothing left
    assert res.returncode == 2 and "made without a session" in res.stderr, res.stderr
    res = run(m, "redo", "--session", "s1")   # s1's own rewind is still there
    assert res.returncode == 0, res.stderr
    assert files(m.ws) == {"a": "3"}


def test_a_stale_redo_is_refused_naming_the_changes_and_forced_discards_them(m):
    turn(m, "s1", 1, "one", {"a": "1"})
    turn(m, "s1", 2, "two", {"a": "2"})
    assert run(m, "rewind", "2").returncode == 0
    assert files(m.ws) == {"a": "1"}
    (m.ws / "mine").write_text("a person's edit after the rewind")
    turn(m, "s1", 2, "two again", {"a": "2b", "c": "c"})
    before = files(m.ws)
    res = run(m, "redo")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "edits between turns" in res.stderr and "turn 2 of s1" in res.stderr
    assert "3 paths would be overwritten" in res.stderr, res.stderr
    assert "rewindfs rewind e" in res.stderr and "--force" in res.stderr
    assert files(m.ws) == before              # refused: nothing changed
    res = run(m, "--json", "redo")
    (err,) = errors(res)
    assert err["code"] == "redo-stale" and err["data"]["paths"] == 3
    assert [(c["kind"], c["turn"]) for c in err["data"]["changes"]] == [
        ("idle", None), ("turn", 2)]
    res = run(m, "redo", "--force")
    assert res.returncode == 0, res.stderr
    assert files(m.ws) == {"a": "2"}          # as the rewind found it
    res = run(m, "--json", "log")             # what it discarded is still a point
    kinds = [json.loads(line)["kind"] for line in res.stdout.splitlines()]
    assert kinds.count("redo") == 1 and kinds.count("rewind") == 1


def test_changes_after_the_rewind_that_were_put_back_do_not_block_redo(m):
    """An editor that saved a file and then saved its old text again, a build that
    rewrote an output with the same bytes, a file held open for writing across the
    rewind: the paths were touched after the rewind, but the tree is as the rewind left
    it, so the redo discards nothing and goes ahead (as ``jj``'s no-op changes do)."""
    turn(m, "s1", 1, "one", {"a": "1"})
    turn(m, "s1", 2, "two", {"a": "2"})
    assert run(m, "rewind", "2").returncode == 0
    assert files(m.ws) == {"a": "1"}
    (m.ws / "a").write_text("an edit after the rewind")
    (m.ws / "a").write_text("1")                       # ... saved back as it was
    (m.ws / "tmp").write_text("a scratch file")
    (m.ws / "tmp").unlink()
    res = run(m, "redo")
    assert res.returncode == 0, res.stdout + res.stderr
    assert files(m.ws) == {"a": "2"}
    # a change that stays is still one: refused, naming it
    assert run(m, "rewind", "2").returncode == 0
    (m.ws / "a").write_text("kept")
    res = run(m, "redo")
    assert res.returncode == 2 and "1 path would be overwritten" in res.stderr, res.stderr
    assert files(m.ws) == {"a": "kept"}


def test_the_agent_api_follows_the_same_rules_and_codes(m):
    from rewindfs.plugin import Rewindfs, RewindfsClientError

    with Rewindfs.for_directory(m.ws, store=m.store, strict=True) as rw:
        for n in (1, 2):
            with rw.turn("s1", n, f"turn {n}"):
                (m.ws / "a").write_text(str(n))
        assert not rw.rewind(2).partial               # the only session's turn 2
        assert files(m.ws) == {"a": "1"}
        (m.ws / "b").write_text("after the rewind")    # an edit between turns
        with pytest.raises(RewindfsClientError) as stale:
            rw.redo()
        assert stale.value.code == "redo-stale"
        assert stale.value.details["data"]["paths"] == 1
        assert files(m.ws) == {"a": "1", "b": "after the rewind"}
        rw.redo(force=True)
        assert files(m.ws) == {"a": "2"}
        with pytest.raises(RewindfsClientError) as empty:
            rw.redo()
        assert empty.value.code == "nothing-to-redo"
        with rw.turn("s2", 1, "another session"):
            (m.ws / "c").write_text("s2")
        with pytest.raises(RewindfsClientError) as ambiguous:
            rw.rewind(1)
        assert ambiguous.value.code == "ambiguous-point"
        assert [c["session"] for c in ambiguous.value.details["data"]["choices"]] == [
            "s1", "s2"]


def _log(ws, store):
    res = cli("--json", "log", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr
    return [r for r in map(json.loads, res.stdout.splitlines()) if "epoch" in r]


def test_each_run_is_a_point_of_its_own(tmp_path):
    """Two ``rewindfs run`` commands, no turns: the second one's changes landed in the
    first one's idle epoch, so the tree between the two was no point — undoing the
    second run undid the first too.  Each mount now starts at a point when the open
    idle epoch recorded anything, and a run's epoch is labelled with its command."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "a").write_text("orig\n")
    for command in ("echo first > a; echo new > b", "echo second > a", "true"):
        res = cli("run", "-C", ws, "--", "sh", "-c", command, store=store)
        assert res.returncode == 0, res.stderr
    epochs = _log(ws, store)
    assert [e["paths"] for e in epochs] == [2, 1, 0], epochs
    # each named by its command in `rewindfs log`, so a person finds the one to undo
    assert [e["label"] for e in epochs] == [
        "run: sh -c 'echo first > a; echo new > b'", "run: sh -c 'echo second > a'",
        "run: sh -c true"], epochs
    res = cli("log", "--tree", "-C", ws, store=store)
    assert 'idle "run: sh -c \'echo second > a\'"' in res.stdout, res.stdout
    second_run = epochs[1]["epoch"]
    res = cli("rewind", f"e{second_run}", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr
    assert files(ws) == {"a": "first\n", "b": "new\n"}


def test_a_state_left_by_edits_while_unmounted_stays_a_point(tmp_path):
    """Edits made while nothing was mounted are not seen (the daemon was not there);
    but the tree they left is what the next mount serves, and a change to it in the
    same idle epoch as before the unmount was not recorded (the path's pre-image was
    already there): that tree was lost.  It is now the point the mount starts at."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "y").write_text("P0\n")
    with mounted(ws, store) as m:
        (m.ws / "y").write_text("mounted edit\n")
    (ws / "y").write_text("P1: edited while unmounted\n")
    with mounted(ws, store) as m:
        (m.ws / "y").write_text("P2\n")
        res = run(m, "rewind", f"e{_log(ws, store)[-1]['epoch']}")
        assert res.returncode == 0, res.stderr
        assert (m.ws / "y").read_text() == "P1: edited while unmounted\n"
