"""``mount --auto``: pushes in the background after every turn end, through a real
daemon and a real S3 server (``rclone serve s3``), seen from outside: turns through the
socket, files through the mount, ``status`` and restores with the CLI.

Waiting for the background pusher is bounded by generous deadlines, never asserted on
(``_until``)."""

from __future__ import annotations

import json
import os
import signal
import time

from mountkit import cli, is_rewindfs_mount, mounted
from remotekit import S3Server
from treesnap import compare, snapshot

# Trees are compared without mtimes, as in test_remote_mount.py (writeback cache).

_WAIT_S = 120.0


def _json(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _env(server) -> dict:
    return {**server.env, "REWINDFS_PUSH_RETRY_MAX_S": "0.5", "REWINDFS_PUSH_FINAL_S": "5"}


def _add_remote(server, store, name="origin"):
    r = cli("remote", "add", name, server.url(), "--endpoint", server.endpoint, store=store,
            env=server.env)
    assert r.returncode == 0, r.stderr


def _auto(m, name="origin") -> dict:
    push = m.call("status")["push"]
    assert push["auto"] == name
    return next(r for r in push["remotes"] if r["remote"] == name)


def _until(what: str, probe):
    """Poll ``probe()`` until it returns something true; fail after a generous bound."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def _drained(m):
    row = _auto(m)
    return row if row["unpushed_epochs"] == 0 and not row["queued"] \
        and row["state"] == "idle" else None


def _turn(m, ws, n: int, files: dict) -> object:
    m.call("turn.begin", session="s1", turn=n, label=f"turn {n}")
    tree = snapshot(ws)
    for name, data in files.items():
        path = ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    m.call("turn.end")
    return tree


def _restore_equals(tmp_path, server, ws_id: str, point: str, tree, tag: str) -> None:
    fresh = tmp_path / f"fresh-{tag}"
    _add_remote(server, fresh / "store")
    r = cli("--json", "restore", "--from", "origin", "--workspace", ws_id, "--point", point,
            fresh / "dir", store=fresh / "store", env=server.env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert compare(tree, snapshot(fresh / "dir")) == [], point


def test_auto_pushes_every_turn_and_the_remote_restores_each(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    try:
        ws, store = tmp_path / "ws", tmp_path / "store"
        _add_remote(server, store)
        points = {}
        with mounted(ws, store, extra=["--auto"], env=_env(server)) as m:
            points[1] = _turn(m, ws, 1, {"a.txt": b"one\n", "big.bin": os.urandom(1_500_000)})
            points[2] = _turn(m, ws, 2, {"a.txt": b"two\n", "src/b.py": b"print(2)\n"})
            points[3] = _turn(m, ws, 3, {"src/b.py": b"print(3)\n", "c": b"c" * 5000})
            last = snapshot(ws)
            row = _until("every turn pushed", lambda: _drained(m))
            assert row["pushed_epoch"] == row["head_epoch"] and row["workspace"]
            assert row["pushed_ns"] and row["last_error"] is None
            # the control method, both ways
            done = m.call("push", remote="origin", wait=True)
            assert done["workspace"] == row["workspace"] and done["objects"] == 0
            # `rewindfs push` on a mount with --auto goes through the daemon's pusher
            r = cli("--json", "push", "-C", ws, store=store, env=server.env)
            assert r.returncode == 0, r.stderr + r.stdout
            pushed = [x for x in _json(r) if x["type"] == "push.done"][0]
            assert pushed["workspace"] == row["workspace"] and pushed["objects"] == 0
            queued = m.call("push", wait=False, session="s1")
            assert queued["queued"] is True and queued["pending"] >= 1
        for turn, tree in points.items():
            _restore_equals(tmp_path, server, row["workspace"], f"t{turn}", tree, f"t{turn}")
        # unmounted: status still says what is pushed, from the store's own record
        r = cli("--json", "status", "-C", ws, store=store, env=server.env)
        st = [x for x in _json(r) if x["type"] == "status"][0]
        assert st["mounted"] is False
        assert [(x["remote"], x["unpushed_epochs"]) for x in st["push"]["remotes"]] == \
            [("origin", 0)]
        assert _restore_after_all(tmp_path, server, row["workspace"], last)
    finally:
        server.stop()


def _restore_after_all(tmp_path, server, ws_id, tree) -> bool:
    """The newest pushed state (the pushed tree's epoch) is the tree after turn 3."""
    fresh = tmp_path / "fresh-now"
    _add_remote(server, fresh / "store")
    r = cli("--json", "restore", "--from", "origin", "--workspace", ws_id, "--point", "t3",
            fresh / "dir", store=fresh / "store", env=server.env)
    assert r.returncode == 0, r.stderr
    log = _json(cli("--json", "log", "-C", fresh / "dir", store=fresh / "store"))
    head = [x for x in log if (x.get("label") or "").startswith("pushed tree")][-1]
    r = cli("rewind", "-C", fresh / "dir", f"e{head['epoch']}", store=fresh / "store")
    assert r.returncode == 0, r.stderr + r.stdout
    assert compare(tree, snapshot(fresh / "dir")) == []
    return True


def test_a_network_cut_keeps_turns_going_and_the_queue_drains_later(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    try:
        ws, store = tmp_path / "ws", tmp_path / "store"
        _add_remote(server, store)
        with mounted(ws, store, extra=["--auto", "origin"], env=_env(server)) as m:
            _turn(m, ws, 1, {"a.txt": b"one\n"})
            _until("turn 1 pushed", lambda: _drained(m))
            server.stop()                                  # the port is closed now
            _turn(m, ws, 2, {"a.txt": b"two\n", "b.bin": os.urandom(300_000)})
            t3 = _turn(m, ws, 3, {"c.txt": b"three\n"})
            row = _until("the cut seen", lambda: (r := _auto(m))["last_error"] and r)
            assert row["unpushed_epochs"] > 0
            assert row["last_error"]["code"] == "remote-unreachable"
            assert row["last_error"]["at_ns"] > 0
            server.start()                                 # same port, same objects
            row = _until("the queue drained", lambda: _drained(m))
            assert row["pushed_epoch"] == row["head_epoch"]
        _restore_equals(tmp_path, server, row["workspace"], "t3", t3, "t3")
    finally:
        server.stop()


def test_a_turn_mark_does_not_wait_for_a_stuck_push(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    try:
        ws, store = tmp_path / "ws", tmp_path / "store"
        _add_remote(server, store)
        with mounted(ws, store, extra=["--auto"], env=_env(server)) as m:
            os.kill(server.proc.pid, signal.SIGSTOP)       # accepts, never answers
            try:
                _turn(m, ws, 1, {"a.txt": b"one\n"})
                _until("the push stuck", lambda: _auto(m)["state"] == "pushing")
                m.call("turn.begin", session="s1", turn=2, label="two")
                (ws / "b.txt").write_bytes(b"two\n")
                ended = m.call("turn.end")
                assert ended["ended"] is True
                # the marks returned while the push was still stuck
                assert _auto(m)["state"] == "pushing"
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            _until("pushed after the server woke", lambda: _drained(m))
    finally:
        server.stop()


def test_the_push_method_names_an_unknown_remote(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    try:
        ws, store = tmp_path / "ws", tmp_path / "store"
        _add_remote(server, store)
        with mounted(ws, store, env=_env(server)) as m:
            from rewindfs.store._errors import UnknownRemote
            try:
                m.call("push", remote="nope", wait=False)
            except UnknownRemote as exc:
                assert exc.code == "unknown-remote"
            else:
                raise AssertionError("push to an unknown remote was accepted")
            assert m.call("status")["push"]["auto"] is None
    finally:
        server.stop()


def test_bad_auto_arguments_leave_nothing_mounted(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        store = tmp_path / "store"
        r = cli("--json", "mount", ws, "--auto", store=store, env=server.env)
        assert (r.returncode, json.loads(r.stdout.splitlines()[-1])["code"]) == \
            (3, "remote-unnamed"), r.stdout + r.stderr
        assert not is_rewindfs_mount(ws)
        _add_remote(server, store, "one")
        r = cli("--json", "mount", ws, "--auto", "nope", store=store, env=server.env)
        assert r.returncode == 3 and "unknown-remote" in r.stdout, r.stdout + r.stderr
        assert not is_rewindfs_mount(ws)
        _add_remote(server, store, "two")
        r = cli("--json", "mount", ws, "--auto", store=store, env=server.env)
        assert r.returncode == 3 and "remote-unnamed" in r.stdout, r.stdout + r.stderr
        assert not is_rewindfs_mount(ws)
    finally:
        if is_rewindfs_mount(ws):
            cli("unmount", ws, store=tmp_path / "store")
        server.stop()


def test_auto_before_the_directory_takes_the_only_remote(tmp_path):
    """``mount --auto DIR`` reads the way people write it: DIR is required, so the one
    word after ``--auto`` is DIR and the push goes to the only remote.  Without any
    word at all it is a usage error, and nothing is mounted."""
    server = S3Server(tmp_path / "s3data").start()
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    try:
        _add_remote(server, store, "one")
        r = cli("--json", "mount", "--auto", store=store, env=server.env)
        assert r.returncode == 3 and '"usage"' in r.stdout, r.stdout + r.stderr
        r = cli("mount", "--auto", ws, store=store, env=server.env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert is_rewindfs_mount(ws)
        r = cli("--json", "status", "-C", ws, store=store, env=server.env)
        status = [json.loads(x) for x in r.stdout.splitlines() if '"status"' in x][-1]
        assert status["push"]["auto"] == "one", status
    finally:
        if is_rewindfs_mount(ws):
            r = cli("unmount", ws, store=store, env=server.env)
            assert r.returncode == 0, r.stderr
        server.stop()


def test_unmount_says_what_is_left_and_a_later_push_sends_it(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    try:
        ws, store = tmp_path / "ws", tmp_path / "store"
        _add_remote(server, store)
        with mounted(ws, store, extra=["--auto"], env=_env(server)) as m:
            server.stop()
            _turn(m, ws, 1, {"a.txt": b"one\n"})
            t2 = _turn(m, ws, 2, {"a.txt": b"two\n"})
            r = cli("--json", "unmount", ws, store=store, env=server.env)
            assert r.returncode == 0, r.stderr
            gone = [x for x in _json(r) if x["type"] == "unmounted"][0]
            left = gone["push"]["remotes"][0]
            assert left["remote"] == "origin" and left["unpushed_epochs"] > 0
            assert left["last_error"]["code"] == "remote-unreachable"
        # the local history is whole: both turns are points here
        log = _json(cli("--json", "log", "-C", ws, store=store))
        assert {x.get("turn") for x in log if x.get("kind") == "turn"} == {1, 2}
        server.start()
        r = cli("--json", "push", "-C", ws, store=store, env=server.env)
        assert r.returncode == 0, r.stderr + r.stdout
        st = [x for x in _json(cli("--json", "status", "-C", ws, store=store))
              if x["type"] == "status"][0]
        row = st["push"]["remotes"][0]
        assert row["unpushed_epochs"] == 0
        _restore_equals(tmp_path, server, row["workspace"], "t2", t2, "t2")
    finally:
        server.stop()


def test_a_remote_removed_while_mounted_is_said_and_unmount_goes_on(tmp_path):
    """No server at all: the endpoint's port is closed from the start."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    r = cli("remote", "add", "gone", "s3://b/p", "--endpoint", "http://127.0.0.1:9",
            store=store)
    assert r.returncode != 0          # the probe cannot reach it: nothing added
    from rewindfs.store import Store
    with Store.open(store) as s:      # added as an unreachable remote, the way a later
        s.add_remote("gone", "s3://b/p", "http://127.0.0.1:9", None, False)  # outage looks
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
           "REWINDFS_PUSH_RETRY_MAX_S": "0.5", "REWINDFS_PUSH_FINAL_S": "2"}
    with mounted(ws, store, extra=["--auto"], env=env) as m:
        _turn(m, ws, 1, {"a.txt": b"one\n"})
        _until("the failure seen", lambda: _auto(m, "gone")["last_error"])
        r = cli("remote", "remove", "gone", store=store)
        assert r.returncode == 0, r.stderr
        row = _auto(m, "gone")
        assert row["removed"] is True and row["unpushed_epochs"] == 0
        r = cli("status", "-C", ws, store=store)
        assert "removed from this store" in r.stdout, r.stdout
