"""File-descriptor exhaustion and error paths must never end the daemon (issue 12, part 6).

Every test runs a real daemon whose ``RLIMIT_NOFILE`` is set to soft = hard = 256 in its
own process before it starts, so raising the soft limit to the hard one cannot help:

- a walk over 1,500 directories through the mount, then a turn with a write in every
  one of them, then a rewind: the daemon stays up and mounted, its fd count stays within
  its budget, every write was captured (the rewind gives back every old byte);
- ~300 idle control connections against a 256-fd daemon: accept() meets EMFILE; the
  clients over the limit are refused with ``fd-exhausted`` (never left hanging), the
  daemon lives on and serves the next client once fds are free;
- a client that hangs up in the middle of a rewind's progress stream: the rewind
  finishes, the daemon stays mounted (the stream's late events used to crash trio).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time

import pytest

from mountkit import is_rewindfs_mount, mounted

pytestmark = pytest.mark.mount

LIMIT = 256
DIRS = 1500


def _low_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _raise(exc):
    raise exc


def _alive(m) -> bool:
    return m.proc.poll() is None and is_rewindfs_mount(m.ws)


def _tree(ws, n: int) -> None:
    ws.mkdir()
    for i in range(n):
        d = ws / f"d{i // 100:02d}" / f"s{i:04d}"
        d.mkdir(parents=True)
        (d / "f").write_bytes(b"old %d\n" % i)


def _dirs(ws, n: int):
    return [ws / f"d{i // 100:02d}" / f"s{i:04d}" for i in range(n)]


def test_walk_many_dirs_then_turn_and_rewind_under_low_fd_limit(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    _tree(ws, DIRS)
    with mounted(ws, store, preexec_fn=_low_limit) as m:
        pid = m.call("status")["pid"]
        assert resource.prlimit(pid, resource.RLIMIT_NOFILE) == (LIMIT, LIMIT)
        base = _fds(pid)
        peak, seen = base, 0
        # find(1): every directory entered, every file stat-ed, through the mount
        for dirpath, dirnames, filenames in os.walk(m.ws, onerror=_raise):
            for name in filenames:
                os.stat(os.path.join(dirpath, name))
            seen += 1
            if seen % 50 == 0:
                peak = max(peak, _fds(pid))
        assert seen == 1 + DIRS // 100 + DIRS
        epoch = m.call("turn.begin", session="s", turn=1, label="all dirs")["epoch"]
        for i, d in enumerate(_dirs(m.ws, DIRS)):
            (d / "f").write_bytes(b"new %d\n" % i)
            (d / "g").write_bytes(b"created %d\n" % i)
            if i % 50 == 0:
                peak = max(peak, _fds(pid))
        m.call("turn.end", session="s")
        fs = m.call("status")["fs"]
        assert fs["dir_fds"] <= fs["dir_fd_limit"] <= LIMIT // 4
        # the daemon's own fds: the baseline plus at most the dir-fd budget (+ a few
        # transient ones: an open file, a control connection, a capture's file)
        assert peak <= base + fs["dir_fd_limit"] + 16, (base, peak, fs)
        res = m.call("rewind", to=f"e{epoch}")
        assert res["exit_code"] == 0, json.dumps(res)[:3000]
        for i, d in enumerate(_dirs(m.ws, DIRS)):
            assert (d / "f").read_bytes() == b"old %d\n" % i
            assert not (d / "g").exists()
        assert _fds(pid) <= base + fs["dir_fd_limit"] + 16
        assert _alive(m)
    print(f"{DIRS} dirs walked, {DIRS * 2} writes captured and rewound; daemon fds "
          f"{base} → peak {peak} (dir-fd budget {fs['dir_fd_limit']}, limit {LIMIT})")


def _request(sock: socket.socket, method: str, rid: int) -> None:
    try:
        sock.sendall(json.dumps({"v": 1, "id": rid, "method": method,
                                 "params": {}}).encode() + b"\n")
    except (BrokenPipeError, ConnectionResetError):
        pass    # refused and closed already: its refusal line waits to be read


def _reply(sock: socket.socket) -> dict | None:
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return json.loads(buf.split(b"\n", 1)[0])


def test_emfile_on_accept_refuses_that_client_and_serves_the_next(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "a").write_text("a0")
    with mounted(ws, store, preexec_fn=_low_limit) as m:
        pid = m.call("status")["pid"]
        base = _fds(pid)
        conns = []
        try:
            for _ in range(LIMIT + 60):    # more than the daemon can hold
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conns.append(s)
                s.connect(m.socket)     # blocking: waits while the backlog is full
                s.settimeout(60)
            for i, s in enumerate(conns):
                _request(s, "points", i)
            answered, refused = 0, 0
            for s in conns:
                msg = _reply(s)
                assert msg is not None, "a client was dropped without an answer"
                if msg.get("ok"):
                    answered += 1
                else:
                    assert msg["error"]["code"] == "fd-exhausted", msg
                    refused += 1
                    assert _reply(s) is None        # and then its connection is closed
            assert refused >= 1 and answered >= 1, (answered, refused)
            assert _alive(m)
        finally:
            for s in conns:
                s.close()
        # once the daemon has seen the hang-ups, the next client is served, the mount
        # works and captures
        deadline = time.monotonic() + 60
        while _fds(pid) > base + 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m.call("status")["mounted"] is True
        epoch = m.call("turn.begin", session="s", turn=1, label="after")["epoch"]
        (m.ws / "a").write_text("a1")
        m.call("turn.end", session="s")
        assert m.call("rewind", to=f"e{epoch}")["exit_code"] == 0
        assert (m.ws / "a").read_text() == "a0"
        assert _alive(m)
    print(f"{len(conns)} connections: {answered} answered, {refused} refused "
          f"(fd-exhausted), daemon alive")


def test_client_hanging_up_mid_rewind_leaves_the_daemon_mounted(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    n = 2000
    for i in range(n):
        (ws / f"f{i:04d}").write_text(f"v0 {i}")
    with mounted(ws, store, preexec_fn=_low_limit) as m:
        epoch = m.call("turn.begin", session="s", turn=1, label="edit all")["epoch"]
        for i in range(n):
            (m.ws / f"f{i:04d}").write_text(f"v1 {i}")
        m.call("turn.end", session="s")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        s.connect(m.socket)
        s.sendall(json.dumps({"v": 1, "id": 1, "method": "rewind",
                              "params": {"to": f"e{epoch}"}}).encode() + b"\n")
        first = _reply(s)
        assert first is not None and "event" in first, first
        s.close()                        # hang up while the progress stream runs
        # a turn mark waits for the running rewind (one lock), then is served
        m.call("turn.begin", session="s", turn=2, label="after the rewind")
        status = m.call("status")
        assert status["mounted"] is True and "intent" not in status
        assert _alive(m)
        for i in range(n):
            assert (m.ws / f"f{i:04d}").read_text() == f"v0 {i}"
        assert _alive(m)
