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

import json
import os

from remotekit import s3  # noqa: F401  (the fixture)
from restorekit import open_history
from store_fixtures import assert_sound
from treesnap import compare, exact

from rewindfs.overlay.cli import main
from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind
from rewindfs.store import Store


def cli(capsys, *argv) -> tuple[int, list[dict]]:
    """Run ``rewindfs --json ARGV`` in this process: (exit code, its JSON records)."""
    capsys.readouterr()
    code = main(["--json", *map(str, argv)])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


def build_history(h, expected: dict) -> None:
    """A history over ``h`` with the tree recorded at the start of every epoch."""
    def mark(eid):
        expected[eid] = exact(h.root)

    mark(h.store.current_epoch(h.ws).id)
    mark(h.turn(1))
    h.write(b"a.txt", b"one\n")
    h.mkdir(b"src")
    h.write(b"src/main.py", b"print('v1')\n" * 50)
    h.write(b"blob.bin", os.urandom(300_000))
    h.chmod(b"src/main.py", 0o755)
    mark(h.end_turn())
    h.write(b"notes.txt", b"a person's edit between turns\n")          # idle edit
    mark(h.turn(2))
    h.write(b"a.txt", b"two\n")
    h.symlink(b"src/main.py", b"link")
    h.link(b"a.txt", b"a-hard")
    h.setxattr(b"src/main.py", b"user.rewindfs-test", b"value")
    h.touch(b"pipe")
    os.mkfifo(h.p(b"pipe"), 0o640)
    h.touch(b"null")
    os.mknod(h.p(b"null"), 0o600 | 0o020000, os.makedev(1, 3))
    h.write(b"large.bin", os.urandom(1_500_000))                         # own object
    mark(h.end_turn())
    mark(h.turn(3))
    h.remove(b"src")
    h.write(b"a.txt", b"three\n", also=[b"a-hard"])
    h.rename(b"notes.txt", b"notes-moved.txt")
    mark(h.end_turn())
    # an offline rewind to turn 2, as `rewindfs rewind t2` does on an unmounted workspace
    before = exact(h.root)
    plan = plan_rewind(h.fd, h.store, h.ws, "t2")
    res = apply_plan(h.fd, h.store, h.ws, plan, session=None)
    assert res.exit_code == 0, res.failed
    expected[res.epoch] = before
    expected[h.store.current_epoch(h.ws).id] = exact(h.root)
    # a fork of s1 at turn 2, with a turn of its own
    h.store.fork_session("s2", "s1", 2)
    mark(h.turn(3, session="s2"))
    h.write(b"a.txt", b"forked\n")
    h.write(b"only-in-s2", b"s2\n")
    mark(h.end_turn())
    h.write(b"tail.txt", b"after the last turn\n")                      # open idle epoch


def test_every_point_restores_byte_exact_on_a_fresh_store(s3, tmp_path, capsys):
    expected: dict[int, object] = {}
    with open_history(_dir(tmp_path / "a")) as h:
        build_history(h, expected)
        head = exact(h.root)
        store_a = str(h.store.path)
        code, _ = cli(capsys, "--store", store_a, "remote", "add", "origin", s3.url(),
                      "--endpoint", s3.endpoint)
        assert code == 0
        code, recs = cli(capsys, "--store", store_a, "push", "-C", h.root.decode())
        assert code == 0, recs
        done = [r for r in recs if r["type"] == "push.done"][0]
        assert done["objects"] > 0 and done["bytes"] > 0 and done["head"] is True
        ws_id = done["workspace"]
        # idempotent: nothing new, nothing written
        code, recs = cli(capsys, "--store", store_a, "push", "-C", h.root.decode())
        again = [r for r in recs if r["type"] == "push.done"][0]
        assert code == 0 and again["objects"] == 0, again

    # remote log: every epoch, without downloading a blob
    b = tmp_path / "b"
    b.mkdir()
    code, _ = cli(capsys, "--store", b / "store", "remote", "add", "origin", s3.url(),
                  "--endpoint", s3.endpoint)
    assert code == 0
    code, recs = cli(capsys, "--store", b / "store", "remote", "log", "origin")
    assert code == 0
    points = [r["epoch"] for r in recs if r["type"] == "remote.point"]
    assert set(expected) <= set(points) and max(points) == max(expected)

    for eid, tree in sorted(expected.items()):
        fresh = tmp_path / f"m{eid}"
        fresh.mkdir()
        cli(capsys, "--store", fresh / "store", "remote", "add", "origin", s3.url(),
            "--endpoint", s3.endpoint)
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
    with open_history(_dir(tmp_path / "a")) as h:
        build_history(h, expected)
        store_a = str(h.store.path)
        cli(capsys, "--store", store_a, "remote", "add", "origin", s3.url(),
            "--endpoint", s3.endpoint)
        code, recs = cli(capsys, "--store", store_a, "push", "-C", h.root.decode())
        ws_id = [r for r in recs if r["type"] == "push.done"][0]["workspace"]
    m = tmp_path / "m"
    m.mkdir()
    cli(capsys, "--store", m / "store", "remote", "add", "origin", s3.url(),
        "--endpoint", s3.endpoint)
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


def _dir(path):
    path.mkdir()
    return path
