"""Retention: ``rewindfs gc`` by number of epochs, age and total bytes; pending redos
(of every session) are kept unless ``--drop-redo``; ``rewindfs status`` reports store
usage per workspace and per session, mounted and unmounted."""

from __future__ import annotations

import json
import os

import pytest

from mountkit import cli, mounted
from restorekit import History, open_history
from rewindfs.store import UnknownPoint
from rewindfs.store import _schema as S
from store_fixtures import assert_sound

KB10 = 10_000


def _jsonl(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture
def hist(tmp_path):
    with open_history(tmp_path) as h:
        (tmp_path / "ws" / "f").write_bytes(b"0" * KB10)
        yield h


def turns(h: History, n: int, session="s1", start=1) -> list[int]:
    """``n`` turns, each rewriting ``f`` with fresh 10 kB (10 kB of pre-image each)."""
    out = []
    for t in range(start, start + n):
        out.append(h.turn(t, session))
        h.write(b"f", os.urandom(KB10))
        h.end_turn()
    return out


def content(h: History) -> bytes:
    with open(h.p(b"f"), "rb") as f:
        return f.read()


def test_keep_epochs(hist):
    h, store = hist, hist.store
    points = turns(h, 6)
    before = len(store.epochs(h.ws))
    blobs = store.statistics()["entries"]["blobs"]
    report = store.gc(keep_epochs=5, grace_s=0)
    assert report.epochs_dropped == before - 5 and report.blobs_removed > 0
    assert len(store.epochs(h.ws)) == 5
    assert store.statistics()["entries"]["blobs"] < blobs
    kept = [e.id for e in store.epochs(h.ws)]
    for p in points:
        if p not in kept:
            with pytest.raises(UnknownPoint):
                store.resolve_point(h.ws, f"e{p}")
    # the oldest kept turn is still a working point
    oldest_turn = next(e for e in store.epochs(h.ws) if e.kind == "turn")
    want = store.read_blob(dict(store.journal(h.ws, oldest_turn.id))[b"f"].blob)
    res = cli("rewind", f"e{oldest_turn.id}", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    assert content(h) == want


def test_gc_dry_run_names_what_gc_then_drops_and_changes_nothing(hist):
    """A local gc is undone by nothing, and ``gc --dry-run`` was refused for it (only
    ``--remote`` had one): there was no way to look first.  The dry run lists the epochs
    the same policy then drops — exactly those — and the blobs it frees, and leaves the
    store as it was (``fsck`` sound, every point still there)."""
    h, store = hist, hist.store
    turns(h, 6)
    before = [e.id for e in store.epochs(h.ws)]
    blobs = store.statistics()["entries"]["blobs"]
    res = cli("--json", "gc", "--keep-epochs", "5", "--grace", "0s", "--dry-run",
              "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    (plan,) = [r for r in _jsonl(res.stdout) if r["type"] == "gc"]
    assert plan["dry_run"] is True and plan["epochs_dropped"] == len(before) - 5
    would = [e["epoch"] for e in plan["epochs"]]
    assert would == before[:len(before) - 5]                # the oldest, in order
    assert all(e["workspace"] == os.fsdecode(os.path.realpath(h.root)) for e in plan["epochs"])
    assert [e.id for e in store.epochs(h.ws)] == before     # nothing dropped
    assert store.statistics()["entries"]["blobs"] == blobs
    assert_sound(store)
    human = cli("gc", "--keep-epochs", "5", "--grace", "0s", "--dry-run", "-C", h.root,
                store=store.path)
    assert "nothing changed" in human.stdout and f"e{would[0]}" in human.stdout, human.stdout
    res = cli("--json", "gc", "--keep-epochs", "5", "--grace", "0s", "-C", h.root,
              store=store.path)
    (done,) = [r for r in _jsonl(res.stdout) if r["type"] == "gc"]
    assert [e.id for e in store.epochs(h.ws)] == before[len(before) - 5:]
    for key in ("epochs_dropped", "entries_dropped", "blobs_removed", "bytes_freed"):
        assert done[key] == plan[key], (key, plan, done)
    assert done["blobs_removed"] > 0


def test_gc_dry_run_on_a_mounted_workspace_changes_nothing(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with mounted(ws, tmp_path / "store") as m:
        for t in (1, 2, 3):
            m.call("turn.begin", session="s1", turn=t, label=f"t{t}")
            (ws / "f").write_bytes(os.urandom(KB10))
            m.call("turn.end")
        before = cli("--json", "log", "-C", ws, store=m.store).stdout
        res = cli("--json", "gc", "--keep-epochs", "1", "--grace", "0s", "--dry-run",
                  "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        (plan,) = [r for r in _jsonl(res.stdout) if r["type"] == "gc"]
        assert plan["dry_run"] is True and plan["epochs_dropped"] >= 5, plan
        assert cli("--json", "log", "-C", ws, store=m.store).stdout == before
        res = cli("rewind", "t1", "--session", "s1", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr                  # t1 is still a point


def _age(store, ws, epoch_ids, by_ns: int) -> None:
    """Make some epochs look old (their start and end moved back by ``by_ns``)."""
    with store._w() as txn:
        for eid in epoch_ids:
            fields = S.load("epochs", S.u64(eid), txn.get(S.u64(eid), db=store._db["epochs"]))
            fields[5] -= by_ns
            fields[6] = None if fields[6] is None else fields[6] - by_ns
            txn.put(S.u64(eid), S.dump(S.u64(eid), fields), db=store._db["epochs"])


def test_max_age(hist):
    h, store = hist, hist.store
    turns(h, 5)
    epochs = store.epochs(h.ws)
    old = [e.id for e in epochs[:4]]
    _age(store, h.ws, old, 10 * 86400 * 10**9)
    res = cli("gc", "--max-age", "7d", "--json", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    assert [e.id for e in store.epochs(h.ws)] == [e.id for e in epochs[4:]]


def test_max_bytes(hist):
    h, store = hist, hist.store
    turns(h, 8)
    budget = 3 * KB10 + 5
    res = cli("gc", "--max-bytes", str(budget), "--json", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    left = store.epochs(h.ws)
    assert sum(e.bytes for e in left) <= budget
    assert sum(e.bytes for e in left) + KB10 > budget      # dropped no more than needed
    assert len([e for e in left if e.kind == "turn"]) == 3


def test_pending_redo_is_kept_unless_told(hist):
    h, store = hist, hist.store
    points = turns(h, 5)
    at_t5 = content(h)
    res = cli("rewind", "2", "--session", "s1", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    at_t2 = content(h)
    res = cli("gc", "--keep-epochs", "1", "--json", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    assert store.epochs(h.ws)[0].id == points[1]          # everything from turn 2 on
    res = cli("redo", "--session", "s1", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    assert content(h) == at_t5
    res = cli("rewind", "2", "--session", "s1", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr                # undoing the redo still works
    assert content(h) == at_t2

    res = cli("gc", "--keep-epochs", "1", "--drop-redo", "--json", "-C", h.root,
              store=store.path)
    assert res.returncode == 0, res.stderr
    assert len(store.epochs(h.ws)) == 1
    res = cli("redo", "--session", "s1", "-C", h.root, store=store.path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert content(h) == at_t2


def test_each_sessions_redo_is_kept(hist):
    """Session a rewinds, later session b rewinds to a later point: retention keeps
    a's redo too, not only the newest rewind's."""
    h, store = hist, hist.store
    turns(h, 2, session="a")
    before_a_rewind = content(h)
    res = cli("rewind", "1", "--session", "a", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    turns(h, 3, session="b")
    res = cli("rewind", "2", "--session", "b", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    res = cli("gc", "--keep-epochs", "1", "--json", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stderr
    # b's turns and rewind came after a's rewind: a plain redo is stale; forced, it
    # still finds every epoch it needs
    res = cli("redo", "--session", "a", "--dry-run", "--json", "-C", h.root,
              store=store.path)
    assert res.returncode == 2 and '"redo-stale"' in res.stdout, res.stdout + res.stderr
    res = cli("redo", "--session", "a", "--force", "--dry-run", "--json", "-C", h.root,
              store=store.path)
    assert res.returncode == 0, res.stdout + res.stderr
    res = cli("redo", "--session", "a", "--force", "-C", h.root, store=store.path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert content(h) == before_a_rewind


def _usage(res) -> dict:
    assert res.returncode == 0, res.stderr
    return next(r for r in _jsonl(res.stdout) if r["type"] == "status")["usage"]


def _check_usage(usage: dict, ws_path, sessions: dict) -> None:
    (w,) = usage["workspaces"]
    assert w["path"] == os.fsdecode(os.path.realpath(ws_path))
    for name, n_turns in sessions.items():
        assert w["sessions"][name]["turns"] == n_turns
        assert w["sessions"][name]["bytes"] >= n_turns * KB10
    assert w["bytes"] == sum(s["bytes"] for s in w["sessions"].values())
    assert usage["store"]["blobs"] > 0 and usage["store"]["disk_bytes"] > 0


def test_status_shows_usage_mounted_and_unmounted(hist):
    h, store = hist, hist.store
    turns(h, 3, session="s1")
    turns(h, 2, session="s2")
    res = cli("status", "--json", "-C", h.root, store=store.path)
    _check_usage(_usage(res), h.root, {"s1": 3, "s2": 2})
    res = cli("status", "-C", h.root, store=store.path)
    assert "s1: 3 turns" in res.stdout and "s2: 2 turns" in res.stdout, res.stdout


def test_status_usage_while_mounted(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"0" * KB10)
    with mounted(ws, tmp_path / "store") as m:
        for t in (1, 2):
            m.call("turn.begin", session="s1", turn=t, label="x")
            (ws / "f").write_bytes(os.urandom(KB10))
            m.call("turn.end")
        (ws / "f").write_bytes(b"person")
        res = cli("status", "--json", "-C", ws, store=m.store)
        usage = _usage(res)
        _check_usage(usage, ws, {"s1": 2})
        assert usage["workspaces"][0]["sessions"]["(none)"]["epochs"] >= 1
