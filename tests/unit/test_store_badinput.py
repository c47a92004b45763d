"""Bad input gives a clear, typed error and changes nothing."""

from __future__ import annotations

import os

import pytest

from rewindfs.store import (
    BadPath, BadPoint, BadSession, EpochClosed, PreImage, SchemaTooNew, Store,
    StoreInsideWorkspace, UnknownPoint, check_relpath,
)
from rewindfs.store import _schema as S
from store_fixtures import store, store_path, ws  # noqa: F401  (fixtures)


def dump(store: Store) -> dict:
    """Every key and value of every database, plus the blob files."""
    out = {}
    with store._r() as txn:
        for name, db in store._db.items():
            out[name] = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
    out["files"] = sorted(os.path.join(d, f) for d, _, fs in os.walk(store.blobs.root)
                          for f in fs)
    return out


@pytest.mark.parametrize("path", [
    b"", b"a", b"a/b", b"\xff\xfe/x", b"a b/c.d", b"...", b"a/.b", b"x" * 4096,
])
def test_good_paths(path):
    assert check_relpath(path) == path


@pytest.mark.parametrize("path", [
    b"/a", b"a/", b"a//b", b".", b"..", b"a/../b", b"a/./b", b"../x", b"a/..",
    b"a\0b", b"x" * 4097, "a", None,
])
def test_bad_paths(path):
    with pytest.raises(BadPath) as info:
        check_relpath(path)
    assert info.value.exit_code == 3


@pytest.mark.parametrize("path", [b"../etc/passwd", b"/abs", b"", b"x" * 5000, b"a\0"])
def test_record_with_a_bad_path_records_nothing(store, ws, path):
    e = store.current_epoch(ws)
    store.record(ws, e.id, [(b"ok", PreImage.ABSENT)])
    before = dump(store)
    bad = [(b"fine", PreImage.ABSENT), (path, PreImage.ABSENT)]
    if path == b"":
        # the root is a valid path: it records; use a bad image instead
        bad = [(b"fine", PreImage.ABSENT), (b"x", "not an image")]
    with pytest.raises((BadPath, TypeError)):
        store.record(ws, e.id, bad)
    assert dump(store) == before


def test_long_paths_round_trip_through_hashed_keys(store, ws):
    """Paths longer than an LMDB key can hold still index, scan and plan."""
    e = store.current_epoch(ws)
    deep = b"/".join([b"d" * 200] * 20)          # 4019 bytes
    sib = deep[:-1] + b"e"
    key, n = store.put_bytes(b"content")
    store.record(ws, e.id, [(deep, PreImage("file", 0o600, size=n, blob=key)),
                            (sib, PreImage.ABSENT), (b"d" * 200, PreImage("dir", 0o755))])
    assert store.is_recorded(ws, e.id, deep)
    assert store.state_at(ws, e.id, deep).blob == key
    assert store.state_at(ws, e.id, sib) == PreImage.ABSENT
    assert dict(store.journal(ws, e.id))[deep].blob == key
    plan = store.plan(ws, e.id, [deep.rpartition(b"/")[0]])
    assert {a.path for a in plan} == {deep, sib}
    assert [a.op for a in store.plan(ws, e.id)] == ["delete", "mkdir", "write", "meta"]


def test_newer_schema_is_refused(store_path):
    with Store.open(store_path) as s:
        with s._w() as txn:
            txn.put(b"schema", S.pack(S.SCHEMA_VERSION + 1), db=s._db["meta"])
    with pytest.raises(SchemaTooNew) as info:
        Store.open(store_path)
    assert "newer rewindfs" in info.value.message
    assert info.value.code == "schema-too-new"


def _history(store, ws_path) -> tuple[int, int]:
    ws = store.workspace(ws_path)
    e = store.begin_turn(ws, "s1", 1, "one")
    key, size = store.put_bytes(b"old content")
    store.record(ws, e.id, [(b"a", PreImage("file", 0o2755, 0, 0, size, 7,
                                            ((b"user.k", b"v"),), key)),
                            (b"l" * 600, PreImage.ABSENT)])
    store.put_intent(ws, {"v": 1, "epoch": e.id})
    store.fork_session("s2", "s1", 1)
    store.end_turn(ws)
    return ws, e.id


