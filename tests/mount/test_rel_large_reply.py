"""Large replies: ``show`` of tens of MB, linear in size and bounded in memory.

Issue 12, item 7: ``show`` sent a file as one JSON line (the daemon held the bytes, their
base64 and the line at once: 1.5 GB peak for 300 MB) and the clients re-searched their
whole buffer for a newline after every recv (40 MB took 26 s, 300 MB never finished).
Now ``show`` with ``"stream": true`` sends ``show.chunk`` events of ≤ 256 KiB and every
client frames lines in linear time.  What must hold:

- the framing searches each byte for a newline once, however the bytes are split (a
  count, not a time);
- a 40 MB file shown through the daemon — at a stored point and as it is now — comes
  back byte-exact through each Python client (``overlay.control.wire.call`` as the CLI uses
  it, ``rewindfs show`` raw and ``--json``, ``plugin.Client``, ``plugin.TrioClient``);
- showing a 100 MB file raises the daemon's peak RSS (``VmHWM``, reset before through
  ``/proc/PID/clear_refs``) by less than 64 MB;
- a reader that stops reading mid-``show`` does not hold up a turn mark;
- a request without ``stream`` still gets ``content_b64`` for a small file (protocol v1
  as before) and a clear ``content-too-large`` for a big one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess

import pytest

from mountkit import PYTHON, ROOT, cli, mounted

MB = 1 << 20
BIG = 40 * MB
HUGE = 100 * MB
RSS_BOUND = 64 * MB


# -- framing: linear in the bytes fed ------------------------------------------------------

def _feed_all(buf, pieces) -> list[bytes]:
    out = []
    for p in pieces:
        buf.feed(p)
        while (line := buf.next_line()) is not None:
            out.append(line)
    return out


@pytest.mark.parametrize("side", ["overlay", "plugin"])
def test_framing_searches_each_byte_once(side):
    if side == "overlay":
        from rewindfs.overlay.control.wire import LineBuffer
    else:
        from rewindfs.plugin._protocol import LineBuffer
    buf = LineBuffer()
    # one 8 MiB line in 2,048 pieces: a buffer searched again from its start after
    # every piece would count ~2,048 × 4 MiB = 8 GiB
    pieces = [b"a" * 4096] * 2048 + [b"\n"]
    lines = _feed_all(buf, pieces)
    assert lines == [b"a" * (8 * MB)]
    assert buf.searched == 8 * MB + 1
    # 10,000 short lines in one piece, then split at every byte
    many = b'{"v":1}\n' * 10_000
    before = buf.searched
    assert _feed_all(buf, [many]) == [b'{"v":1}'] * 10_000
    assert _feed_all(buf, [many[i:i + 1] for i in range(len(many))]) == [b'{"v":1}'] * 10_000
    assert buf.searched - before == 2 * len(many)
    assert buf.pending() == 0


def test_plugin_conversation_streams_chunks_and_bounds_a_line():
    from rewindfs.plugin._errors import BadResponse
    from rewindfs.plugin._protocol import MAX_LINE, Conversation, ShowAssembler

    conv = Conversation()
    rid, _ = conv.request("show", {"path": "f", "stream": True})
    data = os.urandom(3 * MB + 17)
    step = 192 * 1024
    wire = b"".join(json.dumps({"v": 1, "id": rid, "event": {
        "type": "show.chunk", "offset": i,
        "data_b64": base64.b64encode(data[i:i + step]).decode()}}).encode() + b"\n"
        for i in range(0, len(data), step))
    wire += json.dumps({"v": 1, "id": rid, "ok": True, "result": {
        "point": 3, "exists": True, "size": len(data), "streamed": True}}).encode() + b"\n"
    parts = ShowAssembler()
    result = None
    for i in range(0, len(wire), 65536):
        conv.feed(wire[i:i + 65536])
        while (reply := conv.next_reply(rid)) is not None:
            if reply.final:
                result = Conversation.raise_for(reply)
            else:
                parts.on_event(reply.event)
    assert parts.finish(result) == data
    assert conv.lines.searched == len(wire)
    # a line that never ends is refused once it passes 1 MiB
    conv = Conversation()
    rid, _ = conv.request("status", None)
    with pytest.raises(BadResponse):
        for _ in range(MAX_LINE // 65536 + 2):
            conv.feed(b"x" * 65536)
            conv.next_reply(rid)


# -- through a real daemon --------------------------------------------------------------

def _random(n: int, seed: int) -> bytes:
    """n pseudo-random bytes (incompressible, repeatable) without holding n twice."""
    block = hashlib.shake_256(b"rewindfs-%d" % seed).digest(MB)
    return block * (n // MB) + block[: n % MB]


def _write(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    top = tmp_path_factory.mktemp("large")
    ws = top / "ws"
    ws.mkdir()
    v1, v2 = _random(BIG, 1), _random(BIG, 2)[::-1]
    _write(ws / "big", v1)
    _write(ws / "huge", _random(HUGE, 3))
    _write(ws / "small", b"small file\n")
    with mounted(ws, top / "store") as m:
        epoch = m.call("turn.begin", session="s", turn=1, label="big")["epoch"]
        _write(ws / "big", v2)
        _write(ws / "huge", b"gone")
        m.call("turn.end")
        yield m, f"e{epoch}", v1, v2


def _hwm_reset(pid: int) -> int:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")                     # reset the peak RSS to the current RSS
    return _status_kb(pid, "VmHWM")


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def _raw_show(sock_path: bytes, params: dict, *, out=None):
    """A minimal linear reader of one ``show`` reply; chunks go to *out* (a file) or are
    counted.  Returns (result, bytes received as content)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(120)
        s.connect(sock_path)
        s.sendall(json.dumps({"v": 1, "id": 1, "method": "show", "params": params}).encode()
                  + b"\n")
        f = s.makefile("rb")
        n = 0
        while True:
            line = f.readline()
            assert line.endswith(b"\n"), "daemon closed the connection"
            msg = json.loads(line)
            ev = msg.get("event")
            if ev is None:
                assert msg["ok"], msg
                if msg["result"].get("content_b64"):     # a daemon that does not stream
                    data = base64.b64decode(msg["result"]["content_b64"])
                    n += len(data)
                    if out is not None:
                        out.write(data)
                return msg["result"], n
            if ev.get("type") == "show.chunk":
                data = base64.b64decode(ev["data_b64"])
                if out is not None:
                    out.write(data)
                n += len(data)


