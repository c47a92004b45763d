"""Mounts stay where they belong (issue 14): refusals through the real CLI, a busy
unmount, another uid's mount.

Every refusal here is tried on a directory where a wrongful mount would be harmless (a
``tmp_path`` directory; ``/tmp`` only with a store inside it, which the code before
this issue refused as well), and each test unmounts whatever a wrongful mount left.
The system's own shared directories are tested in-process
(tests/unit/test_places_refuse.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from mountkit import cli, is_rewindfs_mount, mounted
from tmpfskit import small_tmpfs


def _cleanup(path) -> None:
    """Undo a wrongful mount of *path* (the code under test should have refused)."""
    if is_rewindfs_mount(path):
        subprocess.run(["fusermount3", "-u", os.fspath(path)], capture_output=True)
    if is_rewindfs_mount(path):
        subprocess.run(["fusermount3", "-uz", os.fspath(path)], capture_output=True)


def _mount_refused(path, store, *, env=None, reason: str) -> str:
    """Run ``rewindfs --json mount PATH``; require exit 2, a ``refused-workspace`` error
    naming *reason*, nothing mounted and no store written.  Returns the message."""
    store_existed = os.path.exists(store)
    try:
        res = cli("--json", "mount", path, store=store, env=env)
    finally:
        mounted_now = is_rewindfs_mount(path)
        _cleanup(path)
    assert not mounted_now, f"{path} was mounted: {res.stdout}{res.stderr}"
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [json.loads(l) for l in res.stdout.splitlines() if '"error"' in l]
    assert errors and errors[-1]["code"] == "refused-workspace", res.stdout + res.stderr
    assert reason in errors[-1]["message"], errors[-1]["message"]
    assert store_existed or not os.path.exists(store), "the store was written"
    return errors[-1]["message"]


def test_mount_tmp_is_refused(tmp_path):
    store = tmp_path / "store"
    # the store lies inside /tmp: even code that does not know /tmp refuses to mount it
    # (store inside the workspace), so this CLI test can never mount /tmp
    assert os.path.realpath(store).startswith("/tmp/")
    run = tmp_path / "run"
    _mount_refused("/tmp", store, env={"XDG_RUNTIME_DIR": str(run)}, reason="shared")
    assert not run.exists()          # no runtime dir, no log, no socket


def test_mount_of_a_directory_with_a_mount_below_is_refused(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep").write_text("k")
    with small_tmpfs(ws / "cache", "1m"):
        msg = _mount_refused(ws, tmp_path / "store", reason="mount")
        assert "cache" in msg


def test_mount_inside_or_above_a_mounted_workspace_is_refused(tmp_path):
    outer = tmp_path / "outer"
    with mounted(outer / "ws", tmp_path / "store") as m:
        (m.ws / "inner").mkdir()
        msg = _mount_refused(m.ws / "inner", tmp_path / "store2", reason="workspace")
        assert os.fspath(m.ws) in msg
        msg = _mount_refused(outer, tmp_path / "store3", reason="workspace")
        assert os.fspath(m.ws) in msg
        assert m.call("status")["mounted"]


def test_mount_of_the_home_parent_is_refused(tmp_path):
    home = tmp_path / "people" / "alice"
    home.mkdir(parents=True)
    _mount_refused(tmp_path / "people", tmp_path / "store", env={"HOME": str(home)},
                   reason="home")


def test_mount_of_the_socket_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / f"rewindfs-{os.getuid()}").mkdir(parents=True, mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(run)}
    _mount_refused(run, tmp_path / "store", env=env, reason="socket")
    _mount_refused(run / f"rewindfs-{os.getuid()}", tmp_path / "store", env=env,
                   reason="socket")


# -- unmount while busy ------------------------------------------------------------------

HOLD = "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(600)"


def _holders(m):
    """A ``sleep`` with its cwd inside the mount and a python holding a file open."""
    (m.ws / "d").mkdir()
    (m.ws / "f").write_text("x")
    sleeper = subprocess.Popen(["sleep", "600"], cwd=m.ws / "d")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, os.fspath(m.ws / "f")], cwd="/",
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "open\n"
    return sleeper, holder


def _stop(*procs):
    for p in procs:
        p.kill()
        p.wait()


def test_unmount_while_busy_names_the_processes_and_changes_nothing(tmp_path):
    with mounted(tmp_path / "ws", tmp_path / "store") as m:
        sleeper, holder = _holders(m)
        try:
            res = cli("unmount", m.ws, store=m.store)
            assert res.returncode == 2, res.stdout + res.stderr
            err = res.stderr
            assert f"pid {sleeper.pid}" in err and "sleep" in err, err
            assert f"pid {holder.pid}" in err, err
            assert "--lazy" in err, err
            # nothing changed: still mounted, the daemon serves, writes are captured
            assert is_rewindfs_mount(m.ws)
            assert m.proc.poll() is None
            assert m.call("status")["mounted"]
            (m.ws / "d" / "g").write_text("y")
            assert (m.ws / "d" / "g").read_text() == "y"
        finally:
            _stop(sleeper, holder)


def test_unmount_lazy_detaches_and_lists_the_processes(tmp_path):
    with mounted(tmp_path / "ws", tmp_path / "store") as m:
        sleeper, holder = _holders(m)
        try:
            res = cli("unmount", "--lazy", m.ws, store=m.store)
            assert res.returncode == 0, res.stdout + res.stderr
            out = res.stdout + res.stderr
            assert f"pid {sleeper.pid}" in out and f"pid {holder.pid}" in out, out
            assert "bare directory" in out, out
            assert not is_rewindfs_mount(m.ws)
            assert m.proc.wait(timeout=60) == 0
        finally:
            _stop(sleeper, holder)


def test_unmount_when_idle_still_just_unmounts(tmp_path):
    with mounted(tmp_path / "ws", tmp_path / "store") as m:
        res = cli("unmount", m.ws, store=m.store)
        assert res.returncode == 0, res.stderr
        assert "unmounted" in res.stdout
        assert not is_rewindfs_mount(m.ws)


def test_a_process_in_the_bare_directory_does_not_keep_the_mount_busy(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    bare = subprocess.Popen(["sleep", "600"], cwd=ws)   # entered before the mount
    try:
        with mounted(ws, tmp_path / "store") as m:
            res = cli("unmount", m.ws, store=m.store)
            assert res.returncode == 0, res.stderr
            assert f"pid {bare.pid}" not in res.stdout + res.stderr
            assert not is_rewindfs_mount(m.ws)
    finally:
        _stop(bare)


def test_run_names_what_its_command_left_running_inside(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    pidfile = tmp_path / "bg.pid"
    script = f"sleep 600 >/dev/null 2>&1 & echo $! > {pidfile}"
    res = cli("run", "--", "sh", "-c", script, store=tmp_path / "store", cwd=ws)
    pid = int(pidfile.read_text())
    try:
        assert res.returncode == 0, res.stderr
        assert f"pid {pid} (sleep 600: cwd)" in res.stderr, res.stderr
        assert not is_rewindfs_mount(ws)
    finally:
        os.kill(pid, 9)
        _cleanup(ws)


# -- another uid -------------------------------------------------------------------------

NOBODY = 65534


@pytest.fixture
def shared_dir():
    """A directory user nobody can reach (pytest's tmp_path is root's alone)."""
    base = tempfile.mkdtemp(prefix="rewindfs-foreign-")
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        _cleanup(os.path.join(base, "ws"))
        shutil.rmtree(base)


def _as_nobody(args, cwd, run_dir):
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           sys.executable, "-m", "rewindfs.overlay.cli", *[os.fspath(a) for a in args]]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "HOME": "/nonexistent", "XDG_RUNTIME_DIR": run_dir, "LANG": "C.UTF-8"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_another_uid_gets_one_message_for_status_mount_unmount(tmp_path, shared_dir):
    ws = os.path.join(shared_dir, "ws")
    run_dir = os.path.join(shared_dir, "run")     # root's, 0755: nobody cannot write it
    os.mkdir(run_dir, 0o755)
    with mounted(ws, tmp_path / "store") as m:
        os.mkdir(m.ws / "sub", 0o755)
        want = f"{ws} is served by a rewindfs daemon of uid 0; only that user or root can control it"
        runs = {
            "status -C": _as_nobody(["status", "-C", ws], "/", run_dir),
            "status (cwd)": _as_nobody(["status"], os.path.join(ws, "sub"), run_dir),
            "mount": _as_nobody(["mount", ws], "/", run_dir),
            "unmount": _as_nobody(["unmount", ws], "/", run_dir),
        }
        for name, res in runs.items():
            assert res.returncode == 2, (name, res.stdout, res.stderr)
            assert want in res.stderr, (name, res.stderr)
        # and nothing happened to root's mount
        assert is_rewindfs_mount(m.ws)
        assert m.call("status")["mounted"]


def test_a_live_mount_of_another_store_is_named_so_not_called_dead(tmp_path):
    """With another store (``--store``, ``$REWINDFS_HOME``) than the daemon's, a live
    mount was "a stale mount left by a dead daemon … run `rewindfs mount --recover`"
    (from a store that knows the workspace) or "not served by a rewindfs daemon" (from
    one that does not): both false, and the first sends the person to recover a mount
    that works.  Each command now says the mount is live and which way to look."""
    ws = tmp_path / "ws"
    with mounted(ws, tmp_path / "store") as m:
        m.call("turn.begin", session="s", turn=1, label="x")
        (ws / "f").write_text("1\n")
        m.call("turn.end", session="s")
        knows = tmp_path / "copy"                  # a store that knows the workspace
        shutil.copytree(tmp_path / "store", knows)
        empty = tmp_path / "empty"
        for store in (knows, empty):
            for args in (["status", "-C", ws], ["log", "-C", ws],
                         ["rewind", "t1", "--dry-run", "-C", ws]):
                res = cli(*args, store=store)
                assert res.returncode == 2, (store, args, res.stderr)
                assert "other-store-mount" in res.stderr, (store, args, res.stderr)
                assert "stale" not in res.stderr and "--recover" not in res.stderr
        assert is_rewindfs_mount(ws) and m.call("status")["mounted"]
        assert (ws / "f").read_text() == "1\n"


def test_a_workspace_moved_while_mounted_is_named_so_and_unmounts_cleanly(tmp_path):
    """A person renames the folder holding a mounted project (``mv code src``): the
    mount moves along, its daemon still serves it, but every command there said "served
    by a live rewindfs daemon, but not for the store …: it serves another store" — the
    same store.  Now each says the workspace moved and from where, and ``unmount``
    reaches the daemon (a clean stop, not fusermount's)."""
    before, after = tmp_path / "code", tmp_path / "src"
    store = tmp_path / "store"
    ws = before / "proj"
    pid = None
    try:
        ws.mkdir(parents=True)
        res = cli("mount", ws, store=store)
        assert res.returncode == 0, res.stderr
        pid = json.loads(cli("status", "--json", "-C", ws, store=store).stdout)["pid"]
        os.rename(before, after)
        moved = after / "proj"
        assert is_rewindfs_mount(moved)
        for args in (["status"], ["log"], ["turn", "begin", "--session", "s", "--turn", "1"]):
            res = cli("--json", *args, "-C", moved, store=store)
            assert res.returncode == 2, (args, res.stdout, res.stderr)
            record = json.loads(res.stdout.splitlines()[-1])
            assert record["code"] == "workspace-moved", (args, record)
            assert str(ws) in record["message"] and str(moved) in record["message"], record
        res = cli("--json", "unmount", moved, store=store)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout.splitlines()[-1])["how"] == "unmounted"
        assert not is_rewindfs_mount(moved)
        for _ in range(500):                  # the daemon stopped by itself
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.01)
        assert not os.path.exists(f"/proc/{pid}")
        pid = None
    finally:
        for place in (ws, after / "proj"):
            _cleanup(place)
        if pid is not None and os.path.exists(f"/proc/{pid}"):
            os.kill(pid, 9)
