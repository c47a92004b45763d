"""The control dispatch in-process: no mount, no socket file, a real store on disk.

The daemon's ``DaemonContext`` is built over a real directory with a real
``RewindOperations`` that is never mounted (its kernel notifications have no session
to go to and are dropped), and requests go straight into the dispatch
(``methods.dispatch``, one request line → exactly one reply line, events first) or,
for framing, into the connection reader (``control.server._read_requests``) over an in-memory
stream.  What this proves, beside the real-mount tests of the same wire
(tests/test_protocol.py): every method's happy path that needs no kernel, the exact
error code of every refusal, and that a refused request leaves the store and the
workspace exactly as they were.
"""

from __future__ import annotations

import base64
import errno
import functools
import json
import os
import socket
import stat

import pyfuse3
import pytest
import trio
import trio.testing

# Kits by today's names; the overlay modules by today's names (one line each to
# rewrite after the move into wings).
import store_fixtures
from rewindfs.overlay.control import methods, wire
from rewindfs.overlay.control import server as control_server
from rewindfs.overlay.control.server import _read_requests, _serve_connection
from rewindfs.overlay.daemon import DaemonContext
from rewindfs.overlay.rewind import land
from rewindfs.overlay.fs.ops import RewindOperations
from rewindfs.store import Store

ROOT = pyfuse3.ROOT_INODE
SOCKET = b"/nonexistent/rewindfs-test.sock"   # reported by status, never bound


class FakeRequest:
    """What pyfuse3 passes handlers as ``ctx`` (its ``RequestContext`` cannot be
    filled in from Python)."""

    def __init__(self, uid=None, gid=None, pid=None, umask=0o022):
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.pid = os.getpid() if pid is None else pid
        self.umask = umask


REQ = FakeRequest()