@pytest.mark.mount
def test_each_python_client_returns_the_exact_bytes(big):
    import trio

    from rewindfs.overlay.control.client import call
    from rewindfs.plugin.client import Client, TrioClient

    m, point, v1, v2 = big
    # the blocking client the CLI uses, with the stream (as the CLI asks for it)
    for pt, want in ((point, v1), (None, v2)):
        got = bytearray()

        def on_event(ev, got=got):
            if ev["type"] == "show.chunk":
                assert ev["offset"] == len(got)
                assert len(ev["data_b64"]) <= 256 * 1024
                got.extend(base64.b64decode(ev["data_b64"]))

        res = call(m.socket, "show", {"point": pt, "path": "big", "stream": True},
                   on_event=on_event, timeout=120)
        assert res["size"] == len(want) and "content_b64" not in res
        assert bytes(got) == want
    with Client(m.socket, timeout=120) as c:
        assert c.show(point, "big") == v1
        assert c.show(None, "big") == v2
        assert c.show(point, "small") == b"small file\n"

    async def via_trio():
        async with TrioClient(m.socket, timeout=120) as c:
            return await c.show(point, "big"), await c.show(None, "big")

    assert trio.run(via_trio) == (v1, v2)


def _cli_bytes(m, *args, stdout=subprocess.PIPE):
    """``rewindfs ARGS -C WS`` with binary output (``mountkit.cli`` decodes text)."""
    return subprocess.run([PYTHON, "-m", "rewindfs.overlay.cli", "--store", os.fspath(m.store), *args,
                           "-C", os.fspath(m.ws)], stdout=stdout, stderr=subprocess.PIPE,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)


@pytest.mark.mount
def test_cli_show_writes_the_exact_bytes(big, tmp_path):
    m, point, v1, _v2 = big
    out = tmp_path / "out"
    for args, want in (([point, "big"], v1), ([point, "small"], b"small file\n")):
        with open(out, "wb") as f:
            res = _cli_bytes(m, "show", *args, stdout=f)
        assert res.returncode == 0, res.stderr
        assert out.read_bytes() == want
    res = cli("show", point, "big", "--json", "-C", m.ws, store=m.store, timeout=300)
    assert res.returncode == 0, res.stderr
    recs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["type"] for r in recs] == ["show"]
    assert base64.b64decode(recs[0]["content_b64"]) == v1
    assert recs[0]["complete"] is True


