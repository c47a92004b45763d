"""Several processes use one store at once (the daemon and CLI commands)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from rewindfs.store import PreImage, Store, StoreError
from store_fixtures import assert_sound

TURNS = 40


def _writer(store_path: str, ws_path: bytes, session: str, shared: bytes, q) -> None:
    with Store.open(store_path) as s:
        ws = s.workspace(ws_path)
        got = []
        for turn in range(1, TURNS + 1):
            # force: the two sessions take the workspace from each other on purpose
            e = s.begin_turn(ws, session, turn, f"{session} {turn}", force=True)
            key, n = s.put_bytes(shared + session.encode() + bytes([turn]))
            k2, n2 = s.put_bytes(shared)       # the same content from both processes
            try:
                s.record(ws, e.id, [(f"{session}/{turn}".encode(),
                                     PreImage("file", 0o644, size=n, blob=key)),
                                    (b"common", PreImage("file", 0o644, size=n2, blob=k2))])
            except StoreError as exc:          # the other process began a turn first
                assert exc.code == "epoch-closed"
            got.append(e.id)
        q.put((ws, got))


@pytest.mark.parametrize("same_workspace", [True, False])
def test_two_processes_write_one_store(tmp_path, same_workspace):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    shared = os.urandom(300 << 10)   # above the inline threshold: a blob file
    store_path = str(tmp_path / "store")
    procs = [ctx.Process(target=_writer, args=(
        store_path, os.fsencode(tmp_path / ("ws" if same_workspace else f"ws{i}")),
        f"s{i}", shared, q)) for i in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ids = [i for _, got in results for i in got]
    assert len(set(ids)) == len(ids) == 2 * TURNS          # never the same epoch id
    with Store.open(store_path) as s:
        assert_sound(s)
        workspaces = {ws for ws, _ in results}
        assert len(workspaces) == (1 if same_workspace else 2)
        for ws in workspaces:
            epochs = s.epochs(ws)
            assert [e.id for e in epochs] == sorted(e.id for e in epochs)
            assert [e.id for e in epochs if e.is_open] == [epochs[-1].id]
        for ws, got in results:
            for turn, eid in enumerate(got, 1):
                e = s.epoch(eid)
                assert (e.workspace, e.turn) == (ws, turn)
        assert s.statistics()["entries"]["blobs"] == 2 * TURNS + 1
        assert os.listdir(s.blobs.tmp_dir) == []


def test_a_store_does_not_cross_fork(tmp_path):
    with Store.open(tmp_path / "store") as s:
        pid = os.fork()
        if pid == 0:
            try:
                s.current_epoch(1)
                os._exit(1)
            except StoreError:
                os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def test_threads_share_one_store(tmp_path):
    import threading
    with Store.open(tmp_path / "store") as s:
        ws = s.workspace(os.fsencode(tmp_path / "ws"))
        errors = []

        def work(n):
            try:
                for i in range(50):
                    e = s.current_epoch(ws)
                    key, size = s.put_bytes(b"thread %d item %d" % (n, i))
                    try:
                        s.record(ws, e.id, [(b"t%d/%d" % (n, i),
                                             PreImage("file", 0o600, size=size, blob=key))])
                    except StoreError as exc:
                        assert exc.code == "epoch-closed"
                    if i % 10 == 0:
                        s.begin_turn(ws, "s%d" % n, i + 1, "", force=True)
                    s.read_blob(key)
            except BaseException as exc:   # surfaced in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        epochs = s.epochs(ws)
        assert [e.id for e in epochs if e.is_open] == [epochs[-1].id]
        assert_sound(s)


_KILLED_CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from rewindfs.store import PreImage, Store
s = Store.open({store!r})
ws = s.workspace(b"/nonexistent/ws")
e = s.begin_turn(ws, "s", 1, "")
key, n = s.put_bytes(b"pre-image content")
s.record(ws, e.id, [(b"file", PreImage("file", 0o644, size=n, blob=key))])
fd = os.open({big!r}, os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b"x" * (4 << 20))
os.close(fd)
print(e.id, flush=True)
fd = os.open({big!r}, os.O_RDONLY)
while True:                       # killed while streaming blobs in and out
    s.put_fd(fd)
    s.put_bytes(os.urandom(2 << 20))
"""


def test_committed_record_survives_sigkill(tmp_path):
    import signal
    import subprocess
    import sys
    import time
    code = _KILLED_CHILD.format(root=os.getcwd(), store=str(tmp_path / "store"),
                                big=str(tmp_path / "big"))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        eid = int(child.stdout.readline())
        time.sleep(0.3)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with Store.open(tmp_path / "store") as s:
        ws = s.workspace(b"/nonexistent/ws")
        img = s.state_at(ws, eid, b"file")
        assert s.read_blob(img.blob) == b"pre-image content"
        assert s.open_turn(ws).id == eid
        assert_sound(s)
        s.gc(grace_s=0)                # orphans and temp files of the killed put go
        assert os.listdir(s.blobs.tmp_dir) == []
        assert [p.code for p in s.fsck().problems] == []


def test_gc_racing_puts_never_leaves_a_dangling_entry(tmp_path):
    import threading
    from rewindfs.store import BlobMissing
    with Store.open(tmp_path / "store") as s:
        data = [os.urandom((1 << 20) + 1 + i) for i in range(3)]   # blob files
        stop = threading.Event()
        errors = []

        def putter():
            try:
                while not stop.is_set():
                    for d in data:
                        key, _ = s.put_bytes(d)
                        try:
                            assert s.read_blob(key) == d
                        except BlobMissing:   # grace 0: gc may take it right away…
                            try:              # …but never the file under a live entry
                                s.blobs.entry(key)
                            except BlobMissing:
                                continue
                            raise AssertionError("entry without its file") from None
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=putter)
        t.start()
        try:
            for _ in range(1000):
                s.gc(grace_s=0)
        finally:
            stop.set()
            t.join()
        assert errors == []
        report = s.fsck()
        assert report.ok, report.errors