class Daemon:
    """A DaemonContext over ``tmp_path/ws`` and a store in ``tmp_path/store``."""

    def __init__(self, tmp_path):
        self.root = tmp_path / "ws"
        self.root.mkdir()
        self.real = os.path.realpath(os.fsencode(self.root))
        self.store = Store.open(tmp_path / "store")
        self.ws = self.store.workspace(self.real)
        self.root_fd = os.open(self.real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fs = RewindOperations(self.root_fd, self.store, self.ws)
        self.ctx = DaemonContext(store=self.store, ws=self.ws, root_fd=self.root_fd,
                                 workspace_path=self.real, socket_path=SOCKET, fs=self.fs)
        self._ids = 0

    def close(self):
        try:
            self.fs.close()
            os.close(self.root_fd)
            store_fixtures.assert_sound(self.store)
        finally:
            self.store.close()

    async def lines(self, line: bytes) -> list[dict]:
        """Every line the dispatch sends for one request line, parsed."""
        sent = []

        async def send(data: bytes) -> None:
            assert data.endswith(b"\n")
            sent.extend(json.loads(x) for x in data.splitlines())

        await methods.dispatch(self.ctx, line, send)
        assert sent, "the dispatch sent nothing"
        for msg in sent:
            assert msg["v"] == 1
        # exactly one reply, and it is the last line
        assert [("ok" in m) for m in sent] == [False] * (len(sent) - 1) + [True]
        return sent

    async def request(self, method: str, **params) -> tuple[dict, list[dict]]:
        """(reply, events) of one well-formed request."""
        self._ids += 1
        rid = self._ids
        sent = await self.lines(json.dumps({"v": 1, "id": rid, "method": method,
                                            "params": params}).encode())
        for msg in sent:
            assert msg["id"] == rid
        return sent[-1], [m["event"] for m in sent[:-1]]

    async def call(self, method: str, **params) -> dict:
        reply, _ = await self.request(method, **params)
        assert reply["ok"] is True, reply
        return reply["result"]

    async def refused(self, method: str, code: str, **params) -> dict:
        """The error of a request that must be refused with ``code``; the store and
        the workspace are unchanged by it."""
        before = self.state()
        reply, events = await self.request(method, **params)
        assert reply["ok"] is False, reply
        assert reply["error"]["code"] == code, reply
        assert reply["error"]["message"]
        assert self.state() == before
        return reply["error"]

    def state(self):
        """Everything a request could change: the epochs, their journals, the entry
        count of every index database (sessions, turns, blobs, …), the intent, the
        filesystem's epoch, and the real tree (names, kinds, contents)."""
        epochs = self.store.epochs(self.ws)
        journals = {e.id: sorted(self.store.journal(self.ws, e.id)) for e in epochs}
        stats = self.store.statistics()["entries"]
        return (epochs, journals, stats, self.store.get_intent(self.ws),
                self.fs.epoch_id, tree(self.root))

    # -- changes through the (unmounted) filesystem's handlers ---------------------

    async def put(self, name: str, data: bytes) -> None:
        """Write a file at the workspace root the way the kernel would ask for it."""
        entry = await self.fs.lookup(ROOT, name.encode(), REQ)
        if entry.st_ino:
            info = await self.fs.open(entry.st_ino, os.O_WRONLY | os.O_TRUNC, REQ)
        else:
            info, entry = await self.fs.create(ROOT, name.encode(), 0o100644,
                                               os.O_WRONLY, REQ)
        await self.fs.write(info.fh, 0, data)
        await self.fs.release(info.fh)


def tree(root) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[rel] = f.read()
            else:
                out[rel] = stat.S_IFMT(st.st_mode)
    return out


@pytest.fixture
def d(tmp_path):
    daemon = Daemon(tmp_path)
    try:
        yield daemon
    finally:
        daemon.close()


# -- happy paths ---------------------------------------------------------------------

async def test_status_reports_this_daemon(d):
    st = await d.call("status")
    assert st["workspace"] == os.fsdecode(d.real)
    assert st["store"] == str(d.store.path)
    assert st["socket"] == os.fsdecode(SOCKET)
    assert st["mounted"] is True and st["pid"] == os.getpid()
    assert st["epoch"] == d.store.current_epoch(d.ws).id == d.fs.epoch_id
    assert st["epoch_kind"] == "idle" and st["open_turn"] is None
    assert st["fs"]["epoch"] == st["epoch"]
    assert "usage" not in st and "intent" not in st
    with_usage = await d.call("status", usage=True)
    (mine,) = with_usage["usage"]["workspaces"]
    assert (mine["workspace"], mine["path"]) == (d.ws, os.fsdecode(d.real))
    assert with_usage["usage"]["store"]["path"] == str(d.store.path)


async def test_turn_begin_and_end_move_the_filesystem_to_the_new_epoch(d):
    began = await d.call("turn.begin", session="s1", turn=1, label="first\nsecond")
    assert d.fs.epoch_id == began["epoch"]        # captures go to the turn from now on
    st = await d.call("status")
    assert st["epoch"] == began["epoch"] and st["epoch_kind"] == "turn"
    assert st["open_turn"]["session"] == "s1" and st["open_turn"]["turn"] == 1
    assert st["open_turn"]["label"] == "first"    # the first line only
    await d.put("f", b"in the turn")
    assert [p for p, _ in d.store.journal(d.ws, began["epoch"])] == [b"f"]
    ended = await d.call("turn.end", session="s1")
    assert ended["epoch"] > began["epoch"] and d.fs.epoch_id == ended["epoch"]
    assert d.store.epoch(ended["epoch"]).kind == "idle"
    assert (await d.call("status"))["open_turn"] is None


async def test_turn_begin_while_another_session_holds_a_turn(d):
    held = await d.call("turn.begin", session="s1", turn=1, label="x")
    err = await d.refused("turn.begin", "turn-open", session="s2", turn=1, label="y")
    assert "s1" in err["message"]
    await d.refused("turn.end", "bad-session", session="s2")
    forced = await d.call("turn.begin", session="s2", turn=1, label="y", force=True)
    assert forced["epoch"] > held["epoch"] and d.fs.epoch_id == forced["epoch"]
    assert (await d.call("status"))["open_turn"]["session"] == "s2"


async def test_turn_marks_are_idempotent_and_an_end_without_a_turn_is_a_no_op(d):
    idle = (await d.call("turn.end"))["epoch"]
    assert idle == d.store.current_epoch(d.ws).id and len(d.store.epochs(d.ws)) == 1
    first = await d.call("turn.begin", session="s", turn=1, label="x")
    again = await d.call("turn.begin", session="s", turn=1, label="x")
    assert again == first and d.fs.epoch_id == first["epoch"]
    nxt = await d.call("turn.begin", session="s", turn=2, label="y")   # closes turn 1
    assert nxt["epoch"] > first["epoch"] and d.store.epoch(first["epoch"]).ended_ns


async def test_points_per_session_and_fork(d):
    t1 = (await d.call("turn.begin", session="s1", turn=1, label="one"))["epoch"]
    await d.call("turn.end", session="s1")
    t2 = (await d.call("turn.begin", session="s1", turn=2, label="two"))["epoch"]
    await d.call("turn.end")
    pts = (await d.call("points"))["points"]
    assert [p["epoch"] for p in pts] == [e.id for e in d.store.epochs(d.ws)]
    assert {p["epoch"]: p["kind"] for p in pts}[t1] == "turn"
    mine = (await d.call("points", session="s1"))["points"]
    assert [(p["epoch"], p["turn"], p["label"]) for p in mine] == [
        (t1, 1, "one"), (t2, 2, "two")]
    assert await d.call("fork", child="c", parent="s1", boundary_turn=1) == {}
    assert [p["epoch"] for p in (await d.call("points", session="c"))["points"]] == [t1]


async def test_rewind_dry_run_then_rewind_then_redo(d):
    await d.put("f", b"v1")
    t1 = (await d.call("turn.begin", session="s", turn=1, label="one"))["epoch"]
    await d.put("f", b"v2")
    await d.put("new", b"made in turn 1")
    await d.call("turn.end", session="s")
    before = tree(d.root)

    dry, events = await d.request("rewind", to=f"e{t1}", dry_run=True)
    assert dry["ok"] is True
    res = dry["result"]
    assert res["dry_run"] is True and res["epoch"] is None and res["target"] == t1
    assert sorted((c["path"], c["change"]) for c in res["changes"]) == [
        ("f", "written"), ("new", "deleted")]
    assert [e["type"] for e in events] == ["rewind.planned"]
    assert tree(d.root) == before                 # a dry run changes nothing

    reply, events = await d.request("rewind", to=f"e{t1}", session="s")
    res = reply["result"]
    assert reply["ok"] is True and res["exit_code"] == 0 and res["failed"] == []
    assert (res["target"], res["written"], res["deleted"]) == (t1, 1, 1)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "rewind.planned" and kinds[-1] == "rewind.done"
    assert {(e["path"], e["type"]) for e in events if "path" in e} == {
        ("f", "rewind.written"), ("new", "rewind.deleted")}
    assert tree(d.root) == {"f": b"v1"}
    assert d.store.epoch(res["epoch"]).kind == "rewind"
    assert d.fs.epoch_id == d.store.current_epoch(d.ws).id   # epoch_changed reached fs

    redone = await d.call("redo", session="s")
    assert redone["exit_code"] == 0 and redone["target"] == res["epoch"]
    assert tree(d.root) == before


async def test_a_turn_mark_waits_for_a_running_rewind_whose_paths_are_fenced(
        d, tmp_path, monkeypatch):
    """The landing is paused after its first change (the restore engine's test hook):
    meanwhile the planned paths answer EBUSY through the filesystem, other paths do
    not, and a turn mark waits for the rewind instead of closing its epoch."""
    await d.put("f", b"f1")
    await d.put("g", b"g1")
    await d.put("free", b"x")          # unchanged since the point: not in the plan
    t1 = (await d.call("turn.begin", session="s", turn=1, label="one"))["epoch"]
    await d.put("f", b"f2")
    await d.put("g", b"g2")
    await d.call("turn.end", session="s")
    pause = tmp_path / "paused"
    monkeypatch.setenv("REWINDFS_PAUSE_AFTER", "1")
    monkeypatch.setenv("REWINDFS_PAUSE_FILE", str(pause))
    monkeypatch.setattr(land.FAULT, "paused", False)   # once per process
    done = {}

    async def run(name, method, **params):
        done[name] = await d.request(method, **params)

    with trio.fail_after(60):           # a hang fails the test instead of the session
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(run, "rewind", "rewind", to=f"e{t1}"))
            try:
                while not pause.exists():
                    await trio.sleep(0.005)
                rewind_epoch = d.fs.epoch_id
                assert d.store.epoch(rewind_epoch).kind == "rewind"
                for name in (b"f", b"g"):
                    ino = (await d.fs.lookup(ROOT, name, REQ)).st_ino
                    with pytest.raises(pyfuse3.FUSEError) as exc:
                        await d.fs.open(ino, os.O_WRONLY, REQ)
                    assert exc.value.errno == errno.EBUSY
                await d.put("free", b"y")                     # not in the plan
                nursery.start_soon(functools.partial(run, "mark", "turn.begin",
                                                     session="s", turn=2, label="two"))
                await trio.testing.wait_all_tasks_blocked()
                assert "mark" not in done and d.fs.epoch_id == rewind_epoch
            finally:   # the worker thread cannot be cancelled: always let it go on
                pause.unlink(missing_ok=True)
    reply, events = done["rewind"]
    assert reply["ok"] is True and reply["result"]["exit_code"] == 0
    assert reply["result"]["epoch"] == rewind_epoch
    mark, _ = done["mark"]
    assert mark["ok"] is True and mark["result"]["epoch"] > rewind_epoch
    assert d.store.epoch(rewind_epoch).ended_ns is not None
    assert tree(d.root) == {"f": b"f1", "g": b"g1", "free": b"y"}
    assert d.fs.busy == set()                              # unfenced after landing