@pytest.mark.mount
def test_daemon_memory_stays_bounded(big, tmp_path):
    m, point, _v1, _v2 = big
    pid = m.proc.pid
    for pt in (point, None):
        if pt is None:      # the current file: put 100 MB there too
            _write(m.ws / "huge", _random(HUGE, 4))
        base = _hwm_reset(pid)
        with open(tmp_path / "huge", "wb") as out:
            res, n = _raw_show(m.socket, {"point": pt, "path": "huge", "stream": True},
                               out=out)
        rise = _status_kb(pid, "VmHWM") - base
        print(f"show of {HUGE >> 20} MB ({'stored' if pt else 'now'}): "
              f"daemon peak RSS rose {rise / MB:.1f} MB")
        assert rise < RSS_BOUND, f"peak RSS rose {rise / MB:.1f} MB"
        want = _random(HUGE, 3 if pt else 4)
        assert n == HUGE and (tmp_path / "huge").read_bytes() == want


@pytest.mark.mount
def test_stalled_reader_holds_up_no_turn(big):
    m, point, _v1, _v2 = big
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(m.socket)
        s.sendall(json.dumps({"v": 1, "id": 1, "method": "show", "params": {
            "point": point, "path": "huge", "stream": True}}).encode() + b"\n")
        assert s.recv(4096)              # the stream has begun; now stop reading
        res = m.call("turn.begin", session="s", turn=2, label="while a show stalls")
        assert res["epoch"] > 0
        m.call("turn.end")
    assert m.call("status")["mounted"] is True


@pytest.mark.mount
def test_without_stream_v1_reply_and_clear_refusal(big):
    from rewindfs.overlay.control.client import call
    from rewindfs.store._errors import RewindfsError

    m, point, _v1, _v2 = big
    res = call(m.socket, "show", {"point": point, "path": "small"}, timeout=60)
    assert res == {"point": int(point[1:]), "exists": True,
                   "content_b64": base64.b64encode(b"small file\n").decode()}
    with pytest.raises(RewindfsError) as info:
        call(m.socket, "show", {"point": point, "path": "big"}, timeout=60)
    assert info.value.code == "content-too-large"
    assert "stream" in str(info.value)


@pytest.mark.mount
def test_damage_found_after_the_last_chunk_fails_the_call(tmp_path):
    """A stored blob is verified as it streams, so damage shows only after its last
    chunk: the error reply that follows must make every client fail — never return or
    silently print the damaged bytes as if they were good."""
    from rewindfs.plugin.client import Client, RewindfsClientError

    ws = tmp_path / "ws"
    ws.mkdir()
    data = _random(3 * MB, 5)
    _write(ws / "f", data)
    with mounted(ws, tmp_path / "store") as m:
        epoch = m.call("turn.begin", session="s", turn=1, label="x")["epoch"]
        _write(ws / "f", b"new")
        m.call("turn.end")
        with m.open_store() as store:
            ws_id, _ = store.workspace_containing(os.path.realpath(os.fsencode(ws)))
            key = dict(store.journal(ws_id, epoch))[b"f"].blob
            blob = store.blobs.file_path(key)
        with open(blob, "r+b") as f:            # one flipped byte in the middle
            f.seek(MB)
            byte = f.read(1)
            f.seek(MB)
            f.write(bytes([byte[0] ^ 0xFF]))
        with Client(m.socket, timeout=60) as c, pytest.raises(RewindfsClientError) as info:
            c.show(f"e{epoch}", "f")
        assert info.value.code == "blob-corrupt"
        res = _cli_bytes(m, "show", f"e{epoch}", "f")
        assert res.returncode != 0 and b"blob-corrupt" in res.stderr, res.stderr
        res = cli("show", f"e{epoch}", "f", "--json", "-C", ws, store=m.store)
        recs = [json.loads(line) for line in res.stdout.splitlines()]
        assert res.returncode != 0
        assert recs[0]["type"] == "show" and recs[0]["complete"] is False, recs[0].keys()
        assert "blob-corrupt" in json.dumps(recs[1:]), recs[1:]
