"""Learning a pushed history into a directory that already has files and no history
here (``rewindfs remote learn``, unmounted): no file changes, every pushed point is
reachable byte-exactly, and ``redo`` comes back to the directory as it was.

The server is ``rclone serve s3`` on 127.0.0.1 (``remotekit``); machine A's history is
``remotekit.build_history`` (two sessions, a fork, every file type); machine B is a
second store and a directory pre-filled with one file equal to A's, one different and
one A never had.
"""

from __future__ import annotations

import os

import pytest
from remotekit import (add_origin, build_history, cli, new_dir, push_done,  # noqa: F401
                       pushed_history, s3)  # s3: the fixture
from restorekit import open_history
from store_fixtures import assert_sound
from treesnap import compare, exact

from rewindfs.store import Store
from rewindfs.store.remote import RemoteConfig, open_backend


@pytest.fixture
def pushed(s3, tmp_path, capsys):
    """A's history pushed: (expected trees by epoch, the remote workspace id)."""
    expected: dict[int, object] = {}
    _store, ws_id = pushed_history(capsys, s3, tmp_path / "a", expected)
    a_txt = (tmp_path / "a" / "ws" / "a.txt").read_bytes()
    return expected, ws_id, a_txt


def _machine_b(tmp_path, capsys, s3, a_txt: bytes):
    b = tmp_path / "b"
    (b / "dir").mkdir(parents=True)
    (b / "dir" / "a.txt").write_bytes(a_txt)                  # equal to A's
    (b / "dir" / "tail.txt").write_bytes(b"B's own version\n")  # A has another
    (b / "dir" / "b-only").mkdir()
    (b / "dir" / "b-only" / "mine.txt").write_bytes(b"only on B\n")
    add_origin(capsys, b / "store", s3)
    return b


def _turn_epoch(store_path, dir_, session, turn) -> int:
    with Store.open(store_path) as store:
        ws = store.workspace(os.path.realpath(dir_))
        return dict(store.session_points(ws, session))[turn]


def test_learn_then_rewind_to_a_pushed_turn_and_redo_back(pushed, s3, tmp_path, capsys):
    expected, ws_id, a_txt = pushed
    b = _machine_b(tmp_path, capsys, s3, a_txt)
    before = exact(b / "dir")
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "--session", "s1", "-C", b / "dir")
    assert code == 0, recs
    done = [r for r in recs if r["type"] == "learn.done"][0]
    assert done["remote_workspace"] == ws_id and done["absent"] == 2   # b-only, its file
    assert compare(before, exact(b / "dir")) == []                    # nothing changed
    for turn in (1, 2, 3):
        code, recs = cli(capsys, "--store", b / "store", "rewind", "-C", b / "dir", f"t{turn}",
                         "--session", "s1")
        assert code == 0, recs
        target = _turn_epoch(b / "store", b / "dir", "s1", turn) - done["offset"]
        assert compare(expected[target], exact(b / "dir")) == [], f"t{turn}"
        code, recs = cli(capsys, "--store", b / "store", "redo", "-C", b / "dir",
                         "--session", "s1")
        assert code == 0, recs
        assert compare(before, exact(b / "dir")) == [], f"redo after t{turn}"
    # the fork s2 of s1 came along: its own turn 3
    code, recs = cli(capsys, "--store", b / "store", "rewind", "-C", b / "dir", "t3",
                     "--session", "s2")
    assert code == 0, recs
    target = _turn_epoch(b / "store", b / "dir", "s2", 3) - done["offset"]
    assert compare(expected[target], exact(b / "dir")) == []
    with Store.open(b / "store") as store:
        assert_sound(store)


def test_learning_twice_is_refused_and_changes_nothing(pushed, s3, tmp_path, capsys):
    _expected, _ws_id, a_txt = pushed
    b = _machine_b(tmp_path, capsys, s3, a_txt)
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "-C", b / "dir")
    assert code == 0, recs
    with Store.open(b / "store") as store:
        epochs = store.epochs(store.workspace(os.path.realpath(b / "dir")))
    before = exact(b / "dir")
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "-C", b / "dir")
    assert code == 3
    assert [r["code"] for r in recs if r["type"] == "error"] == ["learn-target-has-history"]
    with Store.open(b / "store") as store:
        assert store.epochs(store.workspace(os.path.realpath(b / "dir"))) == epochs
    assert compare(before, exact(b / "dir")) == []


