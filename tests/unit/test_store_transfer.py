"""A workspace's history moved between stores (``Store.export_history`` /
``import_history``, ``store/_transfer.py``): the id offset when the ids are taken, the
point resolved inside the import, refusals that write nothing."""

from __future__ import annotations

import pytest
from remotekit import build_history, new_dir
from restorekit import History, open_history
from store_fixtures import assert_sound

from rewindfs.overlay.rewind.remote import capture_tree
from rewindfs.store import Store
from rewindfs.store._errors import RestoreTargetInUse
from rewindfs.store._errors import AmbiguousPoint


def _exported(tmp_path):
    """(history, its epochs, its blobs by key) of a workspace of another store."""
    with open_history(new_dir(tmp_path / "a")) as h:
        build_history(h, {})
        hist = h.store.export_history(h.ws)
        blobs = {img.blob: h.store.read_blob(img.blob)
                 for _e, _p, img in hist.journal if img.kind == "file"}
        return hist, h.store.epochs(h.ws), blobs


def _open_with(path, blobs) -> Store:
    """A store holding ``blobs`` (what a restore fetches before it imports)."""
    store = Store.open(path)
    for data in blobs.values():
        store.put_bytes(data)
    return store


def test_ids_are_kept_in_a_fresh_store_and_shifted_as_a_block_in_a_used_one(tmp_path):
    hist, epochs, blobs = _exported(tmp_path)
    with _open_with(tmp_path / "b", blobs) as store:
        fresh = store.workspace(bytes(new_dir(tmp_path / "fresh")))
        offset, head, t2 = store.import_history(fresh, hist, label="x", head=[],
                                                point="t2", session="s1")
        assert offset == 0 and [e.id for e in store.epochs(fresh)][:-1] == [e.id for e in epochs]
        assert head.id == epochs[-1].id + 1 and store.epoch(t2).turn == 2
        used = store.workspace(bytes(new_dir(tmp_path / "used")))
        offset, head2, t2b = store.import_history(used, hist, label="x", head=[],
                                                  point="t2", session="s1")
        assert offset == head.id + 1 - epochs[0].id and t2b == t2 + offset
        got = store.epochs(used)[:-1]
        assert [e.id - offset for e in got] == [e.id for e in epochs]
        rewinds = [(e, g) for e, g in zip(epochs, got) if e.kind == "rewind"]
        assert rewinds and all(g.target == e.target + offset for e, g in rewinds)
        assert store.session_points(used, "s2")[-1] == (3, store.session_points(fresh, "s2")[-1][1] + offset)
        assert_sound(store)


def test_refusals_write_nothing(tmp_path):
    hist, _epochs, blobs = _exported(tmp_path)
    with _open_with(tmp_path / "b", blobs) as store:
        ws = store.workspace(bytes(new_dir(tmp_path / "w")))
        with pytest.raises(AmbiguousPoint):
            store.import_history(ws, hist, label="x", head=[], point="t3")
        assert store.epochs(ws) == []
        store.check_import(bytes(tmp_path / "w"), hist, point="t3", session="s1")
        assert store.epochs(ws) == []
        store.import_history(ws, hist, label="x", head=[])
        with pytest.raises(RestoreTargetInUse):
            store.import_history(ws, hist, label="x", head=[])
        assert_sound(store)


def test_the_head_epoch_holds_the_tree_as_pre_images(tmp_path):
    hist, _epochs, blobs = _exported(tmp_path)
    with _open_with(tmp_path / "b", blobs) as store:
        root = new_dir(tmp_path / "w")
        src = History(store, new_dir(tmp_path / "src"))
        (tmp_path / "src" / "f").write_bytes(b"content")
        head = capture_tree(src.fd, store)
        src.close()
        ws = store.workspace(bytes(root))
        _off, h, _t = store.import_history(ws, hist, label="pushed", head=head)
        assert h.is_open and h.kind == "idle" and h.label == "pushed"
        assert dict(store.journal(ws, h.id))[b"f"].size == 7
        assert_sound(store)
