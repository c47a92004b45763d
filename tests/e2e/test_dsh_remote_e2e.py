"""A dsh session resumed on another machine rewinds into points made on the first one
(issue 18), end to end: the real harness with the plugin, real daemons, a real S3
server (``rclone serve s3``).

Machine A (store A) runs session s-a, turns 1..3, in a mounted workspace and pushes.
Machine B (store B, another ``REWINDFS_HOME``) has the same checkout path holding
other files (one equal to A's, one different, one A never had) — so the session's log
(its ``cwd``) fits B, as a resumed session on a new machine with the same layout
does — mounts it, resumes s-a with ``remote: origin`` in the plugin's config and types
``/rewind 2``: the plugin finds no point, the daemon learns the pushed history
(``remote.learn``), the files become A's tree at the start of turn 2 and the reply
says where the history came from; ``/redo`` in the child gives B's tree back.

The dsh home (the conversation) is shared by the two "machines": that is the session
log coming along; rewindfs state is not shared.
"""

from __future__ import annotations

import shutil

import pytest

from dshkit import Dsh, MockModel, harness
from mountkit import cli, mounted
from remotekit import S3Server
from treesnap import compare, snapshot

pytestmark = pytest.mark.e2e

P1, P2, P3 = "turn one: scaffold", "turn two: grow", "turn three: polish"


def bash(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command, "description": "scripted step"}}


SCRIPT = {
    "title": "rewindfs remote",
    "turns": {
        P1: [{"tool_calls": [bash("mkdir -p src && echo one > src/app.txt && echo shared > README")]},
             {"content": "one"}],
        P2: [{"tool_calls": [bash("echo two > src/app.txt && echo more > more.txt")]},
             {"content": "two"}],
        P3: [{"tool_calls": [bash("echo three > src/app.txt && rm more.txt")]},
             {"content": "three"}],
    },
}


def one(records, **match):
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, records)
    return found[0]


def test_a_resumed_dsh_session_rewinds_into_points_pushed_from_another_machine(tmp_path):
    paths = harness()
    server = S3Server(tmp_path / "s3data").start()
    try:
        _run(paths, server, tmp_path)
    finally:
        server.stop()


def _run(paths, server, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    store_a, store_b = tmp_path / "home-a" / "store", tmp_path / "home-b" / "store"
    store_a.parent.mkdir()
    store_b.parent.mkdir()
    remote_row = tmp_path / "remote-row.yml"
    remote_row.write_text("- id: rewindfs\n  config: {remote: origin}\n")
    with MockModel(SCRIPT, tmp_path) as model:
        dsh = Dsh(paths, tmp_path, model, store_a)
        dsh.install_plugin(cwd=tmp_path)
        # machine A
        with mounted(ws, store_a, env=server.env):
            assert cli("remote", "add", "origin", server.url(), "--endpoint",
                       server.endpoint, store=store_a, env=server.env).returncode == 0
            recs, _ = dsh.run(ws, new_session="s-a", steps=[{"prompt": P1}])
            at_turn_2 = snapshot(ws)
            recs, _ = dsh.run(ws, session="s-a", steps=[{"prompt": P2}, {"prompt": P3}])
            pushed = cli("push", "-C", ws, store=store_a, env=server.env)
            assert pushed.returncode == 0, pushed.stderr + pushed.stdout
        # machine B: the same path, other files, another store
        shutil.rmtree(ws)
        (ws / "src").mkdir(parents=True)
        (ws / "README").write_text("shared\n")                 # as A has it
        (ws / "src" / "app.txt").write_text("B's version\n")   # A has another
        (ws / "b-only.txt").write_text("only on B\n")
        assert cli("remote", "add", "origin", server.url(), "--endpoint", server.endpoint,
                   store=store_b, env=server.env).returncode == 0
        dsh.env["REWINDFS_HOME"] = str(store_b)
        with mounted(ws, store_b, env=server.env):
            before = snapshot(ws)
            recs, proc = dsh.run(ws, session="s-a", patches=[remote_row], steps=[
                {"command": "/rewind 2 --into s-b"}, {"command": "/rewind status"}])
            rewound = one(recs, line="/rewind 2 --into s-b")
            assert rewound["result"] == "success", rewound["text"] + proc.stderr[-3000:]
            lines = rewound["text"].splitlines()
            assert lines[0].startswith("rewindfs: learned the history from remote origin "
                                       "(workspace "), lines
            assert any(line.startswith("rewindfs: rewound the files to the start of turn 2 — "
                                       + P2) for line in lines), lines
            assert compare(at_turn_2, snapshot(ws)) == []
            status = one(recs, line="/rewind status")
            assert "rewindfs: remote origin: pushed after each turn" in status["text"]
            recs, proc = dsh.run(ws, session="s-b", patches=[remote_row],
                                 steps=[{"command": "/redo"}])
            redo = one(recs, line="/redo")
            assert redo["result"] == "success", redo["text"] + proc.stderr[-3000:]
            assert compare(before, snapshot(ws)) == []                  # b-only.txt too
