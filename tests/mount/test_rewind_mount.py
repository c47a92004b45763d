"""Rewind and redo through a real mount: random seeded sequences of real syscalls over
several turns; rewinding to every point (and redoing) gives trees identical to the
snapshots taken at those points — content, mode, symlink targets, xattrs, link counts —
both through the mount and in the real directory underneath (so the kernel's caches
were invalidated).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from types import SimpleNamespace

import pytest

from mountkit import mounted
from rewindfs.overlay.control.client import call
from rewind_agent import Agent
from treesnap import compare, snapshot

pytestmark = pytest.mark.mount


@contextlib.contextmanager
def mounted_workspace(tmp_path):
    """``mountkit.mounted`` plus ``real_view``: the directory underneath the mount,
    through a dir fd opened before mounting."""
    ws = tmp_path / "ws"
    ws.mkdir()
    real_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tmp_path / "store") as m:
            yield SimpleNamespace(path=str(ws), real_view=f"/proc/self/fd/{real_fd}",
                                  socket=m.socket, mount=m)
    finally:
        os.close(real_fd)


# -- the test -------------------------------------------------------------------------------

def both_views(m):
    """Snapshots through the mount and of the real directory underneath."""
    return snapshot(m.path), snapshot(m.real_view)


def assert_tree(m, expected, what):
    through, real = both_views(m)
    diffs = [f"real directory: {d}" for d in compare(expected, real)]
    diffs += [f"through the mount: {d}" for d in compare(expected, through)]
    assert diffs == [], f"{what}:\n" + "\n".join(diffs[:30])


def run_random_turns(seed, tmp_path, *, links: bool):
    rng = random.Random(seed)
    with mounted_workspace(tmp_path) as m:
        agent = Agent(m.path, rng, links=links)
        for _ in range(20):          # a starting tree, made in the idle epoch
            agent.step()
        points, snaps = [], []
        for turn in range(1, 8):
            snaps.append(snapshot(m.path))
            points.append(call(m.socket, "turn.begin",
                               {"session": "s1", "turn": turn, "label": f"t{turn}"})["epoch"])
            for _ in range(rng.randrange(10, 30)):
                agent.step()
        call(m.socket, "turn.end", {})
        final = snapshot(m.path)

        order = list(range(len(points)))
        rng.shuffle(order)
        state = final
        for i in order:
            res = call(m.socket, "rewind", {"to": f"e{points[i]}"})
            assert res["failed"] == [], res["failed"]
            assert_tree(m, snaps[i], f"rewind to turn {i + 1} (seed {seed})")
            res = call(m.socket, "redo", {})
            assert res["failed"] == []
            assert_tree(m, state, f"redo after turn {i + 1} (seed {seed})")
            res = call(m.socket, "rewind", {"to": f"e{points[i]}"})
            state = snaps[i]
        first_rewind = min(p["epoch"] for p in call(m.socket, "points", {})["points"]
                           if p["kind"] == "rewind")
        call(m.socket, "rewind", {"to": f"e{first_rewind}"})
        assert_tree(m, final, f"back to the end (seed {seed})")


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15, 16] + list(range(100, 100 + int(os.environ.get("REWIND_MOUNT_SEEDS", "0")))))
def test_random_turns_rewind_to_every_point_and_redo(seed, tmp_path):
    run_random_turns(seed, tmp_path, links=False)


@pytest.mark.parametrize("seed", [21, 22, 23, 24] + list(
    range(200, 200 + int(os.environ.get("REWIND_MOUNT_SEEDS", "0")))))
def test_random_turns_with_hard_links(seed, tmp_path):
    run_random_turns(seed, tmp_path, links=True)


def test_rewind_events_and_refusals_through_the_daemon(tmp_path):
    with mounted_workspace(tmp_path) as m:
        with open(os.path.join(m.path, "f"), "wb") as f:
            f.write(b"before")
        e1 = call(m.socket, "turn.begin", {"session": "s1", "turn": 1, "label": "x"})["epoch"]
        with open(os.path.join(m.path, "f"), "wb") as f:
            f.write(b"after")
        events = []
        with pytest.raises(Exception) as info:
            call(m.socket, "rewind", {"to": f"e{e1}"}, on_event=events.append)
        assert info.value.code == "turn-open"
        for bad, code in (({"to": "-1"}, "relative-point"), ({"to": "e999"}, "unknown-point"),
                          ({"to": True}, "bad-params"), ({}, "bad-params"),
                          ({"to": f"e{e1}", "paths": ["../x"]}, "path-escape"),
                          ({"to": f"e{e1}", "paths": "f"}, "bad-params")):
            with pytest.raises(Exception) as info:
                call(m.socket, "rewind", bad)
            assert info.value.code == code, bad
        assert open(os.path.join(m.path, "f"), "rb").read() == b"after"
        call(m.socket, "turn.end", {})
        res = call(m.socket, "rewind", {"to": f"e{e1}", "undo_for": "child"},
                   on_event=events.append)
        assert [e["type"] for e in events][0] == "rewind.planned"
        assert events[-1]["type"] == "rewind.done" and res["failed"] == []
        assert open(os.path.join(m.path, "f"), "rb").read() == b"before"
        with pytest.raises(Exception) as info:
            call(m.socket, "redo", {"session": "other"})
        assert info.value.code == "nothing-to-redo"
        call(m.socket, "redo", {"session": "child"})
        assert open(os.path.join(m.path, "f"), "rb").read() == b"after"
        shown = call(m.socket, "show", {"point": f"e{e1}", "path": "f"})
        assert shown["exists"] and shown["content_b64"] == "YmVmb3Jl"
        diff = call(m.socket, "diff", {"a": f"e{e1}"})
        assert [(c["path"], c["a_size"], c["b_size"]) for c in diff["changes"]] == [("f", 6, 5)]


def test_many_files_each_get_their_event_and_fresh_caches(tmp_path):
    """Events and invalidations travel from the rewind worker in batches: the client
    still gets ``rewind.planned`` first, one ``rewind.written``/``rewind.deleted`` per
    changed path, ``rewind.done`` last; and every restored file (and each directory's
    listing) reads fresh through the mount, whose caches held the newer state."""
    with mounted_workspace(tmp_path) as m:
        names = [f"d{i % 3}/f{i}" for i in range(600)]
        for d in ("d0", "d1", "d2"):
            os.mkdir(os.path.join(m.path, d))
        for i, name in enumerate(names):
            with open(os.path.join(m.path, name), "wb") as f:
                f.write(b"old %d" % i)
        e1 = call(m.socket, "turn.begin", {"session": "s", "turn": 1, "label": "t"})["epoch"]
        for i, name in enumerate(names):
            with open(os.path.join(m.path, name), "wb") as f:
                f.write(b"new content %d" % i)
        for i in range(40):
            with open(os.path.join(m.path, "d1", f"extra{i}"), "wb") as f:
                f.write(b"x")
        call(m.socket, "turn.end", {})
        for name in names:                      # fill the kernel's caches
            with open(os.path.join(m.path, name), "rb") as f:
                f.read()
        assert len(os.listdir(os.path.join(m.path, "d1"))) == 240
        events = []
        res = call(m.socket, "rewind", {"to": f"e{e1}"}, on_event=events.append)
        assert res["failed"] == [] and res["written"] == 600 and res["deleted"] == 40
        types = [e["type"] for e in events]
        assert types[0] == "rewind.planned" and types[-1] == "rewind.done"
        assert types.count("rewind.done") == types.count("rewind.planned") == 1
        written = sorted(e["path"] for e in events if e["type"] == "rewind.written")
        deleted = sorted(e["path"] for e in events if e["type"] == "rewind.deleted")
        assert written == sorted(names)
        assert deleted == sorted(f"d1/extra{i}" for i in range(40))
        for i, name in enumerate(names):
            with open(os.path.join(m.path, name), "rb") as f:
                assert f.read() == b"old %d" % i, name
        assert len(os.listdir(os.path.join(m.path, "d1"))) == 200


def _six_files_rewritten_by_turn_1(m) -> tuple[int, dict]:
    """Six files, then turn 1 rewrites them and adds ``d/x``: (turn 1's epoch, the
    tree at its start)."""
    for i in range(6):
        (m.ws / f"f{i}").write_bytes(b"old %d\n" % i)
    e1 = m.call("turn.begin", session="s1", turn=1, label="t")["epoch"]
    target = snapshot(m.ws)
    for i in range(6):
        (m.ws / f"f{i}").write_bytes(b"new content %d\n" % i)
    (m.ws / "d").mkdir()
    (m.ws / "d" / "x").write_bytes(b"x")
    m.call("turn.end")
    return e1, target


def test_killed_daemon_mid_rewind_is_finished_at_the_next_mount(tmp_path):
    """The daemon dies (SIGKILL, ``REWINDFS_FAULT_AFTER``) in the middle of a rewind; the
    next mount finishes it from the intent before serving, and redo still works."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store, env={"REWINDFS_FAULT_AFTER": "4"}, require_clean=False) as m:
        e1, target = _six_files_rewritten_by_turn_1(m)
        before = snapshot(ws)
        with pytest.raises(Exception):
            m.call("rewind", to=f"e{e1}")      # the daemon is killed on its 4th change
        m.proc.wait(timeout=60)
        assert m.proc.returncode == -9
    with mounted(ws, store, extra=["--recover"]) as m:
        assert m.call("status").get("intent") is None
        assert compare(target, snapshot(ws)) == []
        assert m.call("redo")["failed"] == []
        assert compare(before, snapshot(ws)) == []


