"""Corruption: a damaged blob file, a damaged inline blob value or a damaged index entry is
reported by ``rewindfs fsck`` (exit 1, naming the journal paths that depend on it) and by
the rewind that needs it (``rewind.failed`` naming the path, exit 1), while every other
path of that rewind still lands.
"""

from __future__ import annotations

import json
import os

import pytest

from mountkit import cli
from restorekit import History
from store import Store
from store import _schema as S
from treesnap import snapshot

BIG = 1_300_000     # a blob file
SMALL = 3000        # an inline blob (random: stored raw)
TEXT = b"".join(b"line %d of a source file\n" % i for i in range(200))   # stored zstd


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _history(tmp_path):
    """Turn 1 rewrites four files; returns (store path, ws path, epoch, base files)."""
    ws, store_path = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    base = {b"big": os.urandom(BIG), b"small": os.urandom(SMALL),
            b"ok1": b"fine one", b"d/ok2": os.urandom(SMALL + 1), b"text": TEXT}
    (ws / "d").mkdir()
    for rel, data in base.items():
        (ws / os.fsdecode(rel)).write_bytes(data)
    with Store.open(store_path) as store:
        h = History(store, ws)
        try:
            epoch = h.turn(1)
            for rel in base:
                h.write(rel, b"changed " + rel)
            h.end_turn()
        finally:
            h.close()
    return store_path, ws, epoch, base


def _blob_of(store, ws_id, epoch, rel) -> bytes:
    return dict(store.journal(ws_id, epoch))[rel].blob


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def damage_blob_file(store, ws_id, epoch, rel) -> None:
    path = store.blobs.file_path(_blob_of(store, ws_id, epoch, rel))
    with open(path, "r+b") as f:
        f.seek(BIG // 2)
        byte = f.read(1)
        f.seek(BIG // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def _damage_payload(kind: int, offset: int):
    """A damage function flipping the inline payload of an entry of ``kind`` at ``offset``."""
    def damage(store, ws_id, epoch, rel) -> None:
        key = _blob_of(store, ws_id, epoch, rel)
        with store._w() as txn:
            size, where, touched, data = S.unpack(txn.get(key, db=store._db["blobs"]))
            assert where == kind
            txn.put(key, S.pack([size, where, touched, _flip(data, offset)]),
                    db=store._db["blobs"])
    return damage


damage_inline = _damage_payload(S.INLINE, 10)
damage_inline_zstd = _damage_payload(S.INLINE_ZSTD, 20)


def damage_journal(store, ws_id, epoch, rel) -> None:
    with store._w() as txn:
        txn.put(S.journal_key(ws_id, epoch, rel), b"\xc1garbage", db=store._db["journal"])


def damage_path_index(store, ws_id, epoch, rel) -> None:
    with store._w() as txn:
        assert txn.delete(S.touched_key(ws_id, rel, epoch), db=store._db["touched"])


DAMAGE = {"blob-file": (damage_blob_file, b"big"), "inline": (damage_inline, b"small"),
          "inline-zstd": (damage_inline_zstd, b"text"), "journal": (damage_journal, b"d/ok2")}


def test_lost_path_index_entry_is_reported_and_the_rewind_still_lands(tmp_path):
    """The per-path index entry of a pre-image is gone: fsck names the path; a whole
    rewind restores from the journal itself, so nothing is lost.  (A ``--path`` rewind
    looks paths up in that index and would miss it: run fsck first.)"""
    store_path, ws, epoch, base = _history(tmp_path)
    with Store.open(store_path) as store:
        damage_path_index(store, store.workspace(os.fsencode(ws)), epoch, b"ok1")
    res = cli("fsck", "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    problems = [r for r in _lines(res.stdout) if r["type"] == "fsck.problem"]
    assert any(p["code"] == "index-mismatch" and "ok1" in p["paths"] for p in problems)
    res = cli("rewind", f"e{epoch}", "-C", ws, "--json", store=store_path)
    assert res.returncode == 0, res.stdout + res.stderr
    tree, _ = snapshot(ws)
    assert {rel: tree[rel].data for rel in base} == base


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_is_named_and_the_rest_lands(tmp_path, kind):
    store_path, ws, epoch, base = _history(tmp_path)
    damage, victim = DAMAGE[kind]
    with Store.open(store_path) as store:
        ws_id = store.workspace(os.fsencode(ws))
        damage(store, ws_id, epoch, victim)

    res = cli("fsck", "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    problems = [r for r in _lines(res.stdout) if r["type"] == "fsck.problem"]
    assert any(os.fsdecode(victim) in p.get("paths", ()) for p in problems), problems

    res = cli("rewind", f"e{epoch}", "-C", ws, "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    records = _lines(res.stdout)
    failed = [r["path"] for r in records if r["type"] == "rewind.failed"]
    assert failed == [os.fsdecode(victim)], records
    tree, _ = snapshot(ws)
    for rel, data in base.items():
        if rel != victim:
            assert tree[rel].data == data, rel
    assert tree[victim].data == b"changed " + victim   # left as it was, not torn
    assert not [p for p in tree if os.path.basename(p).startswith(b".rewindfs~")]
