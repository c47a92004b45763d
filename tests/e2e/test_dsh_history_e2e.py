"""History that cannot surprise (issue 15), end to end in the real harness.

- A rewind stops what the removed turns left running: turn 2 starts a
  ``run_in_background`` job and a ``cmd &`` that outlives its foreground call, both
  held at a gate and then writing into the workspace; ``/rewind 2`` names both as
  stopped, and after the gate opens neither write lands, the session gets no turn it
  did not ask for (a job's completion notice would wake it), and turn 1's own
  background job keeps running.
- A redo after the child changed the tree is refused as stale: the child runs a turn
  after ``/rewind 2``; ``/redo`` answers ``redo-stale``, names that turn (from the
  error's ``data.changes``) and the child's files stay.  This needs the daemon's
  stale check (the lead's branch for issue 15); before it, the redo goes through.
"""

from __future__ import annotations

import pytest

from dshkit import Dsh, MockModel, harness
from mountkit import mounted

pytestmark = pytest.mark.e2e

P1 = "turn one: start a watcher"
P2 = "turn two: start the slow jobs"
P3 = "turn three in the child"


def bash(command: str, *, background: bool = False) -> dict:
    args = {"command": command, "description": "scripted step"}
    if background:
        args["run_in_background"] = True
    return {"name": "bash", "arguments": args}


def jobs_script(tmp) -> dict:
    gate = tmp / "gate"
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    return {
        "title": "rewindfs jobs",
        "turns": {
            P1: [{"tool_calls": [bash("echo one > one.txt"),
                                 bash(f"echo $$ > {tmp}/keep.pid; while :; do sleep 0.2; done",
                                      background=True)]},
                 {"content": "turn one done"}],
            P2: [{"tool_calls": [
                bash("echo two > two.txt"),
                bash(f"echo $$ > {tmp}/job.pid; {wait}; echo late > late.txt", background=True),
                bash(f"(echo $BASHPID > {tmp}/amp.pid; {wait}; echo amp > amp.txt) >/dev/null 2>&1 &"),
            ]}, {"content": "turn two done"}],
        },
    }


def short(command: str) -> str:
    """A command as the replies show it (lib/jobs.js shortCommand)."""
    return command if len(command) <= 60 else command[:59] + "\u2026"


def one(records, **match):
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, records)
    return found[0]


def test_rewind_stops_the_background_work_of_removed_turns(tmp_path):
    paths = harness()
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with MockModel(jobs_script(tmp_path), tmp_path) as model, mounted(ws, store):
        dsh = Dsh(paths, tmp_path, model, store)
        dsh.install_plugin(cwd=tmp_path)
        # One harness process throughout: background jobs die with the process that
        # started them, so the rewind must happen while they still run.
        recs, proc = dsh.run(ws, new_session="s-jobs", steps=[
            {"prompt": P1}, {"prompt": P2},
            {"command": "/rewind 2 --into s-jobs-child"},
            {"touch": str(tmp_path / "gate")},
            {"wait_exit": str(tmp_path / "job.pid")},
            {"wait_exit": str(tmp_path / "amp.pid")},
            {"alive": str(tmp_path / "keep.pid")},
        ])
        rewound = one(recs, line="/rewind 2 --into s-jobs-child")
        assert rewound["result"] == "success", rewound["text"] + proc.stderr[-3000:]
        assert [r["exited"] for r in recs if r["kind"] == "wait"] == [True, True]

        # The late writes never landed: the tree is the tree before turn 2.
        assert sorted(p.name for p in ws.iterdir()) == ["one.txt"]
        # No completion notice woke the session into a turn of its own.
        assert [r["turns"] for r in recs if r["kind"] == "wait"] == [[1, 2], [1, 2]]
        # Turn 1 is kept, and so is its job.
        assert one(recs, kind="alive")["alive"] is True

        lines = rewound["text"].splitlines()
        assert "rewindfs: stopped 2 background jobs started in turn 2:" in lines
        job = jobs_script(tmp_path)["turns"][P2][0]["tool_calls"][1]["arguments"]["command"]
        assert f"  turn 2: {short(job)} (job bash-2)" in lines
        assert any(line.startswith("  turn 2: (echo $BASHPID > ") and " (process group " in line
                   for line in lines), lines
        assert "rewindfs: /redo restores files only; it cannot restart those jobs." in lines


