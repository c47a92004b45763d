"""rewindfs in the harness's web UI, in a real browser.

Debian's chromium driven by playwright-core (tests/e2e/browser/driver.mjs) against
``dsh --profile web`` serving a workspace mounted by the real daemon, with the
plugin installed into the web profile and the scripted model endpoint:

- two turns whose bash calls write files;
- the rewind control (↺) of turn 2, with its tooltip → the files are byte for byte
  the tree before turn 2, the child session is open in the page and listed under the
  workspace (not "Ungrouped"), the parent's title starts with "↩ "; a line the person
  added between turns is undone too, and the child's header says so;
- ``/redo`` typed in the parent → refused: rewound into the child;
- the header's "undo the rewind that landed here" → the tree after turn 2, the mark
  is gone; "rewind status" → its answer in the transcript;
- ``/rewind`` typed in the composer; a running turn → the control refuses (busy);
- ``/rewind t2`` typed in the composer → the host's own fork, listed under the
  workspace too, the reply naming it;
- the control while another agent's turn is open in the workspace → the web fork is
  made, the host refuses (turn-open), and that fork is archived: the session list is
  as before, the files unchanged;
- the rewind control of turn 1 (the web fork cannot cut an empty history, so the host
  forks once) → the files before turn 1, that child open in the page.

Screenshots of every step are saved under the test's tmp dir; their paths are printed.
"""

from __future__ import annotations

import json
import re

import pytest

from dshkit import Dsh, MockModel, harness
from mountkit import cli, mounted
from treesnap import compare, snapshot
from webkit import Browser, WebServer, browser_driver

pytestmark = pytest.mark.e2e

P1 = "turn one: create the files"
P2 = "turn two: change the files"
P3 = "turn three: wait for the gate"
P4 = "turn four: a small change"
DONE1, DONE2, DONE3, DONE4 = "turn one done", "turn two done", "turn three done", "turn four done"

UNDO = '[aria-label="undo the rewind that landed here"]'
LANDED = '[data-rewindfs="landed"]'
STATUS = '[aria-label="rewind status"]'
COMPOSER = "textarea"
COMMAND_VIEW = '[data-rewindfs="command-view"]'
SESSIONS = '[role="tree"][aria-label="Sessions"]'
SELECTED = f'{SESSIONS} [role="treeitem"][class*="selected"]'
PARENT_ROW = f'{SESSIONS} [role="treeitem"]:has-text("↩ ")'
CHILD_ROW = f'{SESSIONS} [role="treeitem"][class*="sessionRow"]:not(:has-text("↩ "))'
SIDEBAR_JS = """() => [...document.querySelectorAll('[role="tree"][aria-label="Sessions"] [role="treeitem"]')]
    .map((row) => row.innerText.split('\\n')[0].trim())"""


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command, "description": "scripted step"}}


def script(gate) -> dict:
    return {
        "title": "web rewind",
        "turns": {
            P1: [{"tool_calls": [bash("printf 'one\\n' > notes.txt && head -c 2048 /dev/urandom > data.bin")]},
                 {"content": DONE1}],
            P2: [{"tool_calls": [bash("printf 'two\\n' >> notes.txt && rm data.bin && mkdir -p out"
                                      " && echo made > out/made.txt")]},
                 {"content": DONE2}],
            P4: [{"tool_calls": [bash("echo small > small.txt")]}, {"content": DONE4}],
            P3: [{"tool_calls": [bash(f"while [ ! -e {gate} ]; do sleep 0.05; done; echo late > late.txt")]},
                 {"content": DONE3}],
        },
    }


def rewind_control(turn: int) -> str:
    return f'[aria-label="rewind to before turn {turn}"]'


def session_logs(home) -> dict[str, list[dict]]:
    """Every persisted session: id -> [header, events...] (plain JSONL, see webkit.PLAIN_LOGS)."""
    out = {}
    for f in (home / "sessions").glob("*/*/session.jsonl"):
        lines = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        out[lines[0]["id"]] = lines
    return out


