"""The daemon and the mount CLI: background mount, unmount, run, refusals with codes,
stale mounts and their recovery, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager

import pytest

from mountkit import PYTHON, ROOT, cli, is_rewindfs_mount, mounted

pytestmark = pytest.mark.mount


def jlines(res) -> list[dict]:
    return [json.loads(x) for x in res.stdout.splitlines() if x.strip()]


def error_code(res) -> str:
    return [x for x in jlines(res) if x["type"] == "error"][0]["code"]


@pytest.fixture
def dirs(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws, tmp_path / "store"


def wait_until(pred, what, limit=30.0):
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_background_mount_unmount(dirs):
    ws, store = dirs
    (ws / "f").write_text("bare")
    res = cli("--json", "mount", ws, store=store)
    try:
        assert res.returncode == 0, res.stderr
        assert is_rewindfs_mount(ws)  # mounted by the time the command returned
        assert jlines(res)[-1]["type"] == "mounted"
        st = json.loads(cli("--json", "status", "-C", ws, store=store).stdout)
        pid = st["pid"]
        assert pid != os.getpid() and os.path.exists(f"/proc/{pid}")
        assert (ws / "f").read_text() == "bare"
        (ws / "f").write_text("through the mount")
        again = cli("--json", "mount", ws, store=store)
        assert again.returncode == 2 and error_code(again) == "already-mounted"
    finally:
        res = cli("unmount", ws, store=store)
    assert res.returncode == 0, res.stderr
    assert not is_rewindfs_mount(ws)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
               open(f"/proc/{pid}/stat").read().split()[2] == "Z", "daemon exit")
    assert (ws / "f").read_text() == "through the mount"


@pytest.mark.parametrize("case", ["missing", "file", "root", "home", "store-inside"])
def test_refusals(tmp_path, case):
    ws = tmp_path / "ws"
    store = tmp_path / "store"
    env = {}
    if case == "file":
        ws.write_text("x")
    elif case == "root":
        ws = "/"
    elif case == "home":
        ws.mkdir()
        env = {"HOME": str(ws)}
    elif case == "store-inside":
        ws.mkdir()
        store = ws / ".store"
    res = cli("--json", "mount", ws, store=store, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert error_code(res) == {"missing": "bad-workspace", "file": "bad-workspace",
                               "root": "refused-workspace", "home": "refused-workspace",
                               "store-inside": "store-inside-workspace"}[case]
    assert not is_rewindfs_mount(ws)


def test_usage_errors_exit_3(dirs):
    ws, store = dirs
    assert cli("mount", store=store).returncode == 3
    assert cli("frobnicate", store=store).returncode == 3
    assert cli("turn", "begin", "--session", "s", store=store).returncode == 3
    assert cli("run", "--dir", ws, store=store).returncode == 3
    res = cli("--json", "unmount", ws, store=store)
    assert res.returncode == 2 and error_code(res) == "not-mounted"
    res = cli("--json", "status", "-C", ws, store=store)
    assert res.returncode == 2 and error_code(res) == "not-mounted"  # never mounted


def test_status_of_an_unmounted_workspace_comes_from_the_store(dirs):
    ws, store = dirs
    with mounted(ws, store) as m:
        m.call("turn.begin", session="s", turn=1, label="l")
    res = cli("status", "--json", "--store", store, "-C", ws / ".")
    assert res.returncode == 0, res.stderr
    st = jlines(res)[0]
    assert st["mounted"] is False and st["open_turn"]["turn"] == 1
    (ws / "sub").mkdir()
    assert jlines(cli("status", "--json", "--store", store, cwd=ws / "sub"))[0][
        "workspace"] == os.path.realpath(ws)


def test_status_of_an_unmounted_workspace_names_a_store_it_cannot_open(dirs):
    """An unreadable store (here a damaged index) made ``rewindfs status`` say the
    workspace "is not served by a rewindfs daemon" — the store's error hidden.  No
    store at all still reads as not mounted."""
    ws, store = dirs
    with mounted(ws, store) as m:
        m.call("turn.begin", session="s", turn=1, label="l")
    data = store / "index" / "data.mdb"
    with open(data, "r+b") as f:                 # the meta pages: LMDB refuses the file
        f.write(b"\xff" * 8192)
    res = cli("status", "--store", store, "-C", ws)
    assert res.returncode == 2 and "store-error" in res.stderr, res.stderr
    assert "not served" not in res.stderr, res.stderr
    res = cli("status", "--store", store.parent / "no-store-here", "-C", ws)
    assert res.returncode == 2 and "not-mounted" in res.stderr, res.stderr


def test_run_mounts_runs_inside_and_unmounts(dirs):
    ws, store = dirs
    sub = ws / "sub"
    sub.mkdir()
    script = ("import os, sys; open('made', 'w').write('x'); "
              "print(os.stat('.').st_dev); sys.exit(7)")
    res = cli("run", "--dir", ws, "--", PYTHON, "-c", script, store=store, cwd=sub)
    assert res.returncode == 7, res.stderr
    assert int(res.stdout.split()[-1]) != os.stat(sub).st_dev  # ran inside the mount
    assert not is_rewindfs_mount(ws)
    assert (sub / "made").read_text() == "x"
    from rewindfs.store import Store
    with Store.open(store) as s:
        wsid = s.workspace(os.fsencode(os.path.realpath(ws)))
        touched = [p for e in s.epochs(wsid) for p, _ in s.journal(wsid, e.id)]
        assert b"sub/made" in touched
        assert s.fsck().ok


def test_run_with_a_workspace_elsewhere_runs_the_command_in_it(dirs):
    """``rewindfs run -C ~/proj -- make`` from another directory mounted ~/proj and ran
    ``make`` where the shell stood, outside the mount: nothing it wrote was seen, and
    the workspace was mounted for nothing. Run from outside the workspace, the
    command runs in it (as ``git -C``, ``make -C``); from inside, where it stands."""
    ws, store = dirs
    elsewhere = ws.parent / "elsewhere"
    elsewhere.mkdir()
    script = "import os; open('made', 'w').write('x'); print(os.getcwd())"
    res = cli("run", "-C", ws, "--", PYTHON, "-c", script, store=store, cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-1] == os.path.realpath(ws), res.stdout
    assert (ws / "made").read_text() == "x" and not (elsewhere / "made").exists()
    from rewindfs.store import Store
    with Store.open(store) as s:
        wsid = s.workspace(os.fsencode(os.path.realpath(ws)))
        assert b"made" in [p for e in s.epochs(wsid) for p, _ in s.journal(wsid, e.id)]


def test_run_exits_as_a_shell_does_when_its_command_dies_of_a_signal(dirs):
    """A command killed by SIGTERM made ``rewindfs run`` exit 241 (Python's -15, cut to
    a byte); a shell, ``env`` or ``time`` say 143 = 128 + 15."""
    ws, store = dirs
    die = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    res = cli("run", "--dir", ws, "--", PYTHON, "-c", die, store=store, cwd=ws)
    assert res.returncode == 128 + signal.SIGTERM, (res.returncode, res.stderr)
    assert not is_rewindfs_mount(ws)


def test_run_of_a_file_that_is_not_executable_exits_126_without_a_traceback(dirs):
    ws, store = dirs
    (ws / "build.sh").write_text("echo hi\n")            # 0644: forgot chmod +x
    res = cli("run", "--dir", ws, "--", "./build.sh", store=store, cwd=ws)
    assert res.returncode == 126, (res.returncode, res.stderr)     # as a shell says
    assert "build.sh" in res.stderr and "PermissionError" not in res.stderr, res.stderr
    assert not is_rewindfs_mount(ws)


def test_run_of_a_command_it_cannot_start_mounts_nothing_and_records_nothing(dirs):
    """``rewindfs run ws -- make`` (the workspace given as a word, as ``mount DIR``
    takes it) mounted the *current* directory as a workspace, opened an epoch for it in
    the store, then said "warning: command not executable: ws".  A command that cannot
    start is found out before anything is mounted: 126/127 as a shell says, the
    directory named as such with the ``-C`` that was meant, the store untouched."""
    ws, store = dirs
    parent = ws / "proj"                  # the current directory run would have mounted
    (parent / "app").mkdir(parents=True)
    res = cli("run", "app", "--", "true", store=store, cwd=parent)
    assert res.returncode == 127, (res.returncode, res.stderr)      # bash: not found
    assert "is a directory" in res.stderr and "run -C app -- true" in res.stderr, res.stderr
    assert "warning" not in res.stderr, res.stderr
    res = cli("run", "./app", "--", "true", store=store, cwd=parent)
    assert res.returncode == 126, (res.returncode, res.stderr)      # bash: is a directory
    assert "is a directory" in res.stderr, res.stderr
    res = cli("run", "--dir", ws, "--", "no-such-command-here", store=store, cwd=ws)
    assert res.returncode == 127, (res.returncode, res.stderr)
    assert "no-such-command-here" in res.stderr and "not found" in res.stderr, res.stderr
    assert not is_rewindfs_mount(ws) and not is_rewindfs_mount(parent)
    assert not store.exists(), sorted(p.name for p in store.iterdir())


_CLEANS_UP_ON_CTRL_C = """
import pathlib, signal, sys, time
def stop(*_):
    time.sleep(0.5)                          # a build tidying up after Ctrl-C
    pathlib.Path("cleaned").write_text("yes")
    sys.exit(5)