def stale_script() -> dict:
    return {
        "title": "rewindfs stale redo",
        "turns": {
            P1: [{"tool_calls": [bash("echo one > one.txt")]}, {"content": "one"}],
            P2: [{"tool_calls": [bash("echo two > two.txt")]}, {"content": "two"}],
            P3: [{"tool_calls": [bash("echo child > child.txt")]}, {"content": "three"}],
        },
    }


def test_redo_after_the_child_ran_a_turn_is_refused_as_stale(tmp_path):
    paths = harness()
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with MockModel(stale_script(), tmp_path) as model, mounted(ws, store):
        dsh = Dsh(paths, tmp_path, model, store)
        dsh.install_plugin(cwd=tmp_path)
        recs, _ = dsh.run(ws, new_session="s-p", steps=[
            {"prompt": P1}, {"prompt": P2}, {"command": "/rewind 2 --into s-c"}])
        assert one(recs, kind="command")["result"] == "success"
        recs, _ = dsh.run(ws, session="s-c", steps=[{"prompt": P3}, {"command": "/redo"}])
        redo = one(recs, line="/redo")
        assert redo["result"] == "error", f"the redo went through: {redo['text']}"
        # The child's turn stays; the redo did not bring turn 2's file back.
        assert (ws / "child.txt").read_text() == "child\n"
        assert not (ws / "two.txt").exists()
        lines = redo["text"].splitlines()
        assert lines[0].startswith("rewindfs: /redo refused (redo-stale): "), lines
        assert any(line.startswith("rewindfs: since the rewind") and
                   f"turn 2 ran in session s-c: {P3}" in line for line in lines), lines
        assert lines[-1].startswith("rewindfs: those changes stay; a redo would overwrite "), lines


def test_a_writer_that_cannot_be_told_apart_refuses_the_rewind(tmp_path):
    """A process of the session that dropped its turn tag and started after turn 2
    began may be turn 2's writer: /rewind 2 refuses (nothing restored, no fork kept)."""
    paths = harness()
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    stray = (f"(env -u DSH_REWINDFS_TURN sh -c 'echo $$ > {tmp_path}/stray.pid; "
             f"while :; do sleep 0.1; done') >/dev/null 2>&1 &")
    script = {"title": "rewindfs stray", "turns": {
        P1: [{"tool_calls": [bash("echo one > one.txt")]}, {"content": "one"}],
        P2: [{"tool_calls": [bash("echo two > two.txt"), bash(stray)]}, {"content": "two"}],
    }}
    with MockModel(script, tmp_path) as model, mounted(ws, store):
        dsh = Dsh(paths, tmp_path, model, store)
        dsh.install_plugin(cwd=tmp_path)
        recs, _ = dsh.run(ws, new_session="s-stray", steps=[
            {"prompt": P1}, {"prompt": P2}, {"command": "/rewind 2 --into s-stray-child"},
            {"alive": str(tmp_path / "stray.pid")}])
        refused = one(recs, kind="command")
        pid = one(recs, kind="alive")["pid"]
        assert refused["result"] == "error", refused["text"]
        assert refused["text"] == (
            f"rewindfs: /rewind 2 refused (job-unstoppable): process {pid} (sh) of session "
            "s-stray started after turn 2 began and carries no turn tag; stop it, then rewind; "
            "the files were not rewound")
        assert (ws / "two.txt").read_text() == "two\n"
        assert one(recs, kind="alive")["alive"] is True
        assert not list((tmp_path / "dsh-home" / "sessions").glob("*/s-stray-child"))