async def test_rewind_refused_while_a_turn_is_open(d):
    t1 = (await d.call("turn.begin", session="s", turn=1, label="one"))["epoch"]
    await d.put("f", b"x")
    await d.refused("rewind", "turn-open", to=f"e{t1}")
    done = await d.call("rewind", to=f"e{t1}", force=True)
    assert done["exit_code"] == 0 and tree(d.root) == {}


async def test_diff_and_show(d):
    await d.put("f", b"old")
    t1 = (await d.call("turn.begin", session="s", turn=1, label="one"))["epoch"]
    await d.put("f", b"newer")
    await d.put("g", b"g")
    await d.call("turn.end")

    diff = await d.call("diff", a=f"e{t1}")
    assert diff["a"] == t1 and diff["b"] is None
    assert {c["path"]: (c["a_kind"], c["b_kind"]) for c in diff["changes"]} == {
        "f": ("file", "file"), "g": ("absent", "file")}
    only_g = await d.call("diff", a=f"e{t1}", paths=["g"])
    assert [c["path"] for c in only_g["changes"]] == ["g"]

    inline = await d.call("show", point=f"e{t1}", path="f")
    assert inline["exists"] is True and base64.b64decode(inline["content_b64"]) == b"old"
    now = await d.call("show", path="f")
    assert now["point"] is None and base64.b64decode(now["content_b64"]) == b"newer"
    absent = await d.call("show", point=f"e{t1}", path="g")
    assert absent == {"point": t1, "exists": False, "content_b64": None}

    reply, events = await d.request("show", point=f"e{t1}", path="f", stream=True)
    assert reply["result"] == {"point": t1, "exists": True, "size": 3, "streamed": True}
    assert events[0] == {"type": "show.start", "point": t1, "size": 3}
    data = b"".join(base64.b64decode(e["data_b64"]) for e in events[1:])
    assert data == b"old" and [e["type"] for e in events[1:]] == ["show.chunk"]