signal.signal(signal.SIGINT, stop)
pathlib.Path("ready").write_text("yes")
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("sig,to", [(signal.SIGINT, "group"), (signal.SIGTERM, "run"),
                                    (signal.SIGHUP, "run")])
def test_run_lets_its_command_finish_on_ctrl_c_and_passes_on_term_and_hup(dirs, sig, to):
    """Ctrl-C at a terminal signals the whole foreground group: ``rewindfs run`` raised
    KeyboardInterrupt and SIGKILLed its command in the middle of that command's own
    clean-up.  SIGTERM or SIGHUP sent to ``rewindfs run`` alone (a supervisor, a closed
    terminal) killed it on the spot: no unmount, and the command ran on unwatched.
    Now ``run`` waits, as a shell does, for the command it passed the signal on to,
    exits with its status and unmounts."""
    ws, store = dirs
    script = _CLEANS_UP_ON_CTRL_C.replace("signal.SIGINT, stop", f"{int(sig)}, stop")
    proc = subprocess.Popen(
        [PYTHON, "-m", "rewindfs.overlay.cli", "--store", os.fspath(store), "run", "--dir",
         os.fspath(ws), "--", PYTHON, "-c", script],
        cwd=ws, env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (ws / "ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        if to == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if is_rewindfs_mount(ws):
            cli("unmount", "--lazy", ws, store=store)
    assert (ws / "cleaned").read_text() == "yes"
    assert proc.returncode == 5, (proc.returncode, err)
    assert not is_rewindfs_mount(ws)


def test_cli_turns_and_status(dirs):
    ws, store = dirs
    with mounted(ws, store):
        res = cli("--json", "turn", "begin", "--session", "s", "--turn", "2", "--label", "hi",
                  "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        epoch = jlines(res)[0]["epoch"]
        st = jlines(cli("--json", "status", store=store, cwd=ws))[0]  # found from the cwd
        assert st["open_turn"]["epoch"] == epoch and st["open_turn"]["label"] == "hi"
        res = cli("--json", "turn", "end", "-C", ws, store=store)
        assert jlines(res)[0]["epoch"] > epoch
        human = cli("status", "-C", ws, store=store)
        assert human.returncode == 0 and "no open turn" in human.stdout
        assert cli("fsck", store=store).returncode == 0


def test_mount_warns_when_cwd_is_inside(dirs):
    ws, store = dirs
    res = cli("mount", ws, store=store, cwd=ws)
    try:
        assert res.returncode == 0, res.stderr
        assert 'cd "$PWD"' in res.stderr
    finally:
        assert cli("unmount", ws, store=store).returncode == 0


def test_a_refused_mount_does_not_tell_the_shell_inside_to_re_enter(dirs):
    """A mount refused (here: a directory with a mounted workspace inside it) still told
    the shell standing in it to ``cd "$PWD"`` to see a mount that never came."""
    ws, store = dirs
    with mounted(ws / "inner", store):
        res = cli("mount", ws, store=store, cwd=ws)
        assert res.returncode == 2 and "refused-workspace" in res.stderr, res.stderr
        assert 'cd "$PWD"' not in res.stderr, res.stderr
        assert not is_rewindfs_mount(ws)


@contextmanager
def _foreground_daemon(ws, store):
    """``rewindfs mount --foreground`` as a child process; whatever the test did, the
    child is gone and nothing is left mounted afterwards (kill and lazy unmount only
    as a last resort)."""
    proc = subprocess.Popen([PYTHON, "-m", "rewindfs.overlay.cli", "--store", str(store), "mount",
                             str(ws), "--foreground"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if is_rewindfs_mount(ws):
            subprocess.run(["fusermount3", "-uz", str(ws)])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(dirs, sig):
    ws, store = dirs
    with _foreground_daemon(ws, store) as proc:
        wait_until(lambda: is_rewindfs_mount(ws) or proc.poll() is not None, "mount")
        assert is_rewindfs_mount(ws)
        (ws / "x").write_text("1")
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        assert not is_rewindfs_mount(ws)
    assert (ws / "x").read_text() == "1"


def test_stale_mount_is_refused_then_recovered(dirs):
    ws, store = dirs
    with _foreground_daemon(ws, store) as proc:
        wait_until(lambda: is_rewindfs_mount(ws), "mount")
        proc.kill()  # a dead daemon leaves ENOTCONN behind
        proc.wait()
        with pytest.raises(OSError):
            os.listdir(ws)
        res = cli("--json", "mount", ws, store=store)
        assert res.returncode == 2 and error_code(res) == "stale-mount"
        assert "--recover" in jlines(res)[-1]["message"]
        res = cli("mount", "--recover", ws, store=store)
        assert res.returncode == 0, res.stderr
        (ws / "after").write_text("ok")
        assert cli("unmount", ws, store=store).returncode == 0
        assert (ws / "after").read_text() == "ok"


def test_external_fusermount_unmount_ends_the_daemon_cleanly(dirs):
    ws, store = dirs
    with _foreground_daemon(ws, store) as proc:
        wait_until(lambda: is_rewindfs_mount(ws), "mount")
        (ws / "f").write_text("x")
        assert subprocess.run(["fusermount3", "-u", str(ws)]).returncode == 0
        assert proc.wait(timeout=30) == 0
        assert not is_rewindfs_mount(ws)
        from rewindfs.overlay.places import control_socket_path
        assert not os.path.exists(control_socket_path(store, ws))  # socket removed
