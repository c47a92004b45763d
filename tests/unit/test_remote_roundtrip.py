"""Push a workspace's history to a real S3 server and restore every point elsewhere.

The server is ``rclone serve s3`` on 127.0.0.1 (``remotekit``).  A history is built with
the real capture (``restorekit.History``: turns of two sessions, a fork, edits between
turns, an offline rewind, every file type, hard links, xattrs), the tree is recorded at
the start of every epoch, the workspace is pushed with the CLI, and each point is
restored by ``rewindfs restore`` into a *fresh* store and directory, then compared
byte for byte with what it was (``treesnap.exact``: content, modes, owners, mtimes,
symlinks, xattrs, device numbers, link structure).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from remotekit import (add_origin, build_history, cli, new_dir, push_done,  # noqa: F401
                       pushed_history, s3)  # s3: the fixture
from restorekit import open_history
from store_fixtures import assert_sound
from treesnap import compare, exact

from rewindfs.store import Store


def test_every_point_restores_byte_exact_on_a_fresh_store(s3, tmp_path, capsys):
    expected: dict[int, object] = {}
    with open_history(new_dir(tmp_path / "a")) as h:
        build_history(h, expected)
        head = exact(h.root)
        store_a = str(h.store.path)
        add_origin(capsys, store_a, s3)
        code, recs = cli(capsys, "--store", store_a, "push", "-C", h.root.decode())
        assert code == 0, recs
        done = [r for r in recs if r["type"] == "push.done"][0]
        assert done["objects"] > 0 and done["bytes"] > 0 and done["head"] is True
        steps = [r for r in recs if r["type"] == "push.progress"]
        assert [s["objects"] for s in steps] == list(range(1, done["objects"] + 1))
        assert steps[-1]["bytes"] == done["bytes"]
        ws_id = done["workspace"]
        # idempotent: nothing new, nothing written
        code, recs = cli(capsys, "--store", store_a, "push", "-C", h.root.decode())
        again = [r for r in recs if r["type"] == "push.done"][0]
        assert code == 0 and again["objects"] == 0, again

    # remote log: every epoch, without downloading a blob
    b = tmp_path / "b"
    b.mkdir()
    add_origin(capsys, b / "store", s3)
    code, recs = cli(capsys, "--store", b / "store", "remote", "log", "origin")
    assert code == 0
    points = [r["epoch"] for r in recs if r["type"] == "remote.point"]
    assert set(expected) <= set(points) and max(points) == max(expected)

    for eid, tree in sorted(expected.items()):
        fresh = tmp_path / f"m{eid}"
        fresh.mkdir()
        add_origin(capsys, fresh / "store", s3)
        code, recs = cli(capsys, "--store", fresh / "store", "restore", "--from", "origin",
                         "--workspace", ws_id, "--point", f"e{eid}", fresh / "dir")
        assert code == 0, recs
        assert compare(tree, exact(fresh / "dir")) == [], f"point e{eid}"
        with Store.open(fresh / "store") as store:
            assert_sound(store)

    # the pushed tree itself is a point of the restored history (the head epoch)
    one = tmp_path / f"m{min(expected)}"
    head_epoch = _restored(capsys, one)["head_epoch"]
    code, recs = cli(capsys, "--store", one / "store", "rewind", "-C", one / "dir",
                     f"e{head_epoch}")
    assert code == 0, recs
    assert compare(head, exact(one / "dir")) == []


def test_restored_history_rewinds_and_redoes(s3, tmp_path, capsys):
    expected: dict[int, object] = {}
    _store, ws_id = pushed_history(capsys, s3, tmp_path / "a", expected)
    m = tmp_path / "m"
    m.mkdir()
    add_origin(capsys, m / "store", s3)
    code, recs = cli(capsys, "--store", m / "store", "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", "t2", "--session", "s1", m / "dir")
    assert code == 0, recs
    t2 = [r for r in recs if r["type"] == "restore.done"][0]["target"]
    assert compare(expected[t2], exact(m / "dir")) == []
    # turn names resolve in the restored history, rewind and redo work on
    code, recs = cli(capsys, "--store", m / "store", "rewind", "-C", m / "dir", "t1",
                     "--session", "s1")
    assert code == 0, recs
    t1 = [eid for eid in expected if eid < t2][-2]       # the start of turn 1
    assert compare(expected[t1], exact(m / "dir")) == []
    code, recs = cli(capsys, "--store", m / "store", "redo", "-C", m / "dir", "--session", "s1")
    assert code == 0, recs
    assert compare(expected[t2], exact(m / "dir")) == []
    code, recs = cli(capsys, "--store", m / "store", "log", "-C", m / "dir")
    assert code == 0 and any(r.get("session") == "s2" for r in recs)


def _restored(capsys, fresh):
    """The restore.done record of the restore that made ``fresh`` (re-read from log)."""
    code, recs = cli(capsys, "--store", fresh / "store", "log", "-C", fresh / "dir")
    assert code == 0
    heads = [r for r in recs if (r.get("label") or "").startswith("pushed tree")]
    return {"head_epoch": heads[-1]["epoch"]}


def test_remote_log_cuts_a_long_label_to_the_terminal_as_log_does(tmp_path, capsys, s3,
                                                                   monkeypatch):
    """``rewindfs log`` cuts a label to the terminal's width; ``remote log`` printed a
    100 kB label on one line.  --json keeps it whole."""
    from rewindfs.overlay.cli import main
    long_label = "make the parser handle every corner case " * 2500
    with open_history(new_dir(tmp_path / "a")) as h:
        h.store.begin_turn(h.ws, "s1", 1, long_label)
        h.write(b"a.txt", b"one\n")
        h.end_turn()
        store = str(h.store.path)
        add_origin(capsys, store, s3)
        code, recs = cli(capsys, "--store", store, "push", "-C", h.root.decode())
        assert code == 0, recs
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    assert main(["--store", store, "remote", "log", "origin"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert any("turn 1 of s1" in r and r.endswith("…") for r in rows), rows
    points = [r for r in rows if r.startswith("  e")]
    assert points and all(len(r) <= 80 for r in points), [len(r) for r in points]
    code, recs = cli(capsys, "--store", store, "remote", "log", "origin")
    assert [r["label"] for r in recs if r["type"] == "remote.point" and r["turn"] == 1] == [
        long_label]


def _restore_in_a_terminal(s3, store, wid, dest, env=None):
    from ptykit import Terminal
    rewindfs = str(Path(sys.executable).with_name("rewindfs"))
    return Terminal([rewindfs, "--store", str(store), "restore", "--from", "origin",
                     "--workspace", wid, "--point", "e3", str(dest)], cwd=dest.parent,
                    env={**s3.env, **(env or {})})


def test_ctrl_c_on_a_restore_finishes_it_or_leaves_nothing(s3, tmp_path, capsys):
    """Ctrl-C on ``rewindfs restore`` exited 130 and said nothing.  Pressed while the
    restore landed, it left a half-made tree and a pending rewind, and running the same
    command again was refused ("this store already has history for it"): stuck.  Now,
    as an offline rewind does, a restore that has begun to land finishes first and says
    so; one stopped before (here: the server hangs) says nothing was restored, and the
    same command works again."""
    import signal
    import time
    with open_history(tmp_path) as h:
        h.turn(1)
        for i in range(200):
            h.write(b"f%03d" % i, b"%d\n" % i)
        h.end_turn()
    store = tmp_path / "store"
    add_origin(capsys, store, s3)
    wid = push_done(capsys, store, tmp_path / "ws")["workspace"]
    want = exact(tmp_path / "ws")
    fresh = tmp_path / "fresh"
    add_origin(capsys, fresh, s3)

    # 1. the server hangs (stopped): Ctrl-C before anything landed
    dest = tmp_path / "hung"
    os.kill(s3.proc.pid, signal.SIGSTOP)
    try:
        term = _restore_in_a_terminal(s3, fresh, wid, dest)
        with term:
            time.sleep(3)             # it waits on the server, whatever it asked first
            term.ctrl_c()
            status = term.wait()
    finally:
        os.kill(s3.proc.pid, signal.SIGCONT)
    assert status == 130, term.text()[-2000:]
    assert "nothing was restored" in term.last_line() and "again" in term.last_line(), \
        term.lines()[-5:]
    assert not dest.exists()            # made by the restore, removed again
    code, recs = cli(capsys, "--store", fresh, "restore", "--from", "origin",
                     "--workspace", wid, "--point", "e3", dest)
    assert code == 0, recs
    assert exact(dest) == want

    # 2. Ctrl-C while it lands (paused after its 3rd change): it finishes first
    dest = tmp_path / "landing"
    pause = tmp_path / "pause"
    other = tmp_path / "other"
    add_origin(capsys, other, s3)
    term = _restore_in_a_terminal(s3, other, wid, dest, env={
        "REWINDFS_PAUSE_AFTER": "3", "REWINDFS_PAUSE_FILE": str(pause)})
    with term:
        status = term.ctrl_c_in_pause(pause, "finishing the restore first")
    assert status == 130, term.text()[-2000:]
    assert "was finished first" in term.last_line(), term.lines()[-5:]
    assert exact(dest) == want
    with Store.open(other, create=False) as s:
        ws = s.workspace(os.path.realpath(os.fsencode(dest)))
        assert s.get_intent(ws) is None


def test_a_restore_onto_a_full_disk_says_the_disk_is_full(s3, tmp_path, capsys):
    """``rewindfs restore`` with the store on a full disk said "Remote origin could not be
    reached or refused the request: get blobs/…: [Errno 28] No space left on device; run
    the command again to resume" (``remote-unreachable``): the remote was fine, and the
    same command fails the same way.  It is ``store-full``, naming what to do, and the
    directory it made is gone again."""
    from tmpfskit import small_tmpfs
    with open_history(tmp_path) as h:
        h.turn(1)
        h.write(b"big", os.urandom(6 << 20))
        h.end_turn()
    store = tmp_path / "store"
    add_origin(capsys, store, s3)
    wid = push_done(capsys, store, tmp_path / "ws")["workspace"]
    with small_tmpfs(tmp_path / "full", "3m") as full:
        add_origin(capsys, full / "store", s3)
        code, recs = cli(capsys, "--store", full / "store", "restore", "--from", "origin",
                         "--workspace", wid, "--point", "e3", full / "dest")
        (err,) = [r for r in recs if r["type"] == "error"]
        assert code == 2 and err["code"] == "store-full", recs
        assert "run the command again" not in err["message"], err
        assert not (full / "dest").exists()
