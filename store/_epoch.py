"""Epochs: numbered spans of one workspace's history.

Contract: epoch ids are allocated from ``meta/next_epoch`` inside the same write
transaction that creates the epoch, so ids strictly increase across the whole store
even with several processes writing.  A workspace's newest epoch is always its open
one (``ended_ns is None``); every other epoch is closed.  Opening an epoch closes the
previous one in the same transaction.

Every change here but an append renews the workspace's token ``meta/epochs\\0<ws>`` in
the same transaction: an epoch imported or put back (``put``, ``add_to_index``) or
removed (``delete``).  An append (``open_new``: the newest epoch closed, a new one
after it) and a capture's counters (``add_counts``, on the open epoch) renew nothing.
So while the token is unchanged, every epoch but the newest one that a reader saw is
the same record, and epochs after it may have come: ``all_of`` answers from its memo
after reading the token, that newest epoch and those after it — a UI asks on every
render, and decoding 40,000 epochs took ~0.2 s (docs/store.md).  No module writes the
``epochs`` or ``ws_epochs`` databases but this one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from . import _schema as S
from . import _txn
from ._errors import UnknownPoint

# ``rewind``: restored point ``target``; ``session`` is its owner (None: the workspace's
# manual owner).  ``redo``: undid the rewind epoch ``target`` (back to point ``target``,
# the state that rewind found); ``session`` is the owner of both.
KINDS = ("turn", "idle", "rewind", "redo")


@dataclass(frozen=True, slots=True)
class Epoch:
    id: int
    workspace: int
    kind: str
    session: str | None
    turn: int | None
    label: str
    started_ns: int
    ended_ns: int | None
    paths: int
    bytes: int
    target: int | None

    @property
    def is_open(self) -> bool:
        return self.ended_ns is None

    def as_point(self) -> dict:
        """The epoch as a point in the control protocol and ``--json`` output."""
        return {"epoch": self.id, "kind": self.kind, "session": self.session,
                "turn": self.turn, "label": self.label, "started_ns": self.started_ns,
                "ended_ns": self.ended_ns, "paths": self.paths, "bytes": self.bytes,
                "target": self.target}


def _encode(e: Epoch) -> bytes:
    return S.dump(S.u64(e.id), [e.workspace, e.kind, e.session, e.turn, e.label,
                                e.started_ns, e.ended_ns, e.paths, e.bytes, e.target])


def decode(key: bytes, raw) -> Epoch:
    """The epoch record at ``key``, verified; ``IndexCorrupt`` names it if damaged."""
    fields = S.load("epochs", key, raw)
    with S.decoding("epochs", key):
        ws, kind, session, turn, label, started, ended, paths, nbytes, target = fields
        if kind not in KINDS:
            raise ValueError(kind)
        return Epoch(S.read_u64(key), ws, kind, session, turn, label, started, ended,
                     paths, nbytes, target)


# The last record decoded or written per epoch id, as (stored bytes, Epoch).  A capture
# reads its epoch and rewrites the counters in every commit; ``decode`` is a pure
# function of (key, bytes), so bytes equal to the ones kept need no second check and
# decoding (a memo, not a cache that can go stale: any other bytes are decoded).
_recent: dict[int, tuple[bytes, Epoch]] = {}
_RECENT_MAX = 4096


def get(txn, db, epoch_id: int) -> Epoch | None:
    key = S.u64(epoch_id)
    raw = txn.get(key, db=db["epochs"])
    if raw is None:
        return None
    hit = _recent.get(epoch_id)
    if hit is not None and hit[0] == raw:
        return hit[1]
    e = decode(key, raw)
    _remember(e, raw)
    return e


def _remember(e: Epoch, raw: bytes) -> None:
    if len(_recent) >= _RECENT_MAX:
        _recent.clear()
    _recent[e.id] = (bytes(raw), e)


def get_known(txn, db, epoch_id) -> Epoch:
    """The epoch ``epoch_id`` (any value accepted); ``UnknownPoint`` if there is none."""
    e = get(txn, db, epoch_id) if isinstance(epoch_id, int) and 0 <= epoch_id < 1 << 64 else None
    if e is None:
        raise UnknownPoint(point=_named(epoch_id))
    return e


def get_in(txn, db, ws: int, epoch_id: int) -> Epoch:
    """The epoch, which must belong to ``ws``; else ``UnknownPoint``."""
    e = get_known(txn, db, epoch_id)
    if e.workspace != ws:
        raise UnknownPoint(point=_named(epoch_id))
    return e


def _named(epoch_id):
    """An epoch id as the user types it in a message (``e7``)."""
    return f"e{epoch_id}" if isinstance(epoch_id, int) and not isinstance(epoch_id, bool) \
        else epoch_id


def put(txn, db, e: Epoch) -> None:
    _write(txn, db, e)
    _renew_token(txn, db, e.workspace)


def _write(txn, db, e: Epoch) -> None:
    raw = _encode(e)
    txn.put(S.u64(e.id), raw, db=db["epochs"])
    _remember(e, raw)


def add_to_index(txn, db, e: Epoch) -> None:
    """Name ``e`` in its workspace's epoch list (``ws_epochs``), anywhere in it."""
    _index(txn, db, e)
    _renew_token(txn, db, e.workspace)


def _index(txn, db, e: Epoch) -> None:
    key = S.ws_epoch_key(e.workspace, e.id)
    txn.put(key, S.seal(key, b""), db=db["ws_epochs"])