def test_rewind_and_undo_in_the_web_ui(tmp_path, capsys):
    paths = harness()
    driver = browser_driver()
    ws, store, gate = tmp_path / "ws", tmp_path / "store", tmp_path / "gate"
    ws.mkdir()
    (ws / "README.md").write_text("# demo\n")
    with MockModel(script(gate), tmp_path) as model:
        dsh = Dsh(paths, tmp_path, model, store)
        dsh.install_plugin(cwd=tmp_path, profile="web")
        with mounted(ws, store), WebServer(dsh, ws, tmp_path) as web, \
                Browser(paths["NODE_BIN"], driver, tmp_path / "screenshots") as page:
            try:
                run_flow(page, web, dsh, ws, store, gate)
            finally:
                with capsys.disabled():   # the paths belong in the CI log, pass or fail
                    print(f"\nweb UI screenshots: {', '.join(sorted(map(str, page.shots.glob('*.png'))))}")


def open_workspace(page, web, ws):
    page.do("goto", url=web.url)
    # A fresh DSH_HOME (every test has one) first shows the testing notice; it may
    # appear after the page has rendered, so wait for it rather than look once.
    page.do("click", target='button:has-text("Continue")')
    page.do("wait", target='button:has-text("Continue")', state="detached")
    page.do("click", target='button[aria-label="Choose workspace"]')
    page.do("click", target='button[aria-label="Edit path"]')
    page.do("fill", target='input[aria-label="Edit path"]', text=str(ws))
    page.do("press", target='input[aria-label="Edit path"]', key="Enter")
    page.do("click", target='button:has-text("Open")')


def send(page, text: str):
    """Type `text` into the composer and send it.  For a slash command with an
    argument hint the first Enter only completes the command name; then a second
    Enter sends it."""
    page.do("fill", target=COMPOSER, text=text)
    page.do("press", target=COMPOSER, key="Enter")
    if text.startswith("/") and page.do("eval", js=f"() => document.querySelector('{COMPOSER}').value")["value"].strip():
        page.do("press", target=COMPOSER, key="Enter")


