"""A push whose tree walk races with changes and a turn mark (as the daemon's background
pusher does, while FUSE requests go on) must never put a wrong point on the remote.

The walk is interrupted after some paths were captured: every file is then changed
(write-ahead: pre-image first, as the filesystem does) and a new turn begins.  The
already captured paths are stale in the head, so a point that began after the walk
began cannot be rebuilt from it: the push must leave such points to the next push
(docs/remote.md "Consistency").  Every point the remote has must restore exactly."""

from __future__ import annotations

from remotekit import cli, new_dir, s3  # noqa: F401  (s3: the fixture)
from restorekit import open_history
from treesnap import compare, exact

from rewindfs.store.remote import RemoteConfig, open_backend

from rewindfs.overlay.rewind.remote import push_tree


def _restore(capsys, s3, tmp_path, ws_id: str, point: str, tag: str):
    fresh = new_dir(tmp_path / tag)
    cli(capsys, "--store", fresh / "store", "remote", "add", "origin", s3.url(),
        "--endpoint", s3.endpoint)
    code, recs = cli(capsys, "--store", fresh / "store", "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", point, fresh / "dir")
    return code, recs, fresh / "dir"


def test_a_turn_begun_during_the_walk_is_never_pushed_stale(s3, tmp_path, capsys):
    with open_history(new_dir(tmp_path / "a")) as h:
        code, _ = cli(capsys, "--store", h.store.path, "remote", "add", "origin", s3.url(),
                      "--endpoint", s3.endpoint)
        assert code == 0
        h.turn(1)
        h.write(b"a.txt", b"a1\n")
        h.write(b"z.txt", b"z1\n")
        h.end_turn()
        calls = []
        expected = {}

        def meanwhile():          # before each captured path: the 3rd is the last one
            calls.append(1)
            if len(calls) == 3:
                h.write(b"a.txt", b"a2\n")
                h.write(b"z.txt", b"z2\n")
                h.turn(2)
                expected["t2"] = exact(h.root)

        config = RemoteConfig("origin", s3.url(), s3.endpoint, None, False)
        report = push_tree(h.store, h.ws, h.fd, open_backend(config), config,
                           check=meanwhile)
        assert expected, "the walk never reached its third path"
        code, recs, d = _restore(capsys, s3, tmp_path, report.workspace, "t2", "first")
        if code == 0:      # pushed at all: then exactly
            assert compare(expected["t2"], exact(d)) == []
        else:              # left to the next push
            assert recs[-1]["code"] == "unknown-point", recs
        # the next push carries it, exactly
        report = push_tree(h.store, h.ws, h.fd, open_backend(config), config)
        code, recs, d = _restore(capsys, s3, tmp_path, report.workspace, "t2", "second")
        assert code == 0, recs
        assert compare(expected["t2"], exact(d)) == []