def delete(txn, db, e: Epoch) -> None:
    """Remove ``e``'s record and its place in the workspace's list."""
    txn.delete(S.ws_epoch_key(e.workspace, e.id), db=db["ws_epochs"])
    txn.delete(S.u64(e.id), db=db["epochs"])
    _renew_token(txn, db, e.workspace)


def _renew_token(txn, db, ws: int) -> None:
    # random, not a counter: no read of the old value, and no two renewals alike,
    # whichever processes make them
    key = S.epochs_token_key(ws)
    txn.put(key, S.dump(key, os.urandom(8)), db=db["meta"])


def last(txn, db, ws: int) -> Epoch | None:
    """The newest epoch of ``ws`` (the open one), or None."""
    cur = txn.cursor(db=db["ws_epochs"])
    nxt = S.u32(ws + 1)
    if cur.set_range(nxt):
        if not cur.prev():
            return None
    elif not cur.last():
        return None
    key = cur.key()
    if len(key) != 12:
        raise S.corrupt("ws_epochs", key, "malformed key")
    if S.read_u32(key) != ws:
        return None
    S.unseal("ws_epochs", key, cur.value())
    return get(txn, db, S.read_u64(key, 4))


def every(txn, db):
    """Yield every epoch of the store (all workspaces), by id."""
    for key, raw in txn.cursor(db=db["epochs"]):
        yield decode(key, raw)


def ids_of(txn, db, ws: int, first: int = 0):
    """Yield, ascending, the epoch ids from ``first`` on that the workspace index names
    for ``ws`` (each index entry verified: ``IndexCorrupt``)."""
    cur = txn.cursor(db=db["ws_epochs"])
    prefix = S.u32(ws)
    if cur.set_range(S.ws_epoch_key(ws, first)):
        for key, raw in cur:
            if key[:4] != prefix:
                return
            S.unseal("ws_epochs", key, raw)
            yield S.read_u64(key, 4)


def all_of(txn, db, ws: int) -> list[Epoch]:
    """Every epoch of ``ws``, by id.  An index key whose epoch record is gone (damage
    that fsck reports, see ``_check``) is skipped, so callers never see ``None``.
    While the workspace's token is the one the memo of ``db`` was made under (module
    docstring), the memo's epochs up to its newest one are taken as they are, and that
    one and every epoch after it are read again."""
    token = txn.get(S.epochs_token_key(ws), db=db["meta"])
    memo = getattr(db, "memo", None)
    hit = None if memo is None or token is None else memo.get(("epochs", ws))
    epochs = None
    if hit is not None and hit[0] == token and hit[1]:
        kept = hit[1]
        tail = _from(txn, db, ws, kept[-1].id)
        if tail and tail[0].id == kept[-1].id:
            epochs = [*kept[:-1], *tail]
    if epochs is None:
        epochs = _from(txn, db, ws, 0)
    # only committed state is kept: a write transaction may still abort, and what it
    # saw (an epoch it opened, the one it closed) would then be taken for the store's
    if memo is not None and token is not None and _txn.is_snapshot(txn):
        memo[("epochs", ws)] = (bytes(token), tuple(epochs))
    return epochs


def _from(txn, db, ws: int, first: int) -> list[Epoch]:
    """The epochs of ``ws`` from id ``first`` on, by id (missing records skipped)."""
    return [e for e in (get(txn, db, eid) for eid in ids_of(txn, db, ws, first))
            if e is not None]


def close(txn, db, e: Epoch) -> Epoch:
    """Close ``e``, the workspace's newest epoch (the only one ever open)."""
    if e.ended_ns is not None:
        return e
    e = replace(e, ended_ns=time.time_ns())
    _write(txn, db, e)      # the newest epoch closed: all_of reads it again anyway
    return e


def open_new(txn, db, ws: int, kind: str, *, session=None, turn=None, label="",
             target=None) -> Epoch:
    """Close the workspace's open epoch and open a new one (one transaction)."""
    prev = last(txn, db, ws)
    if prev is not None:
        close(txn, db, prev)
    meta = db["meta"]
    eid = next_id(txn, db)
    txn.put(b"next_epoch", S.dump(b"next_epoch", eid + 1), db=meta)
    e = Epoch(eid, ws, kind, session, turn, label, time.time_ns(), None, 0, 0, target)
    _write(txn, db, e)      # an append: no new token (module docstring) …
    _index(txn, db, e)
    if txn.get(S.epochs_token_key(ws), db=meta) is None:
        _renew_token(txn, db, ws)     # … but a first one, for a store from before it
    return e


def next_id(txn, db) -> int:
    """``meta/next_epoch``, verified."""
    n = S.load("meta", b"next_epoch", txn.get(b"next_epoch", db=db["meta"]) or b"")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise S.corrupt("meta", b"next_epoch", f"not an epoch id: {n!r}")
    return n


def current(txn, db, ws: int) -> Epoch:
    """The open epoch of ``ws``, opening an ``idle`` one if the workspace has none."""
    e = last(txn, db, ws)
    return e if e is not None else open_new(txn, db, ws, "idle")


def add_counts(txn, db, e: Epoch, paths: int, nbytes: int) -> None:
    """Add to ``e``'s counters; ``e`` must have been read in this same write txn."""
    # the constructor, not dataclasses.replace: this runs in every capture's commit,
    # where replace's introspection cost ~3 µs of a ~24 µs Store.record (one absent
    # path, best of 5 runs of 5,000)
    # and no new token: the open epoch's counters are the one change all_of reads
    # again whatever its memo holds
    _write(txn, db, Epoch(e.id, e.workspace, e.kind, e.session, e.turn, e.label,
                          e.started_ns, e.ended_ns, e.paths + paths, e.bytes + nbytes,
                          e.target))