def run_flow(page, web, dsh, ws, store, gate):
    open_workspace(page, web, ws)
    before_turn1 = snapshot(ws)
    send(page, P1)
    page.do("wait", target=f"text={DONE1}")
    before_turn2 = snapshot(ws)
    send(page, P2)
    page.do("wait", target=f"text={DONE2}")
    page.do("wait", target=f"{rewind_control(2)}:not([disabled])")
    # The person adds a line of her own in her editor, between turns: the rewind
    # undoes it too (the point is before turn 2), and must say so where she lands.
    with open(ws / "notes.txt", "a") as f:
        f.write("my own line\n")
    after_turn2 = snapshot(ws)
    assert compare(before_turn2, after_turn2)
    page.shot("1-two-turns")

    tooltip = page.do("attr", target=rewind_control(2), name="title")["value"]
    assert re.fullmatch(rf"rewind to before this turn: turn 2 · \d+ files? changed · \d\d:\d\d:\d\d · {P2}", tooltip), tooltip
    parent = only_session(dsh)

    # The rewind control of turn 2: fork, /rewind 2 --into <child>, open the child.
    # Double-clicked, as people do: one fork, one rewind.
    page.do("dblclick", target=rewind_control(2))
    page.do("wait", target=UNDO)
    page.do("wait", target=LANDED)
    page.shot("2-rewound-into-child")
    assert compare(before_turn2, snapshot(ws)) == []
    # Where she lands (the child), the header says what else the rewind undid; the
    # /rewind reply that says it too stays in the parent's transcript.
    notice = page.do("text", target=LANDED)["text"]
    assert notice == "⚠ the rewind also undid 1 change made outside this session's turns: notes.txt", notice
    full = page.do("attr", target=LANDED, name="title")["value"]
    assert "rewindfs: it also undid edits between turns: notes.txt" in full, full
    assert "↻ undo rewind brings them back" in full, full
    logs = session_logs(dsh.home)
    children = [sid for sid, log in logs.items() if log[0].get("parentSession") == parent]
    assert len(children) == 1, logs.keys()
    child = children[0]
    transcript = page.do("text", target="body")["text"]
    assert P1 in transcript and P2 not in transcript, transcript
    # Listed under the workspace, selected, and the parent marked.
    rows = sidebar_rows(page)
    assert rows[0] == "ws" and sorted(rows[1:]) == ["web rewind", "↩ web rewind"], rows
    assert "Ungrouped" not in page.do("text", target=SESSIONS)["text"]
    assert page.do("text", target=SELECTED)["text"].startswith("web rewind")

    # /redo typed in the session that was rewound out of names the child.
    page.do("click", target=PARENT_ROW)
    page.do("wait", target=f"text={DONE2}")
    send(page, "/redo")
    page.do("wait", target=f"text=this session was rewound into {child}; open it and /redo there")
    page.shot("3-redo-in-parent-refused")
    assert page.do("count", target=UNDO)["count"] == 0
    assert compare(before_turn2, snapshot(ws)) == []

    # Back in the child: the header's undo puts the files of after turn 2 back.  A
    # person double-clicks it (a habit from desktops): one /redo, not a second one
    # that is then refused in red beside the control (nothing-to-redo).
    page.do("click", target=CHILD_ROW)
    page.do("dblclick", target=UNDO)
    page.do("wait", target=UNDO, state="detached")
    page.do("wait", target=f"text=rewindfs: redo done in session {child}")
    assert page.do("count", target=LANDED)["count"] == 0     # her line is back
    page.shot("4-undone")
    redo_rows = f'{COMMAND_VIEW}[data-command="redo"]'
    assert page.do("count", target=redo_rows)["count"] == 1, page.do("text", target="body")["text"][-1500:]
    assert compare(after_turn2, snapshot(ws)) == []
    assert sidebar_rows(page) == ["ws", "web rewind", "web rewind"], sidebar_rows(page)

    # "rewind status": its answer lands in the transcript.
    page.do("click", target=STATUS)
    page.do("wait", target="text=rewindfs: protecting")
    page.shot("5-status")

    # /rewind typed in the composer lists the points (inherited ones say so).
    send(page, "/rewind")
    listing = f'{COMMAND_VIEW}[data-command="rewind"]:has-text("rewindfs: points of session {child}")'
    page.do("wait", target=listing)
    lines = page.do("text", target=f"{listing} pre")["text"].splitlines()
    assert lines[0] == f"rewindfs: points of session {child} (rewind with /rewind <turn>):", lines
    assert re.fullmatch(rf"  turn 1  .* \d+ files? changed  {P1}  \(from {parent}\)", lines[1]), lines
    page.shot("6-typed-rewind")

    before_child_turn2 = check_busy(page, ws, gate)
    check_typed_rewind(page, ws, before_child_turn2)
    check_refused_fork_is_archived(page, ws, store)
    check_turn_one(page, ws, before_turn1)


def check_refused_fork_is_archived(page, ws, store):
    """Another agent's turn is open in the workspace (a second session marked it
    through the CLI): the control forks, the host refuses the rewind (turn-open), and
    the fork it made is archived — the list holds no session nobody asked for."""
    r = cli("turn", "begin", "-C", ws, "--session", "other-agent", "--turn", "1",
            "--label", "another agent's turn", store=store)
    assert r.returncode == 0, r.stderr
    try:
        rows, files = sidebar_rows(page), snapshot(ws)
        page.do("wait", target=f"{rewind_control(2)}:not([disabled])")
        page.do("click", target=rewind_control(2))
        refusal = '[data-rewindfs="refusal"]:has-text("turn-open")'
        page.do("wait", target=refusal)
        text = page.do("text", target=refusal)["text"]
        assert re.search(r"rewindfs: the fork \S+ made for this rewind was archived", text), text
        page.shot("8b-refused-fork-archived")
        page.do("wait", target=f"{SESSIONS} [role=\"treeitem\"] >> nth={len(rows)}", state="detached")
        assert sidebar_rows(page) == rows, (rows, sidebar_rows(page))
        assert compare(files, snapshot(ws)) == []
    finally:
        r = cli("turn", "end", "-C", ws, "--session", "other-agent", store=store)
        assert r.returncode == 0, r.stderr


