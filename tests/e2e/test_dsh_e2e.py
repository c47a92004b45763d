"""rewindfs in the real DeepSeek Harness, end to end.

The pinned harness (scripts/setup-dsh.sh), a scripted model endpoint, a workspace
mounted by the real rewindfs daemon, the plugin installed into a fresh ``headless``
profile, and a multi-turn session driven through the test runner (which resumes
sessions and dispatches slash commands headlessly):

- turn 1: bash writes a text and a binary file, ``write`` creates another;
- turn 2: bash deletes a file, renames a directory, appends to the binary, and
  creates files under a git-ignored directory;
- ``/rewind 2`` → the tree is byte for byte the tree before turn 2; a child session
  exists whose history ends before turn 2's prompt; the parent is intact;
- ``/redo`` in the child → the tree is the tree after turn 2;
- ``/rewind``, ``/rewind status`` and the refusals answer with the documented text.
"""

from __future__ import annotations

import os
import re

import pytest

from dshkit import Dsh, MockModel, harness
from mountkit import mounted
from rewindfs.plugin import Client
from treesnap import compare, snapshot

pytestmark = pytest.mark.e2e

P0 = "plain turn: no daemon here"
P0B = "plain turn again"
P1 = "turn one: create the files"
P2 = "turn two: reshape the tree"
P3 = "turn three: wait for the gate"


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command, "description": "scripted step"}}


def script(gate, outside) -> dict:
    return {
        "title": "rewindfs e2e",
        "turns": {
            P0: [{"tool_calls": [bash("echo plain > plain.txt")]}, {"content": "plain done"}],
            P0B: [{"tool_calls": [bash("echo again >> plain.txt")]}, {"content": "again done"}],
            P1: [
                {"content": "creating", "tool_calls": [bash(
                    "printf 'hello rewind\\n' > notes.txt && head -c 4096 /dev/urandom > data.bin"
                    " && printf '\\000\\377\\000' >> data.bin")]},
                {"tool_calls": [{"name": "write", "arguments": {
                    "file_path": "plan.md", "content": "# plan\n\n1. rewind\n2. redo\n"}}]},
                {"content": "turn one done"},
            ],
            P2: [
                {"tool_calls": [bash(
                    "rm notes.txt && mv src lib && head -c 1000 /dev/urandom >> data.bin"
                    " && mkdir -p build/obj && echo obj > build/obj/a.o && echo log > build/out.log")]},
                {"content": "turn two done"},
            ],
            P3: [
                {"tool_calls": [{"name": "write", "arguments": {
                    "file_path": str(outside), "content": "not protected\n"}}]},
                {"tool_calls": [bash(f"while [ ! -e {gate} ]; do sleep 0.05; done; echo late > late.txt")]},
                {"content": "waited"},
            ],
        },
    }


def seed_workspace(ws):
    (ws / "src" / "util").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print('main')\n")
    (ws / "src" / "util" / "helpers.py").write_text("def helper():\n    return 1\n")
    (ws / ".gitignore").write_text("build/\n")
    (ws / "README.md").write_text("# demo\n")
    os.symlink("README.md", ws / "readme-link")


def one(records, **match):
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, records)
    return found[0]


def texts_of_user_messages(events):
    out = []
    for e in events:
        if e.get("type") == "user/message" and e["data"].get("source", {}).get("kind") == "user":
            out.append("".join(b.get("text", "") for b in e["data"]["content"] if b.get("type") == "text"))
    return out


