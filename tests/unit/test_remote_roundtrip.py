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
