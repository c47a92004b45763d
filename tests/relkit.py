"""Helpers for the reliability suite (``tests/*/test_rel_*.py``); holds no tests.

``Daemon`` runs ``rewindfs mount --foreground`` as *our* subprocess so a test can SIGKILL
it by pid; ``background_mount`` runs ``rewindfs mount [--recover]`` (a forked daemon
that is not our child) and ``stop_background`` unmounts it and waits for that pid to go.
Every helper that mounts has a matching cleanup that a test calls in ``finally``:
``ensure_unmounted`` detaches whatever rewindfs mount is left on *its own* workspace
(lazily only as a last resort).

``trials(n)`` is the list of seeds a parametrised trial runs: ``n`` by default, more
with ``REWINDFS_TRIALS=N`` (soak use), shifted by ``REWINDFS_SEED`` to explore others.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
import pathlib
import signal
import subprocess
import time

from mountkit import PYTHON, ROOT, cli, is_rewindfs_mount

_WAIT_S = 30.0


def trials(default: int) -> list[int]:
    n = int(os.environ.get("REWINDFS_TRIALS", default))
    base = int(os.environ.get("REWINDFS_SEED", 0))
    return [base + i for i in range(1, n + 1)]


def _wait(pred, what: str, timeout: float = _WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def socket_of(store, ws) -> bytes:
    from rewindfs.overlay.places import control_socket_path
    return control_socket_path(pathlib.Path(store), pathlib.Path(ws))


def call(store, ws, method: str, **params):
    from rewindfs.overlay.control.client import call as _call
    return _call(socket_of(store, ws), method, params, timeout=60)


class Daemon:
    """A foreground daemon we own: ``start()``, ``kill()`` (SIGKILL), ``stop()``."""

    def __init__(self, ws, store, *, env=None):
        self.ws, self.store = pathlib.Path(ws), pathlib.Path(store)
        self.env = env or {}
        self.proc = None
        self.log = None

    def start(self) -> "Daemon":
        self.ws.mkdir(parents=True, exist_ok=True)
        self.log = open(self.store.parent / f".rel-{self.ws.name}-{os.getpid()}.log", "a+")
        cmd = [PYTHON, "-m", "rewindfs.overlay.cli", "--store", os.fspath(self.store), "mount",
               os.fspath(self.ws), "--foreground"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=str(ROOT), **self.env))
        _wait(lambda: is_rewindfs_mount(self.ws) or self.proc.poll() is not None,
              "the daemon to mount")
        if self.proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.tail()}")
        return self

    def call(self, method: str, **params):
        return call(self.store, self.ws, method, **params)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self) -> int:
        """Unmount cleanly and return the daemon's exit status."""
        if self.proc.poll() is None and is_rewindfs_mount(self.ws):
            cli("unmount", self.ws, store=self.store, timeout=60)
        try:
            return self.proc.wait(timeout=_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def tail(self) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def close(self) -> None:
        """Last-resort cleanup (``finally``): kill our daemon if alive, detach its mount."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        ensure_unmounted(self.ws)
        if self.log is not None:
            self.log.close()


def background_mount(ws, store, *, recover: bool = False) -> int:
    """``rewindfs mount [--recover] WS``; returns the daemon's pid (from ``status``)."""
    args = ["mount", ws] + (["--recover"] if recover else [])
    res = cli(*args, store=store, timeout=60)
    assert res.returncode == 0, res.stderr + res.stdout
    assert is_rewindfs_mount(ws)
    return call(store, ws, "status")["pid"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stop_background(ws, store, pid: int) -> None:
    res = cli("unmount", ws, store=store, timeout=60)
    assert res.returncode == 0, res.stderr
    _wait(lambda: not _alive(pid), f"daemon {pid} to exit")


def ensure_unmounted(ws) -> None:
    """Detach a rewindfs mount left on *ws* (ours); lazily if a plain unmount fails."""
    if is_rewindfs_mount(ws):
        subprocess.run(["fusermount3", "-u", os.fspath(ws)], capture_output=True)
    if is_rewindfs_mount(ws):
        subprocess.run(["fusermount3", "-uz", os.fspath(ws)], capture_output=True)


def kill_background(pid: int | None) -> None:
    """Last resort for a background daemon this test started (its pid from status)."""
    if pid is not None and _alive(pid):
        os.kill(pid, signal.SIGKILL)


@contextmanager
def crashing_daemon(daemon, ws):
    """The block's foreground ``Daemon`` (which it may kill); afterwards it is closed
    and nothing is left mounted on *ws*."""
    try:
        yield daemon
    finally:
        daemon.close()
        ensure_unmounted(ws)


@contextmanager
def background(ws, store, *, recover: bool = False):
    """A background ``rewindfs mount [--recover]`` for the block (yields its pid);
    unmounted cleanly after it, killed only if the block failed."""
    pid = background_mount(ws, store, recover=recover)
    try:
        yield pid
    except BaseException:
        kill_background(pid)
        raise
    stop_background(ws, store, pid)
