"""The journal: per epoch, every path first changed in it with its pre-image.

Write-ahead contract: ``record`` commits one LMDB write transaction holding the journal
entries, their per-path index entries and the epoch's counters; when it returns the
pre-images are durable against a crash of the calling process (see docs/store.md for
power loss).  The first pre-image of a path in an epoch wins; later ones are ignored.
Recording into an epoch that is no longer open raises ``EpochClosed`` and records
nothing: the caller captured against a stale epoch and must capture again into the
current one (otherwise the mutation would land in an epoch without its pre-image).
"""

from __future__ import annotations

from . import _epoch
from . import _schema as S
from ._errors import StoreError
from ._preimage import PreImage, check_relpath, decode, encode


class EpochClosed(StoreError):
    """Epoch {epoch} is closed; capture again into the current epoch."""

    code = "epoch-closed"
    traceback = False


def record(txn, db, ws: int, epoch_id: int, entries) -> list[bool]:
    e = _epoch.get_in(txn, db, ws, epoch_id)
    if not e.is_open:
        raise EpochClosed(epoch=epoch_id)
    result, added, nbytes = [], 0, 0
    for path, img in entries:
        check_relpath(path)
        if not isinstance(img, PreImage):
            raise TypeError(f"not a PreImage: {img!r}")
        pk = S.pkey(path)
        value = S.pack([encode(img), path if S.is_hashed(pk) else None])
        new = txn.put(S.journal_key(ws, epoch_id, path), value, db=db["journal"],
                      overwrite=False)
        if new:
            txn.put(S.touched_key(ws, path, epoch_id), path if S.is_hashed(pk) else b"",
                    db=db["touched"])
            added += 1
            nbytes += img.size if img.kind == "file" else 0
        result.append(new)
    if added:
        _epoch.add_counts(txn, db, epoch_id, added, nbytes)
    return result


def is_recorded(txn, db, ws: int, epoch_id: int, path: bytes) -> bool:
    check_relpath(path)
    return txn.get(S.journal_key(ws, epoch_id, path), db=db["journal"]) is not None


def get(txn, db, ws: int, epoch_id: int, path: bytes) -> PreImage | None:
    raw = txn.get(S.journal_key(ws, epoch_id, path), db=db["journal"])
    return None if raw is None else decode(S.unpack(raw)[0])


def _decode_entry(key: bytes, raw) -> tuple[bytes, PreImage]:
    fields, full = S.unpack(raw)
    return (full if full is not None else bytes(key[12:])), decode(fields)


def entries(txn, db, ws: int, epoch_id: int):
    """Yield (path, PreImage) of one epoch (pkey order)."""
    prefix = S.ws_epoch_key(ws, epoch_id)
    cur = txn.cursor(db=db["journal"])
    if cur.set_range(prefix):
        for key, raw in cur:
            if key[:12] != prefix:
                break
            yield _decode_entry(key, raw)


def entries_from(txn, db, ws: int, epoch_id: int):
    """Yield (epoch id, path, PreImage) of every epoch >= ``epoch_id`` of ``ws``, in
    epoch order."""
    prefix = S.u32(ws)
    cur = txn.cursor(db=db["journal"])
    if cur.set_range(S.ws_epoch_key(ws, epoch_id)):
        for key, raw in cur:
            if key[:4] != prefix:
                break
            path, img = _decode_entry(key, raw)
            yield S.read_u64(key, 4), path, img


def delete_epoch(txn, db, ws: int, epoch_id: int) -> int:
    """Drop one epoch's journal entries and their index entries; return how many."""
    doomed = [(path, key) for key, path in _keys_of(txn, db, ws, epoch_id)]
    for path, key in doomed:
        txn.delete(key, db=db["journal"])
        txn.delete(S.touched_key(ws, path, epoch_id), db=db["touched"])
    return len(doomed)


def _keys_of(txn, db, ws, epoch_id):
    prefix = S.ws_epoch_key(ws, epoch_id)
    cur = txn.cursor(db=db["journal"])
    out = []
    if cur.set_range(prefix):
        for key, raw in cur:
            if key[:12] != prefix:
                break
            out.append((bytes(key), _decode_entry(key, raw)[0]))
    return out
