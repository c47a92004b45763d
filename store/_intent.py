"""Rewind intents: one per workspace, written before a rewind's first change and
cleared after its last, so an interrupted rewind can be finished at the next start
(DESIGN invariant 6).  The store keeps the dict opaque (any msgpack-able value)."""

from __future__ import annotations

from . import _schema as S


def put(txn, db, ws: int, intent: dict) -> None:
    if not isinstance(intent, dict):
        raise TypeError("an intent is a dict")
    txn.put(S.u32(ws), S.dump(S.u32(ws), intent), db=db["intents"])


def get(txn, db, ws: int) -> dict | None:
    """The workspace's intent, verified: ``IndexCorrupt`` if it is damaged."""
    key = S.u32(ws)
    raw = txn.get(key, db=db["intents"])
    if raw is None:
        return None
    intent = S.load("intents", key, raw)
    if not isinstance(intent, dict):
        raise S.corrupt("intents", key, "not a dict")
    return intent


def clear(txn, db, ws: int) -> None:
    txn.delete(S.u32(ws), db=db["intents"])
