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

from typing import NamedTuple

from . import _epoch
from . import _schema as S
from ._errors import EpochClosed, IndexCorrupt
from ._preimage import Damaged, PreImage, check_relpath, decode, encode


class Recorded(NamedTuple):
    """What ``Store.record`` committed: ``fresh[i]`` is whether entry *i* was newly
    recorded (a path already recorded in the epoch keeps its first image), and
    ``generation`` the store's ``generation()`` right after the commit.  ``record``
    refuses a closed epoch and beginning an epoch closes the one before, so the epoch
    was the open one at that generation: a caller that still sees it as the store's
    generation knows nothing has committed since, without reading the epoch again.

    ``generation`` is None when nothing was new: LMDB then commits nothing and the
    number the transaction had goes to the next commit, which may be anyone's."""
    fresh: list[bool]
    generation: int | None


def record(txn, db, ws: int, epoch_id: int, entries) -> list[bool]:
    e = _epoch.get_in(txn, db, ws, epoch_id)
    if not e.is_open:
        raise EpochClosed(epoch=epoch_id)
    result, added, nbytes = [], 0, 0
    for path, img in entries:
        check_relpath(path)
        if not isinstance(img, PreImage):
            raise TypeError(f"not a PreImage: {img!r}")
        pk, key = S.pkey(path), S.journal_key(ws, epoch_id, path)
        value = S.dump(key, [encode(img), path if S.is_hashed(pk) else None])
        new = txn.put(key, value, db=db["journal"], overwrite=False)
        if new:
            tkey = S.touched_key(ws, path, epoch_id)
            txn.put(tkey, S.seal(tkey, path if S.is_hashed(pk) else b""), db=db["touched"])
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
    key = S.journal_key(ws, epoch_id, path)
    raw = txn.get(key, db=db["journal"])
    return None if raw is None else _decode(key, raw)[1]


def get_or_damaged(txn, db, ws: int, epoch_id: int, path: bytes):
    """As ``get``, but a damaged entry comes back as a ``Damaged`` marker."""
    try:
        return get(txn, db, ws, epoch_id, path)
    except IndexCorrupt as exc:
        return Damaged(epoch_id, exc.details["reason"])


def _decode(key: bytes, raw) -> tuple[bytes, PreImage]:
    """(path, PreImage) of one verified journal value, else ``IndexCorrupt``."""
    value = S.load("journal", key, raw)
    with S.decoding("journal", key):
        fields, full = value
        path = bytes(key[12:]) if full is None else full
        if not isinstance(path, bytes) or S.pkey(path) != key[12:]:
            raise ValueError("the full path does not match the key")
        return path, decode(fields)


def decode_value(key: bytes, raw):
    """``(path, PreImage | Damaged)`` of one journal key/value.  The path and epoch of
    a damaged entry are read from its key (a hashed long path then shows its key form;
    a damaged key may name a path or epoch that never was — the per-path index still
    names the real one, see ``_point.targets``)."""
    try:
        return _decode(key, raw)
    except IndexCorrupt as exc:
        return bytes(key[12:]), Damaged(key_epoch(key), exc.details["reason"])


def key_epoch(key: bytes) -> int:
    """The epoch a journal key names (0 for a key too short to name one: damage)."""
    return S.read_u64(key, 4) if len(key) >= 12 else 0



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
    epoch order.  The epoch bound is checked on every key, not only trusted to the
    seek: a damaged branch page can make ``set_range`` land early."""
    prefix = S.u32(ws)
    cur = txn.cursor(db=db["journal"])
    if cur.set_range(S.ws_epoch_key(ws, epoch_id)):
        for key, raw in cur:
            if key[:4] != prefix:
                break
            eid = key_epoch(key)
            if eid >= epoch_id:
                path, img = decode_value(key, raw)
                yield eid, path, img


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
