"""A squatted runtime directory, a planted log symlink, a socket of another uid.

Issue 12, item 8: as root with ``XDG_RUNTIME_DIR`` unset the runtime directory is
``/tmp/rewindfs-0``, which any local user can create first.  These tests never touch the
real ``/tmp/rewindfs-<uid>``: they point ``XDG_RUNTIME_DIR`` at a private base and squat
``<base>/rewindfs-<uid>`` there (the same code path), and check the ``/tmp`` fallback
through the path function.  What must hold:

- a squatted directory (mode 0777, owned by uid 65534, or a symlink to a good
  directory) is refused by ``rewindfs mount`` with ``unsafe-runtime-dir`` and exit 2
  before anything is written (no log, no socket, no store, nothing mounted);
- a symlink planted at the daemon's log path is never followed (its target unchanged);
- a socket owned by another uid, or answered by a process of another uid, is refused
  by every client (``overlay.control.wire.call``, the CLI, ``plugin.Client``,
  ``plugin.TrioClient``; the JS client in plugin/dsh/test/client.test.js) before a
  single byte is sent.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import threading

import pytest

from mountkit import cli, is_rewindfs_mount
from relkit import ensure_unmounted

NOBODY = 65534


@pytest.fixture
def base():
    """A private base directory that uid 65534 may traverse (tmp_path may not be)."""
    top = tempfile.mkdtemp(prefix="rwrt", dir="/tmp")
    os.chmod(top, 0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _env(run: str) -> dict:
    return {"XDG_RUNTIME_DIR": run}


def _sock(store, ws, run) -> bytes:
    from rewindfs.overlay.places import control_socket_path
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = run
    try:
        return control_socket_path(store, ws)
    finally:
        if old is None:
            del os.environ["XDG_RUNTIME_DIR"]
        else:
            os.environ["XDG_RUNTIME_DIR"] = old


def _squat(kind: str, rdir: str, base: str) -> None:
    if kind == "mode777":
        os.mkdir(rdir)
        os.chmod(rdir, 0o777)
    elif kind == "other-owner":
        os.mkdir(rdir, 0o700)
        os.chown(rdir, NOBODY, NOBODY)
    elif kind == "symlink":          # to a directory that would pass every other check
        good = os.path.join(base, "elsewhere")
        os.mkdir(good, 0o700)
        os.symlink(good, rdir)
    else:
        raise AssertionError(kind)


def _listing(path: str) -> list[str]:
    real = os.path.realpath(path)
    return sorted(os.listdir(real))


# -- the /tmp fallback: path logic and the check on a fake base -------------------------

def test_tmp_fallback_path_and_check(base, monkeypatch):
    from rewindfs.overlay.places import control_socket_path, ensure_runtime_dir
    from rewindfs.overlay.errors import UnsafeRuntimeDir
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    sock = control_socket_path(os.path.join(base, "store"), base)
    assert os.path.dirname(sock) == b"/tmp/rewindfs-%d" % os.getuid()
    # the same check, on a fake base standing in for /tmp
    fake = os.path.join(base, "faketmp")
    os.mkdir(fake, 0o1777)
    rdir = os.fsencode(os.path.join(fake, "rewindfs-%d" % os.getuid()))
    for kind in ("mode777", "other-owner", "symlink"):
        _squat(kind, os.fsdecode(rdir), fake)
        with pytest.raises(UnsafeRuntimeDir) as info:
            ensure_runtime_dir(rdir)
        assert info.value.exit_code == 2 and info.value.code == "unsafe-runtime-dir"
        if os.path.islink(rdir):
            os.unlink(rdir)
        else:
            os.rmdir(rdir)
    assert ensure_runtime_dir(rdir) == rdir                 # absent: created 0700
    st = os.lstat(rdir)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.getuid()
    assert ensure_runtime_dir(rdir) == rdir                 # ours: accepted again


# -- mount refuses a squatted directory before writing anything --------------------------

@pytest.mark.mount
@pytest.mark.parametrize("kind", ["mode777", "other-owner", "symlink"])
def test_mount_refuses_squatted_dir(base, kind):
    run = os.path.join(base, "run")
    os.mkdir(run, 0o755)
    rdir = os.path.join(run, "rewindfs-%d" % os.getuid())
    _squat(kind, rdir, base)
    ws, store = os.path.join(base, "ws"), os.path.join(base, "store")
    os.mkdir(ws)
    before = _listing(rdir)
    try:
        for fg in ([], ["--foreground"]):
            res = cli("mount", ws, *fg, store=store, env=_env(run), timeout=60)
            assert res.returncode == 2, (fg, res.returncode, res.stderr)
            assert "runtime directory" in res.stderr, res.stderr
            assert not is_rewindfs_mount(ws)
            assert _listing(rdir) == before                  # no log, no socket
            assert not os.path.exists(store)                 # nothing written
    finally:
        if is_rewindfs_mount(ws):
            cli("unmount", ws, store=store, env=_env(run), timeout=60)
        ensure_unmounted(ws)


@pytest.mark.mount
def test_log_symlink_is_not_followed(base):
    run = os.path.join(base, "run")
    os.mkdir(run, 0o755)
    ws, store = os.path.join(base, "ws"), os.path.join(base, "store")
    os.mkdir(ws)
    os.mkdir(os.path.join(run, "rewindfs-%d" % os.getuid()), 0o700)
    log = _sock(store, ws, run)[: -len(b".sock")] + b".log"
    target = os.path.join(base, "root-owned-target")
    with open(target, "w") as f:
        f.write("precious\n")
    os.symlink(target, log)
    try:
        res = cli("mount", ws, store=store, env=_env(run), timeout=60)
        assert res.returncode == 2, res.stderr + res.stdout
        assert "log" in res.stderr, res.stderr
        assert not is_rewindfs_mount(ws)
    finally:
        if is_rewindfs_mount(ws):
            cli("unmount", ws, store=store, env=_env(run), timeout=60)
        ensure_unmounted(ws)
    with open(target) as f:
        assert f.read() == "precious\n"
    assert os.path.islink(log)


# -- clients refuse a socket of another uid before sending a byte --------------------------

class _Listener:
    """A listening socket at *path* that records every byte it is sent."""

    def __init__(self, path: bytes):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.got = b""
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(2)
                try:
                    while data := conn.recv(65536):
                        self.got += data
                except OSError:
                    pass

    def close(self):
        self.stop = True
        self.thread.join()
        self.sock.close()


def _python_clients(path: bytes):
    """Each Python client's attempt at a ``status`` on *path*; returns the error codes."""
    import trio

    from rewindfs.overlay.control.client import call
    from rewindfs.plugin.client import Client, RewindfsClientError, TrioClient
    from rewindfs.store._errors import RewindfsError

    codes = []
    try:
        call(path, "status", {}, timeout=5)
        codes.append("answered")
    except RewindfsError as exc:
        codes.append(exc.code)
    try:
        with Client(path, timeout=5) as c:
            c.status()
        codes.append("answered")
    except RewindfsClientError as exc:
        codes.append(exc.code)

    async def trio_status():
        async with TrioClient(path, timeout=5) as c:
            await c.status()

    try:
        trio.run(trio_status)
        codes.append("answered")
    except RewindfsClientError as exc:
        codes.append(exc.code)
    return codes