def test_rewind_and_redo_in_dsh(tmp_path):
    paths = harness()
    ws, store, plain = tmp_path / "ws", tmp_path / "store", tmp_path / "plain"
    ws.mkdir()
    plain.mkdir()
    seed_workspace(ws)
    gate = tmp_path / "gate"
    with MockModel(script(gate, tmp_path / "outside.txt"), tmp_path) as model:
        dsh = Dsh(paths, tmp_path, model, store)
        dsh.install_plugin(cwd=tmp_path)

        # A bad config stops the profile with the reason, before any turn.
        bad = tmp_path / "bad-config.yml"
        bad.write_text("- id: rewindfs\n  config: {turnTimout: 5, callTimeoutMs: 0}\n")
        _, proc = dsh.run(plain, new_session="s-bad", steps=[{"prompt": P0}], patches=[bad],
                          expect_rc=None)
        assert proc.returncode != 0 and not (plain / "plain.txt").exists()
        assert 'rewindfs: unknown config key "turnTimout" (known: store, socket, turnTimeoutMs, ' \
               "callTimeoutMs, enabled, remote)" in proc.stderr
        assert "rewindfs: config callTimeoutMs=0 must be an integer from 1 to 3600000" in proc.stderr

        # Without a daemon the turns still run; the user is told once.
        recs, proc = dsh.run(plain, new_session="s-plain", steps=[{"prompt": P0}, {"prompt": P0B}])
        assert [r["reason"] for r in recs] == ["completed", "completed"]
        assert (plain / "plain.txt").read_text() == "plain\nagain\n"
        assert proc.stderr.count("is NOT protected") == 1
        assert "rewindfs: turn 1 of session s-plain is NOT protected (files it changes cannot " \
               "be rewound): " in proc.stderr

        with mounted(ws, store):
            run_session(dsh, model, ws, store, gate)


def run_session(dsh, model, ws, store, gate):
    parent, child = "s-parent", "s-child"
    before_turn1 = snapshot(ws)
    dsh.run(ws, new_session=parent, steps=[{"prompt": P1}])
    before_turn2 = snapshot(ws)
    assert compare(before_turn1, before_turn2)
    dsh.run(ws, session=parent, steps=[{"prompt": P2}])
    after_turn2 = snapshot(ws)
    assert (ws / "build" / "obj" / "a.o").exists() and not (ws / "src").exists()

    # The daemon saw both turns, numbered as the harness numbers them.
    with Client.for_directory(ws / "lib" / "util", store=store) as c:
        turns = [(p.turn, p.label) for p in c.points(parent) if p.kind == "turn"]
    assert turns == [(1, P1), (2, P2)]

    parent_log = dsh.session_log(parent)
    recs, _ = dsh.run(ws, session=parent, steps=[
        {"command": "/rewind"}, {"command": "/rewind status"}, {"command": "/rewind -1"},
        {"command": "/rewind HEAD~1"}, {"command": "/rewind 7"}, {"command": "/rewind two"},
        {"command": "/redo"}, {"service": "points"}, {"command": "/rewind e999"},
        {"command": f"/rewind 2 --into {child}"},
    ])
    service = one(recs, kind="service")
    assert service["ok"] is True and service["value"]["session"] == parent
    assert [(p["turn"], p["label"]) for p in service["value"]["points"]] == [(1, P1), (2, P2)]
    listing = one(recs, line="/rewind")
    assert listing["result"] == "success"
    assert listing["text"].startswith(f"rewindfs: points of session {parent} (rewind with /rewind <turn>):")
    assert re.search(rf"^  turn 1  \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d  \d+ files? changed  {P1}$", listing["text"], re.M)
    assert re.search(rf"^  turn 2  .* \d+ files? changed  {P2}$", listing["text"], re.M)
    status = one(recs, line="/rewind status")
    assert status["result"] == "success"
    assert status["text"].startswith(f"rewindfs: protecting {os.path.realpath(ws)} (daemon pid ")
    assert "no turn open" in status["text"]
    for arg in ("-1", "HEAD~1"):
        assert one(recs, line=f"/rewind {arg}") == {
            "session": parent, "kind": "command", "line": f"/rewind {arg}", "result": "error",
            "text": f'rewindfs: /rewind refused (relative-point): "{arg}" is a relative point; '
                    "name an absolute turn number (see /rewind)"}
    assert one(recs, line="/rewind 7")["text"] == \
        f"rewindfs: /rewind 7 refused (unknown-point): session {parent} has no turn 7 (turns: 1, 2)"
    assert one(recs, line="/rewind two")["text"] == \
        'rewindfs: /rewind refused (bad-turn): "two" is not a turn number (turns count from 1; see /rewind)'
    assert one(recs, line="/rewind e999")["text"] == \
        f"rewindfs: /rewind e999 refused (unknown-point): session {parent} has no turn point e999 (see /rewind)"
    redo = one(recs, line="/redo")
    assert redo["result"] == "error" and redo["text"].startswith("rewindfs: /redo refused (nothing-to-redo): ")
    rewound = one(recs, line=f"/rewind 2 --into {child}")
    assert rewound["result"] == "success", rewound["text"]
    assert rewound["text"].startswith(
        f"rewindfs: rewound the files to the start of turn 2 — {P2.splitlines()[0]} — e"), rewound["text"]
    assert f"continue in session {child} (session {parent} is unchanged)" in rewound["text"]

    # Files: byte for byte the tree before turn 2 (git-ignored build/ included).
    assert compare(before_turn2, snapshot(ws)) == []
    check_fork(dsh, parent, child, parent_log)

    # /redo where the user landed: the tree after turn 2 again.
    recs, _ = dsh.run(ws, session=child, steps=[
        {"command": "/rewind"}, {"command": f"/rewind 1 --into {parent}"}, {"command": "/redo"}])
    assert one(recs, line=f"/rewind 1 --into {parent}")["text"] == \
        f"rewindfs: /rewind 1 refused (session-exists): session {parent} already exists; pick another name for --into"
    inherited = one(recs, line="/rewind")["text"]
    assert f"{P1}  (from {parent})" in inherited and f"{P2}  (from {parent})" in inherited
    redone = one(recs, line="/redo")
    assert redone["result"] == "success", redone["text"]
    assert redone["text"].startswith(f"rewindfs: redo done in session {child}: ")
    assert compare(after_turn2, snapshot(ws)) == []

    check_busy_and_child_turns(dsh, model, ws, store, gate, parent, child)


