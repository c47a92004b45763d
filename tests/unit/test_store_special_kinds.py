"""Pre-images of special files: fifos, sockets, char and block devices (issue 14).

Each is recorded as what it is, with its device number, and a store written before
these kinds existed (schema 3: a journal value of ten fields, no ``rdev``) still reads
exactly as it did once a newer rewindfs opens it.
"""

from __future__ import annotations

import os

import pytest

from rewindfs.store import PreImage, Store
from rewindfs.store import _schema as S
from rewindfs.store._preimage import decode, encode
from store_fixtures import assert_sound, store, store_path, ws  # noqa: F401  (fixtures)

IMAGES = {
    b"c": PreImage("chardev", 0o620, 5, 6, 0, 11, ((b"trusted.k", b"v"),), rdev=os.makedev(1, 3)),
    b"b": PreImage("blockdev", 0o640, 0, 6, 0, 12, rdev=os.makedev(259, 1 << 19)),
    b"s": PreImage("socket", 0o755, 42, 43, 0, 13),
    b"p": PreImage("fifo", 0o604, 1000, 1000, 0, 14),
}


def test_every_special_kind_round_trips_through_the_journal(store, ws):
    e = store.begin_turn(ws, "s", 1, "specials")
    store.record(ws, e.id, list(IMAGES.items()))
    assert dict(store.journal(ws, e.id)) == IMAGES
    for path, img in IMAGES.items():
        assert store.state_at(ws, e.id, path) == img


def test_only_a_device_has_a_device_number():
    for kind in ("fifo", "socket", "dir", "absent"):
        with pytest.raises(ValueError):
            PreImage(kind, rdev=os.makedev(1, 3))
    assert decode(encode(IMAGES[b"c"])).rdev == os.makedev(1, 3)


def test_a_ten_field_record_decodes_with_no_device_number():
    old = encode(IMAGES[b"p"])[:10]
    assert decode(old) == IMAGES[b"p"]


def test_a_schema_3_store_reads_as_before_and_is_upgraded(store_path, tmp_path):
    """A version-3 journal value (ten fields, sealed) is read back unchanged by this
    version; opening the store marks it version 4, so a version-3 program refuses it
    from then on instead of taking a device's entry for a damaged one."""
    with Store.open(store_path) as s:
        ws = s.workspace(os.fsencode(tmp_path / "w"))
        e = s.begin_turn(ws, "s", 1, "old")
        key, size = s.put_bytes(b"old content")
        file_img = PreImage("file", 0o644, 1, 2, size, 7, ((b"user.k", b"v"),), key)
        s.record(ws, e.id, [(b"f", file_img), (b"p", IMAGES[b"p"]), (b"gone", PreImage.ABSENT)])
        s.end_turn(ws)
        with s._w() as txn:     # what version 3 wrote: ten fields, no rdev
            cur = txn.cursor(db=s._db["journal"])
            rewritten = 0
            for k, raw in list(cur):
                fields, full = S.load("journal", k, raw)
                assert len(fields) == 11
                txn.put(k, S.dump(k, [fields[:10], full]), db=s._db["journal"])
                rewritten += 1
            assert rewritten == 3
            txn.put(b"schema", S.pack(3), db=s._db["meta"])
    with Store.open(store_path) as s:
        assert dict(s.journal(ws, e.id)) == {b"f": file_img, b"p": IMAGES[b"p"],
                                             b"gone": PreImage.ABSENT}
        with s._r() as txn:
            assert S.unpack(txn.get(b"schema", db=s._db["meta"])) == S.SCHEMA_VERSION == 6
        assert_sound(s)
