"""Kernel caches are dropped for paths changed behind the kernel's back.

The filesystem tells the kernel to keep pages, attributes and entries for long
(we are the only writer while mounted); when the restore engine changes real files it
calls ``ctx.invalidate(relpath)``.  Here a rewind over the socket replaces contents the
kernel has cached (pages, attributes, a negative entry) and the mount must show the
restored tree at once.  Also: processes working in the bare directory are reported.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from mountkit import PYTHON, mounted

pytestmark = pytest.mark.mount


def test_rewind_through_the_socket_is_visible_at_once(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "f").write_text("one")
    (ws / "gone").write_text("was here")
    with mounted(ws, store) as m:
        assert (ws / "f").read_text() == "one"      # pages + attrs cached
        m.call("turn.begin", session="s", turn=1, label="change")
        (ws / "f").write_text("two, longer")
        os.unlink(ws / "gone")
        assert not (ws / "gone").exists()            # negative entry cached
        (ws / "new").write_text("n")
        os.chmod(ws / "f", 0o600)
        m.call("turn.end", session="s")
        assert (ws / "f").read_text() == "two, longer"
        res = m.call("rewind", to="t1", session="s")
        assert not res.get("failed"), res
        assert (ws / "f").read_text() == "one"
        assert (ws / "f").stat().st_size == 3
        assert oct((ws / "f").stat().st_mode & 0o777) == oct(0o644)
        assert (ws / "gone").read_text() == "was here"
        assert not (ws / "new").exists()
        assert sorted(os.listdir(ws)) == ["f", "gone"]
        # the mount keeps capturing after the rewind epoch
        (ws / "f").write_text("three")
        assert (ws / "f").read_text() == "three"


def test_status_reports_processes_in_the_bare_directory(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    # a process that entered the directory before the mount keeps the bare inode
    proc = subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read()"], cwd=ws,
                            stdin=subprocess.PIPE)
    try:
        with mounted(ws, store) as m:
            st = m.call("status")
            assert proc.pid in st["bypass_writes"]["pids"]
            inside = subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read()"],
                                      cwd=ws, stdin=subprocess.PIPE)
            try:
                assert inside.pid not in m.call("status")["bypass_writes"]["pids"]
            finally:
                inside.communicate(b"")
    finally:
        proc.communicate(b"")