async def test_show_inline_is_bounded_and_stream_is_not(d):
    big = os.urandom(600 * 1024)
    await d.put("big", big)
    await d.refused("show", "content-too-large", path="big")
    reply, events = await d.request("show", path="big", stream=True)
    assert reply["result"]["size"] == len(big)
    chunks = events[1:]
    assert len(chunks) > 1 and [c["offset"] for c in chunks][0] == 0
    assert b"".join(base64.b64decode(c["data_b64"]) for c in chunks) == big


async def test_gc(d):
    await d.put("f", b"a" * 10_000)
    await d.call("turn.begin", session="s", turn=1, label="one")
    await d.put("f", b"b")                       # pre-image: the 10,000 bytes
    await d.call("turn.end")
    assert len(d.store.epochs(d.ws)) == 3
    report = await d.call("gc", grace_s=0)
    assert report == {"epochs_dropped": 0, "entries_dropped": 0, "blobs_removed": 0,
                      "bytes_freed": 0, "files_removed": 0}   # all still referenced
    kept = await d.call("gc", grace_s=0, keep_epochs=1, drop_redo=True)
    assert (kept["epochs_dropped"], kept["entries_dropped"]) == (2, 2)
    assert (kept["blobs_removed"], kept["bytes_freed"]) == (1, 10_000)
    assert len(d.store.epochs(d.ws)) == 1


