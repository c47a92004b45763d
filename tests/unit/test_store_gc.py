"""gc (reachability with a grace period, retention policies) and fsck."""

from __future__ import annotations

import dataclasses
import os

import pytest

from rewindfs.store import PreImage, UnknownPoint
from rewindfs.store import _blob, _epoch
from rewindfs.store import _schema as S
from store_fixtures import store, store_path, ws  # noqa: F401  (fixtures)

BIG = _blob.INLINE_MAX + 1


def file_image(store, data: bytes) -> PreImage:
    key, n = store.put_bytes(data)
    return PreImage("file", 0o644, size=n, blob=key)


def test_grace_keeps_young_unreferenced_blobs(store, ws):
    key, _ = store.put_bytes(b"in flight")
    big, _ = store.put_bytes(os.urandom(BIG))
    report = store.gc(grace_s=3600)
    assert report.blobs_removed == 0
    assert store.read_blob(key) == b"in flight" and len(store.read_blob(big)) == BIG


def test_unreferenced_blobs_go_referenced_stay(store, ws):
    e = store.current_epoch(ws)
    keep_small = file_image(store, b"kept")
    keep_big = file_image(store, os.urandom(BIG))
    store.record(ws, e.id, [(b"a", keep_small), (b"b", keep_big)])
    lost_small, _ = store.put_bytes(b"lost")
    lost_big, _ = store.put_bytes(os.urandom(BIG))
    report = store.gc(grace_s=0)
    assert (report.blobs_removed, report.files_removed) == (2, 1)
    assert report.bytes_freed == 4 + BIG
    assert not os.path.exists(store.blobs.file_path(lost_big))
    assert os.path.exists(store.blobs.file_path(keep_big.blob))
    store.read_blob(keep_small.blob)
    store.read_blob(keep_big.blob)
    assert [p.code for p in store.fsck().problems] == []


def test_a_dedup_hit_restarts_the_grace_period(store, monkeypatch):
    key, _ = store.put_bytes(b"old content")
    with store._w() as txn:        # pretend it was put long ago
        entry = S.unpack(txn.get(key, db=store._db["blobs"]))
        entry[2] = 0
        txn.put(key, S.pack(entry), db=store._db["blobs"])
    store.put_bytes(b"old content")          # a capture in flight reuses it
    assert store.gc(grace_s=60).blobs_removed == 0


def test_orphan_files_and_temp_files(store):
    key = bytes(range(16))
    path = store.blobs.file_path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(b"junk")
    tmp = os.path.join(store.blobs.tmp_dir, "999999999-2-3.tmp")   # no such pid
    open(tmp, "wb").write(b"partial")
    assert [p.code for p in store.fsck().problems] == ["orphan-file"]
    assert store.fsck().ok                    # an orphan is a warning
    assert store.gc(grace_s=3600).files_removed == 0
    assert store.gc(grace_s=0).files_removed == 2
    assert not os.path.exists(path) and not os.path.exists(tmp)


def _history(store, ws, n):
    ids = []
    for turn in range(1, n + 1):
        e = store.begin_turn(ws, "s", turn, "")
        store.record(ws, e.id, [(b"f", file_image(store, b"v%d" % turn + b"x" * 100))])
        ids.append(e.id)
    store.end_turn(ws)
    return ids


def test_keep_epochs_drops_the_oldest(store, ws):
    ids = _history(store, ws, 5)
    report = store.gc(grace_s=0, keep_epochs=3)
    # epochs: t1..t5, idle → keep the newest 3: t4, t5, idle
    assert report.epochs_dropped == 3 and report.entries_dropped == 3
    assert report.blobs_removed == 3
    remaining = [e.id for e in store.epochs(ws)]
    assert remaining[:2] == ids[3:]
    for gone in ids[:3]:
        with pytest.raises(UnknownPoint):
            store.resolve_point(ws, gone)
    assert store.session_points(ws, "s") == [(4, ids[3]), (5, ids[4])]
    assert store.read_blob(store.state_at(ws, ids[3], b"f").blob).startswith(b"v4")


def test_retention_never_drops_what_a_redo_needs(store, ws):
    ids = _history(store, ws, 5)
    store.begin_rewind(ws, ids[1], "s")
    store.end_rewind(ws)
    store.gc(grace_s=0, keep_epochs=1)
    remaining = [e.id for e in store.epochs(ws)]
    assert remaining[0] == ids[1]            # the rewind's target and all after it
    assert store.state_at(ws, ids[1], b"f") is not None


def test_max_bytes_and_max_age(store, ws):
    ids = _history(store, ws, 4)              # 102 bytes per turn
    assert store.gc(grace_s=0, max_bytes=10_000).epochs_dropped == 0
    report = store.gc(grace_s=0, max_bytes=250)
    assert report.entries_dropped == 2        # 408 → 204 bytes
    assert [e.id for e in store.epochs(ws)][:2] == ids[2:]
    assert store.gc(grace_s=0, max_age_s=3600).epochs_dropped == 0
    assert store.gc(grace_s=0, max_age_s=0).epochs_dropped == 2   # all but the open one
    assert len(store.epochs(ws)) == 1


def test_fsck_reports_dangling_references(store, ws):
    e = store.current_epoch(ws)
    store.record(ws, e.id, [(b"x", PreImage("file", 0o644, size=3, blob=b"\1" * 16))])
    report = store.fsck()
    assert [(p.code, p.paths) for p in report.errors] == [("missing-blob-ref", (b"x",))]
    with store._w() as txn:      # make the fixture's store sound again
        txn.delete(S.journal_key(ws, e.id, b"x"), db=store._db["journal"])
        report = None
    problems = store.fsck().errors    # the path index, and the epoch's entry count
    assert [p.code for p in problems] == ["index-mismatch", "index-mismatch"]
    with store._w() as txn:
        txn.delete(S.touched_key(ws, b"x", e.id), db=store._db["touched"])
        _epoch.put(txn, store._db, dataclasses.replace(_epoch.get(txn, store._db, e.id),
                                                       paths=0))
