"""The kernel-direct FUSE session at the protocol's edges (issue 17).

Each test mounts with ``--session kernel`` (or ``REWINDFS_SESSION=kernel``) and
looks from outside: what programs see through the mount, whether the daemon still
serves afterwards, whether the mount goes away.  Waiting on a child process carries a
generous timeout only so that a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from mountkit import cli, is_rewindfs_mount, mounted
from relkit import Daemon, background, call, crashing_daemon
from rewindfs.overlay.places import DEAD_MOUNT

pytestmark = pytest.mark.mount

KERNEL = ("--session", "kernel")
HANG_GUARD_S = 120
MiB = 1 << 20

# What an older kernel may lack; each set must leave behaviour as it was.
HIDDEN = {
    "all-offered": "",
    "no-killpriv-no-opendir-no-auto": "killpriv_v2,no_opendir,readdirplus_auto",
    "no-ext-no-pages-no-trunc-no-plus": "init_ext,max_pages,atomic_o_trunc,readdirplus",
    "no-passthrough": "passthrough",
    "no-passthrough-no-writeback": "passthrough,writeback_cache",
}


def _python(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=HANG_GUARD_S, **kw)


def _without_fsetid(cmd: str) -> subprocess.CompletedProcess:
    """*cmd* in a shell that lacks ``CAP_FSETID`` (root otherwise: it can reach the
    test's private directories), as an ordinary user's process would."""
    return subprocess.run(["setpriv", "--bounding-set=-fsetid", "sh", "-c", cmd],
                          capture_output=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize("hide", list(HIDDEN.values()), ids=list(HIDDEN))
def test_init_without_the_newer_flags_falls_back(tmp_path, hide):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "d").mkdir()
    for i in range(300):
        (ws / "d" / f"f{i:03}").write_bytes(b"%d\n" % i)
    (ws / "setid").write_bytes(b"x")
    os.chmod(ws / "setid", 0o6777)
    with mounted(ws, store, extra=KERNEL, env={"REWINDFS_FUSE_HIDE": hide}):
        assert sorted(os.listdir(ws / "d")) == [f"f{i:03}" for i in range(300)]
        big = os.urandom(3 * MiB + 5)
        (ws / "big").write_bytes(big)
        assert (ws / "big").read_bytes() == big
        with open(ws / "d" / "f007", "w") as f:          # O_TRUNC
            f.write("seven\n")
        assert (ws / "d" / "f007").read_text() == "seven\n"
        os.rename(ws / "d" / "f001", ws / "d" / "one")
        os.unlink(ws / "d" / "f002")
        assert len(os.listdir(ws / "d")) == 299 and "one" in os.listdir(ws / "d")
        # a write without CAP_FSETID drops set-user-ID and (group-executable) set-group-ID
        res = _without_fsetid(f"printf y >> '{ws / 'setid'}'")
        assert res.returncode == 0, res.stderr
        assert stat.S_IMODE(os.stat(ws / "setid").st_mode) == 0o777
        assert (ws / "setid").read_bytes() == b"xy"
    assert (ws / "big").read_bytes() == big
    assert stat.S_IMODE(os.stat(ws / "setid").st_mode) == 0o777


def test_truncate_without_fsetid_drops_setid_bits_but_sgid_only_with_group_exec(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    for name, mode in (("a", 0o6777), ("b", 0o2767), ("c", 0o6777)):
        (ws / name).write_bytes(b"content")
        os.chmod(ws / name, mode)
    with mounted(ws, store, extra=KERNEL):
        for cmd in (f"truncate -s 1 '{ws / 'a'}'", f"truncate -s 1 '{ws / 'b'}'",
                    f": > '{ws / 'c'}'"):
            res = _without_fsetid(cmd)
            assert res.returncode == 0, res.stderr
        modes = {n: stat.S_IMODE(os.stat(ws / n).st_mode) for n in "abc"}
        assert modes == {"a": 0o777, "b": 0o2767, "c": 0o777}
    assert {n: stat.S_IMODE(os.stat(ws / n).st_mode) for n in "abc"} == modes


def test_requests_the_session_does_not_serve_get_an_answer(tmp_path):
    """O_TMPFILE (FUSE_TMPFILE), SEEK_DATA/SEEK_HOLE (FUSE_LSEEK) and poll (FUSE_POLL)
    reach a session without those operations: each gets ENOSYS and the kernel falls
    back or refuses — nothing hangs, the daemon goes on serving."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "f").write_bytes(b"data" * 1000)
    with mounted(ws, store, extra=KERNEL):
        with pytest.raises(OSError) as info:
            os.open(ws, os.O_TMPFILE | os.O_RDWR, 0o600)
        assert info.value.errno == errno.EOPNOTSUPP
        fd = os.open(ws / "f", os.O_RDONLY)
        try:
            assert os.lseek(fd, 0, os.SEEK_DATA) == 0
            assert os.lseek(fd, 0, os.SEEK_HOLE) == 4000
            p = select.poll()
            p.register(fd, select.POLLIN)
            assert p.poll(HANG_GUARD_S * 1000)[0][1] & select.POLLIN
        finally:
            os.close(fd)
        res = _python(f"""
            import fcntl, termios
            f = open({str(ws / 'f')!r}, 'rb')     # buffered open asks isatty (an ioctl)
            try:
                fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))
            except OSError as e:
                print(e.errno)
            """)
        assert res.stdout.strip() == str(errno.ENOTTY), res.stderr
        assert (ws / "f").read_bytes() == b"data" * 1000


def _big_file(ws, name="big", size=96 * MiB):
    with open(ws / name, "wb") as f:
        chunk = os.urandom(MiB)
        for _ in range(size // MiB):
            f.write(chunk)


_OPEN_FOR_WRITING = """
    import os, signal, sys
    hits = []
    signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    print("ready", flush=True)
    fd = os.open(sys.argv[1], os.O_WRONLY)      # the capture of a big file runs here
    os.pwrite(fd, b"!", 0)
    os.close(fd)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print("done", len(hits), flush=True)
"""


def test_interrupted_requests_are_answered_and_the_daemon_goes_on(tmp_path):
    """A writer showered with signals while its open waits for a capture (the kernel
    sends FUSE_INTERRUPT): the open still completes; a writer killed meanwhile
    leaves a reply nobody waits for — the daemon drops it and serves on."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _big_file(ws, "one")
    _big_file(ws, "two")
    with mounted(ws, store, extra=KERNEL) as m:
        m.call("turn.begin", session="s", turn=1, label="interrupts")
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_OPEN_FOR_WRITING),
                                  os.fspath(ws / "one")], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        while child.poll() is None:
            try:
                os.kill(child.pid, signal.SIGUSR1)
            except ProcessLookupError:
                break
            select.select([], [], [], 0.001)
        out = child.stdout.read()
        assert child.wait(HANG_GUARD_S) == 0 and out.startswith("done"), out

        victim = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_OPEN_FOR_WRITING),
                                   os.fspath(ws / "two")], stdout=subprocess.PIPE, text=True)
        assert victim.stdout.readline().strip() == "ready"
        select.select([], [], [], 0.05)
        victim.kill()
        victim.wait(HANG_GUARD_S)
        assert (ws / "one").read_bytes()[:1] == b"!"
        (ws / "after").write_bytes(b"still serving")
        assert (ws / "after").read_bytes() == b"still serving"
        m.call("turn.end")


def test_unmount_with_a_request_in_flight(tmp_path):
    """``rewindfs unmount`` while a writer's open waits for the capture of a big file.
    The CLI needs a moment to start; if the capture ended first, the writer holds the
    file open when the unmount looks and the unmount rightly refuses (``mount-busy``,
    naming it: seen once in CI). That is not this case, so it is tried again in a new
    turn (a new capture), up to three times."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _big_file(ws)
    with mounted(ws, store, extra=KERNEL) as m:
        for turn in (1, 2, 3):
            m.call("turn.begin", session="s", turn=turn, label="in flight")
            child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_OPEN_FOR_WRITING),
                                      os.fspath(ws / "big")], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            assert child.stdout.readline().strip() == "ready"
            res = cli("unmount", ws, store=store, timeout=HANG_GUARD_S)
            rc = child.wait(HANG_GUARD_S)
            out, err = child.communicate()
            if res.returncode == 0:
                break
            assert "mount-busy" in res.stderr and f"pid {child.pid} " in res.stderr, \
                res.stderr + res.stdout
            assert rc == 0 and out.startswith("done"), (rc, out, err)
        assert res.returncode == 0, res.stderr + res.stdout
        # its open was served before the unmount, or failed cleanly after it
        assert rc == 0 or "Errno" in err, (rc, out, err)
        assert m.proc.wait(HANG_GUARD_S) == 0
    assert not is_rewindfs_mount(ws)