def check_fork(dsh, parent, child, parent_log):
    """The child holds the parent's history up to turn 2's prompt; the parent is intact."""
    child_log = dsh.session_log(child)
    header, events = child_log[0], child_log[1:]
    assert header["id"] == child and header["parentSession"] == parent
    seed = header["seedLength"]
    assert events[:seed] == parent_log[1:seed + 1]
    assert not any(e["type"] == "turn/start" and e["data"]["turn"] >= 2 for e in events)
    assert texts_of_user_messages(events) == [P1]
    assert P2 not in str(events)
    parent_now = dsh.session_log(parent)
    assert parent_now[:len(parent_log)] == parent_log
    assert texts_of_user_messages(parent_now[1:]) == [P1, P2]


def check_busy_and_child_turns(dsh, model, ws, store, gate, parent, child):
    """A rewind while the agent runs is refused; the child's next turn is its turn 2."""
    recs, _ = dsh.run(ws, session=child, steps=[
        {"prompt": P3, "during": "/rewind 1", "gate": str(gate)}, {"command": "/rewind status"}])
    turn = one(recs, kind="turn")
    assert turn["reason"] == "completed"
    assert turn["during"]["status_at_dispatch"] == "running"
    assert turn["during"]["result"] == "error"
    assert turn["during"]["text"] == ("rewindfs: /rewind 1 refused (busy): the agent is running; "
                                      "wait for the turn to finish (or cancel it), then rewind")
    assert (ws / "late.txt").read_text() == "late\n"
    status = one(recs, line="/rewind status")["text"]
    assert f"rewindfs: writes outside the workspace (not protected): {gate.parent / 'outside.txt'}" in status
    with Client.for_directory(ws, store=store) as c:
        points = [(p.turn, p.session, p.label) for p in c.points(child) if p.kind == "turn"]
    assert points == [(1, parent, P1), (2, child, P3)]
    # The model saw the forked conversation: turn 1, then turn three; never turn two.
    asked = [r for r in model.requests() if r.get("tools") and P3 in str(r["messages"])]
    assert asked and all(P1 in str(r["messages"]) and P2 not in str(r["messages"]) for r in asked)
