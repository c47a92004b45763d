"""FUSE over io_uring, the kernel session's opt-in transport (``REWINDFS_URING=1``).

Root only, and only where the fuse module has ``enable_uring``: the ``uring`` fixture
sets it to Y for the test and puts the old value back afterwards.  Every daemon here is
started with ``REWINDFS_URING=1``; ``status`` (``fs.uring_queues``) says whether the
rings served the requests.  A ring that cannot be set up is simulated with our own
fault knob (``REWINDFS_URING_FAIL=setup``), never with the machine-wide
``/proc/sys/kernel/io_uring_disabled``.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time

import pytest

from mountkit import cli, is_rewindfs_mount, mounted
from relkit import Daemon, call, crashing_daemon
from rewindfs.overlay.fs.kernel.uring import nr_possible_cpus

pytestmark = pytest.mark.mount

PARAM = "/sys/module/fuse/parameters/enable_uring"
URING = {"REWINDFS_URING": "1", "REWINDFS_SESSION": "kernel"}
HANG_GUARD_S = 120


@pytest.fixture
def uring():
    """enable_uring=Y for the test, the old value restored afterwards."""
    if os.geteuid() != 0:
        pytest.skip("FUSE over io_uring needs root")
    if not os.path.exists(PARAM):
        pytest.skip("this kernel's fuse module has no enable_uring parameter")
    with open(PARAM) as f:
        old = f.read().strip()
    with open(PARAM, "w") as f:
        f.write("Y")
    try:
        yield
    finally:
        with open(PARAM, "w") as f:
            f.write(old)


def _queues(m) -> list[int] | None:
    return m.call("status")["fs"]["uring_queues"]


def test_requests_go_through_the_rings(tmp_path, uring):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "old").write_bytes(b"old\n")
    with mounted(ws, store, env=URING) as m:
        before = _queues(m)
        assert before is not None and len(before) == nr_possible_cpus(), before
        assert (ws / "old").read_bytes() == b"old\n"
        big = os.urandom((3 << 20) + 17)                  # > one 1 MiB payload
        (ws / "big").write_bytes(big)
        assert (ws / "big").read_bytes() == big
        (ws / "d").mkdir()
        for i in range(50):
            (ws / "d" / f"f{i}").write_text(f"{i}\n")
        assert sorted(os.listdir(ws / "d")) == sorted(f"f{i}" for i in range(50))
        os.rename(ws / "d" / "f1", ws / "d" / "one")
        os.unlink(ws / "d" / "f2")
        os.symlink("one", ws / "d" / "link")
        assert os.readlink(ws / "d" / "link") == "one"
        os.setxattr(ws / "old", "user.k", b"v")
        assert os.getxattr(ws / "old", "user.k") == b"v"
        with pytest.raises(OSError) as exc:
            os.getxattr(ws / "old", "user.missing")
        assert exc.value.errno == errno.ENODATA
        after = _queues(m)
        assert sum(after) > sum(before) + 50, (before, after)
    assert (ws / "big").read_bytes() == big
    assert (ws / "d" / "one").read_text() == "1\n"


def test_a_write_after_a_turn_mark_is_rewound(tmp_path, uring):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "a.txt").write_text("before\n")
    with mounted(ws, store, env=URING) as m:
        m.call("turn.begin", session="s1", turn=1, label="one")
        (ws / "a.txt").write_text("turn one\n")
        (ws / "new.txt").write_text("made in turn one\n")
        m.call("turn.end", session="s1")
        assert sum(_queues(m)) > 0
        res = cli("rewind", "t1", "--session", "s1", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr + res.stdout
        assert (ws / "a.txt").read_text() == "before\n"
        assert not (ws / "new.txt").exists()
        res = cli("redo", "--session", "s1", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr + res.stdout
        assert (ws / "a.txt").read_text() == "turn one\n"


def test_rings_that_cannot_be_set_up_leave_the_mount_on_dev_fuse(tmp_path, uring):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with mounted(ws, store, env=dict(URING, REWINDFS_URING_FAIL="setup")) as m:
        (ws / "f").write_text("x\n")
        assert (ws / "f").read_text() == "x\n"
        st = m.call("status")["fs"]
        assert st["uring_queues"] is None
        assert st["requests"].get("create", 0) + st["requests"].get("lookup", 0) > 0
    assert (ws / "f").read_text() == "x\n"


def test_killed_daemon_leaves_a_stale_mount_that_recover_clears(tmp_path, uring):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "keep").write_text("k\n")
    with crashing_daemon(Daemon(ws, store, env=URING), ws) as daemon:
        daemon.start()
        assert sum(daemon.call("status")["fs"]["uring_queues"]) >= 0
        (ws / "f").write_text("x\n")
        daemon.kill()
        assert is_rewindfs_mount(ws)
        with pytest.raises(OSError) as exc:
            os.statvfs(ws)
        assert exc.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        res = cli("mount", ws, "--json", store=store)
        assert res.returncode == 2 and "stale-mount" in res.stdout, res.stdout + res.stderr
        res = cli("mount", "--recover", ws, store=store, env=URING)
        assert res.returncode == 0, res.stderr + res.stdout
        try:
            assert (ws / "keep").read_text() == "k\n"
            assert (ws / "f").read_text() == "x\n"
            assert call(store, ws, "status")["fs"]["uring_queues"] is not None
        finally:
            res = cli("unmount", ws, store=store, timeout=60)
            assert res.returncode == 0, res.stderr


def test_the_forgets_of_an_rm_rf_do_not_hold_up_the_rings(tmp_path, uring):
    """The kernel sends FORGET on ``/dev/fuse`` only, never on a ring.  Each one woke the
    trio thread, which took the ``serial`` lock from the queue threads to forget one
    inode: in an ``rm -rf`` about one ring request in nine slept on that lock
    (docs/benchmarks.md, ninth pass).  Forgets are gathered now — and every one still
    lands: the inode table empties."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with mounted(ws, store, env=URING) as m:
        for i in range(40):
            (ws / "tree" / f"d{i}").mkdir(parents=True)
            for j in range(50):
                (ws / "tree" / f"d{i}" / f"f{j}").write_bytes(b"x")
        base = m.call("status")["fs"]
        shutil.rmtree(ws / "tree")
        deadline = time.monotonic() + 30
        while (st := m.call("status")["fs"])["inodes"] > 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert st["inodes"] <= 8, st["inodes"]          # the root and a few at most
        forgets = sum(st["requests"].get(k, 0) - base["requests"].get(k, 0)
                      for k in ("forget", "batch_forget"))
        served = sum(st["uring_queues"]) - sum(base["uring_queues"])
        waited = sum(st["uring_waits"]) - sum(base["uring_waits"])
        assert forgets > 0 and served > 2000, (forgets, served)
        assert waited * 20 < served, (waited, served, forgets)   # was 11-13 %, now <1 %


