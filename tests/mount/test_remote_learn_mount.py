"""A session resumed on another machine rewinds into points made on the first one
(issue 18), with real mounts, real daemons and a real S3 server (``rclone serve s3``).

Machine A (its own store, its workspace mounted) runs session s1, turns 1..3, through
the Python API with every write through the mount, and pushes.  Machine B (another
store) has a workspace already holding files — one equal to A's, one different, one A
never had — and mounts it.  ``Rewindfs.for_directory(B, remote="origin")`` then
``rewind(2, session="s1")``: B learns the pushed history (``remote.learn`` in B's
daemon) and lands on A's tree at the start of turn 2; ``redo`` gives B's tree back.

Trees are compared without mtimes (as in test_remote_mount.py: through the writeback
cache a file's mtime as the kernel shows it may differ by milliseconds from the one
captured); content, kinds, modes, symlinks, xattrs and links are compared exactly.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from mountkit import cli, mounted
from remotekit import S3Server
from treesnap import compare, snapshot

from rewindfs.plugin import Rewindfs, RewindfsClientError


@pytest.fixture
def server(tmp_path):
    s = S3Server(tmp_path / "s3data").start()
    try:
        yield s
    finally:
        s.stop()


def _add_origin(server, store) -> None:
    r = cli("remote", "add", "origin", server.url(), "--endpoint", server.endpoint,
            store=store, env=server.env)
    assert r.returncode == 0, r.stderr


def _machine_a(tmp_path, server) -> dict:
    """A's turns 1..3 of s1 through its mount, pushed: the tree at the start of each."""
    ws, store = tmp_path / "a-ws", tmp_path / "a-home" / "store"
    store.parent.mkdir()
    points = {}
    with mounted(ws, store, env=server.env):
        _add_origin(server, store)
        with Rewindfs.for_directory(ws, store=store, strict=True) as rw:
            with rw.turn("s1", 1, "scaffold"):
                points[1] = snapshot(ws)
                (ws / "src").mkdir()
                (ws / "src" / "app.py").write_bytes(b"print('one')\n")
                (ws / "README").write_bytes(b"shared readme\n")
                (ws / "data.bin").write_bytes(os.urandom(1_200_000))
            with rw.turn("s1", 2, "grow"):
                points[2] = snapshot(ws)
                (ws / "src" / "app.py").write_bytes(b"print('two')\n")
                os.symlink("src/app.py", ws / "app-link")
                os.chmod(ws / "src" / "app.py", 0o750)
                os.unlink(ws / "data.bin")
            with rw.turn("s1", 3, "polish"):
                points[3] = snapshot(ws)
                (ws / "src" / "app.py").write_bytes(b"print('three')\n")
                (ws / "notes.md").write_bytes(b"turn three\n")
        points["end"] = snapshot(ws)
        r = cli("push", "-C", ws, store=store, env=server.env)
        assert r.returncode == 0, r.stderr + r.stdout
    return points


def _machine_b_dir(tmp_path, name="b-ws"):
    """A checkout on B before it is mounted: README as A has it, src/app.py not, and a
    file A never had."""
    ws = tmp_path / name
    (ws / "src").mkdir(parents=True)
    (ws / "README").write_bytes(b"shared readme\n")
    (ws / "src" / "app.py").write_bytes(b"print('B was here')\n")
    (ws / "b-only.txt").write_bytes(b"only on B\n")
    return ws


def _epochs(m) -> list:
    return [p["epoch"] for p in m.call("points")["points"]]


def test_a_resumed_session_rewinds_into_points_made_on_another_machine(tmp_path, server):
    points = _machine_a(tmp_path, server)
    ws, store = _machine_b_dir(tmp_path), tmp_path / "b-home" / "store"
    store.parent.mkdir()
    _add_origin(server, store)
    with mounted(ws, store, env=server.env) as m:
        before = snapshot(ws)
        with Rewindfs.for_directory(ws, store=store, strict=True, remote="origin") as rw:
            res = rw.rewind(2, session="s1")
            assert res.learned is not None and res.learned["remote"] == "origin"
            res_ws = res.learned["remote_workspace"]
            assert res.learned["absent"] == 1 and not res.partial       # b-only.txt
            # the mount's empty epoch gave way: A's epoch ids kept, bound to its history
            assert res.learned["offset"] == 0 and res.learned["bound"] is True
            assert compare(points[2], snapshot(ws)) == []
            rw.redo(session="s1")
            assert compare(before, snapshot(ws)) == []                  # B-only file too
            # the other pushed points are there, learned once
            for turn in (1, 3):
                res = rw.rewind(turn, session="s1")
                assert res.learned is None
                assert compare(points[turn], snapshot(ws)) == [], f"t{turn}"
                rw.redo(session="s1")
                assert compare(before, snapshot(ws)) == []
            # learning twice: refused, nothing changed
            epochs = _epochs(m)
            with pytest.raises(RewindfsClientError) as exc:
                rw.learn(session="s1")
            assert exc.value.code == "learn-target-has-history"
            assert _epochs(m) == epochs and compare(before, snapshot(ws)) == []
        # the pushed tree is a point too: A's tree when it pushed
        head = [p for p in m.call("points")["points"]
                if (p["label"] or "").startswith("pushed tree")][-1]["epoch"]
        m.call("rewind", to=f"e{head}")
        assert compare(points["end"], snapshot(ws)) == []
        # B's pushes extend the history A pushed (the same remote workspace)
        r = cli("--json", "push", "-C", ws, store=store, env=server.env)
        assert r.returncode == 0, r.stderr + r.stdout
        done = [json.loads(x) for x in r.stdout.splitlines() if '"push.done"' in x][0]
        assert done["workspace"] == res_ws and done["epochs"] > 0