def test_the_protocol_table_in_the_docs_names_what_each_method_takes():
    """docs/architecture.md's methods table is what a client author reads: each row
    names exactly the parameters ``methods.PARAMS`` accepts (``push`` is documented in
    docs/remote.md)."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z.]+)` \| (.*?) \|", text, re.M)}
    for method, takes in methods.PARAMS.items():
        if method == "push":
            continue
        assert method in rows, method
        named = set(re.findall(r"\b([a-z_]+)\??(?=[:,` ]|$)", rows[method])) & {
            n for names in methods.PARAMS.values() for n in names}
        assert named == set(takes), (method, named, takes)


async def test_unmount_is_only_requested(d):
    assert await d.call("unmount") == {}
    assert d.ctx.unmount_pending is True and not d.ctx.shutdown.is_set()


async def test_a_parameter_the_method_does_not_take_is_refused_before_it_runs(d):
    """Parameters a method did not know were ignored: ``rewind`` with ``dryRun`` (a
    JavaScript spelling) rewound for real, and so did ``gc`` with ``dry_run`` sent by a
    newer CLI to an older daemon — a safety flag lost on the way became a change
    nobody asked for.  Now the request is refused, naming the parameter and what the
    method takes, and nothing changes."""
    await d.put("f", b"v1")
    t1 = (await d.call("turn.begin", session="s", turn=1, label="one"))["epoch"]
    await d.put("f", b"v2")
    await d.call("turn.end", session="s")
    err = await d.refused("rewind", "bad-params", to=f"e{t1}", dryRun=True)
    assert "'dryRun'" in err["message"] and "dry_run" in err["message"], err
    await d.refused("gc", "bad-params", keep_epoch=0, grace_s=0)
    await d.refused("turn.begin", "bad-params", session="s", turn=2, label="x",
                    colour="blue")
    await d.refused("status", "bad-params", no_such_option=1)
    # a turn past the store's range was refused as bad-session, blaming the session
    err = await d.refused("turn.begin", "bad-params", session="s", turn=1 << 32, label="x")
    assert "'turn' must be an integer from 1 to 4294967295" in err["message"], err
    assert tree(d.root) == {"f": b"v2"}
    for method in methods.TABLE:            # every method says what it takes
        assert method in methods.PARAMS, method
    assert set(methods.PARAMS) == set(methods.TABLE)


# -- refusals: exact codes, nothing changed ------------------------------------------

@pytest.mark.parametrize("line", [
    b"this is not json",
    b"[1,2,3]",
    b'"a string"',
    b"\xff\xfe",
    b'{"v":1,"id":1,"method":"status"',           # cut short
    b"[" * 100_000 + b"]" * 100_000,              # nested too deeply for the parser
])
async def test_bad_json(d, line):
    before = d.state()
    (reply,) = await d.lines(line)
    assert reply == {"v": 1, "id": None, "ok": False, "error": reply["error"]}
    assert reply["error"]["code"] == "bad-json" and reply["error"]["message"]
    assert d.state() == before


@pytest.mark.parametrize("msg, rid", [
    ({"v": 2, "id": 5, "method": "status"}, 5),
    ({"id": 6, "method": "status"}, 6),
    ({"v": "1", "id": 7, "method": "status"}, 7),
    ({"v": 1.5, "id": "x", "method": "status"}, "x"),
    ({"v": None, "method": "status"}, None),
    ({"v": True, "id": 8, "method": "status"}, 8),     # true == 1 in Python: not v1
])
async def test_bad_version(d, msg, rid):
    before = d.state()
    (reply,) = await d.lines(json.dumps(msg).encode())
    assert reply["id"] == rid and reply["ok"] is False
    assert reply["error"]["code"] == "bad-version"
    assert d.state() == before


async def test_unknown_method_echoes_the_id(d):
    before = d.state()
    (reply,) = await d.lines(b'{"v":1,"id":"q7","method":"turn.start"}')
    assert reply["id"] == "q7" and reply["error"]["code"] == "unknown-method"
    (reply,) = await d.lines(b'{"v":1,"id":8,"method":"__init__"}')
    assert reply["error"]["code"] == "unknown-method"
    assert d.state() == before


@pytest.mark.parametrize("msg", [
    {"v": 1, "id": True, "method": "status"},
    {"v": 1, "id": None, "method": "status"},
    {"v": 1, "id": 1.5, "method": "status"},
    {"v": 1, "id": [1], "method": "status"},
    {"v": 1, "method": "status"},
    {"v": 1, "id": 1},
    {"v": 1, "id": 1, "method": 5},
    {"v": 1, "id": 1, "method": "status", "params": [1]},
    {"v": 1, "id": 1, "method": "status", "params": "usage"},
])
async def test_bad_envelope(d, msg):
    before = d.state()
    (reply,) = await d.lines(json.dumps(msg).encode())
    assert reply["error"]["code"] == "bad-params", reply
    assert d.state() == before


async def test_null_params_mean_none(d):
    (reply,) = await d.lines(b'{"v":1,"id":1,"method":"status","params":null}')
    assert reply["ok"] is True


_BAD_PARAMS = [
    ("turn.begin", {"turn": 1, "label": "x"}),                     # no session
    ("turn.begin", {"session": "", "turn": 1}),
    ("turn.begin", {"session": 5, "turn": 1}),
    ("turn.begin", {"session": "\ud800", "turn": 1}),              # not Unicode
    ("turn.begin", {"session": "s"}),                              # no turn
    ("turn.begin", {"session": "s", "turn": 0}),
    ("turn.begin", {"session": "s", "turn": "3"}),
    ("turn.begin", {"session": "s", "turn": True}),
    ("turn.begin", {"session": "s", "turn": 1.0}),
    ("turn.begin", {"session": "s", "turn": 1, "label": 5}),
    ("turn.begin", {"session": "s", "turn": 1, "label": "\udcff"}),
    ("turn.begin", {"session": "s", "turn": 1, "force": "yes"}),
    ("turn.end", {"session": ""}),
    ("turn.end", {"session": 3}),
    ("points", {"session": ["s"]}),
    ("fork", {"child": "c", "parent": "p"}),
    ("fork", {"child": "c", "parent": "p", "boundary_turn": -1}),
    ("fork", {"child": "", "parent": "p", "boundary_turn": 1}),
    ("rewind", {}),
    ("rewind", {"to": True}),
    ("rewind", {"to": ""}),
    ("rewind", {"to": [1]}),
    ("rewind", {"to": 1, "paths": []}),
    ("rewind", {"to": 1, "paths": "f"}),
    ("rewind", {"to": 1, "paths": [1]}),
    ("rewind", {"to": 1, "dry_run": 1}),
    ("rewind", {"to": 1, "force": "no"}),
    ("rewind", {"to": 1, "session": ""}),
    ("rewind", {"to": 1, "undo_for": 7}),
    ("redo", {"dry_run": "yes"}),
    ("redo", {"session": 1}),
    ("diff", {}),
    ("diff", {"a": 1, "b": False}),
    ("diff", {"a": 1, "paths": [None]}),
    ("show", {"point": 1}),                                         # no path
    ("show", {"path": 5}),
    ("show", {"path": "f", "stream": "yes"}),
    ("gc", {"grace_s": -1}),
    ("gc", {"grace_s": "1"}),
    ("gc", {"grace_s": True}),
    ("gc", {"max_age_s": 1e11}),
    ("gc", {"keep_epochs": 1.5}),
    ("gc", {"keep_epochs": -1}),
    ("gc", {"max_bytes": 2 ** 63}),
    ("gc", {"drop_redo": "yes"}),
]


@pytest.mark.parametrize("method, params", _BAD_PARAMS,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(_BAD_PARAMS)])
async def test_bad_params(d, method, params):
    # history to act on: without the bad parameter, rewind/redo/gc would change things
    await d.put("f", b"content")
    await d.call("turn.begin", session="p", turn=1, label="x")
    await d.put("f", b"changed")
    await d.call("turn.end", session="p")
    err = await d.refused(method, "bad-params", **params)
    assert method in err["message"]


@pytest.mark.parametrize("path", ["", "."])
async def test_show_of_the_root_is_not_a_file(d, path):
    """The root is a directory, refused as any directory is (``rewindfs show e2 .``
    printed "Bad parameters for show: 'path' must name a file")."""
    err = await d.refused("show", "not-a-file", path=path)
    assert "root" in err["message"], err


async def test_non_finite_gc_numbers_are_bad_params(d):
    """JSON has no NaN, but Python's parser accepts the literal: still refused."""
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        before = d.state()
        (reply,) = await d.lines(b'{"v":1,"id":1,"method":"gc","params":{"grace_s":%s}}'
                                 % literal)
        assert reply["error"]["code"] == "bad-params", literal
        assert d.state() == before


