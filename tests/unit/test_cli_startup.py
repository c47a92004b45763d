"""The CLI in a person's hands while it starts: a Ctrl-C that comes while ``rewindfs``
is still loading exits 130 quietly, as git does — never a page of Python traceback.

Provoked from outside, through the installed ``rewindfs`` script: the test watches the
process's memory map and sends SIGINT the moment LMDB's extension is loaded — the store,
which every command but ``--version`` and ``--help`` needs, is loaded then, and what is
left to load and run takes longer than the signal takes to arrive.  (A SIGINT before the
interpreter has run any of our code is Python's own business; this one is not.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rewindfs.store import Store

REWINDFS = Path(sys.executable).with_name("rewindfs")
_LMDB = "lmdb/cpython"


def _loaded(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return marker in maps.read()
    except OSError:
        return False


def _interrupt_once_loaded(args, marker=_LMDB, timeout=60.0):
    """Start ``rewindfs ARGS``, send SIGINT once *marker* is mapped; (rc, stderr, seen)."""
    proc = subprocess.Popen([str(REWINDFS), *map(os.fspath, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = False
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            if _loaded(proc.pid, marker):
                seen = True
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.0005)
        _out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err, seen


@pytest.mark.parametrize("args", [["log"], ["status", "-C", "."]], ids=["log", "status"])
def test_ctrl_c_while_the_cli_loads_exits_130_without_a_traceback(tmp_path, args):
    store = tmp_path / "store"
    Store.open(store).close()
    rc, err, seen = _interrupt_once_loaded(["--store", store, *args])
    assert seen, "the store's extension was never loaded: the test provoked nothing"
    assert "Traceback" not in err, err
    assert rc == 130, (rc, err)


def _modules_loaded(args, tmp_path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``rewindfs ARGS`` to the end with Python's import log on; the modules it
    loaded."""
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    res = subprocess.run([str(REWINDFS), *map(os.fspath, args)], capture_output=True,
                         text=True, env=env, timeout=120, cwd=tmp_path)
    names = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()
             if line.startswith("import time:")}
    return res, names


def test_a_turn_mark_loads_neither_the_store_nor_trio(tmp_path):
    """``turn begin``/``end`` only talk to the daemon: scripts call them around every
    turn, and loading LMDB, trio and the filesystem code cost them over half a second
    per call on this machine (docs/benchmarks.md, "The CLI's start")."""
    store = tmp_path / "store"
    Store.open(store).close()
    res, names = _modules_loaded(["--store", store, "turn", "begin", "--session", "s",
                                  "--turn", "1", "-C", tmp_path],
                                 tmp_path)
    assert res.returncode == 2 and "not-mounted" in res.stderr, res.stderr[-2000:]
    assert "rewindfs.overlay.cli.mount" in names         # the import log works
    heavy = {"lmdb", "trio", "pyfuse3", "boto3", "rewindfs.store._store",
             "rewindfs.overlay.daemon"}
    assert not heavy & names, sorted(heavy & names)