def test_unmount_while_requests_are_in_flight(tmp_path, uring):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    for i in range(20):
        (ws / f"f{i}").write_text(f"{i}\n")
    stop = threading.Event()
    errors: list[BaseException] = []
    done = [0]

    def hammer(k: int) -> None:
        # no fd and no cwd in the mount, not even for a moment: a listing's open
        # directory would make the unmount's busy check refuse (it did, in CI). Stats,
        # lookup misses, xattr misses — each one a round trip through a ring
        while not stop.is_set():
            try:
                os.stat(ws / f"f{(done[0] + k) % 20}")
                try:
                    os.lstat(ws / f"missing{k}")
                except FileNotFoundError:
                    pass
                try:
                    os.getxattr(ws / "f0", "user.none")
                except OSError as exc:
                    if exc.errno != errno.ENODATA:
                        raise
                done[0] += 1
            except OSError as exc:
                if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED, errno.ENOENT):
                    errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(k,), daemon=True) for k in range(4)]
    try:
        with mounted(ws, store, env=URING) as m:
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            while done[0] < 200 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert done[0] >= 200
            assert sum(_queues(m)) > 0
            res = cli("unmount", ws, store=store, timeout=60)    # while they go on
            assert res.returncode == 0, res.stderr
            assert m.proc.wait(timeout=HANG_GUARD_S) == 0
    finally:
        # also when an assertion failed: hammers left running would go on touching
        # the directory through the rest of the session (they upset later fd counts)
        stop.set()
        for t in threads:
            if t.ident is not None:      # started
                t.join(HANG_GUARD_S)
    assert not any(t.is_alive() for t in threads)
    assert not is_rewindfs_mount(ws)
    assert errors == []
    assert (ws / "f3").read_text() == "3\n"