@pytest.mark.parametrize("path, code", [
    ("/etc/passwd", "path-escape"),
    ("a/../../x", "path-escape"),
    ("..", "path-escape"),
    ("x" * 256, "bad-path"),
    ("a\0b", "bad-path"),
    ("a/" * 2100 + "b", "path-too-long"),             # over 4096 bytes
])
async def test_paths_that_leave_or_cannot_name_the_workspace(d, path, code):
    t1 = (await d.call("turn.begin", session="s", turn=1, label="x"))["epoch"]
    await d.put("f", b"x")
    await d.call("turn.end")
    await d.refused("rewind", code, to=f"e{t1}", paths=[path])
    await d.refused("diff", code, a=f"e{t1}", paths=[path])
    await d.refused("show", code, point=f"e{t1}", path=path)


@pytest.mark.parametrize("point, code", [
    (999, "unknown-point"), ("e999", "unknown-point"), ("t9", "unknown-point"),
    ("-1", "relative-point"), ("HEAD~1", "relative-point"), ("prev", "relative-point"),
])
async def test_points_that_do_not_resolve(d, point, code):
    await d.call("turn.begin", session="s", turn=1, label="x")
    await d.put("f", b"x")
    await d.call("turn.end")
    await d.refused("rewind", code, to=point, session="s")
    await d.refused("diff", code, a=point, session="s")
    await d.refused("show", code, point=point, path="f", session="s")


@pytest.mark.parametrize("method, params", [
    ("points", {"session": "s\0"}),
    ("show", {"point": "t1", "path": "f", "session": "s\0"}),
    ("diff", {"a": "t1", "session": "s\0"}),
    ("rewind", {"to": "t1", "session": "s\0", "dry_run": True}),
    ("rewind", {"to": 1, "session": "s\0"}),
    ("turn.begin", {"session": "s\0", "turn": 2}),
    ("fork", {"child": "c", "parent": "s\0", "boundary_turn": 1}),
])
async def test_a_session_name_with_nul_is_bad_session(d, method, params):
    """Session names are stored NUL-terminated in the turn index, so a NUL inside one
    is refused everywhere — also where the name is only read (it once reached the
    index scan and came back as an ``internal`` error)."""
    await d.put("f", b"x")
    await d.call("turn.begin", session="s", turn=1, label="x")
    await d.put("f", b"y")
    await d.call("turn.end")
    await d.refused(method, "bad-session", **params)


