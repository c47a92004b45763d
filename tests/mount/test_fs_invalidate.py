"""Kernel caches are dropped for paths changed behind the kernel's back.

The filesystem tells the kernel to keep pages, attributes and entries for long
(we are the only writer while mounted); when the restore engine changes real files it
calls ``ctx.invalidate(relpath)``.  Here a rewind over the socket replaces contents the
kernel has cached (pages, attributes, a negative entry) and the mount must show the
restored tree at once.  Also: processes working in the bare directory are reported.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading

import pytest

from mountkit import PYTHON, cli, mounted

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


def test_a_redo_that_puts_a_symlink_back_over_a_directory_shows_it_while_the_mount_is_busy(
        tmp_path):
    """``npm link`` in a turn replaced ``pkg/`` by a symlink; rewind brings the directory
    back, redo the symlink — while a watcher (a dev server, an editor) keeps asking the
    mount about other names.  The redo deleted ``pkg/f`` and then put the symlink at
    ``pkg``; their invalidations reached the daemon's trio thread in one batch, after
    both landed.  ``pkg/f`` could not be looked at any more (``pkg`` is a symlink now:
    ``PathEscape``), the batch was dropped whole, and the kernel went on showing ``pkg``
    as the directory: ``readlink`` failed with EINVAL (found as a CI flake of
    ``test_rel_lesser.py::test_dir_replaced_by_symlink_is_restored_in_one_rewind``)."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "f").write_bytes(b"the package's own file")
    (ws / "linked").mkdir()
    with mounted(ws, store) as m:
        m.call("turn.begin", session="s", turn=1)
        shutil.rmtree(ws / "pkg")
        os.symlink(ws / "linked", ws / "pkg")
        m.call("turn.end", session="s")
        wrong = []
        for round_ in range(4):
            res = cli("rewind", "1", "--session", "s", "-C", ws, store=store)
            assert res.returncode == 0, res.stdout + res.stderr
            assert (ws / "pkg").is_dir() and not (ws / "pkg").is_symlink()
            with _watcher(ws):
                res = cli("redo", "--session", "s", "-C", ws, store=store)
            assert res.returncode == 0, res.stdout + res.stderr
            try:
                if os.readlink(ws / "pkg") != os.fspath(ws / "linked"):
                    wrong.append((round_, os.readlink(ws / "pkg")))
            except OSError as exc:
                wrong.append((round_, exc))
        assert wrong == []


@contextlib.contextmanager
def _watcher(ws):
    """A thread asking the mount about names that are not there (each a request the
    kernel cannot answer from its cache) until the block ends."""
    stop = threading.Event()

    def poll():
        n = 0
        while not stop.is_set():
            n += 1
            os.path.lexists(ws / f"not-there-{n}")

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
