"""The daemon outlives its clients (issue 14): Ctrl-C in a terminal in the middle of a
5,000-file rewind and of a redo, a client that stops reading, a client SIGKILLed, and
``status`` from a directory whose daemon died.

The Ctrl-C is a person's: the CLI runs on a pty (``ptykit``) and the test writes
``\\x03`` to it, so the terminal driver sends SIGINT.  To press it mid-stream every
time, the daemon's landing pauses after its 1,000th change (the restore engine's test
hook ``REWINDFS_PAUSE_AFTER``/``REWINDFS_PAUSE_FILE``, overlay/rewind/land.py); the
test presses Ctrl-C while it waits, waits for the client to exit, then lets it go on.
What must hold afterwards: the daemon is alive and still mounted, the mount works (a
write and a read, a turn mark), the tree is exactly the state before or after the
rewind (``treesnap``), and the client's last line says which.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from mountkit import cli, is_rewindfs_mount, mounted
from ptykit import Terminal
from treesnap import compare, snapshot

REWINDFS = str(Path(sys.executable).with_name("rewindfs"))
N = 5000
DIRS = 50
PAUSE_AT = 1000
_WAIT_S = 120.0


def _seed(ws: Path, n: int = N) -> None:
    """n files in DIRS directories, written bare (before the mount): the rewind target."""
    for i in range(n):
        d = ws / f"d{i % DIRS:02d}"
        d.mkdir(exist_ok=True)
        (d / f"f{i:04d}").write_text(f"v0 {i}\n")


def _turn_rewriting_all(m, n: int = N) -> int:
    """Turn 1 of s rewrites every file and adds one per directory; returns its epoch."""
    epoch = m.call("turn.begin", session="s", turn=1, label="rewrite all")["epoch"]
    for i in range(n):
        (m.ws / f"d{i % DIRS:02d}" / f"f{i:04d}").write_text(f"v1 {i} " + "x" * 100)
    for j in range(DIRS):
        (m.ws / f"d{j:02d}" / "new").write_text("new\n")
    m.call("turn.end", session="s")
    return epoch


def test_ctrl_c_on_an_unmount_says_what_the_daemon_does_without_us(tmp_path):
    """Ctrl-C on ``rewindfs unmount`` while the daemon waits for a running rewind (it
    waits up to 2 s, then refuses).  It used to exit 130 and say nothing, and a rewind
    ending within the 2 s then unmounted the workspace behind the person's back; now
    the last line says the daemon decides without us and where to look."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _seed(ws, 1000)
    with _rewind_paused_at_100(tmp_path, ws, "unmount") as (m, client, pause):
        term = Terminal([REWINDFS, "--store", str(m.store), "unmount", str(ws)],
                        cwd=ws.parent)
        try:
            _wait_until(lambda: _blocked_on_reply(term.pid), "unmount to send its request")
            term.ctrl_c()
            assert term.wait() == 130, term.text()[-3000:]
            last = term.last_line()
            assert "unmount" in last and "`rewindfs status`" in last, term.text()[-3000:]
        finally:
            term.close()
        time.sleep(2.5)              # the rewind still paused: the daemon refused
        assert is_rewindfs_mount(ws)
        pause.unlink()
        _finished(m)
        _mount_works(m, 8)


def _pause_env(tmp_path, name: str) -> tuple[dict, Path]:
    pause = tmp_path / f"pause-{name}"
    return {"REWINDFS_PAUSE_AFTER": str(PAUSE_AT), "REWINDFS_PAUSE_FILE": str(pause)}, pause