def test_a_workspace_with_history_here_is_refused(pushed, s3, tmp_path, capsys):
    _expected, _ws_id, a_txt = pushed
    with open_history(new_dir(tmp_path / "c")) as h:          # local turns, own store
        h.turn(1)
        h.write(b"local.txt", b"made here\n")
        h.end_turn()
        store_c = str(h.store.path)
        add_origin(capsys, store_c, s3)
        epochs = h.store.epochs(h.ws)
        before = exact(h.root)
        code, recs = cli(capsys, "--store", store_c, "remote", "learn", "origin",
                         "--session", "s1", "-C", h.root.decode())
        assert code == 3
        assert [r["code"] for r in recs if r["type"] == "error"] == ["learn-target-has-history"]
        assert h.store.epochs(h.ws) == epochs
        assert compare(before, exact(h.root)) == []


@pytest.mark.parametrize("args, code_name", [
    (("nowhere",), "unknown-remote"),
    (("origin", "--session", "no-such-session"), "unknown-remote-session"),
    (("origin", "--workspace", "0123456789ab"), "unknown-remote-workspace"),
])
def test_unknown_remote_session_or_workspace_is_refused(pushed, s3, tmp_path, capsys,
                                                         args, code_name):
    _expected, _ws_id, a_txt = pushed
    b = _machine_b(tmp_path, capsys, s3, a_txt)
    before = exact(b / "dir")
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", *args,
                     "-C", b / "dir")
    assert code == 3, recs
    assert [r["code"] for r in recs if r["type"] == "error"] == [code_name]
    with Store.open(b / "store") as store:
        assert store.epochs(store.workspace(os.path.realpath(b / "dir"))) == []
    assert compare(before, exact(b / "dir")) == []


def test_a_session_in_several_remote_workspaces_is_ambiguous_until_one_is_named(
        pushed, s3, tmp_path, capsys):
    expected, ws_id, a_txt = pushed
    with open_history(new_dir(tmp_path / "a2")) as h:        # s1 ran here too
        h.turn(1)
        h.write(b"other.txt", b"another checkout\n")
        h.end_turn()
        store_a2 = str(h.store.path)
        add_origin(capsys, store_a2, s3)
        other_id = push_done(capsys, store_a2, h.root.decode())["workspace"]
    b = _machine_b(tmp_path, capsys, s3, a_txt)
    before = exact(b / "dir")
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "--session", "s1", "-C", b / "dir")
    assert code == 3
    [error] = [r for r in recs if r["type"] == "error"]
    assert error["code"] == "ambiguous-remote-workspace"
    assert sorted(c["workspace"] for c in error["data"]["choices"]) == sorted([ws_id, other_id])
    assert ws_id in error["message"] and other_id in error["message"]
    assert compare(before, exact(b / "dir")) == []
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "--workspace", ws_id, "-C", b / "dir")
    assert code == 0, recs
    code, recs = cli(capsys, "--store", b / "store", "rewind", "-C", b / "dir", "t2",
                     "--session", "s1")
    assert code == 0, recs
    target = _turn_epoch(b / "store", b / "dir", "s1", 2)
    assert compare(expected[target], exact(b / "dir")) == []


def test_a_fork_made_here_of_a_pushed_session_learns_its_parent(pushed, s3, tmp_path, capsys):
    expected, ws_id, a_txt = pushed
    b = _machine_b(tmp_path, capsys, s3, a_txt)
    with Store.open(b / "store") as store:
        store.fork_session("s1-here", "s1", 2)        # what a harness does on B, first
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "--session", "s1-here", "-C", b / "dir")
    assert code == 0, recs
    assert [r["remote_workspace"] for r in recs if r["type"] == "learn.done"] == [ws_id]
    code, recs = cli(capsys, "--store", b / "store", "rewind", "-C", b / "dir", "t2",
                     "--session", "s1-here")
    assert code == 0, recs
    target = _turn_epoch(b / "store", b / "dir", "s1", 2)
    assert compare(expected[target], exact(b / "dir")) == []


def test_a_blob_the_remote_cannot_give_is_named_and_the_rest_is_learned(
        pushed, s3, tmp_path, capsys):
    expected, _ws_id, a_txt = pushed
    with Store.open(tmp_path / "a" / "store") as a:
        backend = open_backend(RemoteConfig("origin", *a.remote("origin")[:4]))
    [large] = [k for k, _ in backend.list("blobs/")]   # the one blob of its own: large.bin
    backend.delete(large)
    b = _machine_b(tmp_path, capsys, s3, a_txt)
    code, recs = cli(capsys, "--store", b / "store", "remote", "learn", "origin",
                     "--session", "s1", "-C", b / "dir")
    assert code == 1, recs
    [done] = [r for r in recs if r["type"] == "learn.done"]
    assert [(p["code"], p["object"], p["paths"]) for p in done["problems"]] == [
        ("remote-object-missing", large, ["large.bin"])]
    code, recs = cli(capsys, "--store", b / "store", "rewind", "-C", b / "dir", "t1",
                     "--session", "s1")
    assert code == 0, recs
    target = _turn_epoch(b / "store", b / "dir", "s1", 1)
    assert compare(expected[target], exact(b / "dir")) == []