def check_turn_one(page, ws, before_turn1):
    """The control of turn 1: `/rewind 1` with the host's fork, then that child opens."""
    page.do("wait", target=f"{rewind_control(1)}:not([disabled])")
    page.do("click", target=rewind_control(1))
    # The child holds no turn yet: the page shows it as an empty session (the composer
    # of a fresh session; there is no header to hold the undo control).
    page.do("wait", target=f'{SELECTED}:has-text("New Session")')
    page.do("wait", target=f"text={DONE1}", state="detached")
    page.shot("9-turn-one")
    assert compare(before_turn1, snapshot(ws)) == []
    rows = sidebar_rows(page)
    assert len(rows) == 5 and "Ungrouped" not in page.do("text", target=SESSIONS)["text"], rows


def check_busy(page, ws, gate):
    """While a turn runs, the control refuses with the busy reason (nothing forked).

    In the child: its turn 2 (P4), then turn 3 (P3) waits for the gate while the
    control of turn 2 is clicked.  Returns the tree before the child's turn 2."""
    before = snapshot(ws)
    send(page, P4)
    page.do("wait", target=f"text={DONE4}")
    page.do("wait", target=f"{rewind_control(2)}:not([disabled])")
    send(page, P3)
    page.do("wait", target=f'{rewind_control(2)}[data-rewindfs-running="true"]')
    page.do("click", target=rewind_control(2))
    refusal = page.do("text", target='[data-rewindfs="refusal"]')["text"]
    assert refusal == ("rewindfs: /rewind 2 refused (busy): the agent is running; "
                       "wait for the turn to finish (or cancel it), then rewind"), refusal
    page.shot("7-busy-refused")
    gate.touch()
    page.do("wait", target=f"text={DONE3}")
    assert (ws / "late.txt").read_text() == "late\n"
    assert len(sidebar_rows(page)) == 3, sidebar_rows(page)   # no fork was made
    return before


def check_typed_rewind(page, ws, before_turn2_files):
    """`/rewind t2` typed in the composer — the CLI's spelling of turn 2, which a person
    who uses both types here too (the control sends `/rewind 2`): the host forks, and
    the fork is listed under the workspace too; the reply names the child and how to
    open it."""
    send(page, "/rewind t2")
    reply = page.do("text", target=f'{COMMAND_VIEW}[data-command="rewind"]:has-text("rewound the files") pre')["text"]
    assert "rewindfs: open session session-" in reply and "(web UI: the session list, under this workspace" in reply, reply
    page.shot("8-typed-rewind-2")
    rows = sidebar_rows(page)
    assert rows[0] == "ws" and len(rows) == 4 and "Ungrouped" not in page.do("text", target=SESSIONS)["text"], rows
    assert compare(before_turn2_files, snapshot(ws)) == []


def sidebar_rows(page) -> list[str]:
    """The session tree's rows, top to bottom: workspace rows and session titles."""
    return page.do("eval", js=SIDEBAR_JS)["value"]


def only_session(dsh) -> str:
    """The one session that has run a turn so far."""
    ran = [sid for sid, log in session_logs(dsh.home).items()
           if any(e.get("type") == "turn/start" for e in log[1:])]
    assert len(ran) == 1, ran
    return ran[0]
