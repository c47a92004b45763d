"""A user who is not root mounts, marks turns, rewinds, redoes and unmounts (issue 17).

As a user the kernel-direct session cannot call ``mount(2)``: it asks ``fusermount3``
(set-uid root) to mount and pass the ``/dev/fuse`` fd back over a socket, as libfuse
does.  Until now only root's path was exercised by the suite.  Everything here runs as
user ``nobody`` through the real CLI, on both session layers; files are written and read
as ``nobody`` too (without ``allow_other`` root cannot look inside a user's FUSE mount,
which is the kernel's rule and also checked).

Each program is started with ``setpriv`` exec'ing the interpreter directly (not through
``env`` or a shell): this machine's Python lives under a directory only root can search,
and only the direct exec reaches it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from mountkit import ROOT, is_rewindfs_mount

NOBODY = 65534

_FILE_OPS = r"""
import os, sys, json
ws, what = sys.argv[1], sys.argv[2]
def tree():
    out = {}
    for dirpath, dirs, files in os.walk(ws):
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, ws)
            if os.path.islink(p):
                out[rel] = ["link", os.readlink(p)]
            elif os.path.isdir(p):
                out[rel] = ["dir", st.st_mode & 0o7777]
            else:
                out[rel] = ["file", st.st_mode & 0o7777, open(p, "rb").read().hex()]
    return out
if what == "write":
    with open(os.path.join(ws, "a"), "w") as f: f.write("changed\n")
    with open(os.path.join(ws, "b"), "w") as f: f.write("new\n")
    os.mkdir(os.path.join(ws, "d"))
    os.symlink("a", os.path.join(ws, "d", "l"))
    with open(os.path.join(ws, "big"), "wb") as f: f.write(os.urandom(3 << 20))
    os.chmod(os.path.join(ws, "b"), 0o600)
print(json.dumps(tree()))
"""


@pytest.fixture
def user_place():
    """A base directory nobody can reach, with ``ws``, ``store`` and ``run`` owned by
    nobody; whatever stays mounted is taken off at the end (by root, lazily)."""
    base = tempfile.mkdtemp(prefix="rewindfs-user-", dir=os.environ.get("TMPDIR"))
    os.chmod(base, 0o755)
    for name in ("ws", "store", "run"):
        os.mkdir(os.path.join(base, name), 0o700)
        os.chown(os.path.join(base, name), NOBODY, NOBODY)
    a = os.path.join(base, "ws", "a")
    with open(a, "w") as f:
        f.write("before\n")
    os.chown(a, NOBODY, NOBODY)
    try:
        yield base
    finally:
        ws = os.path.join(base, "ws")
        if is_rewindfs_mount(ws):
            subprocess.run(["umount", "-l", ws], capture_output=True)
        shutil.rmtree(base)


def _as_nobody(base, *args, timeout=120, env=None):
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           sys.executable, *args]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": "/nonexistent",
           "XDG_RUNTIME_DIR": os.path.join(base, "run"), "LANG": "C.UTF-8",
           "REWINDFS_HOME": os.path.join(base, "store"), **(env or {})}
    return subprocess.run(cmd, cwd="/", env=env, capture_output=True, text=True,
                          timeout=timeout)


def _cli(base, *args, env=None):
    res = _as_nobody(base, "-m", "rewindfs.overlay.cli", *args, env=env)
    assert res.returncode == 0, (args, res.stdout, res.stderr)
    return res.stdout


def _files(base, what="read"):
    res = _as_nobody(base, "-c", _FILE_OPS, os.path.join(base, "ws"), what)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _mount_options(ws) -> str:
    real = os.path.realpath(ws).encode()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            left, _, right = line.partition(b" - ")
            if left.split()[4] == real:
                return right.decode()
    return ""


@pytest.mark.parametrize("session, passthrough", [("kernel", "0"), ("libfuse", "0"),
                                                  ("kernel", "1")])
def test_a_user_mounts_rewinds_redoes_and_unmounts(user_place, session, passthrough):
    """``REWINDFS_PASSTHROUGH=1`` asks for kernel passthrough, which needs CAP_SYS_ADMIN:
    a user's mount keeps the writeback cache instead of failing."""
    base, ws = user_place, os.path.join(user_place, "ws")
    _cli(base, "mount", "--session", session, ws, env={"REWINDFS_PASSTHROUGH": passthrough})
    try:
        assert is_rewindfs_mount(ws)
        assert "user_id=65534" in _mount_options(ws)
        with pytest.raises(PermissionError):      # no allow_other: root stays out
            os.listdir(ws)
        before = _files(base)
        assert before == {"a": ["file", 0o644, b"before\n".hex()]}
        _cli(base, "turn", "begin", "-C", ws, "--session", "s1", "--turn", "1",
             "--label", "one")
        after = _files(base, "write")
        _cli(base, "turn", "end", "-C", ws)
        status = json.loads(_cli(base, "status", "-C", ws, "--json").splitlines()[-1])
        assert status["fs"]["session"] == session
        assert status["fs"]["passthrough"] is False    # needs CAP_SYS_ADMIN
        assert status["fs"]["writeback"] is True

        _cli(base, "rewind", "-C", ws, "1")
        assert _files(base) == before
        _cli(base, "redo", "-C", ws)
        assert _files(base) == after
    finally:
        res = _as_nobody(base, "-m", "rewindfs.overlay.cli", "unmount", ws)
    assert res.returncode == 0, res.stderr
    assert not is_rewindfs_mount(ws)
    # underneath, the real files are the redone tree, owned by the user
    st = os.lstat(os.path.join(ws, "b"))
    assert (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o600)