@pytest.mark.parametrize("old", [1, 2])
def test_an_older_store_is_upgraded_in_place(store_path, tmp_path, old):
    """Versions 1 and 2 wrote every value without a checksum (a version-3 value is the
    version-2 value + 8 bytes): opening one seals every value in one transaction, and
    it then reads exactly as it did."""
    ws_path = os.fsencode(tmp_path / "w")
    with Store.open(store_path) as s:
        ws, eid = _history(s, ws_path)
        before = (list(s.journal(ws, eid)), s.epochs(ws), s.session_points(ws, "s2"),
                  s.get_intent(ws), s.workspaces())
        sealed = dump(s)
        with s._w() as txn:     # what an older rewindfs wrote: the bare payloads
            for name, db in s._db.items():
                for k, v in sealed[name]:
                    if name != "blobs" and k != b"schema":
                        assert S.is_sealed(k, v)
                        txn.put(k, v[:-S.CHECKSUM], db=db)
            txn.put(b"schema", S.pack(old), db=s._db["meta"])
    with Store.open(store_path) as s:
        assert dump(s) == sealed
        assert (list(s.journal(ws, eid)), s.epochs(ws), s.session_points(ws, "s2"),
                s.get_intent(ws), s.workspaces()) == before
        assert s.fsck().ok


def test_a_schema_number_damaged_into_an_older_one_seals_nothing_twice(store_path, tmp_path):
    """``meta/schema`` is the one unsealed index value (every version must read it); a
    current store whose number reads as 1 or 2 has every value already sealed, and the
    upgrade leaves each one alone."""
    with Store.open(store_path) as s:
        ws, eid = _history(s, os.fsencode(tmp_path / "w"))
        sealed = dump(s)
        with s._w() as txn:
            txn.put(b"schema", S.pack(2), db=s._db["meta"])
    with Store.open(store_path) as s:
        assert dump(s) == sealed
        assert s.fsck().ok


def test_a_schema_number_that_is_no_number_is_named(store_path):
    from rewindfs.store import IndexCorrupt
    with Store.open(store_path) as s:
        with s._w() as txn:
            txn.put(b"schema", b"\xc1", db=s._db["meta"])
    with pytest.raises(IndexCorrupt) as info:
        Store.open(store_path)
    assert "meta record" in info.value.message


def test_missing_store_without_create(tmp_path):
    from rewindfs.store import StoreError
    with pytest.raises(StoreError):
        Store.open(tmp_path / "nothing", create=False)
    assert not (tmp_path / "nothing").exists()


def test_store_inside_workspace_is_refused(tmp_path):
    ws_root = tmp_path / "project"
    ws_root.mkdir()
    with Store.open(ws_root / ".cache" / "rw") as s:
        before = dump(s)
        for path in (ws_root, tmp_path, b"/"):
            with pytest.raises(StoreInsideWorkspace):
                s.workspace(os.fsencode(path))
        assert dump(s) == before
        assert s.workspace(os.fsencode(tmp_path / "projectx")) == 1   # a sibling is fine


def test_store_inside_workspace_through_a_symlink(tmp_path):
    real = tmp_path / "real"
    (real / "st").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    with Store.open(tmp_path / "link" / "st") as s, pytest.raises(StoreInsideWorkspace):
        s.workspace(os.fsencode(real))


