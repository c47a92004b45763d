"""The control socket under malformed input (property-based) and foreign clients.

One live daemon takes thousands of generated messages — random bytes, random JSON,
wrong types for every parameter of every method, huge ids, deep nesting — and answers
each with exactly one well-formed reply: an error (never the catch-all ``internal``,
which would mean a validation gap) where the message is malformed.  A valid ``status``
works afterwards, and the workspace is untouched.  A client running as another uid
(fork + ``setuid(65534)``) is refused.

More examples: ``REWINDFS_TRIALS=N`` multiplies the example counts.
"""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mountkit import mounted
from relkit import socket_of

pytestmark = pytest.mark.mount

SCALE = int(os.environ.get("REWINDFS_TRIALS", 1))
FUZZ = settings(max_examples=700 * SCALE, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


class Client:
    """One persistent connection: ``ask(line)`` → the final reply (events skipped)."""

    def __init__(self, path: bytes):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(60)
        self.sock.connect(path)
        self.buf = b""
        self.sent = 0

    def ask(self, line: bytes) -> dict:
        self.sock.sendall(line + b"\n")
        self.sent += 1
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                assert chunk, f"daemon closed the connection after {line[:200]!r}"
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(raw)
            assert msg.get("v") == 1, msg
            if "event" not in msg:
                assert isinstance(msg.get("ok"), bool), msg
                return msg

    def close(self):
        self.sock.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    top = tmp_path_factory.mktemp("sock")
    ws = top / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("keep")
    with mounted(ws, top / "store") as m:
        m.call("turn.begin", session="s", turn=1, label="one")
        (ws / "d" / "f").write_text("keep!")
        m.call("turn.end")
        client = Client(socket_of(m.store, ws))
        try:
            yield m, client
        finally:
            client.close()
        assert m.call("status")["mounted"] is True
        assert (ws / "d" / "f").read_text() == "keep!"


def _error(reply: dict) -> str:
    assert reply["ok"] is False, reply
    code = reply["error"]["code"]
    assert isinstance(code, str) and isinstance(reply["error"]["message"], str), reply
    assert code != "internal", reply        # caught only by the safety net: a gap
    return code


# -- generators ---------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                      st.text(max_size=20), st.integers(min_value=10**18, max_value=10**60))
json_any = st.recursive(json_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)

# Every method's parameters, each with values of the wrong type (or out of range).
WRONG = {
    "turn.begin": {"session": [5, None, [], "", {}, "\ud800"],
                   "turn": ["1", 0, -3, 1.5, True, None],
                   "label": [5, [], {}, "\udfff"]},
    "turn.end": {"session": [5, [], {}, ""]},
    "points": {"session": [5, [], {}, ""]},
    "fork": {"child": [5, None, "", "\ud800"], "parent": [5, None, ""],
             "boundary_turn": ["x", -1, None]},
    "rewind": {"to": [None, [], {}, True, "", "-1", "~1", "HEAD~1", "e999999", 10**40,
                      "\ud800", "t\udcff"],
               "paths": ["d", [], [5], [None], {}, ["../x"], ["/abs"], ["a\x00b"],
                         ["x" * 5000], ["d/" * 3000]],
               "dry_run": ["yes", 1, None], "force": ["yes", 1], "session": [5, ""],
               "undo_for": [5, [], ""]},
    "redo": {"session": [5, [], ""], "dry_run": ["no", 0], "force": [[], "x"]},
    "diff": {"a": [None, [], {}, True, "", "prev"], "b": [[], {}, True, "~2"],
             "paths": ["d", [], [1], ["/x"], ["a\x00b"], ["y" * 5000]], "session": [5, ""]},
    "show": {"point": [[], {}, True, "", "-1"], "path": [None, 5, [], "", "/etc/passwd",
                                                         "../x", "\ud800", "d/f\x00",
                                                         "z" * 5000, "d/" * 3000],
             "session": [7, []]},
    "gc": {"grace_s": ["1", -1, [], True], "keep_epochs": ["x", -5, {}, 1.5e300],
           "max_age_s": ["1d", -1, []], "max_bytes": [[], "1M", -1, 2.5],
           "drop_redo": ["yes", 1, []]},
}
VALID = {"turn.begin": {"session": "s", "turn": 9, "label": "x"}, "fork": {
    "child": "c", "parent": "s", "boundary_turn": 1}, "rewind": {"to": "e1", "dry_run": True},
    "redo": {"dry_run": True}, "diff": {"a": "e1"}, "show": {"path": "d/f"}}


@st.composite
def wrong_params(draw):
    method = draw(st.sampled_from(sorted(WRONG)))
    params = dict(VALID.get(method, {}))
    bad = draw(st.sampled_from(sorted(WRONG[method])))
    params[bad] = draw(st.sampled_from(WRONG[method][bad]))
    return method, params


def _req(method, params, rid=1, v=1) -> bytes:
    return json.dumps({"v": v, "id": rid, "method": method, "params": params}).encode()


# -- the properties -------------------------------------------------------------------

@FUZZ
@given(st.binary(min_size=1, max_size=300))
def test_random_bytes(daemon, data):
    _m, client = daemon
    line = b"#" + data.replace(b"\n", b" ")     # one non-blank line
    _error(client.ask(line))


@FUZZ
@given(json_any)
def test_random_json_values(daemon, value):
    _m, client = daemon
    if isinstance(value, dict) and value.get("v") == 1:
        value["v"] = 2
    _error(client.ask(json.dumps(value).encode()))


@FUZZ
@given(rid=json_any, method=json_any, params=json_any, v=json_any)
def test_wrong_envelope_types(daemon, rid, method, params, v):
    _m, client = daemon
    if v == 1 and isinstance(method, str) and isinstance(params, (dict, type(None))) \
            and isinstance(rid, (int, str)) and not isinstance(rid, bool):
        method = ["not", "a", "method"]
    _error(client.ask(json.dumps({"v": v, "id": rid, "method": method,
                                  "params": params}).encode()))


@FUZZ
@given(wrong_params(), st.one_of(st.integers(), st.text(max_size=30)))
def test_wrong_parameter_types(daemon, call, rid):
    _m, client = daemon
    method, params = call
    reply = _error(client.ask(_req(method, params, rid)))
    assert reply in ("bad-params", "path-escape", "relative-point", "unknown-point",
                     "bad-point", "bad-path", "path-too-long", "ambiguous-point", "bad-session",
                     "session-conflict", "not-a-file"), (method, params, reply)


def test_edge_messages(daemon):
    m, client = daemon
    deep = b"[" * 100_000 + b"]" * 100_000
    for line in (deep, b'{"v":1,"id":1,"method":"status","params":' + deep + b"}",
                 b"\xff\xfe\x00", b"{" * 5000, b'"just a string"', b"nan", b"1e999999",
                 b'{"v":1,"id":' + b"9" * 5000 + b',"method":"status"}',
                 _req("unknown.method", {}), _req("status", [], rid=2),
                 _req("status", {}, v=None), _req("rewind", {"to": "e1"}, rid=True)):
        _error(client.ask(line))
    big = 10**300   # huge ids are echoed, not mangled
    reply = client.ask(_req("points", {}, rid=big))
    assert reply["ok"] and reply["id"] == big
    reply = client.ask(b"x" * (2 << 20))
    assert _error(reply) == "too-large"
    assert client.ask(_req("status", {}))["ok"]
    assert m.call("status")["mounted"] is True


# -- a client of another uid ---------------------------------------------------------------

def _as_nobody(path: bytes) -> str:
    """Fork; the child drops to uid 65534 and tries a ``status``.  Returns what it saw:
    ``refused-connect``, ``forbidden`` or ``answered``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                c = Client(path)
                reply = c.ask(_req("status", {}))
                what = "forbidden" if reply.get("error", {}).get("code") == "forbidden" \
                    else "answered"
            except PermissionError:
                what = "refused-connect"
            except (AssertionError, OSError):
                what = "forbidden"      # closed on us without answering: also a refusal
            os.write(w, what.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


def test_other_uid_is_refused(daemon):
    m, _client = daemon
    path = socket_of(m.store, m.ws)
    assert _as_nobody(path) == "refused-connect"        # 0700 dir / 0600 socket
    # With the file modes opened up, the peer-uid check alone must refuse it.
    d = os.path.dirname(path)
    dmode, smode = stat.S_IMODE(os.stat(d).st_mode), stat.S_IMODE(os.stat(path).st_mode)
    try:
        os.chmod(d, 0o755)
        os.chmod(path, 0o666)
        assert _as_nobody(path) == "forbidden"
    finally:
        os.chmod(d, dmode)
        os.chmod(path, smode)
    assert m.call("status")["mounted"] is True
