"""The control socket: v1 JSON lines, structured errors, peer-uid check, and the daemon
(and its mount) keep serving after every bad message."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from mountkit import mounted
from rewindfs.overlay.control.client import call
from rewindfs.overlay.errors import BadParams, UnknownMethod
from rewindfs.store._errors import RewindfsError

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    base = tmp_path_factory.mktemp("proto")
    with mounted(base / "ws", base / "store") as mnt:
        yield mnt


class Raw:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(30)
        self.s.connect(path)
        self.buf = b""

    def send(self, data: bytes):
        self.s.sendall(data)

    def line(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        self.s.close()


def alive(m):
    assert call(m.socket, "status", {})["mounted"] is True
    (m.ws / "alive").write_text("yes")
    assert (m.ws / "alive").read_text() == "yes"


def test_socket_is_private(m):
    st = os.stat(m.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.getuid()


def test_turns_status_points(m):
    r1 = m.call("turn.begin", session="s1", turn=1, label="first line\nsecond")
    st = m.call("status")
    assert st["open_turn"]["turn"] == 1 and st["open_turn"]["label"] == "first line"
    assert st["epoch"] == r1["epoch"] and st["workspace"] == os.path.realpath(m.ws)
    assert st["socket"] == os.fsdecode(m.socket) and st["pid"] == m.proc.pid
    with pytest.raises(RewindfsError) as exc:     # another session's turn stays open
        call(m.socket, "turn.end", {"session": "intruder"})
    assert exc.value.code == "bad-session" and m.call("status")["open_turn"]["turn"] == 1
    r2 = m.call("turn.end", session="s1")
    assert r2["epoch"] > r1["epoch"]
    assert m.call("status")["open_turn"] is None
    pts = m.call("points")["points"]
    assert [p["kind"] for p in pts if p["epoch"] in (r1["epoch"], r2["epoch"])] == [
        "turn", "idle"]
    assert [p["epoch"] for p in m.call("points", session="s1")["points"]] == [r1["epoch"]]
    assert m.call("fork", child="s2", parent="s1", boundary_turn=1) == {}
    assert r1["epoch"] in [p["epoch"] for p in m.call("points", session="s2")["points"]]


@pytest.mark.parametrize("payload, code", [
    (b"this is not json\n", "bad-json"),
    (b"[1,2,3]\n", "bad-json"),
    (b'{"v":2,"id":1,"method":"status"}\n', "bad-version"),
    (b'{"id":1,"method":"status"}\n', "bad-version"),
    (b'{"v":1,"id":1,"method":"no.such"}\n', "unknown-method"),
    (b'{"v":1,"id":1,"method":"turn.begin","params":{"session":"s","turn":0}}\n', "bad-params"),
    (b'{"v":1,"id":1,"method":"turn.begin","params":{"session":"","turn":1}}\n', "bad-params"),
    (b'{"v":1,"id":1,"method":"turn.begin","params":[1]}\n', "bad-params"),
    (b'{"v":1,"id":true,"method":"status"}\n', "bad-params"),
    (b'\xff\xfe\n', "bad-json"),
])
def test_malformed_messages_get_structured_errors(m, payload, code):
    c = Raw(m.socket)
    try:
        c.send(payload)
        reply = c.line()
        assert reply["v"] == 1 and reply["ok"] is False
        assert reply["error"]["code"] == code and reply["error"]["message"]
        # the same connection keeps working
        c.send(b'{"v":1,"id":9,"method":"status"}\n')
        assert c.line()["ok"] is True
    finally:
        c.close()
    alive(m)


def test_oversized_line_is_refused_and_connection_recovers(m):
    c = Raw(m.socket)
    try:
        c.send(b'{"v":1,"id":1,"method":"status","params":{"x":"' + b"a" * (2 << 20))
        reply = c.line()
        assert reply["error"]["code"] == "too-large"
        c.send(b'"}}\n{"v":1,"id":2,"method":"status"}\n')
        reply = c.line()
        assert reply["id"] == 2 and reply["ok"] is True
    finally:
        c.close()
    alive(m)


def test_abrupt_disconnects_do_not_hurt(m):
    for _ in range(20):
        c = Raw(m.socket)
        c.send(b'{"v":1,"id":1,"method":"sta')
        c.close()
    c = Raw(m.socket)
    c.send(b'{"v":1,"id":1,"method":"status"}\n')
    c.close()  # before reading the reply
    alive(m)


def test_ids_are_echoed_and_pipelined(m):
    c = Raw(m.socket)
    try:
        c.send(b'{"v":1,"id":"a","method":"status"}\n{"v":1,"id":7,"method":"nope"}\n')
        assert c.line()["id"] == "a"
        second = c.line()
        assert second["id"] == 7 and second["error"]["code"] == "unknown-method"
    finally:
        c.close()


def test_other_uid_is_refused(m):
    """Peer-credential check: a process of another uid gets ``forbidden`` even when the
    file mode would let it connect (the test opens the modes to reach that layer)."""
    path = m.socket  # computed now: it depends on the uid
    sock_dir = os.path.dirname(path)
    old_dir = stat.S_IMODE(os.stat(sock_dir).st_mode)
    os.chmod(sock_dir, 0o711)
    os.chmod(m.socket, 0o666)
    r, w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # child: become nobody, then connect
            try:
                os.close(r)
                os.setgid(65534)
                os.setuid(65534)
                c = Raw(path)
                try:  # the daemon may answer and close before we even send
                    c.send(b'{"v":1,"id":1,"method":"status"}\n')
                except BrokenPipeError:
                    pass
                os.write(w, json.dumps(c.line()).encode())
            except BaseException as exc:
                os.write(w, json.dumps({"child-error": repr(exc)}).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            reply = json.loads(f.read())
        os.waitpid(pid, 0)
    finally:
        os.chmod(m.socket, 0o600)
        os.chmod(sock_dir, old_dir)
    assert reply.get("ok") is False, reply
    assert reply["error"]["code"] == "forbidden"
    alive(m)


def test_client_raises_typed_errors(m):
    with pytest.raises(UnknownMethod):
        call(m.socket, "bogus", {})
    with pytest.raises(BadParams) as exc:
        call(m.socket, "turn.begin", {"session": "s", "turn": "3"})
    assert exc.value.exit_code == 3