def test_learning_refusals_change_nothing(tmp_path, server):
    _machine_a(tmp_path, server)
    ws, store = _machine_b_dir(tmp_path), tmp_path / "b-home" / "store"
    store.parent.mkdir()
    _add_origin(server, store)
    with mounted(ws, store, env=server.env) as m:
        before, epochs = snapshot(ws), _epochs(m)
        for remote, session, code in (("nowhere", "s1", "unknown-remote"),
                                      ("origin", "nobody", "unknown-remote-session")):
            with Rewindfs.for_directory(ws, store=store, strict=True, remote=remote) as rw:
                with pytest.raises(RewindfsClientError) as exc:
                    rw.rewind(2, session=session)
                assert exc.value.code == code, exc.value.message
            assert _epochs(m) == epochs and compare(before, snapshot(ws)) == []
        # the CLI on a mounted workspace asks its daemon
        r = cli("--json", "remote", "learn", "origin", "--session", "nobody", "-C", ws,
                store=store, env=server.env)
        assert r.returncode == 3, r.stdout + r.stderr
        assert [json.loads(x)["code"] for x in r.stdout.splitlines()
                if '"error"' in x] == ["unknown-remote-session"]
        assert _epochs(m) == epochs and compare(before, snapshot(ws)) == []
        # a workspace with a turn of its own here: refused, nothing changed
        with Rewindfs.for_directory(ws, store=store, strict=True) as rw:   # no push
            with rw.turn("local", 1, "a local turn"):
                (ws / "local.txt").write_bytes(b"made on B\n")
        before, epochs = snapshot(ws), _epochs(m)
        with Rewindfs.for_directory(ws, store=store, strict=True, remote="origin") as rw:
            with pytest.raises(RewindfsClientError) as exc:
                rw.rewind(2, session="s1")
            assert exc.value.code == "learn-target-has-history"
            assert _epochs(m) == epochs and compare(before, snapshot(ws)) == []


def test_a_fork_made_on_the_new_machine_rewinds_into_its_parents_pushed_points(tmp_path,
                                                                               server):
    points = _machine_a(tmp_path, server)
    ws, store = _machine_b_dir(tmp_path), tmp_path / "b-home" / "store"
    store.parent.mkdir()
    _add_origin(server, store)
    with mounted(ws, store, env=server.env):
        before = snapshot(ws)
        with Rewindfs.for_directory(ws, store=store, strict=True, remote="origin") as rw:
            rw.client.fork("s1-on-b", "s1", 3)     # the harness forks first, as dsh does
            res = rw.rewind(2, session="s1-on-b")
            assert res.learned is not None
            assert compare(points[2], snapshot(ws)) == []
            rw.redo(session="s1-on-b")
            assert compare(before, snapshot(ws)) == []


def _row(m, name):
    return next(r for r in m.call("status")["push"]["remotes"] if r["remote"] == name)


def test_the_api_naming_a_remote_pushes_every_turn_and_another_machine_rewinds_into_it(
        tmp_path, server):
    """No ``rewindfs push`` and no ``mount --auto`` on A: ``remote="origin"`` makes each
    turn's end queue a push in A's daemon (``push``, ``wait: false``), with the
    credentials of the shell that mounted.  B then rewinds into A's turn 2."""
    ws, store = tmp_path / "a-ws", tmp_path / "a-home" / "store"
    store.parent.mkdir()
    points = {}
    with mounted(ws, store, env=server.env) as m:
        _add_origin(server, store)
        with Rewindfs.for_directory(ws, store=store, strict=True, remote="origin") as rw:
            for turn in (1, 2):
                with rw.turn("s1", turn, f"turn {turn}") as mark:
                    points[turn] = snapshot(ws)
                    (ws / f"t{turn}.txt").write_bytes(b"x" * turn)
                assert mark.push_error is None
        deadline = time.monotonic() + 120
        while _row(m, "origin")["unpushed_epochs"] or _row(m, "origin")["state"] != "idle":
            assert time.monotonic() < deadline, _row(m, "origin")
            time.sleep(0.05)
        assert _row(m, "origin")["pushes"] >= 1 and _row(m, "origin")["failures"] == 0
    b_ws, b_store = tmp_path / "b-ws", tmp_path / "b-home" / "store"
    b_ws.mkdir()
    b_store.parent.mkdir()
    _add_origin(server, b_store)
    with mounted(b_ws, b_store, env=server.env):
        with Rewindfs.for_directory(b_ws, store=b_store, strict=True, remote="origin") as rw:
            res = rw.rewind(2, session="s1")
            assert res.learned is not None
            assert compare(points[2], snapshot(b_ws)) == []