def test_socket_of_other_owner_refused(base):
    path = os.fsencode(os.path.join(base, "s.sock"))
    lst = _Listener(path)
    try:
        os.chown(path, NOBODY, NOBODY)
        codes = _python_clients(path)
    finally:
        lst.close()
    assert codes == ["unsafe-socket"] * 3, codes
    assert lst.got == b""


def _nobody_listener(path: bytes):
    """Fork a process of uid 65534 listening at *path*; returns (pid, pipe of what it got)."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.close(ready_r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
            s.listen(8)
            os.write(ready_w, b"1")
            s.settimeout(30)
            got = b""
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    break
                with conn:
                    conn.settimeout(2)
                    try:
                        while data := conn.recv(65536):
                            got += data
                    except OSError:
                        pass
                if b"stop" in got:
                    break
            os.write(w, got)
        finally:
            os._exit(0)
    os.close(w)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid, r


def _stop_nobody(pid: int, r: int, path: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(b"stop")
    with os.fdopen(r, "rb") as f:
        got = f.read()
    os.waitpid(pid, 0)
    return got.replace(b"stop", b"")


def test_daemon_of_other_uid_refused(base):
    """The socket file is root's (chowned back), but the process answering is not."""
    d = os.path.join(base, "open")
    os.mkdir(d, 0o777)
    os.chmod(d, 0o777)
    path = os.fsencode(os.path.join(d, "s.sock"))
    pid, r = _nobody_listener(path)
    try:
        os.chown(path, 0, 0)
        codes = _python_clients(path)
    finally:
        got = _stop_nobody(pid, r, path)
    assert codes == ["unsafe-socket"] * 3, codes
    assert got == b""


@pytest.mark.mount
def test_cli_does_not_talk_to_a_fake_daemon(base):
    """The scenario of the issue: another user squats the runtime directory and binds a
    fake daemon where root's socket goes; root's ``turn begin --label secret`` must not
    reach it."""
    run = os.path.join(base, "run")
    os.mkdir(run, 0o755)
    rdir = os.path.join(run, "rewindfs-%d" % os.getuid())
    os.mkdir(rdir)
    os.chmod(rdir, 0o777)
    ws, store = os.path.join(base, "ws"), os.path.join(base, "store")
    os.mkdir(ws)
    path = _sock(store, ws, run)
    pid, r = _nobody_listener(path)
    try:
        res = cli("turn", "begin", "--session", "s", "--turn", "1", "--label", "secret",
                  "-C", ws, store=store, env=_env(run), timeout=60)
    finally:
        got = _stop_nobody(pid, r, path)
    assert got == b"", got
    assert res.returncode == 2, res.stderr
    assert "unsafe-socket" in res.stderr or "not owned" in res.stderr, res.stderr