def test_a_daemon_dead_mid_rewind_is_named_and_a_refused_mount_says_nothing_of_finishing(tmp_path):
    """The daemon dies mid-rewind: its client says the tree is half-way and names
    ``mount --recover``.  A plain ``rewindfs mount`` on the dead mount is then
    refused (``stale-mount``): it must not first announce that it finishes the rewind,
    which it then does not do.  ``mount --recover`` says so and does it."""
    from mountkit import cli
    from relkit import ensure_unmounted, kill_background, stop_background
    ws, store = tmp_path / "ws", tmp_path / "store"
    pid = None
    try:
        with mounted(ws, store, env={"REWINDFS_FAULT_AFTER": "4"}, require_clean=False) as m:
            e1, target = _six_files_rewritten_by_turn_1(m)
            res = cli("rewind", f"e{e1}", "-C", ws, store=store, timeout=120)
            # the daemon is gone: the client says what that leaves and what to run
            assert res.returncode == 2 and "(daemon-died)" in res.stderr, res.stderr
            assert "half-way" in res.stderr, res.stderr
            assert f"rewindfs mount --recover {ws}" in res.stderr, res.stderr
            m.proc.wait(timeout=60)
            assert m.proc.returncode == -9
            res = cli("mount", ws, store=store, timeout=60)
            assert res.returncode == 2 and "(stale-mount)" in res.stderr, res.stderr
            assert "finishing" not in res.stderr, res.stderr
            res = cli("mount", "--recover", ws, store=store, timeout=120)
            assert res.returncode == 0, res.stderr
            assert res.stderr.splitlines()[0] == "warning: finishing an interrupted rewind first"
            pid = json.loads(cli("status", "--json", "-C", ws, store=store).stdout)["pid"]
            assert compare(target, snapshot(ws)) == []
            stop_background(ws, store, pid)
            pid = None
    finally:
        kill_background(pid)
        ensure_unmounted(ws)