@pytest.mark.parametrize("boundary", [2 ** 32, 2 ** 64, 2 ** 70])
async def test_fork_boundary_beyond_any_turn_is_bad_session(d, boundary):
    """Like ``turn.begin``'s turn number (below 2**32); from 2**64 up it once reached
    the index encoder and came back as an ``internal`` error."""
    await d.refused("fork", "bad-session", child="c", parent="p", boundary_turn=boundary)
    assert await d.call("fork", child="c", parent="p", boundary_turn=2 ** 32 - 1) == {}


async def test_redo_with_nothing_to_redo(d):
    await d.refused("redo", "nothing-to-redo")


async def test_a_handler_bug_is_an_internal_error_and_the_next_request_works(d, monkeypatch):
    async def broken(ctx, params, emit):
        raise ZeroDivisionError("boom")

    async def out_of_fds(ctx, params, emit):
        raise OSError(errno.EMFILE, "Too many open files")

    for name, fn in (("test.broken", broken), ("test.emfile", out_of_fds)):
        monkeypatch.setitem(methods.TABLE, name, fn)
        monkeypatch.setitem(methods.PARAMS, name, frozenset())
    (reply,) = await d.lines(b'{"v":1,"id":3,"method":"test.broken"}')
    assert reply["id"] == 3 and reply["error"]["code"] == "internal"
    assert "ZeroDivisionError" in reply["error"]["message"]
    (reply,) = await d.lines(b'{"v":1,"id":4,"method":"test.emfile"}')
    assert reply["id"] == 4 and reply["error"]["code"] == "fd-exhausted"
    assert (await d.call("status"))["mounted"] is True


# -- framing: the connection reader ------------------------------------------------

async def converse(d, payload: bytes, *, chunk: int = 1 << 16) -> list[dict]:
    """Send *payload* into the daemon's connection reader over an in-memory stream
    (unbounded buffers: nothing waits on the other side) in writes of *chunk* bytes,
    close our side, let the reader run to our EOF, and return every line it wrote."""
    client, server = trio.testing.memory_stream_pair()
    for i in range(0, len(payload), chunk):
        await client.send_all(payload[i:i + chunk])
    await client.send_stream.aclose()
    await _read_requests(d.ctx, server)
    await server.send_stream.aclose()
    got = bytearray()
    while data := await client.receive_some(1 << 20):
        got += data
    assert got.endswith(b"\n")
    return [json.loads(x) for x in bytes(got).splitlines()]


async def test_too_large_line_is_refused_and_the_connection_goes_on(d):
    huge = b'{"v":1,"id":1,"method":"status","params":{"x":"' + b"a" * (2 << 20) + b'"}}\n'
    before = d.state()
    replies = await converse(d, huge + b'{"v":1,"id":2,"method":"status"}\n')
    assert [r["id"] for r in replies] == [None, 2]
    assert replies[0]["error"]["code"] == "too-large"
    assert replies[1]["ok"] is True
    assert d.state() == before


async def test_line_limit_is_exactly_one_mebibyte(d):
    head = b'{"v":1,"id":1,"method":"status"}'
    at_limit = head + b" " * (wire.MAX_LINE - len(head))
    assert len(at_limit) == wire.MAX_LINE
    replies = await converse(d, at_limit + b"\n" + at_limit + b" \n")
    assert replies[0]["ok"] is True
    assert replies[1]["error"]["code"] == "too-large"
    # the same with the whole oversized line in one read
    replies = await converse(d, at_limit + b" \n", chunk=wire.MAX_LINE + 2)
    assert [r["error"]["code"] for r in replies] == ["too-large"]


async def test_pipelined_requests_answer_in_order_and_blank_lines_are_skipped(d):
    payload = (b'{"v":1,"id":"a","method":"status"}\n\n   \n'
               b'{"v":1,"id":7,"method":"nope"}\n'
               b'junk\n'
               b'{"v":1,"id":8,"method":"turn.begin","params":{"session":"s","turn":1}}\n')
    replies = await converse(d, payload, chunk=5)       # split mid-line everywhere
    assert [(r["id"], r["ok"]) for r in replies] == [
        ("a", True), (7, False), (None, False), (8, True)]
    assert replies[1]["error"]["code"] == "unknown-method"
    assert replies[2]["error"]["code"] == "bad-json"
    assert d.fs.epoch_id == replies[3]["result"]["epoch"]


async def test_unmount_through_the_reader_sets_shutdown(d):
    replies = await converse(d, b'{"v":1,"id":1,"method":"unmount"}\n')
    assert replies == [{"v": 1, "id": 1, "ok": True, "result": {}}]
    assert d.ctx.shutdown.is_set()


# -- one connection, over a socket pair (the peer uid needs a real socket) ----------

def serve_pair():
    """(client socket, server stream) of a connected Unix socket pair."""
    a, b = trio.socket.socketpair()
    return a, trio.SocketStream(b)


