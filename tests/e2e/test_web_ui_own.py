"""Back to a session's own files, in the harness's web UI, in a real browser.

A person rewinds turn 2 with its ↺ and lands in the fork; there the agent runs a turn
of its own.  The fork's "↻ undo rewind" is gone then (a redo would throw that turn
away: stale), and the session she came from, marked ↩, offered nothing: its files
(turn 2's work) were reachable only with `rewindfs rewind e<N>` in a terminal, and a
turn typed there ran against the fork's files.  Now that session's header says so
("⚠ not this session's files") and offers "↻ back to this session's files" (`/rewind
own`): the files are turn 2's again, the
marks change places, and its "↻ undo rewind" (`/redo`) puts the fork's files back.
What the fork's turn left running (here a `cmd &` held at a gate, then writing into
the workspace) is stopped first, as a ↺ rewind stops the work of the turns it removes:
its late write must not land in the files just put back.
"""

from __future__ import annotations

import os
import time

import pytest

from test_web_ui import bash, rewind_control, send, session_logs, sidebar_rows
from test_web_ui_unprotected import web_ui
from treesnap import compare, snapshot

pytestmark = pytest.mark.e2e

TITLE = "own files"
P1, P2, P3 = "turn one: start the notes", "turn two: the parent's work", "turn three: the fork's own work"


def turns(tmp) -> dict:
    gate = tmp / "gate"
    late = f"(echo $BASHPID > {tmp}/late.pid; while [ ! -e {gate} ]; do sleep 0.05; done; " \
           "echo late > late.txt) >/dev/null 2>&1 &"
    return {
        P1: [{"tool_calls": [bash("echo one > notes.txt")]}, {"content": "one done"}],
        P2: [{"tool_calls": [bash("echo parent >> notes.txt && echo p > parent.txt")]}, {"content": "two done"}],
        P3: [{"tool_calls": [bash("echo fork >> notes.txt && echo f > fork.txt"), bash(late)]},
             {"content": "three done"}],
    }
UNDO = '[aria-label="undo the rewind that landed here"]'
OWN = '''[aria-label="back to this session's files"]'''
LANDED = '[data-rewindfs="landed"]'
AWAY = '[data-rewindfs="away"]'
SESSIONS = '[role="tree"][aria-label="Sessions"]'
MARKED_ROW = f'{SESSIONS} [role="treeitem"]:has-text("↩ ")'
UNMARKED_ROW = f'{SESSIONS} [role="treeitem"][class*="sessionRow"]:not(:has-text("↩ "))'


def test_a_session_rewound_away_gets_its_own_files_back(tmp_path, capsys):
    with web_ui(tmp_path, capsys, TITLE, mount=True, turns=turns(tmp_path)) as (page, _, dsh):
        run_flow(page, dsh, tmp_path / "ws", tmp_path)


def exited(pid_file, timeout=20.0) -> bool:
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    return not os.path.exists(f"/proc/{pid}")


def run_flow(page, dsh, ws, tmp):
    send(page, P1)
    page.do("wait", target="text=one done")
    send(page, P2)
    page.do("wait", target="text=two done")
    parents_files = snapshot(ws)

    # ↺ on turn 2: the fork opens; there the agent runs a turn of its own.
    page.do("wait", target=f"{rewind_control(2)}:not([disabled])")
    page.do("click", target=rewind_control(2))
    page.do("wait", target=UNDO)
    send(page, P3)
    page.do("wait", target="text=three done")
    page.do("wait", target=UNDO, state="detached")       # stale: a redo would lose turn 3
    forks_files = snapshot(ws)
    assert (ws / "notes.txt").read_text() == "one\nfork\n"
    page.shot("1-fork-ran-a-turn")

    # The session it came from, marked ↩, offers its own files back.
    page.do("click", target=MARKED_ROW)
    page.do("wait", target="text=two done")
    page.do("wait", target=OWN)
    # beside it, what a turn typed here would work on
    assert page.do("text", target=AWAY)["text"] == "⚠ not this session's files"
    fork = [sid for sid, log in session_logs(dsh.home).items() if log[0].get("parentSession")][0]
    why = page.do("attr", target=AWAY, name="title")["value"]
    assert why == f"the workspace holds session {fork}'s files, not this session's: a turn here works on them", why
    tooltip = page.do("attr", target=OWN, name="title")["value"]
    assert "/rewind own" in tooltip and "files in the workspace" in tooltip, tooltip
    page.shot("2-back-offered")
    page.do("dblclick", target=OWN)                      # one /rewind own, not two
    page.do("wait", target="text=rewindfs: this session's own files are back")
    # the fork's `cmd &` was stopped before the files came back: its write never lands
    page.do("wait", target=f"text=rewindfs: stopped 1 background job started in turn 2 of session {fork}")
    (tmp / "gate").touch()
    assert exited(tmp / "late.pid")
    assert compare(parents_files, snapshot(ws)) == []
    # the fork's turn was undone in the files, and the header says so (its "↻ undo
    # rewind" puts them back)
    page.do("wait", target=LANDED)
    notice = page.do("text", target=LANDED)["text"]
    assert notice.startswith("⚠ the rewind also undid 2 changes made outside this session's turns"), notice
    page.do("wait", target=UNDO)
    assert page.do("count", target=OWN)["count"] == page.do("count", target=AWAY)["count"] == 0
    rows = sidebar_rows(page)
    assert sorted(rows[1:]) == [TITLE, f"↩ {TITLE}"], rows
    assert page.do("count", target=f'{MARKED_ROW}[class*="selected"]')["count"] == 0   # the fork is marked now
    page.shot("3-own-files-back")
    logs = session_logs(dsh.home)
    assert len(logs) == 2 and all(len(log) > 1 for log in logs.values())             # nothing forked

    # Its "↻ undo rewind" puts the fork's files back; the marks change places again.
    page.do("click", target=UNDO)
    page.do("wait", target=UNDO, state="detached")
    page.do("wait", target="text=rewindfs: redo done in session")
    assert compare(forks_files, snapshot(ws)) == []
    page.do("wait", target=f'{MARKED_ROW}[class*="selected"]')
    page.do("wait", target=OWN)                          # and it could go back again
    page.shot("4-fork-files-again")