def test_kill_9_leaves_a_stale_mount_that_recover_clears(tmp_path, monkeypatch):
    monkeypatch.setenv("REWINDFS_SESSION", "kernel")
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "f").write_bytes(b"before")
    with crashing_daemon(Daemon(ws, store), ws) as daemon:
        daemon.start()
        (ws / "f").write_bytes(b"after")
        daemon.kill()
        assert is_rewindfs_mount(ws)
        with pytest.raises(OSError) as info:
            os.stat(ws / "f")
        # ENOTCONN through /dev/fuse, ECONNABORTED over io_uring (REWINDFS_URING=1)
        assert info.value.errno in DEAD_MOUNT
        res = cli("mount", ws, "--json", store=store)
        assert res.returncode == 2 and "stale-mount" in res.stdout, res.stdout + res.stderr
        with background(ws, store, recover=True):
            assert (ws / "f").read_bytes() == b"after"
            assert call(store, ws, "status")["fs"]["session"] == "kernel"
    assert not is_rewindfs_mount(ws)


# -- passthrough -----------------------------------------------------------------------

PASSTHROUGH = {"REWINDFS_PASSTHROUGH": "1"}


def test_passthrough_mount_reads_and_writes(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    data = os.urandom(5 * MiB)
    (ws / "f").write_bytes(data)
    with mounted(ws, store, extra=KERNEL, env=PASSTHROUGH) as m:
        fs = m.call("status")["fs"]
        assert fs["passthrough"] is True and fs["writeback"] is False
        assert (ws / "f").read_bytes() == data
        with open(ws / "f", "r+b") as w, open(ws / "f", "rb") as r:   # one backing id
            w.seek(MiB)
            w.write(b"passed through")
            w.flush()
            r.seek(MiB)
            assert r.read(14) == b"passed through"
        (ws / "g").write_bytes(b"new file")
        assert (ws / "g").read_bytes() == b"new file"
    assert (ws / "f").read_bytes()[MiB:MiB + 14] == b"passed through"
    assert (ws / "g").read_bytes() == b"new file"


def test_passthrough_writers_send_no_write_to_the_daemon(tmp_path):
    """On a passthrough mount a file opened for writing is passed through too (the
    kernel writes the real file): a burst of writes costs no WRITE request.  The file
    is still captured at open, so rewinding the turn gives the content before it."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "db").write_bytes(b"\0" * MiB)
    with mounted(ws, store, extra=KERNEL, env=PASSTHROUGH) as m:
        e1 = m.call("turn.begin", session="s", turn=1, label="writes")["epoch"]
        before = m.call("status")["fs"]["requests"].get("write", 0)
        fd = os.open(ws / "db", os.O_RDWR)
        try:
            for i in range(256):
                os.pwrite(fd, b"%04d" % i * 1024, (i * 4096) % MiB)
            os.fsync(fd)
        finally:
            os.close(fd)
        with open(ws / "new", "wb") as fh:
            fh.write(b"n" * 100_000)
        assert m.call("status")["fs"]["requests"].get("write", 0) == before
        m.call("turn.end")
        res = m.call("rewind", to=f"e{e1}")
        assert res["failed"] == [], res["failed"]
        assert (ws / "db").read_bytes() == b"\0" * MiB
        assert not (ws / "new").exists()


@pytest.mark.parametrize("reader", [False, True], ids=["alone", "with-a-reader"])
def test_passthrough_file_held_open_across_turn_marks_rewinds_to_each_mark(tmp_path, reader):
    """A file held open for writing across turn marks: rewinding to a mark gives the
    content it had then.  Alone, the writer is direct I/O (each WRITE captured); while a
    reader holds the file passed through, the writer is passed through too and its
    file is captured at open and again into each new epoch at the mark."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "log").write_bytes(b"start\n")
    with mounted(ws, store, extra=KERNEL, env=PASSTHROUGH) as m:
        held = open(ws / "log", "rb") if reader else None     # passed through
        e1 = m.call("turn.begin", session="s", turn=1, label="one")["epoch"]
        fd = os.open(ws / "log", os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"turn one\n")
            e2 = m.call("turn.begin", session="s", turn=2, label="two")["epoch"]
            os.write(fd, b"turn two\n")
            m.call("turn.end")
        finally:
            os.close(fd)
        if held is not None:
            assert held.read() == b"start\nturn one\nturn two\n"
            held.close()
        assert (ws / "log").read_bytes() == b"start\nturn one\nturn two\n"
        res = m.call("rewind", to=f"e{e2}")
        assert res["failed"] == [], res["failed"]
        assert (ws / "log").read_bytes() == b"start\nturn one\n"
        res = m.call("rewind", to=f"e{e1}", force=True)
        assert res["failed"] == [], res["failed"]
        assert (ws / "log").read_bytes() == b"start\n"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the loop spins only with two CPUs")
@pytest.mark.skipif(os.environ.get("REWINDFS_URING") == "1",
                    reason="over io_uring the /dev/fuse loop does not spin")
def test_a_client_pausing_between_requests_is_not_spun_for_at_every_pause(tmp_path):
    """The loop polls up to 100 µs for the next request before it sleeps (the caller
    usually sends one within µs).  A client that pauses longer each time — an editor
    saving every few ms, a build waiting on a compiler — would cost that spin of one CPU
    at every pause: after a few spins that catch nothing the loop sleeps at once."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "f").write_bytes(b"x")
    with mounted(ws, store, extra=KERNEL) as m:
        before = m.call("status")["fs"]["spins"]
        for _ in range(200):
            os.close(os.open(ws / "f", os.O_RDONLY))   # OPEN, then RELEASE without a wait
            time.sleep(0.002)
        after = m.call("status")["fs"]["spins"]
    missed = after["missed"] - before["missed"]
    assert missed < 50, f"{missed} spins caught nothing in 200 pauses of 2 ms"