def _wait_until(pred, what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _ctrl_c_while_paused(m, pause: Path, *args) -> Terminal:
    """``rewindfs ARGS`` on a pty; Ctrl-C once the daemon's landing is paused and the
    client has shown the plan; returns the ended terminal (pause released)."""
    term = Terminal([REWINDFS, "--store", str(m.store), *args, "-C", str(m.ws)],
                    cwd=m.ws.parent)
    try:
        _wait_until(pause.exists, "the landing to pause")
        term.wait_for(" written, ")        # the plan is shown: the client is streaming
        term.ctrl_c()
        term.status = term.wait()
        # what the last line promises: status shows the rewind still running
        shown = cli("status", "-C", m.ws, store=m.store)
        assert shown.returncode == 0, shown.stderr
        assert f"a {args[0]} is running" in shown.stdout, shown.stdout
    finally:
        try:
            pause.unlink()                          # let the landing go on
        except FileNotFoundError:
            pass
        term.close()
    return term


def _mount_works(m, turn: int) -> None:
    """The daemon is alive and mounted; a turn mark, a write and a read work."""
    assert m.proc.poll() is None, "the daemon died"
    assert is_rewindfs_mount(m.ws)
    status = m.call("status")
    assert status["mounted"] is True and "intent" not in status, status
    m.call("turn.begin", session="s", turn=turn, label="after Ctrl-C")
    (m.ws / "probe").write_text(f"probe {turn}\n")
    assert (m.ws / "probe").read_text() == f"probe {turn}\n"
    m.call("turn.end", session="s")


def _finished(m) -> None:
    """Wait for the rewind the client left behind: a turn mark waits for it (one lock)."""
    m.call("turn.begin", session="s", turn=90, label="wait for the rewind")
    m.call("turn.end", session="s")


def test_ctrl_c_in_a_terminal_mid_rewind_and_mid_redo(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _seed(ws)
    before = snapshot(ws)                       # the rewind's target state
    env, pause = _pause_env(tmp_path, "rewind")
    with mounted(ws, store, env=env) as m:
        epoch = _turn_rewriting_all(m)
        after_turn = snapshot(ws)               # the rewind's starting state
        term = _ctrl_c_while_paused(m, pause, "rewind", f"e{epoch}")
        assert term.status == 130, term.text()[-3000:]
        last = term.last_line()
        assert "goes on in the daemon" in last and "`rewindfs status`" in last, last
        _finished(m)
        assert compare(before, snapshot(ws)) == []     # all of it, as the line said
        _mount_works(m, 2)
    env, pause = _pause_env(tmp_path, "redo")
    with mounted(ws, store, env=env) as m:      # the pause hook fires once per daemon
        term = _ctrl_c_while_paused(m, pause, "redo", "--force")   # the probe turn came after
        assert term.status == 130, term.text()[-3000:]
        last = term.last_line()
        assert "the redo goes on in the daemon" in last, last
        _finished(m)
        assert compare(after_turn, snapshot(ws)) == []  # the probe is gone too
        _mount_works(m, 3)


def test_a_client_that_stops_reading_holds_up_no_turn_mark(tmp_path):
    """A client sends ``rewind`` and never reads (a suspended ``rewindfs rewind``, a
    full pipe): the rewind's progress fills the socket.  The rewind still finishes and
    the next turn mark is served (before: the lock stayed held while the daemon waited
    to send the progress, so every turn mark hung until that client went away)."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _seed(ws)
    before = snapshot(ws)
    with mounted(ws, store) as m:
        epoch = _turn_rewriting_all(m)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            s.connect(m.socket)
            s.sendall(json.dumps({"v": 1, "id": 1, "method": "rewind",
                                  "params": {"to": f"e{epoch}"}}).encode() + b"\n")
            # the rewind's own epoch ends when its landing does (no lock needed to see)
            _wait_until(lambda: m.call("status")["epoch"] > epoch + 1
                        and "intent" not in m.call("status"), "the rewind to land")
            got = []
            mark = threading.Thread(target=lambda: got.append(m.call(
                "turn.begin", session="s", turn=2, label="while a client sleeps")),
                daemon=True)
            mark.start()
            mark.join(_WAIT_S)
            assert got, "a turn mark waited for a client that does not read"
            m.call("turn.end", session="s")
            assert compare(before, snapshot(ws)) == []
        finally:
            s.close()
        _mount_works(m, 3)


@contextmanager
def _rewind_paused_at_100(tmp_path, ws: Path, name: str):
    """1,000 files rewritten by turn 1 on a mount of *ws*, and a ``rewindfs --json
    rewind`` to before it whose landing is paused after its 100th change.  Yields
    ``(m, client, pause)``; afterwards the pause is released and the client reaped."""
    store = tmp_path / "store"
    env, pause = _pause_env(tmp_path, name)
    env["REWINDFS_PAUSE_AFTER"] = "100"
    with mounted(ws, store, env=env) as m:
        epoch = _turn_rewriting_all(m, 1000)
        client = subprocess.Popen([REWINDFS, "--store", str(store), "--json", "rewind",
                                   f"e{epoch}", "-C", str(ws)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL)
        try:
            _wait_until(pause.exists, "the landing to pause")
            yield m, client, pause
        finally:
            try:
                pause.unlink()                      # let the landing go on
            except FileNotFoundError:
                pass
            client.stdout.close()                   # a client still streaming ends too
            client.wait(_WAIT_S)


def test_ctrl_c_on_a_gc_says_it_goes_on_in_the_daemon(tmp_path):
    """Ctrl-C on ``rewindfs gc`` while the daemon still holds it (a gc waits for a
    running rewind): it exited 130 and said nothing, though the daemon runs the gc all
    the same once it gets to it.  The last line says so and where to look."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _seed(ws, 1000)
    with _rewind_paused_at_100(tmp_path, ws, "gc") as (m, client, pause):
        term = Terminal([REWINDFS, "--store", str(m.store), "gc", "--keep-epochs", "1000",
                         "-C", str(ws)], cwd=ws.parent)
        try:
            _wait_until(lambda: _blocked_on_reply(term.pid), "gc to send its request")
            term.ctrl_c()
            assert term.wait() == 130, term.text()[-3000:]
            last = term.last_line()
            assert "gc" in last and "goes on in the daemon" in last, term.text()[-3000:]
            assert "`rewindfs status`" in last, term.text()[-3000:]
        finally:
            term.close()
        pause.unlink()
        _wait_until(lambda: m.call("status").get("busy") is None, "the rewind and gc to end")
        _mount_works(m, 8)


def test_a_client_killed_mid_rewind_leaves_the_rewind_finished(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    _seed(ws, 1000)
    before = snapshot(ws)
    with _rewind_paused_at_100(tmp_path, ws, "kill") as (m, client, pause):
        client.stdout.readline()                    # it is streaming
        client.kill()
        client.wait()
        pause.unlink()
        _finished(m)
        assert compare(before, snapshot(ws)) == []
        _mount_works(m, 2)


def test_status_in_a_dead_mount_says_stale_and_how_to_recover(tmp_path):
    """The daemon is SIGKILLed under a shell whose cwd is inside the mount (every
    command there now meets "Transport endpoint is not connected")."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "sub").mkdir()
    with mounted(ws, store, require_clean=False) as m:
        shell = subprocess.Popen(["bash"], cwd=ws / "sub", stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        out, err = shell.communicate(
            f"'{REWINDFS}' --store '{store}' status; echo \"exit=$?\"\n"
            f"'{REWINDFS}' --store '{store}' --json status; echo \"exit=$?\"\n", timeout=120)
    assert "Traceback" not in err, err
    assert out.count("exit=2") == 2, (out, err)
    assert f"{ws} is a stale mount" in err, err
    assert f"rewindfs mount --recover {ws}" in err, err
    record = json.loads(out.splitlines()[1])
    assert record["type"] == "error" and record["code"] == "stale-mount", record
    assert not is_rewindfs_mount(ws)        # mountkit detached it


def test_mount_says_first_that_it_finishes_an_interrupted_rewind(tmp_path):
    """An offline rewind killed half-way leaves an intent; ``mount`` finishes it before
    it serves, and says so before anything else."""
    from relkit import ensure_unmounted, kill_background, stop_background
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _seed(ws, 200)
    before = snapshot(ws)
    with mounted(ws, store) as m:
        epoch = _turn_rewriting_all(m, 200)
    res = cli("rewind", f"e{epoch}", "-C", ws, store=store, env={"REWINDFS_FAULT_AFTER": "20"})
    assert res.returncode == -9, res.stderr          # killed half-way: an intent is left
    pid = None
    try:
        res = cli("mount", ws, store=store, timeout=120)
        assert res.returncode == 0, res.stderr
        pid = json.loads(cli("status", "--json", "-C", ws, store=store).stdout)["pid"]
        assert res.stderr.splitlines()[0] == "warning: finishing an interrupted rewind first"
        assert compare(before, snapshot(ws)) == []
        stop_background(ws, store, pid)
        pid = None
    finally:
        kill_background(pid)
        ensure_unmounted(ws)


# The syscalls a client blocked on its reply sits in (``/proc/PID/syscall``): recvfrom,
# or poll (ppoll on aarch64) when its socket has a timeout (``unmount``'s).
_WAITING = {"x86_64": {45, 7}, "aarch64": {207, 73}}[os.uname().machine]


def _blocked_on_reply(pid: int) -> bool:
    """The CLI has sent its request and waits for the daemon's answer."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return int(f.read().split(" ", 1)[0]) in _WAITING
    except (OSError, ValueError):
        return False


def test_ctrl_c_on_a_turn_mark_says_whether_it_happened(tmp_path):
    """A person presses Ctrl-C on ``rewindfs turn begin`` while the daemon still holds
    it (a turn mark waits for a running rewind).  The daemon carries the mark out all the
    same; the CLI's last line must say so and where to look — before, it exited 130 and
    said nothing, so the person could not tell whether turn 7 had begun."""
    ws = tmp_path / "ws"
    ws.mkdir()
    _seed(ws, 1000)
    with _rewind_paused_at_100(tmp_path, ws, "mark") as (m, client, pause):
        term = Terminal([REWINDFS, "--store", str(m.store), "turn", "begin", "--session",
                         "s", "--turn", "7", "-C", str(ws)], cwd=ws.parent)
        try:
            _wait_until(lambda: _blocked_on_reply(term.pid), "turn begin to send its request")
            term.ctrl_c()
            assert term.wait() == 130, term.text()[-3000:]
            last = term.last_line()
            assert "turn begin" in last and "`rewindfs status`" in last, term.text()[-3000:]
        finally:
            term.close()
        pause.unlink()
        # what the line promised: once the rewind is done, turn 7 has begun
        _wait_until(lambda: (m.call("status").get("open_turn") or {}).get("turn") == 7,
                    "the interrupted mark to be carried out")
        m.call("turn.end", session="s")
        _mount_works(m, 8)