async def recv_all(sock) -> list[dict]:
    """Every line until the daemon closes.  A close with our request still unread in
    its socket reaches us as a reset after the lines it sent (Unix sockets)."""
    got = bytearray()
    try:
        while data := await sock.recv(1 << 20):
            got += data
    except ConnectionResetError:
        pass
    return [json.loads(x) for x in bytes(got).splitlines()]


async def test_a_peer_of_another_uid_is_forbidden_before_any_request(d, monkeypatch):
    monkeypatch.setattr(control_server, "peer_uid", lambda sock: 4242)
    client, server = serve_pair()
    before = d.state()
    with client:
        await client.send(b'{"v":1,"id":1,"method":"turn.begin",'
                          b'"params":{"session":"s","turn":1}}\n')
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_connection, d.ctx, server)
            replies = await recv_all(client)       # the daemon answers, then closes
    assert replies == [{"v": 1, "id": None, "ok": False,
                        "error": {"code": "forbidden", "message": replies[0]["error"][
                            "message"]}}]
    assert "4242" in replies[0]["error"]["message"]
    assert d.state() == before


async def test_our_own_uid_is_served_until_it_hangs_up(d):
    client, server = serve_pair()
    with client:
        await client.send(b'{"v":1,"id":1,"method":"status"}\n'
                          b'{"v":1,"id":2,"method":"points"}\n')
        client.shutdown(socket.SHUT_WR)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_connection, d.ctx, server)
            replies = await recv_all(client)
    assert [(r["id"], r["ok"]) for r in replies] == [(1, True), (2, True)]


async def test_a_client_gone_mid_stream_costs_only_its_connection(d):
    """``rewindfs show … | head``: the reader leaves while chunks are on their way;
    the connection ends quietly and the daemon answers the next client."""
    await d.put("big", os.urandom(4 << 20))
    await d.call("status")             # anything a first request opens lazily, opened
    fds = sorted(os.listdir("/proc/self/fd"))
    client, server = serve_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_connection, d.ctx, server)
        await client.send(b'{"v":1,"id":1,"method":"show",'
                          b'"params":{"path":"big","stream":true}}\n')
        first = await client.recv(1024)
        assert first.startswith(b'{"v": 1, "id": 1, "event"')
        client.close()                             # gone without reading the rest
    assert sorted(os.listdir("/proc/self/fd")) == fds     # the content was closed too
    assert (await d.call("status"))["mounted"] is True


async def test_redo_state_says_what_a_redo_would_undo_without_planning(d):
    """``redo.state`` (the web UI's header control asks it on every render): the top of
    the owner's redo stack, and whether the tree changed since (a stale redo)."""
    await d.put("f", b"v1")
    t1 = (await d.call("turn.begin", session="p", turn=1, label="one"))["epoch"]
    await d.put("f", b"v2")
    await d.call("turn.end", session="p")
    state = await d.call("redo.state", session="c")
    assert state == {"can_redo": False, "rewind": None, "stale": [],
                     "reason": "Nothing to redo: no rewind of session c is left to undo."}
    done = await d.call("rewind", to=f"e{t1}", session="p", undo_for="c")
    state = await d.call("redo.state", session="c")
    assert state["can_redo"] is True and state["rewind"] == done["epoch"]
    assert (await d.call("redo.state", session="p"))["can_redo"] is False
    assert (await d.call("redo.state"))["can_redo"] is False     # the manual owner's
    await d.put("g", b"after the rewind")                        # the tree changes
    state = await d.call("redo.state", session="c")
    assert state["can_redo"] is False and state["rewind"] == done["epoch"]
    assert [p["kind"] for p in state["stale"]] == ["idle"] and "changed" in state["reason"]
    await d.refused("redo.state", "bad-params", session=7)


async def test_push_refuses_what_names_no_single_remote_and_bad_params(d):
    """``push``: no remote, an unknown one, several with none named, a bad ``wait`` or
    ``remote`` — each refused with its code before anything is queued or sent (no
    server: nothing here reaches the network)."""
    await d.refused("push", "remote-unnamed", wait=False)
    d.store.add_remote("one", "s3://b/p", "http://127.0.0.1:9", None, False)
    await d.refused("push", "unknown-remote", remote="nope", wait=False)
    await d.refused("push", "bad-params", remote="one", wait="yes")
    await d.refused("push", "bad-params", remote=7)
    d.store.add_remote("two", "s3://b/q", "http://127.0.0.1:9", None, False)
    await d.refused("push", "remote-unnamed")
    status = await d.call("status")
    assert status["push"]["auto"] is None
    assert [(r["remote"], r["pushed_epoch"], r["state"]) for r in status["push"]["remotes"]] \
        == [("one", None, "idle"), ("two", None, "idle")]
