"""Directories other people's or programs' files live in are never a workspace
(issue 14, "Mounts stay where they belong").

``check_workspace`` is what ``rewindfs mount`` runs before anything is written or
mounted (the CLI parent before it forks the daemon, the daemon before it opens the
store), so it is tested here in-process for the system's shared directories: a CLI test
of ``rewindfs mount /var/tmp`` against code that did not refuse would really mount it.
The CLI's refusals are tested on harmless directories in tests/mount/test_rel_mounts.py.
"""

from __future__ import annotations

import os
import pwd

import pytest

from rewindfs.overlay.errors import RefusedWorkspace
from rewindfs.overlay.places import check_workspace, ensure_runtime_dir
from tmpfskit import small_tmpfs


@pytest.mark.parametrize("path", ["/tmp", "/var/tmp", "/dev/shm", "/run", "/proc/self",
                                  "/sys/kernel", "/dev", "/"])
def test_shared_system_directories_are_refused(path, tmp_path):
    store = tmp_path / "store"
    with pytest.raises(RefusedWorkspace) as err:
        check_workspace(path, store)
    assert err.value.exit_code == 2
    assert "shared" in err.value.message or "system" in err.value.message \
        or "root directory" in err.value.message
    assert not store.exists()


def test_a_subdirectory_of_tmp_is_still_a_workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    assert check_workspace(ws, tmp_path / "store") == os.fsencode(os.path.realpath(ws))


def test_the_parent_of_home_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "people" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(RefusedWorkspace) as err:
        check_workspace(tmp_path / "people", tmp_path / "store")
    assert "home" in err.value.message
    with pytest.raises(RefusedWorkspace):
        check_workspace(home, tmp_path / "store")       # the home itself, as before
    (home / "proj").mkdir()
    check_workspace(home / "proj", tmp_path / "store")  # a project in it is fine


def test_the_parent_of_any_users_home_is_refused(tmp_path):
    parents = {os.path.dirname(os.path.realpath(p.pw_dir)) for p in pwd.getpwall()}
    parents = sorted(p for p in parents if p != "/" and os.path.isdir(p))
    assert parents, "this machine's passwd names no home below a directory other than /"
    for parent in parents:
        with pytest.raises(RefusedWorkspace) as err:
            check_workspace(parent, tmp_path / "store")
        if parent not in ("/tmp", "/var/tmp", "/run") and not parent.startswith("/dev"):
            assert "home" in err.value.message


def test_the_runtime_directory_and_its_parents_are_refused(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    rdir = run / f"rewindfs-{os.getuid()}"
    ensure_runtime_dir(rdir)
    for path in (rdir, run):
        with pytest.raises(RefusedWorkspace) as err:
            check_workspace(path, tmp_path / "elsewhere" / "store")
        assert "socket" in err.value.message


def test_a_directory_with_a_mount_below_is_refused(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with small_tmpfs(ws / "sub", "1m"):
        with pytest.raises(RefusedWorkspace) as err:
            check_workspace(ws, tmp_path / "store")
        assert "sub" in err.value.message and "mount" in err.value.message
        check_workspace(ws / "sub", tmp_path / "store")   # the mount point itself is fine
