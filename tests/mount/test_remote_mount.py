"""Push a *mounted* workspace (the daemon running, turns marked through the control
socket, files written through the mount) to a real S3 server, and restore its turns on
a fresh store with the CLI in a subprocess, as a user would."""

from __future__ import annotations

import json
import os

from mountkit import cli, mounted
from remotekit import S3Server
from treesnap import compare, snapshot

# Compared without mtimes: through the mount (writeback cache) a file's mtime as the
# kernel shows it may differ by milliseconds from the real file's, which is what a
# capture records; mtimes round-trip exactly in tests/unit/test_remote_roundtrip.py.


def _json(proc) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_a_mounted_workspace_pushes_and_restores_elsewhere(tmp_path):
    server = S3Server(tmp_path / "s3data").start()
    try:
        env = server.env
        ws, store = tmp_path / "ws", tmp_path / "store"
        ws.mkdir()
        points = {}
        with mounted(ws, store) as m:
            r = cli("remote", "add", "origin", server.url(), "--endpoint", server.endpoint,
                    store=store, env=env)
            assert r.returncode == 0, r.stderr
            m.call("turn.begin", session="s1", turn=1, label="one")
            points[1] = snapshot(ws)
            (ws / "src").mkdir()
            (ws / "src" / "a.py").write_bytes(b"print(1)\n")
            (ws / "data.bin").write_bytes(os.urandom(2_000_000))
            os.symlink("src/a.py", ws / "link")
            m.call("turn.end")
            m.call("turn.begin", session="s1", turn=2, label="two")
            points[2] = snapshot(ws)
            (ws / "src" / "a.py").write_bytes(b"print(2)\n")
            os.unlink(ws / "data.bin")
            os.link(ws / "src" / "a.py", ws / "a-again.py")
            m.call("turn.end")
            now = snapshot(ws)
            r = cli("--json", "push", "-C", ws, store=store, env=env)
            assert r.returncode == 0, r.stderr + r.stdout
            done = [x for x in _json(r) if x["type"] == "push.done"][0]
            assert done["objects"] >= 3 and done["head"]
        for turn, tree in points.items():
            fresh = tmp_path / f"fresh{turn}"
            r = cli("remote", "add", "origin", server.url(), "--endpoint", server.endpoint,
                    store=fresh / "store", env=env)
            assert r.returncode == 0, r.stderr
            r = cli("--json", "restore", "--from", "origin", "--workspace", done["workspace"],
                    "--point", f"t{turn}", fresh / "dir", store=fresh / "store", env=env)
            assert r.returncode == 0, r.stderr + r.stdout
            assert compare(tree, snapshot(fresh / "dir")) == [], f"t{turn}"
        # and the newest state: the pushed tree's epoch
        r = cli("--json", "log", "-C", tmp_path / "fresh1" / "dir", store=tmp_path / "fresh1" / "store",
                env=env)
        head = [x for x in _json(r) if (x.get("label") or "").startswith("pushed tree")]
        r = cli("rewind", "-C", tmp_path / "fresh1" / "dir", f"e{head[-1]['epoch']}",
                store=tmp_path / "fresh1" / "store", env=env)
        assert r.returncode == 0, r.stderr + r.stdout
        assert compare(now, snapshot(tmp_path / "fresh1" / "dir")) == []
    finally:
        server.stop()


def test_a_restore_into_a_mounted_workspace_is_refused_before_anything(tmp_path):
    """``rewindfs restore … ~/proj/sub`` with ``~/proj`` mounted: every file failed with
    "EPERM: Operation not permitted" (the restore's temp names go through the mount,
    which keeps that prefix for itself), the result was "partial", and ``proj/sub``
    stayed behind, half made, as a second workspace with its own history inside the
    mounted one (which ``mount`` itself refuses).  Now the place is checked as ``mount``
    checks it: refused up front naming the mounted workspace, nothing downloaded, no
    directory made, no history added."""
    server = S3Server(tmp_path / "s3data").start()
    try:
        env = server.env
        ws, store = tmp_path / "ws", tmp_path / "store"
        ws.mkdir()
        with mounted(ws, store) as m:
            r = cli("remote", "add", "origin", server.url(), "--endpoint", server.endpoint,
                    store=store, env=env)
            assert r.returncode == 0, r.stderr
            m.call("turn.begin", session="s1", turn=1, label="one")
            (ws / "a.txt").write_bytes(b"one\n")
            m.call("turn.end")
            r = cli("--json", "push", "-C", ws, store=store, env=env)
            assert r.returncode == 0, r.stderr + r.stdout
            wid = [x for x in _json(r) if x["type"] == "push.done"][0]["workspace"]
            before = snapshot(ws)
            r = cli("log", "--json", "-C", ws, store=store, env=env)
            epochs = len(_json(r))
            for target in (ws / "sub", ws):
                r = cli("--json", "restore", "--from", "origin", "--workspace", wid,
                        "--point", "t1", target, store=store, env=env)
                (err,) = [x for x in _json(r) if x["type"] == "error"]
                assert r.returncode == 3 and err["code"] == "restore-target-in-use", r.stdout
                assert f"inside the mounted workspace {ws}" in err["message"] or \
                    f"{ws} is a mounted workspace" in err["message"], err
            assert not (ws / "sub").exists()
            assert compare(before, snapshot(ws)) == []
            assert len(_json(cli("log", "--json", "-C", ws, store=store, env=env))) == epochs
            r = cli("--json", "log", "-C", ws / "sub", store=store, env=env)
            assert r.returncode != 0
    finally:
        server.stop()