def test_cli_through_the_daemon(tmp_path):
    from mountkit import cli
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        (ws / "a.txt").write_bytes(b"one\n")
        m.call("turn.begin", session="s1", turn=1, label="first turn")
        (ws / "a.txt").write_bytes(b"two\n")
        (ws / "b.bin").write_bytes(b"\0\1\2")
        m.call("turn.end")
        res = cli("log", "--json", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        assert any(r["kind"] == "turn" and r["label"] == "first turn" for r in rows)
        res = cli("diff", "t1", "--json", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr
        assert {json.loads(line)["path"] for line in res.stdout.splitlines()} == {"a.txt",
                                                                                 "b.bin"}
        res = cli("rewind", "1", "--session", "s1", "--json", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr
        types = [json.loads(line)["type"] for line in res.stdout.splitlines()]
        assert types[0] == "rewind.planned" and types[-1] == "rewind.done"
        assert (ws / "a.txt").read_bytes() == b"one\n" and not (ws / "b.bin").exists()
        res = cli("show", "t1", "a.txt", store=store, cwd=ws)
        assert res.stdout == "one\n"
        res = cli("redo", "--session", "s1", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr
        assert (ws / "a.txt").read_bytes() == b"two\n" and (ws / "b.bin").exists()
        res = cli("rewind", "HEAD~1", store=store, cwd=ws)
        assert res.returncode == 3
