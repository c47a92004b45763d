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

import msgpack

from . import _epoch
from . import _schema as S
from ._errors import IndexCorrupt, StoreError
from ._preimage import Damaged, PreImage, check_relpath, decode, encode

# What a damaged journal value raises while being decoded.
_DECODE_ERRORS = (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException)


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
        _epoch.add_counts(txn, db, e, added, nbytes)
    return result


def is_recorded(txn, db, ws: int, epoch_id: int, path: bytes) -> bool:
    check_relpath(path)
    return txn.get(S.journal_key(ws, epoch_id, path), db=db["journal"]) is not None


def get(txn, db, ws: int, epoch_id: int, path: bytes) -> PreImage | None:
    """The pre-image of ``path`` in that epoch, ``None`` if none; ``IndexCorrupt`` if
    its entry is damaged."""
    img = get_or_damaged(txn, db, ws, epoch_id, path)
    if isinstance(img, Damaged):
        raise IndexCorrupt(path=path, epoch=epoch_id, reason=img.reason)
    return img


def get_or_damaged(txn, db, ws: int, epoch_id: int, path: bytes):
    """As ``get``, but a damaged entry comes back as a ``Damaged`` marker."""
    raw = txn.get(S.journal_key(ws, epoch_id, path), db=db["journal"])
    if raw is None:
        return None
    try:
        return decode(S.unpack(raw)[0])
    except _DECODE_ERRORS as exc:
        return Damaged(epoch_id, f"undecodable entry ({type(exc).__name__})")


def decode_value(key: bytes, raw):
    """``(path, PreImage | Damaged)`` of one journal key/value.  The path of a damaged
    value is read from its key (a hashed long path then shows its key form)."""
    try:
        fields, full = S.unpack(raw)
        path = full if full is not None else bytes(key[12:])
        return path, decode(fields)
    except _DECODE_ERRORS as exc:
        return bytes(key[12:]), Damaged(S.read_u64(key, 4),
                                        f"undecodable entry ({type(exc).__name__})")



def entries(txn, db, ws: int, epoch_id: int):
    """Yield (path, PreImage) of one epoch (pkey order)."""
    prefix = S.ws_epoch_key(ws, epoch_id)
    cur = txn.cursor(db=db["journal"])
    if cur.set_range(prefix):
        for key, raw in cur:
            if key[:12] != prefix:
                break
            yield decode_value(key, raw)


def entries_from(txn, db, ws: int, epoch_id: int):
    """Yield (epoch id, path, PreImage) of every epoch >= ``epoch_id`` of ``ws``, in
    epoch order."""
    prefix = S.u32(ws)
    cur = txn.cursor(db=db["journal"])
    if cur.set_range(S.ws_epoch_key(ws, epoch_id)):
        for key, raw in cur:
            if key[:4] != prefix:
                break
            path, img = decode_value(key, raw)
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
            out.append((bytes(key), decode_value(key, raw)[0]))
    return out
