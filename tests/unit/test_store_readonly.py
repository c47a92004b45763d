"""A store on a read-only file system (a backup disk, a read-only bind mount) can be
read: ``log``, ``show``, ``diff``, ``status``, ``fsck`` and ``gc --dry-run`` work, as
``git log`` does in a read-only clone; a command that would write is refused as such
(``store-read-only``), changing nothing.  It used to be "cannot open the index …:
Read-only file system" for every command."""

from __future__ import annotations

import subprocess

import pytest

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
