"""The control-socket client (blocking and trio) and the agent-loop API.

Against a minimal scripted socket server in this file: it checks framing, typed
results, error codes and the turn context manager -- not the daemon, which the mount
and end-to-end tests exercise for real.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading

import pytest

from rewindfs.plugin import (Client, DaemonUnreachable, NotMounted, Rewindfs, RewindfsClientError,
                    TrioClient, control_socket_path, find_socket)
from rewindfs.plugin._paths import socket_path_for


class ScriptedDaemon:
    """Answers each request line with ``reply(request) -> list of messages`` (thread)."""

    def __init__(self, path, reply):
        self.path = path
        self.reply = reply
        self.requests = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn,), daemon=True).start()

    def _conn(self, conn):
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                req = json.loads(line)
                self.requests.append(req)
                out = self.reply(req)
                if out is None:
                    return  # hang up without a reply
                conn.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in out))

    def close(self):
        self.sock.close()


def ok(req, result):
    return [{"v": 1, "id": req["id"], "ok": True, "result": result}]


def err(req, code, message):
    return [{"v": 1, "id": req["id"], "ok": False, "error": {"code": code, "message": message}}]


POINTS = [
    {"epoch": 4, "kind": "turn", "session": "s1", "turn": 1, "label": "first", "started_ns": 1,
     "paths": 3, "bytes": 10},
    {"epoch": 5, "kind": "idle", "session": None, "turn": None, "label": "", "started_ns": 2,
     "paths": 0, "bytes": 0},
    {"epoch": 6, "kind": "turn", "session": "s1", "turn": 2, "label": "second",
     "started_ns": 3, "paths": 1, "bytes": 1, "future_field": True},
]


def standard_reply(req):
    m, p = req["method"], req["params"]
    if m == "turn.begin":
        return ok(req, {"epoch": 10 + p["turn"]})
    if m == "turn.end":
        return ok(req, {"epoch": 99})
    if m == "points":
        return ok(req, {"points": POINTS})
    if m == "rewind":
        if p["to"] not in (4, 6, "e4", "e6", "t1", "t2"):
            return err(req, "unknown-point", f"No point {p['to']!r}")
        events = [{"v": 1, "id": req["id"], "event": {"type": "rewind.planned", "actions": 2}}]
        return events + ok(req, {"epoch": 20, "target": p["to"], "written": 1, "deleted": 1,
                                 "meta": 0, "failed": [{"path": "x", "code": "EACCES",
                                                        "message": "denied"}], "foreign": []})
    if m == "redo":
        return err(req, "nothing-to-redo", "Nothing to redo")
    if m == "status":
        return ok(req, {"workspace": "/w", "store": "/s", "socket": "/k", "epoch": 7,
                        "open_turn": None, "mounted": True, "pid": 1})
    if m == "hang":
        return None
    if m == "garbage":
        return ["not an object"]
    return err(req, "unknown-method", m)


@pytest.fixture
def daemon(tmp_path):
    d = ScriptedDaemon(str(tmp_path / "d.sock"), standard_reply)
    yield d
    d.close()


def test_typed_results_and_events(daemon):
    with Client(daemon.path, timeout=5) as c:
        assert c.turn_begin("s1", 2, "second") == 12
        assert daemon.requests[-1] == {"v": 1, "id": 1, "method": "turn.begin",
                                       "params": {"session": "s1", "turn": 2, "label": "second"}}
        pts = c.points("s1")
        assert [(p.epoch, p.kind, p.turn) for p in pts] == [(4, "turn", 1), (5, "idle", None),
                                                            (6, "turn", 2)]
        assert pts[2].raw["future_field"] is True
        events = []
        r = c.rewind(6, session="s1", undo_for="s2", on_event=events.append)
        assert events == [{"type": "rewind.planned", "actions": 2}]
        assert (r.epoch, r.target, r.written, r.deleted, r.partial) == (20, 6, 1, 1, True)
        assert r.failed[0].path == "x"
        assert daemon.requests[-1]["params"] == {"to": 6, "session": "s1", "undo_for": "s2"}
        assert c.status().pid == 1


def test_daemon_errors_keep_their_code_and_connection(daemon):
    with Client(daemon.path, timeout=5) as c:
        with pytest.raises(RewindfsClientError) as exc:
            c.redo("s2")
        assert exc.value.code == "nothing-to-redo"
        assert c.turn_end("s1") == 99  # the connection survived the error reply


def test_protocol_failures(daemon):
    with Client(daemon.path, timeout=5) as c:
        with pytest.raises(RewindfsClientError) as exc:
            c.call("garbage")
        assert exc.value.code == "bad-response"
        with pytest.raises(RewindfsClientError) as exc:
            c.call("hang")
        assert exc.value.code == "connection-lost"
        assert c.turn_end() == 99  # reconnects after a lost connection


def test_timeout_and_unreachable(tmp_path):
    silent = ScriptedDaemon(str(tmp_path / "q.sock"), lambda req: [])
    try:
        with Client(silent.path, timeout=0.2) as c:
            with pytest.raises(RewindfsClientError) as exc:
                c.status()
            assert exc.value.code == "timeout"
    finally:
        silent.close()
    with pytest.raises(DaemonUnreachable) as exc:
        Client(str(tmp_path / "none.sock")).status()
    assert exc.value.code == "daemon-unreachable"


async def test_trio_client(daemon):
    async with TrioClient(daemon.path, timeout=5) as c:
        assert await c.turn_begin("s1", 1, "first") == 11
        events = []
        r = await c.rewind(4, on_event=events.append)
        assert r.target == 4 and len(events) == 1
        with pytest.raises(RewindfsClientError) as exc:
            await c.rewind(5)
        assert exc.value.code == "unknown-point"
        assert [p.epoch for p in await c.points()] == [4, 5, 6]
    c2 = TrioClient(daemon.path, timeout=0.3)
    with pytest.raises(RewindfsClientError) as exc:
        await c2.call("hang")
    assert exc.value.code == "connection-lost"


def test_agent_api(daemon):
    rw = Rewindfs(Client(daemon.path, timeout=5))
    with rw.turn("s1", 3, "third line\nmore") as mark:
        assert mark.protected and mark.epoch == 13
        assert daemon.requests[-1]["params"]["label"] == "third line"
    assert daemon.requests[-1]["method"] == "turn.end"
    with pytest.raises(ValueError):
        with rw.turn("s1", 4, "boom"):
            raise ValueError
    assert daemon.requests[-1]["method"] == "turn.end"  # ended also when the block raises
    assert rw.rewind(2, session="s1").target == "t2"   # the daemon resolves the turn
    assert daemon.requests[-1]["params"] == {"to": "t2", "session": "s1"}
    assert rw.rewind(epoch=6).target == "e6"
    assert rw.epoch_of(2, "s1") == 6
    with pytest.raises(RewindfsClientError) as exc:
        rw.rewind(7, session="s1")
    assert exc.value.code == "unknown-point"
    with pytest.raises(RewindfsClientError) as exc:
        rw.rewind(-1, session="s1")
    assert exc.value.code == "relative-point"
    with pytest.raises(RewindfsClientError) as exc:
        rw.redo(session="s1")
    assert exc.value.code == "nothing-to-redo"
    rw.close()


def test_unprotected_turns_warn_once(tmp_path, caplog):
    rw = Rewindfs(Client(str(tmp_path / "gone.sock"), timeout=1))
    with caplog.at_level(logging.WARNING, logger="plugin.agent"):
        for n in (1, 2):
            with rw.turn("s", n, "x") as mark:
                assert not mark.protected
    assert len([r for r in caplog.records if "unprotected" in r.message]) == 1
    strict = Rewindfs(Client(str(tmp_path / "gone.sock")), strict=True)
    with pytest.raises(DaemonUnreachable):
        with strict.turn("s", 1, "x"):
            pass


def test_find_socket_walks_up(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    store = tmp_path / "store"
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    assert find_socket(ws / "a" / "b", store) is None
    with pytest.raises(NotMounted) as exc:
        Rewindfs.for_directory(ws / "a", store=store, strict=True)
    assert exc.value.code == "not-mounted"
    sock = control_socket_path(store, ws)
    assert sock == socket_path_for(os.fsencode(os.path.realpath(store)),
                                   os.fsencode(os.path.realpath(ws)), os.getuid(),
                                   os.fsencode(str(runtime)))
    os.makedirs(os.path.dirname(sock))
    d = ScriptedDaemon(os.fsdecode(sock), standard_reply)
    try:
        assert find_socket(ws / "a" / "b", store) == (sock, os.fsencode(os.path.realpath(ws)))
        with Client.for_directory(ws / "a" / "b", store=store) as c:
            assert c.status().workspace == "/w"
        monkeypatch.setenv("REWINDFS_HOME", str(store))
        assert find_socket(ws / "a")[0] == sock  # default store from the environment
    finally:
        d.close()


def test_plugin_imports_no_store_or_lmdb():
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "plugin"
    for py in root.glob("*.py"):
        tree = ast.parse(py.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for n in names:
                assert n.split(".")[0] not in ("store", "overlay", "lmdb"), (py, n)


def test_agent_with_a_remote_pushes_after_each_turn_and_learns_unknown_points(tmp_path, caplog):
    learned = []

    def reply(req):
        m, p = req["method"], req["params"]
        if m == "push":
            return ok(req, {"queued": True, "pending": 1})
        if m == "remote.learn":
            learned.append(p)
            return ok(req, {"remote": p["remote"], "head_epoch": 30, "epoch": 31})
        if m == "rewind" and not learned:
            return err(req, "unknown-point", "No point t2 of session s1 in this workspace")
        return standard_reply(req)

    d = ScriptedDaemon(str(tmp_path / "d.sock"), reply)
    try:
        rw = Rewindfs(Client(d.path, timeout=5), remote="origin")
        with rw.turn("s1", 3, "x") as mark:
            pass
        assert [r["method"] for r in d.requests] == ["turn.begin", "turn.end", "push"]
        assert d.requests[-1]["params"] == {"remote": "origin", "wait": False}
        assert mark.push == {"queued": True, "pending": 1} and mark.push_error is None
        res = rw.rewind(2, session="s1")
        assert [r["method"] for r in d.requests[3:]] == ["rewind", "remote.learn", "rewind"]
        assert learned == [{"remote": "origin", "session": "s1"}]
        assert res.target == "t2" and res.learned["head_epoch"] == 30
        # learned once: a point still unknown afterwards is refused as it is
        with pytest.raises(RewindfsClientError) as exc:
            rw.rewind(7, session="s1")
        assert exc.value.code == "unknown-point" and len(learned) == 1
    finally:
        d.close()


def test_a_refused_push_never_fails_the_turn_and_is_logged_once(daemon, caplog):
    rw = Rewindfs(Client(daemon.path, timeout=5), remote="origin")   # no push method
    with caplog.at_level(logging.WARNING):
        for n in (1, 2):
            with rw.turn("s1", n, "x") as mark:
                pass
            assert mark.push is None and mark.push_error.code == "unknown-method"
    assert [r["method"] for r in daemon.requests] == ["turn.begin", "turn.end", "push"] * 2
    warned = [r.message for r in caplog.records if "not pushed" in r.message]
    assert len(warned) == 1 and "no push method" in warned[0], warned
