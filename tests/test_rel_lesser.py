"""Issue 12, the lesser four: another session's open turn is never closed silently;
gc numbers are validated at both edges; a directory replaced by a symlink is restored
in one rewind without following the symlink; blobs and restores keep files sparse."""

from __future__ import annotations

import json
import math
import os

import pytest

from mountkit import cli, mounted
from overlay._protocol import call as proto_call
from store import Store
from store_fixtures import assert_sound


# -- 1. turn.begin refuses another session's open turn -------------------------------------

@pytest.mark.mount
def test_turn_begin_refuses_another_sessions_open_turn(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        (ws / "f").write_bytes(b"before")
        a = m.call("turn.begin", session="A", turn=1, label="a1")["epoch"]
        # B over the control socket: refused, naming A's turn; nothing changes
        with pytest.raises(Exception) as exc:
            m.call("turn.begin", session="B", turn=1, label="b1")
        assert getattr(exc.value, "code", None) == "turn-open"
        assert "Turn 1 of session A" in str(exc.value)
        # B through the CLI: same refusal, exit 2, the holder named
        res = cli("turn", "begin", "--session", "B", "--turn", "1", "-C", ws, store=store)
        assert res.returncode == 2, res.stderr
        assert "Turn 1 of session A is still open" in res.stderr, res.stderr
        st = m.call("status")
        assert st["open_turn"]["session"] == "A" and st["epoch"] == a
        # A's later write lands in A's turn and A's end still works
        (ws / "f").write_bytes(b"during A")
        m.call("turn.end", session="A")
        # A re-beginning its own stale turn (lost turn.end) stays allowed
        m.call("turn.begin", session="A", turn=2)
        a3 = m.call("turn.begin", session="A", turn=3)["epoch"]
        assert m.call("status")["open_turn"]["turn"] == 3
        # --force closes A's turn
        res = cli("turn", "begin", "--session", "B", "--turn", "1", "--force", "-C", ws,
                  store=store)
        assert res.returncode == 0, res.stderr
        st = m.call("status")
        assert st["open_turn"]["session"] == "B" and st["epoch"] > a3
        with pytest.raises(Exception) as exc:     # A's end now names the mismatch
            m.call("turn.end", session="A")
        assert getattr(exc.value, "code", None) == "bad-session"
        m.call("turn.end", session="B")
    points = {(p["session"], p["turn"]) for p in _points(store, ws) if p["kind"] == "turn"}
    assert points == {("A", 1), ("A", 2), ("A", 3), ("B", 1)}


def _points(store, ws):
    res = cli("log", "--json", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


# -- 2. gc numbers -------------------------------------------------------------------------

_BAD_CLI = [
    ("--grace", "1e400"), ("--grace", "inf"), ("--grace", "nan"), ("--grace", "-1"),
    ("--grace", "1e300"),
    ("--max-age", "9" * 400 + "d"), ("--max-age", "99999999999w"),
    ("--max-bytes", "9" * 400), ("--max-bytes", "99999999999999T"),
    ("--keep-epochs", "9" * 40), ("--keep-epochs", "-1"),
]
_BAD_WIRE = [
    ("grace_s", math.inf), ("grace_s", math.nan), ("grace_s", -1), ("grace_s", 10 ** 400),
    ("grace_s", 1e300), ("max_age_s", math.inf), ("max_age_s", 10 ** 30),
    ("max_age_s", -0.5), ("keep_epochs", 10 ** 30), ("keep_epochs", -1),
    ("keep_epochs", 1.5), ("max_bytes", 10 ** 30), ("max_bytes", math.nan),
    ("max_bytes", True), ("grace_s", "10"),
]


def _history(ws, store):
    with Store.open(store) as s:
        w = s.workspace(os.fsencode(ws))
        return [e.id for e in s.epochs(w)], s.statistics()["entries"]


@pytest.mark.mount
def test_gc_refuses_absurd_numbers_at_both_edges(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        for t in range(1, 4):
            m.call("turn.begin", session="s", turn=t)
            (ws / "f").write_bytes(os.urandom(5000))
            m.call("turn.end", session="s")
        before = [p["epoch"] for p in m.call("points")["points"]]
        for name, value in _BAD_WIRE:
            with pytest.raises(Exception) as exc:
                proto_call(m.socket, "gc", {name: value, "keep_epochs": 1}
                           if name != "keep_epochs" else {name: value}, timeout=60)
            assert getattr(exc.value, "code", None) == "bad-params", (name, value, exc.value)
        for flag, value in _BAD_CLI:   # through the live daemon
            res = cli("gc", "--keep-epochs", "1", flag, value, "-C", ws, store=store)
            assert res.returncode == 3, (flag, value, res.stderr)
            assert "internal" not in res.stderr.lower(), res.stderr
        assert [p["epoch"] for p in m.call("points")["points"]] == before
    history = _history(ws, store)
    for flag, value in _BAD_CLI:       # straight from the store (no daemon)
        res = cli("gc", "--keep-epochs", "1", flag, value, "-C", ws, store=store)
        assert res.returncode == 3, (flag, value, res.stderr)
    assert _history(ws, store) == history
    res = cli("gc", "--keep-epochs", "1", "--grace", "0", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr      # a sane gc still works and drops
    assert len(_history(ws, store)[0]) < len(history[0])
    with Store.open(store) as s:
        assert_sound(s)


def test_store_gc_refuses_absurd_numbers(tmp_path):
    from store._gc import BadPolicy
    with Store.open(tmp_path / "store") as s:
        for name, value in _BAD_WIRE:
            with pytest.raises(BadPolicy):
                s.gc(**{name: value})
        assert_sound(s)


# -- 3. a directory replaced by a symlink since the point -----------------------------------

def _tree(top) -> dict:
    """{relpath: (kind, content or target, mode, mtime_ns)} of everything under *top*,
    read without following symlinks."""
    out = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, top)
            if os.path.islink(full):
                out[rel] = ("symlink", os.readlink(full), st.st_mode, st.st_mtime_ns)
            elif os.path.isdir(full):
                out[rel] = ("dir", None, st.st_mode, st.st_mtime_ns)
            else:
                with open(full, "rb") as f:
                    out[rel] = ("file", f.read(), st.st_mode, st.st_mtime_ns)
    return out


@pytest.mark.mount
@pytest.mark.parametrize("where", ["outside", "inside"])
def test_dir_replaced_by_symlink_is_restored_in_one_rewind(tmp_path, where):
    import shutil
    ws, store = tmp_path / "ws", tmp_path / "store"
    (ws / "pkg" / "sub").mkdir(parents=True)
    (ws / "pkg" / "a").write_bytes(b"a at the point")
    (ws / "pkg" / "sub" / "c").write_bytes(b"c at the point")
    (ws / "keep").write_bytes(b"keep")
    # the link target holds the same names with other contents (npm link / pnpm)
    target = tmp_path / "linked" if where == "outside" else ws / "linked"
    (target / "sub").mkdir(parents=True)
    (target / "a").write_bytes(b"the linked package's a")
    (target / "sub" / "c").write_bytes(b"the linked package's c")
    (target / "only-there").write_bytes(b"x")
    with mounted(ws, store) as m:
        before = _tree(ws)
        m.call("turn.begin", session="s", turn=1)
        shutil.rmtree(ws / "pkg")
        os.symlink(target, ws / "pkg")
        m.call("turn.end", session="s")
        linked = _tree(target)
        after = _tree(ws)
        res = cli("rewind", "1", "--session", "s", "--json", "-C", ws, store=store)
        assert res.returncode == 0, res.stdout + res.stderr
        assert not (ws / "pkg").is_symlink()
        got = _tree(ws)
        for rel in ("pkg/a", "pkg/sub/c", "keep"):
            assert got[rel][:3] == before[rel][:3], rel
        assert set(k for k in got if k.startswith("pkg")) == \
            set(k for k in before if k.startswith("pkg"))
        assert _tree(target) == linked          # the link's target is untouched
        res = cli("redo", "--session", "s", "--json", "-C", ws, store=store)
        assert res.returncode == 0, res.stdout + res.stderr
        assert os.readlink(ws / "pkg") == os.fspath(target)
        assert _tree(target) == linked
        redone = _tree(ws)
        assert {k: v[:3] for k, v in redone.items()} == \
            {k: v[:3] for k, v in after.items()}
    with Store.open(store) as s:
        assert_sound(s)