def test_default_store_path(monkeypatch, tmp_path):
    # its one Python home is the plugin's (the store opens the path it is given)
    from rewindfs.plugin._paths import default_store_path
    monkeypatch.setenv("REWINDFS_HOME", str(tmp_path / "h"))
    assert default_store_path() == tmp_path / "h"
    monkeypatch.delenv("REWINDFS_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "x"))
    assert default_store_path() == tmp_path / "x" / "rewindfs"
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".local" / "share" / "rewindfs"


@pytest.mark.parametrize("point", [-1, "-1", "~1", "HEAD~1", "HEAD", "prev", "t-1", "^"])
def test_relative_points_are_refused(store, ws, point):
    store.begin_turn(ws, "s", 1, "x")
    with pytest.raises(BadPoint) as info:
        store.resolve_point(ws, point)
    assert (info.value.code, info.value.exit_code) == ("relative-point", 3)


@pytest.mark.parametrize("point", [999, "e999", "t7", "turn:7", "banana", 1.5, None, True])
def test_unknown_points(store, ws, point):
    store.begin_turn(ws, "s", 1, "x")
    with pytest.raises(UnknownPoint):
        store.resolve_point(ws, point)


def test_epoch_of_another_workspace_is_unknown(store, ws, tmp_path):
    other = store.workspace(os.fsencode(tmp_path / "other"))
    e = store.current_epoch(other)
    before = dump(store)
    for call in (lambda: store.plan(ws, e.id), lambda: store.state_at(ws, e.id, b"a"),
                 lambda: store.record(ws, e.id, [(b"a", PreImage.ABSENT)]),
                 lambda: store.journal(ws, e.id), lambda: store.resolve_point(ws, e.id)):
        with pytest.raises(UnknownPoint):
            call()
    assert dump(store) == before


def test_record_into_a_closed_epoch(store, ws):
    old = store.current_epoch(ws)
    store.begin_turn(ws, "s", 1, "x")
    before = dump(store)
    with pytest.raises(EpochClosed):
        store.record(ws, old.id, [(b"a", PreImage.ABSENT)])
    assert dump(store) == before


@pytest.mark.parametrize("session", ["", "a\0b", "x" * 300, None, 5])
def test_bad_session_names(store, ws, session):
    before = dump(store)
    with pytest.raises(BadSession):
        store.begin_turn(ws, session, 1, "x")
    assert dump(store) == before


def test_relative_workspace_path_is_refused(store):
    from rewindfs.store import StoreError
    with pytest.raises(StoreError):
        store.workspace(b"relative/path")


def test_end_turn_of_another_session_changes_nothing(store, ws):
    from rewindfs.store import BadSession
    turn = store.begin_turn(ws, "alice", 1, "hers")
    with pytest.raises(BadSession) as info:
        store.end_turn(ws, session="bob")
    assert info.value.code == "bad-session" and "alice" in str(info.value)
    assert store.open_turn(ws) == turn            # still open, nothing ended
    idle = store.end_turn(ws, session="alice")
    assert idle.kind == "idle" and store.open_turn(ws) is None


def test_points_of_a_session_follow_its_fork(store, ws):
    a1 = store.begin_turn(ws, "a", 1, "one")
    store.end_turn(ws)
    a2 = store.begin_turn(ws, "a", 2, "two")
    store.end_turn(ws)
    store.fork_session("b", "a", 1)
    b2 = store.begin_turn(ws, "b", 2, "other two")
    store.end_turn(ws)
    assert [e.id for e in store.points(ws, "b")] == [a1.id, b2.id]
    assert [e.id for e in store.points(ws, "a")] == [a1.id, a2.id]
    assert [e.id for e in store.points(ws)] == [e.id for e in store.epochs(ws)]
    assert store.points(ws, "b")[0].as_point()["label"] == "one"


def test_workspace_containing_picks_the_innermost(store, tmp_path):
    outer = store.workspace(str(tmp_path / "w"))
    inner = store.workspace(str(tmp_path / "w" / "sub"))
    deep = os.fsencode(tmp_path / "w" / "sub" / "x" / "y")
    assert store.workspace_containing(deep)[0] == inner
    assert store.workspace_containing(os.fsencode(tmp_path / "w" / "subx"))[0] == outer
    assert store.workspace_containing(os.fsencode(tmp_path / "elsewhere")) is None
