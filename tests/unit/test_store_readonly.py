"""A store on a read-only file system (a backup disk, a read-only bind mount) can be
read: ``log``, ``show``, ``diff``, ``status``, ``fsck`` and ``gc --dry-run`` work, as
``git log`` does in a read-only clone; a command that would write is refused as such
(``store-read-only``), changing nothing.  It used to be "cannot open the index …:
Read-only file system" for every command."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from mountkit import ROOT
from tmpfskit import small_tmpfs
from test_rewind_cli import Env
from treesnap import compare, snapshot


@pytest.fixture
def ro_env(tmp_path, monkeypatch):
    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        e = Env(tmp_path)
        e.store_path = disk / "store"
        e.history()
        monkeypatch.chdir(e.root)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        yield e


@pytest.mark.parametrize("argv, shows", [
    (["log"], "e1"),
    (["log", "--tree"], "s1 t2"),
    (["show", "t2", "a.txt"], "one\ntwo\n"),
    (["diff", "t2"], "+three"),
    (["status"], "not mounted"),
    (["fsck"], "store is sound"),
    (["gc", "--dry-run", "--keep-epochs", "1"], "would drop"),
])
def test_a_read_only_store_can_be_read(ro_env, capfd, argv, shows):
    code, out, err = ro_env.run(*argv, capfd=capfd)
    assert code == 0, err
    assert shows in out, out


@pytest.mark.parametrize("argv", [["rewind", "t1"], ["gc", "--keep-epochs", "1"]])
def test_a_write_to_a_read_only_store_is_refused_and_changes_nothing(ro_env, capfd, argv):
    code, lines, _ = ro_env.json(*argv, capfd=capfd)
    assert code == 2 and lines[-1]["code"] == "store-read-only", lines
    assert len(lines) == 1, lines      # refused first: no plan shown for a rewind not made
    assert "read-only" in lines[-1]["message"]
    assert compare(ro_env.snap_end, snapshot(ro_env.root)) == []


NOBODY = 65534


def test_another_users_store_is_refused_clearly_and_left_as_it_is(tmp_path):
    """A store its owner made readable to others (a shared backup, a colleague's
    history): LMDB's readers register in ``index/lock.mdb``, which the reader cannot
    write.  It used to be "cannot open the index …: Permission denied" for every
    command; now it says whose store it is and what to do, and writes nothing."""
    import json
    import os
    import shutil
    import sys
    import tempfile
    base = tempfile.mkdtemp(prefix="rewindfs-foreign-", dir=os.environ.get("TMPDIR"))
    try:
        os.chmod(base, 0o755)
        e = Env(pathlib.Path(base))
        e.history()
        for dirpath, dirs, files in os.walk(base):
            for name in dirs + files:
                p = os.path.join(dirpath, name)
                os.chmod(p, os.stat(p).st_mode | (0o005 if name in dirs else 0o004))
        lock = e.store_path / "index" / "lock.mdb"
        before = {p: (p.stat().st_mtime_ns, p.read_bytes())
                  for p in (lock, e.store_path / "index" / "data.mdb")}
        for argv in (["fsck"], ["log", "-C", str(e.root)]):
            res = subprocess.run(
                ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                 sys.executable, "-m", "rewindfs.overlay.cli", "--json",
                 "--store", str(e.store_path), *argv],
                cwd="/", capture_output=True, text=True, timeout=60,
                env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT),
                     "HOME": "/nonexistent", "LANG": "C.UTF-8"})
            assert res.returncode == 2, (argv, res.stdout, res.stderr)
            record = json.loads(res.stdout.splitlines()[-1])
            assert record["code"] == "store-foreign", record
            assert "uid 0" in record["message"] and "lock.mdb" in record["message"], record
        assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in before} == before
    finally:
        shutil.rmtree(base)
